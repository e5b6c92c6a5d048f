//! v1alpha1 ⇄ v1beta1 conversion loses nothing in either direction.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::collections::BTreeMap;

use hpp_api::conversion::{API_VERSION_V1ALPHA1, API_VERSION_V1BETA1, convert_json, to_v1alpha1, to_v1beta1};
use hpp_api::{v1alpha1, v1beta1};
use serde_json::json;

fn beta(value: serde_json::Value) -> v1beta1::HostPathProvisioner {
    serde_json::from_value(value).unwrap()
}

fn alpha(value: serde_json::Value) -> v1alpha1::HostPathProvisioner {
    serde_json::from_value(value).unwrap()
}

#[test]
fn beta_with_pools_round_trips_through_alpha() {
    let original = beta(json!({
        "apiVersion": API_VERSION_V1BETA1, "kind": "HostPathProvisioner",
        "metadata": {"name": "hpp", "annotations": {"keep": "me"}},
        "spec": {
            "imagePullPolicy": "Always",
            "featureGates": ["Snapshotting"],
            "storagePools": [{"name": "local", "path": "/var/hpvolumes", "snapshotProvider": "reflink",
                "pvcTemplate": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}}],
            "workload": {"nodeSelector": {"kubernetes.io/os": "linux"}}
        },
        "status": {
            "conditions": [{"type": "Available", "status": "True", "reason": "Complete"}],
            "observedVersion": "v1", "storagePoolStatuses": [{"name": "local", "phase": "Ready"}]
        }
    }));
    let down = to_v1alpha1(&original).unwrap();
    assert_eq!(down.spec.path_config.path, "");
    assert_eq!(down.metadata.annotations.as_ref().unwrap()["keep"], "me");
    let up = to_v1beta1(&down).unwrap();
    assert_eq!(up, original);
}

#[test]
fn pool_ephemeral_and_quota_settings_survive_a_trip_through_alpha() {
    let original = beta(json!({
        "apiVersion": API_VERSION_V1BETA1, "kind": "HostPathProvisioner",
        "metadata": {"name": "hpp"},
        "spec": {
            "storagePools": [{"name": "local", "path": "/var/hpvolumes", "quota": "btrfs",
                "overcommitPercent": 150, "ephemeral": {"allowed": false, "maxSize": "2Gi"}}]
        },
        "status": {"storagePoolStatuses": [{"name": "local", "phase": "Ready", "quota": "btrfs",
            "committed": "3Gi", "available": "7Gi", "message": "x"}]}
    }));
    let down = to_v1alpha1(&original).unwrap();
    let alpha_json = serde_json::to_value(&down).unwrap();
    assert!(
        alpha_json["spec"].get("storagePools").is_none(),
        "v1alpha1 has no pools"
    );
    let up = to_v1beta1(&down).unwrap();
    assert_eq!(up, original);
    assert_eq!(
        serde_json::to_value(&up).unwrap()["spec"]["storagePools"][0]["ephemeral"]["maxSize"],
        "2Gi"
    );
}

#[test]
fn pool_trash_settings_survive_a_trip_through_alpha() {
    let original = beta(json!({
        "apiVersion": API_VERSION_V1BETA1, "kind": "HostPathProvisioner",
        "metadata": {"name": "hpp"},
        "spec": {"storagePools": [{"name": "local", "path": "/var/hpvolumes",
            "trash": {"retention": "72h", "minFreePercent": 5}}]}
    }));
    let down = to_v1alpha1(&original).unwrap();
    let annotation = &down.metadata.annotations.as_ref().unwrap()[hpp_api::constants::ANNOTATION_CONVERSION_DATA];
    assert!(
        annotation.contains(r#""trash":{"retention":"72h","minFreePercent":5}"#),
        "{annotation}"
    );
    let up = to_v1beta1(&down).unwrap();
    assert_eq!(up, original);
    assert_eq!(
        serde_json::to_value(&up).unwrap()["spec"]["storagePools"][0]["trash"],
        json!({"retention": "72h", "minFreePercent": 5})
    );
}

#[test]
fn node_loss_status_survives_a_trip_through_alpha() {
    let original = beta(json!({
        "apiVersion": API_VERSION_V1BETA1, "kind": "HostPathProvisioner",
        "metadata": {"name": "hpp"},
        "spec": {"storagePools": [{"name": "local", "path": "/var/hpvolumes"}]},
        "status": {"nodeLoss": {"claimsReleased": 4, "lostNodes": [
            {"name": "node02", "reason": "OutOfService", "since": "2025-01-02T03:04:05Z", "claimsReleased": 1}]}}
    }));
    let down = to_v1alpha1(&original).unwrap();
    assert!(
        serde_json::to_value(&down).unwrap()["status"].get("nodeLoss").is_none(),
        "v1alpha1 has no node-loss status"
    );
    assert_eq!(to_v1beta1(&down).unwrap(), original);
    // A status with only the node-loss summary still comes back (not as an absent status).
    let only = beta(json!({
        "apiVersion": API_VERSION_V1BETA1, "kind": "HostPathProvisioner",
        "metadata": {"name": "hpp"},
        "spec": {"storagePools": [{"name": "local", "path": "/var/hpvolumes"}]},
        "status": {"nodeLoss": {"claimsReleased": 1}}
    }));
    let mut down = to_v1alpha1(&only).unwrap();
    down.status = None;
    assert_eq!(to_v1beta1(&down).unwrap().status, only.status);
}

#[test]
fn beta_legacy_round_trips_through_alpha_without_annotations() {
    let original = beta(json!({
        "apiVersion": API_VERSION_V1BETA1, "kind": "HostPathProvisioner",
        "metadata": {"name": "hpp"},
        "spec": {"pathConfig": {"path": "/var/hpvolumes", "useNamingPrefix": true}}
    }));
    let down = to_v1alpha1(&original).unwrap();
    assert_eq!(down.spec.path_config.use_naming_prefix.as_deref(), Some("true"));
    // Nothing was lost, so nothing is stashed.
    assert_eq!(down.metadata.annotations, None);
    assert_eq!(to_v1beta1(&down).unwrap(), original);
}

#[test]
fn alpha_round_trips_through_beta_including_odd_strings() {
    for prefix in [None, Some("true"), Some("false"), Some("TRUE"), Some("yes"), Some("")] {
        let mut spec = json!({"pathConfig": {"path": "/var/hpvolumes"}, "imagePullPolicy": "IfNotPresent"});
        if let Some(p) = prefix {
            spec["pathConfig"]["useNamingPrefix"] = json!(p);
        }
        let original = alpha(json!({
            "apiVersion": API_VERSION_V1ALPHA1, "kind": "HostPathProvisioner",
            "metadata": {"name": "hpp", "annotations": {"a": "b"}},
            "spec": spec,
            "status": {"conditions": [{"type": "Degraded", "status": "False"}], "targetVersion": "v2"}
        }));
        let up = to_v1beta1(&original).unwrap();
        let expected = prefix.map(|p| p.eq_ignore_ascii_case("true"));
        assert_eq!(
            up.spec.path_config.as_ref().unwrap().use_naming_prefix,
            expected,
            "{prefix:?}"
        );
        assert_eq!(to_v1alpha1(&up).unwrap(), original, "{prefix:?}");
    }
}

#[test]
fn json_conversion_sets_api_version_and_is_identity_for_same_version() {
    let obj = json!({
        "apiVersion": API_VERSION_V1ALPHA1, "kind": "HostPathProvisioner",
        "metadata": {"name": "hpp"}, "spec": {"pathConfig": {"path": "/p", "useNamingPrefix": "true"}}
    });
    let up = convert_json(obj.clone(), API_VERSION_V1BETA1).unwrap();
    assert_eq!(up["apiVersion"], API_VERSION_V1BETA1);
    assert_eq!(up["spec"]["pathConfig"]["useNamingPrefix"], json!(true));
    let down = convert_json(up, API_VERSION_V1ALPHA1).unwrap();
    assert_eq!(down, obj);
    assert_eq!(convert_json(obj.clone(), API_VERSION_V1ALPHA1).unwrap(), obj);
    assert!(convert_json(obj, "hostpathprovisioner.kubevirt.io/v2").is_err());
}

#[test]
fn corrupt_conversion_annotation_is_an_error_not_a_panic() {
    let mut annotations = BTreeMap::new();
    annotations.insert(
        hpp_api::constants::ANNOTATION_CONVERSION_DATA.to_string(),
        "{not json".to_string(),
    );
    let mut obj = alpha(json!({"metadata": {"name": "x"}, "spec": {"pathConfig": {"path": "/p"}}}));
    obj.metadata.annotations = Some(annotations);
    assert!(to_v1beta1(&obj).is_err());
}

#[test]
fn a_stored_object_with_a_corrupt_annotation_still_reads_as_v1alpha1() {
    // Reads convert stored v1beta1 objects; a failure there fails every v1alpha1 list and
    // watch, so the unreadable annotation is dropped instead.
    let mut obj =
        beta(json!({"metadata": {"name": "x"}, "spec": {"pathConfig": {"path": "/p", "useNamingPrefix": true}}}));
    obj.metadata.annotations = Some(BTreeMap::from([
        (
            hpp_api::constants::ANNOTATION_CONVERSION_DATA.to_string(),
            "oops".to_string(),
        ),
        ("team".to_string(), "storage".to_string()),
    ]));
    let alpha = to_v1alpha1(&obj).unwrap();
    assert_eq!(alpha.spec.path_config.path, "/p");
    assert_eq!(alpha.spec.path_config.use_naming_prefix.as_deref(), Some("true"));
    let annotations = alpha.metadata.annotations.unwrap();
    assert_eq!(annotations.get("team").map(String::as_str), Some("storage"));
    assert!(!annotations.contains_key(hpp_api::constants::ANNOTATION_CONVERSION_DATA));
}

#[test]
fn statuses_too_large_for_an_annotation_are_left_out_of_it() {
    // One claim status per node of a pvcTemplate pool: thousands on a large cluster.
    let claims: Vec<serde_json::Value> = (0..5000)
        .map(|i| json!({"name": format!("hpp-pool-local-node-{i:05}"), "status": {"phase": "Bound", "capacity": {"storage": "100Gi"}}}))
        .collect();
    let obj = beta(json!({
        "metadata": {"name": "x"},
        "spec": {"storagePools": [{"name": "local", "path": "/p"}]},
        "status": {"storagePoolStatuses": [{"name": "local", "phase": "Ready", "claimStatuses": claims}]},
    }));
    let alpha = to_v1alpha1(&obj).unwrap();
    let annotation = &alpha.metadata.annotations.as_ref().unwrap()[hpp_api::constants::ANNOTATION_CONVERSION_DATA];
    assert!(
        annotation.len() <= hpp_api::conversion::MAX_STATUS_ANNOTATION_BYTES,
        "{}",
        annotation.len()
    );
    // The spec still round-trips; only the statuses were dropped.
    let back = to_v1beta1(&alpha).unwrap();
    assert_eq!(back.spec, obj.spec);
    assert!(back.status.is_none_or(|s| s.storage_pool_statuses.is_empty()));
}

/// Issue 28, part 3: the volume audit (spec) and its findings (status, pool status) exist only
/// in v1beta1 and come back unchanged from a trip through v1alpha1.
#[test]
fn volume_audit_survives_a_trip_through_alpha() {
    let original = beta(json!({
        "apiVersion": API_VERSION_V1BETA1, "kind": "HostPathProvisioner",
        "metadata": {"name": "hpp"},
        "spec": {
            "storagePools": [{"name": "local", "path": "/var/hpvolumes"}],
            "volumeAudit": {"interval": "30m"}
        },
        "status": {
            "conditions": [{"type": "OrphanedVolumes", "status": "True", "reason": "OrphansFound"}],
            "volumeAudit": {"lastAuditTime": "2025-06-01T10:00:00Z", "nodesAudited": 2, "nodesNotAudited": 1,
                            "notAudited": [{"name": "node03", "reason": "connection refused"}]},
            "storagePoolStatuses": [{"name": "local", "phase": "Ready",
                "volumeAudit": {"orphanedVolumes": 1, "orphanedBytes": 4096, "orphans": ["node01/pvc-x"],
                                "missingVolumes": 1, "missing": ["pvc-y"]}}]
        }
    }));
    let down = to_v1alpha1(&original).unwrap();
    let alpha_json = serde_json::to_value(&down).unwrap();
    assert!(alpha_json["spec"].get("volumeAudit").is_none(), "v1alpha1 has no audit");
    assert!(alpha_json["status"].get("volumeAudit").is_none());
    let up = to_v1beta1(&down).unwrap();
    assert_eq!(up, original);
    assert_eq!(
        serde_json::to_string(&up).unwrap(),
        serde_json::to_string(&original).unwrap()
    );
    // Only the status: the status comes back too.
    let mut status_only = original.clone();
    status_only.spec.volume_audit = None;
    status_only.status.as_mut().unwrap().storage_pool_statuses.clear();
    assert_eq!(to_v1beta1(&to_v1alpha1(&status_only).unwrap()).unwrap(), status_only);
}
