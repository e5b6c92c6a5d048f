//! A custom distribution that keeps the standard pipeline but ships its own images and wraps
//! one sub-reconciler: the CSI DaemonSet step is decorated (one adapter, no re-delegation of the
//! trait) so every DaemonSet it builds carries the distribution's label, tolerates the
//! distribution's storage-node taint and runs a log-shipping sidecar (a typed edit of the
//! DaemonSet). Rendered offline, so it runs without a cluster.
//!
//! Run with `cargo run -p hpp-examples --example custom_distribution` (prints the objects as
//! YAML); `examples/tests/custom_distribution.rs` checks them.

use hpp_api::HostPathProvisioner;
use hpp_reconcile::deps::k8s_openapi::api::apps::v1::DaemonSet;
use hpp_reconcile::deps::k8s_openapi::api::core::v1::{Container, Toleration};
use hpp_reconcile::names::STEP_CSI_DAEMONSET;
use hpp_reconcile::{ClusterFacts, DesiredObject, OperatorConfig, Pipeline};

/// Label the distribution adds to the CSI DaemonSet.
pub const TEAM_LABEL: &str = "example.com/team";

/// Taint of the distribution's storage nodes, which the CSI DaemonSet tolerates.
pub const STORAGE_NODE_TAINT: &str = "example.com/storage-node";

/// The sidecar the distribution adds to every CSI driver pod.
pub const LOG_SHIPPER: &str = "log-shipper";

// ANCHOR: wrapper
/// Adds the distribution's label to every object of a step.
pub fn add_team_label(
    _hpp: &HostPathProvisioner,
    _cfg: &OperatorConfig,
    _facts: &ClusterFacts,
    objects: &mut Vec<DesiredObject>,
) -> hpp_reconcile::Result<()> {
    for obj in objects {
        obj.object
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(TEAM_LABEL.to_owned(), "storage".to_owned());
    }
    Ok(())
}
// ANCHOR_END: wrapper

// ANCHOR: typed_edit
/// Edits the step's DaemonSet as a typed `DaemonSet` (a misspelt field does not compile): a
/// toleration for the storage nodes' taint and a sidecar that ships the driver's logs.
#[allow(clippy::ptr_arg)] // the `Edit` signature: other edits add or remove objects
pub fn storage_node_sidecar(
    _hpp: &HostPathProvisioner,
    _cfg: &OperatorConfig,
    _facts: &ClusterFacts,
    objects: &mut Vec<DesiredObject>,
) -> hpp_reconcile::Result<()> {
    for obj in objects.iter_mut().filter(|o| o.is::<DaemonSet>()) {
        obj.edit(|ds: &mut DaemonSet| {
            let Some(pod) = ds.spec.as_mut().and_then(|s| s.template.spec.as_mut()) else {
                return;
            };
            pod.tolerations.get_or_insert_with(Vec::new).push(Toleration {
                key: Some(STORAGE_NODE_TAINT.into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            });
            pod.containers.push(Container {
                name: LOG_SHIPPER.into(),
                image: Some("registry.example.com/acme/log-shipper:1.0".into()),
                args: Some(vec!["--pod-logs".into(), "--to=https://logs.example.com".into()]),
                ..Default::default()
            });
        })?;
    }
    Ok(())
}
// ANCHOR_END: typed_edit

// ANCHOR: distribution
/// The distribution's pipeline: standard, with the CSI DaemonSet step decorated in place (same
/// name and field manager, so live objects are adopted; readiness and cleanup unchanged). A
/// misspelt step name fails here, naming the steps there are.
pub fn pipeline() -> hpp_reconcile::Result<Pipeline> {
    let mut pipeline = Pipeline::standard();
    pipeline.decorate(STEP_CSI_DAEMONSET, add_team_label)?;
    pipeline.decorate(STEP_CSI_DAEMONSET, storage_node_sidecar)?;
    Ok(pipeline)
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
    hpp_reconcile::render::render_objects(&pipeline()?, hpp, &config(), &facts)
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
        hpp_reconcile::render::render_yaml(&pipeline()?, &hpp, &config(), &facts)?
    );
    Ok(())
}
