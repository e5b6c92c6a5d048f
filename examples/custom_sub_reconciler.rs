//! A custom hpp distribution in a few lines: the standard pipeline, minus the Prometheus
//! objects, plus a sub-reconciler that publishes one WaitForFirstConsumer StorageClass per
//! storage pool (the KubeVirt operator leaves that to the administrator).
//!
//! Run against a cluster with `cargo run -p hpp-examples --example custom_sub_reconciler`;
//! `examples/tests/custom_sub_reconciler.rs` runs it against the fake API server.

use std::future::Future;
use std::sync::Arc;

use hpp_api::HostPathProvisioner;
use hpp_reconcile::deps::{async_trait, k8s_openapi, kube, serde_json};
use hpp_reconcile::metrics::Metrics;
use hpp_reconcile::object::Kind;
use hpp_reconcile::operator::Context;
use hpp_reconcile::reconcilers::common::{meta, ssa};
use hpp_reconcile::{ClusterFacts, DesiredObject, OperatorConfig, Pipeline, SubReconciler};

// ANCHOR: sub_reconciler
/// One StorageClass `hostpath-<pool>` per pool, owned by the CR and swept when the pool goes.
pub struct PoolStorageClasses;

#[async_trait]
impl SubReconciler for PoolStorageClasses {
    fn name(&self) -> &str {
        "pool-storage-classes"
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        vec![Kind::of::<k8s_openapi::api::storage::v1::StorageClass>()]
    }

    fn desired(
        &self,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        _facts: &ClusterFacts,
    ) -> hpp_reconcile::Result<Vec<DesiredObject>> {
        let kind = Kind::of::<k8s_openapi::api::storage::v1::StorageClass>();
        hpp.spec
            .storage_pools
            .iter()
            .flatten()
            .map(|pool| {
                let name = format!("hostpath-{}", pool.name);
                ssa(
                    kind.clone(),
                    serde_json::json!({
                        "metadata": meta(&name, None, cfg, &[], Some(hpp)),
                        "provisioner": hpp_api::constants::DRIVER_NAME,
                        "reclaimPolicy": "Delete",
                        "volumeBindingMode": "WaitForFirstConsumer",
                        "parameters": { hpp_api::constants::PARAM_STORAGE_POOL: pool.name },
                    }),
                )
            })
            .collect()
    }
}
// ANCHOR_END: sub_reconciler

// ANCHOR: pipeline
/// The distribution's pipeline: standard, without monitoring, plus pool StorageClasses.
pub fn pipeline() -> Pipeline {
    let mut pipeline = Pipeline::standard();
    pipeline.remove("prometheus");
    pipeline.push(Box::new(PoolStorageClasses));
    pipeline
}
// ANCHOR_END: pipeline

// ANCHOR: run
/// Runs the distribution's controller until `shutdown` resolves.
pub async fn run(
    client: kube::Client,
    config: OperatorConfig,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let ctx = Context::new(client, config, pipeline(), Metrics::default());
    hpp_reconcile::controller::run(Arc::new(ctx), shutdown).await;
    Ok(())
}
// ANCHOR_END: run

#[allow(dead_code)] // the test includes this file as a module and never calls main
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let client = kube::Client::try_default().await?;
    let stop = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    run(client, OperatorConfig::from_env(std::env::vars()), stop).await
}
