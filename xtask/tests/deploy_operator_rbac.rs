//! `deploy/operator/rbac.yaml` is the operator's RBAC as `hpp-operator render --rbac` derives
//! it from what the operator runs; `HPP_BLESS=1` rewrites the file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::path::PathBuf;

const FILE: &str = "deploy/operator/rbac.yaml";
const BLESS: &str = "HPP_BLESS=1 cargo test -p xtask --test deploy_operator_rbac";

#[test]
fn deploy_operator_rbac_is_the_derived_one() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(FILE);
    let generated = hpp_bin::operator::rbac::yaml("hostpath-provisioner");
    if std::env::var_os("HPP_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{} cannot be read ({e}); regenerate it with: {BLESS}", path.display()));
    if committed != generated {
        let first = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
        panic!(
            "{FILE} differs from the derived RBAC from line {} on:\n  file:    {:?}\n  derived: {:?}\n\
             Regenerate it with: {BLESS}",
            first + 1,
            committed.lines().nth(first).unwrap_or("<end>"),
            generated.lines().nth(first).unwrap_or("<end>")
        );
    }
}
