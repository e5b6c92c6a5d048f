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
    let names = example::pipeline();
    assert!(!names.names().contains(&"prometheus"));
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
