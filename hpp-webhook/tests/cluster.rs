//! `KubeClusterState` against a small in-process fake of the API: the HostPathProvisioner list,
//! PersistentVolume pagination, and errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use hpp_api::constants::{ANNOTATION_PROVISIONED_BY, DRIVER_NAME, LEGACY_PROVISIONER_NAME};
use hpp_webhook::cluster::{ClusterState, KubeClusterState};
use http_body_util::Full;
use hyper::body::Bytes;
use serde_json::{Value, json};

fn respond(code: u16, value: &Value) -> http::Response<Full<Bytes>> {
    http::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(value).unwrap())))
        .unwrap()
}

fn pv(name: &str, driver: Option<&str>, provisioned_by: Option<&str>) -> Value {
    let mut pv = json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": {}});
    if let Some(d) = driver {
        pv["spec"]["csi"] = json!({"driver": d, "volumeHandle": name});
    }
    if let Some(p) = provisioned_by {
        pv["metadata"]["annotations"] = json!({ANNOTATION_PROVISIONED_BY: p});
    }
    pv
}

/// A fake API server; records every request's path and query.
fn fake_api(fail: bool) -> (kube::Client, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let log = log.clone();
        async move {
            let path = req.uri().path().to_string();
            let query = req.uri().query().unwrap_or_default().to_string();
            log.lock().unwrap().push(format!("{path}?{query}"));
            let response = if fail {
                respond(
                    500,
                    &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500,
                            "reason": "InternalError", "message": "etcdserver: request timed out"}),
                )
            } else {
                match path.as_str() {
                    "/apis/hostpathprovisioner.kubevirt.io/v1beta1/hostpathprovisioners" => respond(
                        200,
                        &json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList", "metadata": {},
                                "items": [{"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                                           "metadata": {"name": "hostpath-provisioner"}}]}),
                    ),
                    "/api/v1/persistentvolumes" if query.contains("continue=page2") => respond(
                        200,
                        &json!({"apiVersion": "v1", "kind": "PersistentVolumeList", "metadata": {"resourceVersion": "9"},
                                "items": [pv("c", None, Some(LEGACY_PROVISIONER_NAME)), pv("d", Some(DRIVER_NAME), None)]}),
                    ),
                    "/api/v1/persistentvolumes" => respond(
                        200,
                        &json!({"apiVersion": "v1", "kind": "PersistentVolumeList",
                                "metadata": {"resourceVersion": "9", "continue": "page2"},
                                "items": [pv("a", Some(DRIVER_NAME), Some(DRIVER_NAME)), pv("b", Some("nfs.csi.k8s.io"), None)]}),
                    ),
                    _ => respond(
                        404,
                        &json!({"kind": "Status", "apiVersion": "v1", "code": 404, "reason": "NotFound"}),
                    ),
                }
            };
            Ok::<_, Infallible>(response)
        }
    });
    (kube::Client::new(service, "default"), seen)
}

#[tokio::test]
async fn lists_provisioners_and_counts_volumes_across_pages() {
    let (client, seen) = fake_api(false);
    let state = KubeClusterState::new(client);
    assert_eq!(state.hostpath_provisioners().await.unwrap(), ["hostpath-provisioner"]);
    assert_eq!(state.hpp_volume_count().await.unwrap(), 3);
    let seen = seen.lock().unwrap().clone();
    let pv_requests: Vec<&String> = seen
        .iter()
        .filter(|r| r.starts_with("/api/v1/persistentvolumes"))
        .collect();
    assert_eq!(pv_requests.len(), 2, "{seen:?}");
    assert!(pv_requests.iter().all(|r| r.contains("limit=500")), "{seen:?}");
    assert!(pv_requests[1].contains("continue=page2"), "{seen:?}");
}

#[tokio::test]
async fn errors_say_what_failed() {
    let (client, _) = fake_api(true);
    let state = KubeClusterState::new(client);
    let error = state.hpp_volume_count().await.unwrap_err().to_string();
    assert!(
        error.contains("listing PersistentVolumes") && error.contains("etcdserver"),
        "{error}"
    );
    let error = state.hostpath_provisioners().await.unwrap_err().to_string();
    assert!(error.contains("listing HostPathProvisioners"), "{error}");
}
