//! A custom hpp distribution in a few lines: the standard pipeline, minus the Prometheus
//! objects, plus a sub-reconciler that publishes one WaitForFirstConsumer StorageClass per
//! storage pool (the KubeVirt operator leaves that to the administrator), gathers a fact of its
//! own (the cluster's default StorageClass) and reports it as a condition on the CR.
//!
//! Run against a cluster with `cargo run -p hpp-examples --example custom_sub_reconciler`;
//! `examples/tests/custom_sub_reconciler.rs` runs it against the fake API server.

use std::future::Future;
use std::sync::Arc;

use hpp_api::HostPathProvisioner;
use hpp_reconcile::apply::Applier;
use hpp_reconcile::deps::k8s_openapi::api::storage::v1::StorageClass;
use hpp_reconcile::deps::kube::api::{Api, DynamicObject, ListParams};
use hpp_reconcile::deps::{async_trait, kube};
use hpp_reconcile::metrics::Metrics;
use hpp_reconcile::names::STEP_PROMETHEUS;
use hpp_reconcile::object::Kind;
use hpp_reconcile::operator::Context;
use hpp_reconcile::reconcilers::common::{object_meta, typed_ssa};
use hpp_reconcile::{ClusterFacts, DesiredObject, OperatorConfig, Pipeline, Readiness, StepCondition, SubReconciler};

// ANCHOR: sub_reconciler
/// One StorageClass `hostpath-<pool>` per pool, owned by the CR, watched for drift and swept
/// when the pool goes; reports whether the cluster has a default StorageClass.
pub struct PoolStorageClasses;

/// The step's own fact: the cluster's default StorageClass, if any.
#[derive(Clone, Debug)]
pub struct DefaultClass(pub Option<String>);

/// Condition type the step contributes to the CR's status.
pub const CONDITION: &str = "DefaultStorageClass";

#[async_trait]
impl SubReconciler for PoolStorageClasses {
    fn name(&self) -> &str {
        "pool-storage-classes"
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        vec![Kind::of::<StorageClass>()]
    }

    async fn gather(
        &self,
        applier: &Applier,
        _cfg: &OperatorConfig,
        facts: &mut ClusterFacts,
    ) -> hpp_reconcile::Result<()> {
        let classes = Api::<StorageClass>::all(applier.client().clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| hpp_reconcile::Error::kube("list", "storageclasses", e))?;
        let default = classes.items.into_iter().find(|sc| {
            sc.metadata.annotations.as_ref().is_some_and(|a| {
                a.get("storageclass.kubernetes.io/is-default-class").map(String::as_str) == Some("true")
            })
        });
        facts
            .extensions
            .insert(DefaultClass(default.and_then(|sc| sc.metadata.name)));
        Ok(())
    }

    fn desired(
        &self,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        _facts: &ClusterFacts,
    ) -> hpp_reconcile::Result<Vec<DesiredObject>> {
        hpp.spec
            .storage_pools
            .iter()
            .flatten()
            .map(|pool| {
                typed_ssa(&StorageClass {
                    metadata: object_meta(&format!("hostpath-{}", pool.name), None, cfg, &[], Some(hpp)),
                    provisioner: hpp_api::constants::DRIVER_NAME.into(),
                    reclaim_policy: Some("Delete".into()),
                    volume_binding_mode: Some("WaitForFirstConsumer".into()),
                    parameters: Some([(hpp_api::constants::PARAM_STORAGE_POOL.into(), pool.name.clone())].into()),
                    ..Default::default()
                })
            })
            .collect()
    }

    fn readiness(&self, _hpp: &HostPathProvisioner, facts: &ClusterFacts, _live: &[DynamicObject]) -> Readiness {
        let default = facts.get::<DefaultClass>().and_then(|d| d.0.clone());
        Readiness {
            conditions: vec![StepCondition {
                type_: CONDITION.into(),
                status: default.is_some(),
                reason: if default.is_some() { "Found" } else { "NotFound" }.into(),
                message: default.map_or_else(|| "no default StorageClass".into(), |n| format!("default is {n}")),
            }],
            ..Readiness::ready()
        }
    }
}
// ANCHOR_END: sub_reconciler

// ANCHOR: pipeline
/// The distribution's pipeline: standard, without monitoring, plus pool StorageClasses.
pub fn pipeline() -> hpp_reconcile::Result<Pipeline> {
    let mut pipeline = Pipeline::standard();
    pipeline.remove(STEP_PROMETHEUS)?;
    pipeline.push(Box::new(PoolStorageClasses))?;
    Ok(pipeline)
}
// ANCHOR_END: pipeline

// ANCHOR: run
/// Runs the distribution's controller until `shutdown` resolves.
pub async fn run(
    client: kube::Client,
    config: OperatorConfig,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let ctx = Context::new(client, config, pipeline()?, Metrics::default());
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
