//! Golden snapshots: every object the standard pipeline renders for every example CR, in two
//! clusters (offline with no nodes; two nodes with OpenShift, Prometheus and leftover pool
//! objects), as canonical JSON under `tests/golden/`. A refactoring of the builders must keep
//! them byte-identical; a deliberate change of the rendered objects is re-blessed with
//! `HPP_BLESS=1 cargo test -p hpp-reconcile --test golden` and shows up in review as a diff.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::path::PathBuf;

use hpp_api::HostPathProvisioner;
use hpp_reconcile::facts::{ClaimFact, CleanupJobFact, ClusterFacts, MounterFact};
use hpp_reconcile::{OperatorConfig, Pipeline};
use serde_json::{Map, Value};

const BLESS: &str = "HPP_BLESS=1 cargo test -p hpp-reconcile --test golden";

const EXAMPLES: [&str; 4] = [
    "hostpathprovisioner_cr",
    "hostpathprovisioner_legacy_cr",
    "hostpathprovisioner_pvctemplate_cr",
    "hostpathprovisioner_overlay_csi_cr",
];

fn example(name: &str) -> HostPathProvisioner {
    // deploy/examples/ as copied into the crate (xtask/tests/deploy_example_copies.rs keeps them equal).
    let path = format!("{}/tests/fixtures/examples/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
    let mut hpp: HostPathProvisioner = serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    hpp.metadata.uid = Some("uid-1".into());
    hpp
}

fn cfg() -> OperatorConfig {
    OperatorConfig::from_env([("OPERATOR_VERSION", "v1.0.0"), ("POD_NAMESPACE", "hpp")])
}

/// Two Ready nodes, optional APIs present, and pool objects left from an earlier pass: a
/// mounter of a removed pool (so a cleanup Job is rendered) and a claim of a node that left.
fn cluster_facts(hpp: &HostPathProvisioner) -> ClusterFacts {
    let mut facts = hpp_reconcile::render::offline_facts(hpp, &["node01".into(), "node02".into()], true, true);
    facts.mounters.push(MounterFact {
        name: "hpp-pool-gone-node01".into(),
        pool_label: "gone-hpp".into(),
        node: "node01".into(),
        mount_path: "/var/gone/csi".into(),
    });
    facts.cleanup_jobs.push(CleanupJobFact {
        name: "cleanup-pool-old-node02".into(),
        node: "node02".into(),
        pool_label: "old-hpp".into(),
        mount_path: "/var/old/csi".into(),
        succeeded: false,
    });
    facts.claims.push(ClaimFact {
        name: "hpp-pool-local-node09".into(),
        pool_label: "local-hpp".into(),
    });
    facts
}

/// `{ "<scenario>": { "<step>": [objects] } }` with sorted keys (serde_json's default map).
fn render(hpp: &HostPathProvisioner) -> Value {
    let scenarios = [
        ("offline", hpp_reconcile::render::offline_facts(hpp, &[], false, false)),
        ("cluster", cluster_facts(hpp)),
    ];
    let mut out = Map::new();
    for (scenario, facts) in scenarios {
        let mut steps = Map::new();
        for (step, objects) in Pipeline::standard().desired(hpp, &cfg(), &facts).unwrap() {
            // The node-loss step (added after these files) owns and renders nothing; it is
            // left out of the snapshots so they stay byte-identical, and checked to be empty.
            if step == hpp_reconcile::names::STEP_NODE_LOSS {
                assert!(objects.is_empty(), "the node-loss step renders nothing");
                continue;
            }
            // Likewise the volume-audit step (added later) while the CR does not turn it on;
            // with the audit on it renders its Secret (`volume_audit_golden` below).
            if step == hpp_reconcile::names::STEP_VOLUME_AUDIT && hpp.spec.volume_audit.is_none() {
                assert!(
                    objects.is_empty(),
                    "the volume-audit step renders nothing while it is off"
                );
                continue;
            }
            let objects: Vec<Value> = objects.iter().map(|o| o.to_value().unwrap()).collect();
            steps.insert(step, Value::Array(objects));
        }
        out.insert(scenario.into(), Value::Object(steps));
    }
    Value::Object(out)
}

/// The basic example with `spec.volumeAudit` on (issue 28, part 3): only this golden shows the
/// audit's token Secret and the driver's `--volume-report-token-file` and mount.
const VOLUME_AUDIT_GOLDEN: &str = "hostpathprovisioner_volume_audit_cr";

fn golden_cr(name: &str) -> HostPathProvisioner {
    if name == VOLUME_AUDIT_GOLDEN {
        let mut hpp = example("hostpathprovisioner_cr");
        hpp.spec.volume_audit = Some(hpp_api::v1beta1::VolumeAudit {
            interval: Some("30m".into()),
        });
        return hpp;
    }
    example(name)
}

#[test]
fn rendered_objects_of_every_example_match_the_golden_files() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut stale = Vec::new();
    for name in EXAMPLES.into_iter().chain([VOLUME_AUDIT_GOLDEN]) {
        let path = dir.join(format!("{name}.json"));
        let rendered = serde_json::to_string_pretty(&render(&golden_cr(name))).unwrap() + "\n";
        if std::env::var_os("HPP_BLESS").is_some() {
            std::fs::write(&path, &rendered).unwrap();
        }
        let golden = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{} cannot be read ({e}); create it with: {BLESS}", path.display()));
        if golden != rendered {
            let first = golden
                .lines()
                .zip(rendered.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(golden.lines().count().min(rendered.lines().count()));
            stale.push(format!("{name}.json differs from line {}", first + 1));
        }
    }
    assert!(
        stale.is_empty(),
        "{stale:#?}\nif the change is intended, re-bless with: {BLESS}"
    );
}
