//! Runs the custom-distribution example against the fake API server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

#[path = "../custom_sub_reconciler.rs"]
mod example;

use std::time::Duration;

use hpp_api::HostPathProvisioner;
use hpp_reconcile::OperatorConfig;
use hpp_reconcile::deps::k8s_openapi::api::apps::v1::DaemonSet;
use hpp_reconcile::deps::k8s_openapi::api::storage::v1::StorageClass;
use hpp_testkit::FakeApiServer;

#[tokio::test]
async fn the_distribution_adds_pool_classes_and_drops_monitoring() {
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
    let _ = tx.send(());
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
