//! Runs the custom-distribution example against the fake API server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

#[path = "../custom_sub_reconciler.rs"]
mod example;

use std::sync::Arc;
use std::time::Duration;

use hpp_api::HostPathProvisioner;
use hpp_reconcile::deps::async_trait;
use hpp_reconcile::deps::k8s_openapi::api::apps::v1::DaemonSet;
use hpp_reconcile::deps::k8s_openapi::api::core::v1::ConfigMap;
use hpp_reconcile::deps::k8s_openapi::api::storage::v1::StorageClass;
use hpp_reconcile::metrics::Metrics;
use hpp_reconcile::object::Kind;
use hpp_reconcile::operator::Context;
use hpp_reconcile::reconcilers::common::{object_meta, typed_ssa};
use hpp_reconcile::{ClusterFacts, DesiredObject, OperatorConfig, OperatorRules, Pipeline, SubReconciler};
use hpp_testkit::{FakeApiServer, RbacPolicy};

/// Generous bound so a broken controller fails the test instead of hanging it.
const PATIENCE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn the_distribution_adds_pool_classes_and_drops_monitoring() -> anyhow::Result<()> {
    let names = example::pipeline().unwrap();
    assert!(!names.contains(hpp_reconcile::names::STEP_PROMETHEUS));
    assert_eq!(names.names().last(), Some(&"pool-storage-classes"));

    // ANCHOR: testkit
    let fake = FakeApiServer::new();
    fake.register::<HostPathProvisioner>(false, true);
    let hpp = HostPathProvisioner::new(
        "hostpath-provisioner",
        hpp_api::HostPathProvisionerSpec {
            storage_pools: Some(vec![hpp_api::StoragePool {
                name: "local".into(),
                path: "/var/hpvolumes".into(),
                ..Default::default()
            }]),
            ..Default::default()
        },
    );
    fake.seed(&hpp);
    // The RBAC the distribution's pipeline derives, enforced: a call it does not grant is a 403.
    let rules = OperatorRules::for_pipeline(&example::pipeline()?);
    fake.enforce_rbac(
        RbacPolicy::new()
            .cluster_rules(rules.cluster_rules())
            .namespace_rules("hpp", rules.namespace_rules()),
    );
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let config = OperatorConfig::from_env([("POD_NAMESPACE", "hpp")]);
    let task = tokio::spawn(example::run(fake.client(), config, async move {
        let _ = rx.await;
    }));
    let done = |f: &FakeApiServer| {
        f.get::<StorageClass>(None, "hostpath-local").is_some()
            && f.get::<DaemonSet>(Some("hpp"), "hostpath-provisioner-csi").is_some()
    };
    tokio::time::timeout(Duration::from_secs(60), fake.wait_until(done))
        .await
        .expect("the distribution reconciled");
    // ANCHOR_END: testkit
    // The step's own condition, from the fact it gathered, is on the CR.
    let has_condition = |f: &FakeApiServer| {
        f.get::<HostPathProvisioner>(None, "hostpath-provisioner")
            .and_then(|h| h.status)
            .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == example::CONDITION))
    };
    tokio::time::timeout(Duration::from_secs(60), fake.wait_until(has_condition))
        .await
        .expect("the step's condition is published");
    let status = fake
        .get::<HostPathProvisioner>(None, "hostpath-provisioner")
        .unwrap()
        .status
        .unwrap();
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == example::CONDITION)
        .unwrap();
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_deref()),
        ("False", Some("NotFound"))
    );
    // Drift on the step's objects is repaired through the watch on its kind.
    assert!(fake.remove::<StorageClass>(None, "hostpath-local"));
    tokio::time::timeout(
        Duration::from_secs(60),
        fake.wait_until(|f| f.get::<StorageClass>(None, "hostpath-local").is_some()),
    )
    .await
    .expect("repaired");
    let sc = fake.get::<StorageClass>(None, "hostpath-local").unwrap();
    assert_eq!(sc.volume_binding_mode.as_deref(), Some("WaitForFirstConsumer"));
    assert_eq!(sc.parameters.unwrap()["storagePool"], "local");
    assert!(fake.denied_requests().is_empty(), "{:#?}", fake.denied_requests());
    let _ = tx.send(());
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    Ok(())
}

/// A step of the distribution's own that owns a ConfigMap, a kind no standard step has.
struct SiteSettings;

#[async_trait]
impl SubReconciler for SiteSettings {
    fn name(&self) -> &str {
        "site-settings"
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        vec![Kind::of::<ConfigMap>()]
    }

    fn desired(
        &self,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        _facts: &ClusterFacts,
    ) -> hpp_reconcile::Result<Vec<DesiredObject>> {
        Ok(vec![typed_ssa(&ConfigMap {
            metadata: object_meta("site-settings", Some(&cfg.namespace), cfg, &[], Some(hpp)),
            data: Some([("tier".to_owned(), "gold".to_owned())].into()),
            ..Default::default()
        })?])
    }
}

fn degraded_message(fake: &FakeApiServer) -> Option<String> {
    let status = fake.get::<HostPathProvisioner>(None, "hostpath-provisioner")?.status?;
    let degraded = status.conditions.into_iter().find(|c| c.type_ == "Degraded")?;
    (degraded.status == "True").then_some(degraded.message).flatten()
}

/// Runs `pipeline`'s controller against `fake` until the sender is dropped or used.
fn start(fake: &FakeApiServer, pipeline: Pipeline) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let config = OperatorConfig::from_env([("POD_NAMESPACE", "hpp")]);
    let ctx = Context::new(fake.client(), config, pipeline, Metrics::default())
        .with_backoff(Duration::from_millis(20), Duration::from_millis(200));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(hpp_reconcile::controller::run(Arc::new(ctx), async move {
        let _ = rx.await;
    }));
    (tx, task)
}

#[tokio::test]
async fn a_kind_the_rbac_does_not_grant_is_refused_and_reported() -> anyhow::Result<()> {
    let fake = FakeApiServer::new();
    fake.register::<HostPathProvisioner>(false, true);
    fake.seed(&HostPathProvisioner::new("hostpath-provisioner", Default::default()));
    let pipeline = Pipeline::standard().with(SiteSettings)?;
    // ANCHOR: rbac
    let policy = |rules: &OperatorRules| {
        RbacPolicy::new()
            .cluster_rules(rules.cluster_rules())
            .namespace_rules("hpp", rules.namespace_rules())
    };
    // hpp's own RBAC (deploy/operator/rbac.yaml) knows nothing of the step's ConfigMap.
    fake.enforce_rbac(policy(&OperatorRules::for_pipeline(&Pipeline::standard())));
    let own_rules = OperatorRules::for_pipeline(&pipeline);
    let (stop, operator) = start(&fake, pipeline);
    // The operator's call is refused with a 403, as on a cluster, and the CR says so.
    let forbidden = |f: &FakeApiServer| degraded_message(f).is_some_and(|m| m.contains("is forbidden"));
    tokio::time::timeout(PATIENCE, fake.wait_until(forbidden)).await?;
    // With the rules derived from the distribution's own pipeline, the ConfigMap is applied.
    fake.enforce_rbac(policy(&own_rules));
    let applied = |f: &FakeApiServer| f.get::<ConfigMap>(Some("hpp"), "site-settings").is_some();
    tokio::time::timeout(PATIENCE, fake.wait_until(applied)).await?;
    // ANCHOR_END: rbac
    let message = fake
        .denied_requests()
        .iter()
        .map(|r| r.path.clone())
        .collect::<Vec<_>>();
    assert!(message.iter().any(|p| p.contains("/configmaps")), "{message:?}");
    let _ = stop.send(());
    tokio::time::timeout(PATIENCE, operator).await??;
    Ok(())
}
