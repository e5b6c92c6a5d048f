//! Commands in docs/user-guide.md that run hpp's executables parse, and do what the text says.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::path::PathBuf;

/// The user guide's "Run the operator on your laptop" command parses, and runs the operator
/// the way the text says: named namespace, no leader election, no webhook, loopback ports,
/// and every hpp image variable set.
#[test]
fn laptop_recipe_in_the_user_guide_parses_as_described() {
    use clap::Parser;
    let guide =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/user-guide.md")).unwrap();
    let section = guide.split("## Run the operator on your laptop").nth(1).unwrap();
    let block = section.split("```sh").nth(1).unwrap().split("```").next().unwrap();
    let joined = block.replace("\\\n", " ");
    let exported: Vec<&str> = joined
        .lines()
        .filter_map(|l| l.trim().strip_prefix("export "))
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    for var in [
        "KUBECONFIG",
        "OPERATOR_IMAGE",
        "CSI_PROVISIONER_IMAGE",
        "PROVISIONER_IMAGE",
    ] {
        assert!(exported.contains(&var), "the recipe sets {var}: {exported:?}");
    }
    let line = joined.lines().find(|l| l.contains("hpp-operator run")).unwrap();
    let argv: Vec<&str> = line.split_whitespace().collect();
    let args = hpp_bin::operator::Args::try_parse_from(&argv).unwrap();
    let Some(hpp_bin::operator::Command::Run(run)) = args.command else {
        panic!("run expected: {line}")
    };
    assert_eq!(run.namespace.as_deref(), Some("hostpath-provisioner"));
    assert!(run.no_leader_election && run.disable_webhook, "{line}");
    assert!(
        run.admin_addr.ip().is_loopback() && run.metrics.addr.ip().is_loopback(),
        "{line}"
    );
}
