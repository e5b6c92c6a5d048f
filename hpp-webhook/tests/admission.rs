//! Every admission rule through a real AdmissionReview (v1 and v1beta1) over real TLS.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use std::sync::Arc;

use common::Server;
use hpp_api::constants::{ANNOTATION_FORCE_DELETE, ANNOTATION_PROVISIONED_BY, DRIVER_NAME, LEGACY_PROVISIONER_NAME};
use hpp_webhook::cluster::InMemoryClusterState;
use hpp_webhook::names::VALIDATE_PATH;
use k8s_openapi::api::core::v1::PersistentVolume;
use serde_json::{Value, json};

const VERSIONS: [&str; 2] = ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];

fn hpp(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1",
        "kind": "HostPathProvisioner",
        "metadata": {"name": name},
        "spec": spec,
    })
}

fn pools(list: &[(&str, &str)]) -> Value {
    json!({"storagePools": list.iter().map(|(n, p)| json!({"name": n, "path": p})).collect::<Vec<_>>()})
}

fn review(version: &str, operation: &str, name: &str, object: Option<Value>, old: Option<Value>) -> Value {
    json!({
        "apiVersion": version,
        "kind": "AdmissionReview",
        "request": {
            "uid": "7d4e3c2b-1a09-4f8e-9d7c-6b5a4f3e2d1c",
            "kind": {"group": "hostpathprovisioner.kubevirt.io", "version": "v1beta1", "kind": "HostPathProvisioner"},
            "resource": {"group": "hostpathprovisioner.kubevirt.io", "version": "v1beta1", "resource": "hostpathprovisioners"},
            "name": name,
            "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
            "object": object,
            "oldObject": old,
            "dryRun": false,
        }
    })
}

async fn send(server: &Server, body: &Value) -> Value {
    let (status, reply) = server.post(VALIDATE_PATH, serde_json::to_vec(body).unwrap()).await;
    assert_eq!(status, 200, "{reply}");
    // Same apiVersion and uid back, as the API server requires.
    assert_eq!(reply["apiVersion"], body["apiVersion"], "{reply}");
    assert_eq!(reply["kind"], "AdmissionReview");
    assert_eq!(reply["response"]["uid"], body["request"]["uid"], "{reply}");
    reply["response"].clone()
}

fn assert_allowed(response: &Value) {
    assert_eq!(response["allowed"], true, "{response}");
}

/// Denied with 422 Invalid, the field path and `needle` in the message, and the path as a cause.
fn assert_invalid(response: &Value, path: &str, needle: &str) {
    assert_eq!(response["allowed"], false, "{response}");
    let status = &response["status"];
    assert_eq!(status["code"], 422, "{response}");
    assert_eq!(status["reason"], "Invalid", "{response}");
    let message = status["message"].as_str().unwrap();
    assert!(message.contains(&format!("{path}: ")), "{path} not in {message}");
    assert!(message.contains(needle), "{needle:?} not in {message}");
    let causes = status["details"]["causes"].as_array().unwrap();
    assert!(
        causes
            .iter()
            .any(|c| c["field"] == path && c["message"].as_str().unwrap().contains(needle)),
        "{path} not among the causes {causes:?}"
    );
    assert_eq!(status["details"]["kind"], "HostPathProvisioner");
}

#[tokio::test]
async fn every_create_rule() {
    let server = Server::builder().start().await;
    let long_name = "a".repeat(51);
    let long_path = format!("/{}", "p".repeat(255));
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            json!({"pathConfig": {"path": "/var/a"}, "storagePools": [{"name": "local", "path": "/var/b"}]}),
            "spec.storagePools",
            "pathConfig",
        ),
        (json!({}), "spec", "must be set"),
        (
            json!({"pathConfig": {"useNamingPrefix": true}}),
            "spec.pathConfig.path",
            "must be set",
        ),
        (
            json!({"pathConfig": {"path": "var/a"}}),
            "spec.pathConfig.path",
            "absolute",
        ),
        (pools(&[("", "/a")]), "spec.storagePools[0].name", "length"),
        (pools(&[(&long_name, "/a")]), "spec.storagePools[0].name", "length"),
        (
            pools(&[("ok", "/a"), ("Bad_Name", "/b")]),
            "spec.storagePools[1].name",
            "lower case",
        ),
        (pools(&[("a", "")]), "spec.storagePools[0].path", "length"),
        (pools(&[("a", &long_path)]), "spec.storagePools[0].path", "length"),
        (
            pools(&[("ok", "/ok"), ("a", "relative/path")]),
            "spec.storagePools[1].path",
            "absolute",
        ),
        (pools(&[("ok", "/ok"), ("a", "/")]), "spec.storagePools[1].path", "root"),
        (
            pools(&[("ok", "/ok"), ("a", "/var/hp/")]),
            "spec.storagePools[1].path",
            "end with",
        ),
        (
            pools(&[("ok", "/ok"), ("a", "/var//hp")]),
            "spec.storagePools[1].path",
            "duplicate",
        ),
        (
            pools(&[("ok", "/ok"), ("a", "/var/../etc")]),
            "spec.storagePools[1].path",
            "'..'",
        ),
        (
            pools(&[("ok", "/ok"), ("a", "/var/./hp")]),
            "spec.storagePools[1].path",
            "'.'",
        ),
        (
            pools(&[("a", "/x"), ("b", "/y"), ("a", "/z")]),
            "spec.storagePools[2].name",
            "spec.storagePools[0].name",
        ),
        (
            pools(&[("a", "/x"), ("b", "/x")]),
            "spec.storagePools[1].path",
            "spec.storagePools[0].path",
        ),
        (
            pools(&[("outer", "/data"), ("inner", "/data/fast")]),
            "spec.storagePools[1].path",
            "nested",
        ),
        (
            json!({"storagePools": [{"name": "a", "path": "/x", "snapshotProvider": "zfs"}]}),
            "spec.storagePools[0].snapshotProvider",
            "reflink",
        ),
        (
            json!({"storagePools": [{"name": "a", "path": "/x"}], "featureGates": ["Snapshotting", "Teleport"]}),
            "spec.featureGates[1]",
            "Snapshotting",
        ),
        (
            json!({"storagePools": [{"name": "a", "path": "/x"}], "imagePullPolicy": "Sometimes"}),
            "spec.imagePullPolicy",
            "IfNotPresent",
        ),
        (
            json!({"storagePools": [{"name": "a", "path": "/x", "overlayClassName": "Not_A_Name"}]}),
            "spec.storagePools[0].overlayClassName",
            "StorageClass",
        ),
    ];
    for version in VERSIONS {
        for (spec, path, needle) in &cases {
            let body = review(version, "CREATE", "hpp", Some(hpp("hpp", spec.clone())), None);
            let response = send(&server, &body).await;
            assert_invalid(&response, path, needle);
        }
        // Valid objects pass: a pool CR (as in deploy/examples) and a legacy CR.
        let good = json!({
            "imagePullPolicy": "IfNotPresent",
            "storagePools": [{"name": "local", "path": "/var/hpvolumes", "snapshotProvider": "reflink"}],
            "featureGates": ["Snapshotting"],
            "workload": {"nodeSelector": {"kubernetes.io/os": "linux"}},
        });
        assert_allowed(&send(&server, &review(version, "CREATE", "hpp", Some(hpp("hpp", good)), None)).await);
        let legacy = json!({"pathConfig": {"path": "/var/hpvolumes", "useNamingPrefix": false}});
        assert_allowed(
            &send(
                &server,
                &review(version, "CREATE", "hpp", Some(hpp("hpp", legacy)), None),
            )
            .await,
        );
    }
    assert_eq!(
        server.metrics.request_count("validate", "denied"),
        2 * cases.len() as u64
    );
    assert_eq!(server.metrics.request_count("validate", "allowed"), 4);
    server.stop().await;
}

#[tokio::test]
async fn every_error_is_reported_at_once() {
    let server = Server::builder().start().await;
    let spec = pools(&[("Bad", "rel"), ("ok", "/x"), ("ok", "/x")]);
    let response = send(
        &server,
        &review(VERSIONS[0], "CREATE", "hpp", Some(hpp("hpp", spec)), None),
    )
    .await;
    let causes = response["status"]["details"]["causes"].as_array().unwrap();
    let fields: Vec<&str> = causes.iter().map(|c| c["field"].as_str().unwrap()).collect();
    for path in [
        "spec.storagePools[0].name",
        "spec.storagePools[0].path",
        "spec.storagePools[2].name",
        "spec.storagePools[2].path",
    ] {
        assert!(fields.contains(&path), "{path} missing from {fields:?}");
    }
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("HostPathProvisioner.hostpathprovisioner.kubevirt.io \"hpp\" is invalid: "),
        "{message}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_flood_of_identical_pools_gets_a_short_bounded_answer() {
    // 3,000 identical pools (a 75 KB body): before, 9 million causes and gigabytes of memory.
    let server = Server::builder().start().await;
    let list: Vec<(&str, &str)> = (0..3000).map(|_| ("local", "/var/hpvolumes")).collect();
    let object = hpp("hpp", pools(&list));
    let response = send(
        &server,
        &review(VERSIONS[0], "CREATE", "hpp", Some(object.clone()), None),
    )
    .await;
    assert_eq!(response["allowed"], false, "{response}");
    let causes = response["status"]["details"]["causes"].as_array().unwrap();
    assert_eq!(causes.len(), 1, "{causes:?}");
    assert_eq!(causes[0]["field"], "spec.storagePools");
    assert!(response["status"]["message"].as_str().unwrap().len() < 300);
    // UPDATE with the same flood on both sides: compared as sets, tolerated, answered.
    let response = send(
        &server,
        &review(VERSIONS[0], "UPDATE", "hpp", Some(object.clone()), Some(object)),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
    // The most pools the schema admits, all identical: causes are capped with "and N more".
    let max = hpp_api::constants::MAX_STORAGE_POOLS;
    let list: Vec<(&str, &str)> = (0..max).map(|_| ("local", "/var/hpvolumes")).collect();
    let response = send(
        &server,
        &review(VERSIONS[0], "CREATE", "hpp", Some(hpp("hpp", pools(&list))), None),
    )
    .await;
    let causes = response["status"]["details"]["causes"].as_array().unwrap();
    assert_eq!(causes.len(), hpp_api::constants::MAX_REPORTED_ERRORS + 1);
    let last = causes.last().unwrap()["message"].as_str().unwrap();
    assert_eq!(
        last,
        format!("and {} more", 2 * (max - 1) - hpp_api::constants::MAX_REPORTED_ERRORS)
    );
    server.stop().await;
}

#[tokio::test]
async fn update_rules() {
    let server = Server::builder().start().await;
    for version in VERSIONS {
        let old = hpp("hpp", pools(&[("a", "/x"), ("b", "/y")]));
        // A pool's path cannot move while the pool exists.
        let moved = hpp("hpp", pools(&[("a", "/x"), ("b", "/z")]));
        let response = send(
            &server,
            &review(version, "UPDATE", "hpp", Some(moved), Some(old.clone())),
        )
        .await;
        assert_invalid(&response, "spec.storagePools[1].path", "cannot change");
        // Adding, removing and reordering pools is fine.
        let reordered = hpp("hpp", pools(&[("b", "/y"), ("c", "/x")]));
        assert_allowed(
            &send(
                &server,
                &review(version, "UPDATE", "hpp", Some(reordered), Some(old.clone())),
            )
            .await,
        );
        // The create rules apply to the new object too.
        let dup = hpp("hpp", pools(&[("a", "/x"), ("a", "/w")]));
        let response = send(&server, &review(version, "UPDATE", "hpp", Some(dup), Some(old))).await;
        assert_invalid(&response, "spec.storagePools[1].name", "unique");
        // pathConfig.path is immutable.
        let old = hpp("hpp", json!({"pathConfig": {"path": "/a"}}));
        let new = hpp("hpp", json!({"pathConfig": {"path": "/b"}}));
        let response = send(&server, &review(version, "UPDATE", "hpp", Some(new), Some(old.clone()))).await;
        assert_invalid(&response, "spec.pathConfig.path", "cannot change");
        // Moving from pathConfig to storage pools is allowed.
        let new = hpp("hpp", pools(&[("a", "/b")]));
        assert_allowed(&send(&server, &review(version, "UPDATE", "hpp", Some(new), Some(old))).await);
        // Problems the stored object already had are tolerated, and reported as warnings.
        let old = hpp("hpp", json!({"pathConfig": {"path": "relative"}}));
        let new = hpp(
            "hpp",
            json!({"pathConfig": {"path": "relative"}, "featureGates": ["Snapshotting"]}),
        );
        let response = send(&server, &review(version, "UPDATE", "hpp", Some(new), Some(old.clone()))).await;
        assert_allowed(&response);
        let warnings = response["warnings"].as_array().unwrap();
        assert!(
            warnings[0].as_str().unwrap().contains("spec.pathConfig.path"),
            "{warnings:?}"
        );
        // New problems are still caught.
        let new = hpp(
            "hpp",
            json!({"pathConfig": {"path": "relative"}, "featureGates": ["Bogus"]}),
        );
        let response = send(&server, &review(version, "UPDATE", "hpp", Some(new), Some(old))).await;
        assert_invalid(&response, "spec.featureGates[0]", "unknown");
        // A CR being deleted can always lose its finalizer, whatever its spec.
        let mut deleting = hpp("hpp", json!({}));
        deleting["metadata"]["deletionTimestamp"] = "2026-11-21T06:00:00Z".into();
        deleting["metadata"]["finalizers"] = json!([]);
        let mut before = deleting.clone();
        before["metadata"]["finalizers"] = json!(["finalizer.delete.hostpath-provisioner"]);
        assert_allowed(&send(&server, &review(version, "UPDATE", "hpp", Some(deleting), Some(before))).await);
        // A stored object that cannot be read: the new object is judged on its own.
        let unreadable = hpp("hpp", json!({"storagePools": "lots"}));
        let repaired = hpp("hpp", pools(&[("a", "/x")]));
        let response = send(
            &server,
            &review(version, "UPDATE", "hpp", Some(repaired), Some(unreadable.clone())),
        )
        .await;
        assert_allowed(&response);
        assert!(
            response["warnings"][0].as_str().unwrap().contains("could not be read"),
            "{response}"
        );
        let still_bad = hpp("hpp", pools(&[("a", "x")]));
        let response = send(
            &server,
            &review(version, "UPDATE", "hpp", Some(still_bad), Some(unreadable)),
        )
        .await;
        assert_invalid(&response, "spec.storagePools[0].path", "absolute");
        // An update without oldObject cannot be judged.
        let new = hpp("hpp", pools(&[("a", "/b")]));
        let response = send(&server, &review(version, "UPDATE", "hpp", Some(new), None)).await;
        assert_eq!(response["allowed"], false);
        assert_eq!(response["status"]["code"], 400);
        assert!(response["status"]["message"].as_str().unwrap().contains("oldObject"));
    }
    server.stop().await;
}

#[tokio::test]
async fn v1alpha1_objects_are_converted_before_validation() {
    let server = Server::builder().start().await;
    let alpha = |path: &str| {
        json!({
            "apiVersion": "hostpathprovisioner.kubevirt.io/v1alpha1",
            "kind": "HostPathProvisioner",
            "metadata": {"name": "hpp"},
            "spec": {"pathConfig": {"path": path, "useNamingPrefix": "true"}},
        })
    };
    let mut body = review(VERSIONS[0], "CREATE", "hpp", Some(alpha("/var/hpvolumes")), None);
    body["request"]["kind"]["version"] = "v1alpha1".into();
    assert_allowed(&send(&server, &body).await);
    let mut body = review(VERSIONS[0], "CREATE", "hpp", Some(alpha("/var/../etc")), None);
    body["request"]["kind"]["version"] = "v1alpha1".into();
    assert_invalid(&send(&server, &body).await, "spec.pathConfig.path", "'..'");
    server.stop().await;
}

#[tokio::test]
async fn status_updates_and_other_kinds_pass() {
    let server = Server::builder().start().await;
    let bad = hpp("hpp", json!({}));
    let mut body = review(VERSIONS[0], "UPDATE", "hpp", Some(bad.clone()), Some(bad));
    body["request"]["subResource"] = "status".into();
    assert_allowed(&send(&server, &body).await);
    let mut body = review(
        VERSIONS[0],
        "CREATE",
        "x",
        Some(json!({"metadata": {"name": "x"}})),
        None,
    );
    body["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "ConfigMap"});
    assert_allowed(&send(&server, &body).await);
    server.stop().await;
}

#[tokio::test]
async fn second_provisioner_is_refused() {
    let cluster = Arc::new(InMemoryClusterState::new());
    let server = Server::builder().cluster(cluster.clone()).start().await;
    let spec = pools(&[("local", "/var/hpvolumes")]);
    for version in VERSIONS {
        cluster.clear_provisioners();
        let first = review(
            version,
            "CREATE",
            "hostpath-provisioner",
            Some(hpp("hostpath-provisioner", spec.clone())),
            None,
        );
        assert_allowed(&send(&server, &first).await);
        cluster.add_provisioner("hostpath-provisioner");
        let second = review(version, "CREATE", "another", Some(hpp("another", spec.clone())), None);
        let response = send(&server, &second).await;
        assert_eq!(response["allowed"], false, "{response}");
        assert_eq!(response["status"]["code"], 403);
        assert_eq!(response["status"]["reason"], "Forbidden");
        let message = response["status"]["message"].as_str().unwrap();
        assert!(message.contains("only one HostPathProvisioner"), "{message}");
        assert!(message.contains("\"hostpath-provisioner\" already exists"), "{message}");
        // Updating the existing one is not a second one.
        let old = hpp("hostpath-provisioner", spec.clone());
        let update = review(version, "UPDATE", "hostpath-provisioner", Some(old.clone()), Some(old));
        assert_allowed(&send(&server, &update).await);
    }
    // A failing lookup denies (fail closed) and says why.
    cluster.set_failure(Some("connection refused"));
    let body = review(VERSIONS[0], "CREATE", "x", Some(hpp("x", spec)), None);
    let response = send(&server, &body).await;
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 500);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("connection refused")
    );
    server.stop().await;
}

fn pv(name: &str, driver: Option<&str>, provisioned_by: Option<&str>) -> PersistentVolume {
    let mut value = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]},
    });
    if let Some(d) = driver {
        value["spec"]["csi"] = json!({"driver": d, "volumeHandle": name});
    } else {
        value["spec"]["hostPath"] = json!({"path": format!("/var/hpvolumes/{name}")});
    }
    if let Some(p) = provisioned_by {
        value["metadata"]["annotations"] = json!({ANNOTATION_PROVISIONED_BY: p});
    }
    serde_json::from_value(value).unwrap()
}

#[tokio::test]
async fn delete_is_refused_while_hpp_volumes_exist() {
    let cluster = Arc::new(InMemoryClusterState::new());
    let server = Server::builder().cluster(cluster.clone()).start().await;
    let stored = hpp("hostpath-provisioner", pools(&[("local", "/var/hpvolumes")]));
    let delete = |version: &str, obj: Value| review(version, "DELETE", "hostpath-provisioner", None, Some(obj));
    for version in VERSIONS {
        cluster.clear_volumes();
        // Other drivers' volumes do not count.
        cluster.add_volume(pv("ebs", Some("ebs.csi.aws.com"), Some("ebs.csi.aws.com")));
        assert_allowed(&send(&server, &delete(version, stored.clone())).await);

        cluster.add_volume(pv("csi-1", Some(DRIVER_NAME), None));
        cluster.add_volume(pv("csi-2", Some(DRIVER_NAME), Some(DRIVER_NAME)));
        cluster.add_volume(pv("legacy-1", None, Some(LEGACY_PROVISIONER_NAME)));
        let response = send(&server, &delete(version, stored.clone())).await;
        assert_eq!(response["allowed"], false, "{response}");
        assert_eq!(response["status"]["code"], 403);
        let message = response["status"]["message"].as_str().unwrap();
        assert!(message.contains("3 PersistentVolumes provisioned by hpp"), "{message}");
        assert!(
            message.contains(&format!("{ANNOTATION_FORCE_DELETE}=true")),
            "{message}"
        );
        assert!(
            response["status"]["details"]["causes"][0]["field"]
                .as_str()
                .unwrap()
                .contains(ANNOTATION_FORCE_DELETE)
        );

        // The force annotation lets it through, with a warning.
        let mut forced = stored.clone();
        forced["metadata"]["annotations"] = json!({ANNOTATION_FORCE_DELETE: "true"});
        let response = send(&server, &delete(version, forced)).await;
        assert_allowed(&response);
        assert!(
            response["warnings"][0]
                .as_str()
                .unwrap()
                .contains("3 PersistentVolumes"),
            "{response}"
        );

        // Any other value is not a force.
        let mut not_forced = stored.clone();
        not_forced["metadata"]["annotations"] = json!({ANNOTATION_FORCE_DELETE: "yes please"});
        assert_eq!(send(&server, &delete(version, not_forced)).await["allowed"], false);

        // Once the volumes are gone, deletion is allowed.
        cluster.clear_volumes();
        assert_allowed(&send(&server, &delete(version, stored.clone())).await);
    }
    // One volume is reported in the singular.
    cluster.add_volume(pv("csi-1", Some(DRIVER_NAME), None));
    let response = send(&server, &delete(VERSIONS[1], stored.clone())).await;
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("1 PersistentVolume provisioned by hpp still exists")
    );
    // A failing lookup denies.
    cluster.set_failure(Some("etcd is on fire"));
    let response = send(&server, &delete(VERSIONS[0], stored)).await;
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("etcd is on fire")
    );
    server.stop().await;
}

#[tokio::test]
async fn without_a_cluster_singleton_and_delete_checks_are_off() {
    let server = Server::builder().start().await;
    let stored = hpp("hostpath-provisioner", pools(&[("local", "/var/hpvolumes")]));
    let delete = review(
        VERSIONS[0],
        "DELETE",
        "hostpath-provisioner",
        None,
        Some(stored.clone()),
    );
    assert_allowed(&send(&server, &delete).await);
    let create = review(VERSIONS[0], "CREATE", "second", Some(stored), None);
    assert_allowed(&send(&server, &create).await);
    server.stop().await;
}

#[tokio::test]
async fn malformed_reviews_get_clear_errors() {
    let server = Server::builder().start().await;
    // Not JSON at all: 400 with a Status body.
    let (status, body) = server.post(VALIDATE_PATH, "{not json").await;
    assert_eq!(status, 400);
    assert_eq!(body["kind"], "Status");
    assert!(body["message"].as_str().unwrap().contains("not JSON"), "{body}");
    // JSON, but not an AdmissionReview.
    let (status, body) = server
        .post(VALIDATE_PATH, r#"{"apiVersion":"v1","kind":"ConfigMap"}"#)
        .await;
    assert_eq!(status, 400);
    assert!(
        body["message"].as_str().unwrap().contains("admission.k8s.io/v1"),
        "{body}"
    );
    // An unknown AdmissionReview version.
    let mut bad = review(VERSIONS[0], "CREATE", "hpp", Some(hpp("hpp", json!({}))), None);
    bad["apiVersion"] = "admission.k8s.io/v2".into();
    let (status, _) = server.post(VALIDATE_PATH, serde_json::to_vec(&bad).unwrap()).await;
    assert_eq!(status, 400);
    // No request.
    let (status, body) = server
        .post(
            VALIDATE_PATH,
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
        )
        .await;
    assert_eq!(status, 400);
    assert!(body["message"].as_str().unwrap().contains("request.uid"), "{body}");
    // A request with a uid but a broken shape: a denial carrying that uid.
    for version in VERSIONS {
        let mut broken = review(version, "CREATE", "hpp", None, None);
        broken["request"]["operation"] = "EXPLODE".into();
        let response = send(&server, &broken).await;
        assert_eq!(response["allowed"], false);
        assert_eq!(response["status"]["code"], 400);
        assert!(
            response["status"]["message"].as_str().unwrap().contains("malformed"),
            "{response}"
        );
    }
    // An object that is not a HostPathProvisioner.
    let body = review(
        VERSIONS[1],
        "CREATE",
        "hpp",
        Some(hpp("hpp", json!({"storagePools": "lots"}))),
        None,
    );
    let response = send(&server, &body).await;
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("request.object"),
        "{response}"
    );
    // CREATE without an object.
    let response = send(&server, &review(VERSIONS[0], "CREATE", "hpp", None, None)).await;
    assert_eq!(response["allowed"], false);
    assert!(response["status"]["message"].as_str().unwrap().contains("missing"));
    // Wrong method and unknown path.
    let (status, _) = server.get(VALIDATE_PATH).await;
    assert_eq!(status, 405);
    let (status, body) = server.post("/mutate", "{}").await;
    assert_eq!(status, 404);
    assert!(body["message"].as_str().unwrap().contains(VALIDATE_PATH));
    // The server is still healthy after all of that.
    assert_eq!(server.get("/healthz").await, (200, "ok".to_string()));
    assert_eq!(server.get("/readyz").await, (200, "ok".to_string()));
    server.stop().await;
}

#[tokio::test]
async fn snapshotting_without_a_snapshot_provider_is_admitted_with_a_warning() {
    let server = Server::builder().start().await;
    let mut spec = pools(&[("local", "/var/hpvolumes")]);
    spec["featureGates"] = json!(["Snapshotting"]);
    for (operation, old) in [("CREATE", None), ("UPDATE", Some(hpp("hpp", spec.clone())))] {
        let response = send(
            &server,
            &review(VERSIONS[0], operation, "hpp", Some(hpp("hpp", spec.clone())), old),
        )
        .await;
        assert_allowed(&response);
        assert_eq!(
            response["warnings"],
            json!([hpp_api::validation::WARNING_SNAPSHOTS_OFF]),
            "{operation}"
        );
    }
    // With a provider on the pool there is nothing to say.
    spec["storagePools"][0]["snapshotProvider"] = "reflink".into();
    let response = send(
        &server,
        &review(VERSIONS[0], "CREATE", "hpp", Some(hpp("hpp", spec)), None),
    )
    .await;
    assert_allowed(&response);
    assert!(response.get("warnings").is_none_or(Value::is_null), "{response}");
    server.stop().await;
}
