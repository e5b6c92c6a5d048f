//! `KubeClusterState` against the hpp-testkit fake API server: the HostPathProvisioner list,
//! PersistentVolume pagination, and errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use hpp_api::HostPathProvisioner;
use hpp_api::constants::{ANNOTATION_PROVISIONED_BY, DRIVER_NAME, LEGACY_PROVISIONER_NAME};
use hpp_testkit::{FailureRule, FakeApiServer};
use hpp_webhook::cluster::{ClusterState, KubeClusterState};
use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec};
use kube::api::ObjectMeta;

fn pv(name: &str, driver: Option<&str>, provisioned_by: Option<&str>) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: provisioned_by.map(|p| [(ANNOTATION_PROVISIONED_BY.to_string(), p.to_string())].into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            csi: driver.map(|d| CSIPersistentVolumeSource {
                driver: d.into(),
                volume_handle: name.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A fake API server holding one HostPathProvisioner and more PersistentVolumes than fit in
/// one page (500): three provisioned by hpp, the rest by another driver.
fn fake_api() -> FakeApiServer {
    let fake = FakeApiServer::new();
    fake.register::<HostPathProvisioner>(false, true);
    let hpp = HostPathProvisioner::new("hostpath-provisioner", Default::default());
    fake.seed(&hpp);
    fake.seed(&pv("a", Some(DRIVER_NAME), Some(DRIVER_NAME)));
    fake.seed(&pv("b", Some("nfs.csi.k8s.io"), None));
    fake.seed(&pv("c", None, Some(LEGACY_PROVISIONER_NAME)));
    fake.seed(&pv("d", Some(DRIVER_NAME), None));
    for i in 0..500 {
        fake.seed(&pv(&format!("other-{i:03}"), Some("nfs.csi.k8s.io"), None));
    }
    fake
}

#[tokio::test]
async fn lists_provisioners_and_counts_volumes_across_pages() {
    let fake = fake_api();
    let state = KubeClusterState::new(fake.client());
    assert_eq!(state.hostpath_provisioners().await.unwrap(), ["hostpath-provisioner"]);
    assert_eq!(state.hpp_volume_count().await.unwrap(), 3);
    let seen = fake.requests();
    let pv_requests: Vec<_> = seen.iter().filter(|r| r.path == "/api/v1/persistentvolumes").collect();
    assert_eq!(pv_requests.len(), 2, "{seen:?}");
    assert!(
        pv_requests
            .iter()
            .all(|r| r.query_param("limit").as_deref() == Some("500")),
        "{seen:?}"
    );
    assert!(pv_requests[0].query_param("continue").is_none(), "{seen:?}");
    assert!(pv_requests[1].query_param("continue").is_some(), "{seen:?}");
}

#[tokio::test]
async fn errors_say_what_failed() {
    let fake = fake_api();
    fake.fail_requests(FailureRule::new(500));
    let state = KubeClusterState::new(fake.client());
    let error = state.hpp_volume_count().await.unwrap_err().to_string();
    assert!(
        error.contains("listing PersistentVolumes") && error.contains("injected failure (500)"),
        "{error}"
    );
    let error = state.hostpath_provisioners().await.unwrap_err().to_string();
    assert!(error.contains("listing HostPathProvisioners"), "{error}");
}
