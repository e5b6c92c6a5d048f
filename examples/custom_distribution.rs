//! A custom distribution that keeps the standard pipeline but ships its own images and replaces
//! one sub-reconciler: the CSI DaemonSet step is wrapped so every DaemonSet it builds carries the
//! distribution's label. Rendered offline, so it runs without a cluster.
//!
//! Run with `cargo run -p hpp-examples --example custom_distribution` (prints the objects as
//! YAML); `examples/tests/custom_distribution.rs` checks them.

use hpp_api::HostPathProvisioner;
use hpp_reconcile::deps::async_trait;
use hpp_reconcile::deps::kube::api::DynamicObject;
use hpp_reconcile::object::Kind;
use hpp_reconcile::reconcilers::CsiDaemonSet;
use hpp_reconcile::{ClusterFacts, DesiredObject, OperatorConfig, Pipeline, Readiness, SubReconciler};

/// Label the distribution adds to the CSI DaemonSet.
pub const TEAM_LABEL: &str = "example.com/team";

// ANCHOR: wrapper
/// The stock CSI DaemonSet step, plus the distribution's label on what it builds.
pub struct LabelledCsiDaemonSet;

#[async_trait]
impl SubReconciler for LabelledCsiDaemonSet {
    // Same name as the step it replaces: same field manager, so live objects are adopted.
    fn name(&self) -> &str {
        CsiDaemonSet.name()
    }

    fn kinds(&self, facts: &ClusterFacts) -> Vec<Kind> {
        CsiDaemonSet.kinds(facts)
    }

    fn desired(
        &self,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
    ) -> hpp_reconcile::Result<Vec<DesiredObject>> {
        let mut objects = CsiDaemonSet.desired(hpp, cfg, facts)?;
        for obj in &mut objects {
            obj.object
                .metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(TEAM_LABEL.to_owned(), "storage".to_owned());
        }
        Ok(objects)
    }

    fn readiness(&self, hpp: &HostPathProvisioner, live: &[DynamicObject]) -> Readiness {
        CsiDaemonSet.readiness(hpp, live)
    }
}
// ANCHOR_END: wrapper

// ANCHOR: distribution
/// The distribution's pipeline: standard, with the CSI DaemonSet step replaced in place.
pub fn pipeline() -> Pipeline {
    let mut pipeline = Pipeline::standard();
    pipeline.replace("csi-daemonset", Box::new(LabelledCsiDaemonSet));
    pipeline
}

/// The distribution's images and namespace, as the operator would read them from its
/// environment (`OperatorConfig::from_env(std::env::vars())` in a real main).
pub fn config() -> OperatorConfig {
    OperatorConfig::from_env([
        ("POD_NAMESPACE", "acme-storage"),
        ("CSI_PROVISIONER_IMAGE", "registry.example.com/acme/hpp-csi-driver:1.0"),
        ("OPERATOR_IMAGE", "registry.example.com/acme/hpp-operator:1.0"),
        ("PROVISIONER_IMAGE", "registry.example.com/acme/hpp-csi-driver:1.0"),
    ])
}

/// Every object the distribution would own for `hpp`, computed offline.
pub fn render(hpp: &HostPathProvisioner) -> hpp_reconcile::Result<Vec<DesiredObject>> {
    let facts = hpp_reconcile::render::offline_facts(hpp, &["node-a".to_owned()], false, false);
    hpp_reconcile::render::render_objects(&pipeline(), hpp, &config(), &facts)
}
// ANCHOR_END: distribution

/// A CR with one node-local pool.
pub fn example_cr() -> HostPathProvisioner {
    HostPathProvisioner::new(
        "hostpath-provisioner",
        hpp_api::HostPathProvisionerSpec {
            storage_pools: Some(vec![hpp_api::StoragePool {
                name: "local".into(),
                path: "/var/hpvolumes".into(),
                ..Default::default()
            }]),
            ..Default::default()
        },
    )
}

#[allow(dead_code)] // the test includes this file as a module and never calls main
fn main() -> anyhow::Result<()> {
    let hpp = example_cr();
    let facts = hpp_reconcile::render::offline_facts(&hpp, &["node-a".to_owned()], false, false);
    print!(
        "{}",
        hpp_reconcile::render::render_yaml(&pipeline(), &hpp, &config(), &facts)?
    );
    Ok(())
}
