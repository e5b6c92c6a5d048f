//! Fields the real API server refuses to change once set (422 Invalid, "field is immutable"),
//! for the kinds the hpp components manage. An operator that tries to change them must delete
//! and recreate the object instead, and tests against the fake catch it.

use serde_json::Value;

/// JSON pointers that may be set once (from absent) but never changed or removed afterwards.
fn immutable_paths(group: &str, plural: &str) -> &'static [&'static str] {
    match (group, plural) {
        ("apps", "daemonsets" | "deployments" | "replicasets" | "statefulsets") => &["/spec/selector"],
        ("batch", "jobs") => &["/spec/selector", "/spec/template", "/spec/completionMode"],
        ("storage.k8s.io", "storageclasses") => {
            &["/provisioner", "/parameters", "/reclaimPolicy", "/volumeBindingMode"]
        }
        ("storage.k8s.io", "csidrivers") => &["/spec/attachRequired", "/spec/volumeLifecycleModes"],
        ("rbac.authorization.k8s.io", "rolebindings" | "clusterrolebindings") => &["/roleRef"],
        ("", "persistentvolumeclaims") => &[
            "/spec/accessModes",
            "/spec/storageClassName",
            "/spec/volumeMode",
            "/spec/selector",
            "/spec/dataSource",
            "/spec/dataSourceRef",
            "/spec/volumeName",
        ],
        // `spec.persistentvolumesource is immutable after creation`: the volume a PV names
        // never changes; another volume needs another PV.
        ("", "persistentvolumes") => &["/spec/hostPath", "/spec/local", "/spec/csi", "/spec/nfs"],
        ("", "services") => &["/spec/clusterIP"],
        _ => &[],
    }
}

/// Paths of `new` that change an immutable field of `old`, as `field.path` strings.
pub(crate) fn violations(group: &str, plural: &str, old: &Value, new: &Value) -> Vec<String> {
    let mut changed: Vec<String> = immutable_paths(group, plural)
        .iter()
        .filter(|p| {
            let before = old.pointer(p).filter(|v| !v.is_null());
            before.is_some() && before != new.pointer(p)
        })
        .map(|p| p.trim_start_matches('/').replace('/', "."))
        .collect();
    let locked = old.get("immutable").and_then(Value::as_bool) == Some(true);
    if locked && group.is_empty() && matches!(plural, "configmaps" | "secrets") {
        for field in ["data", "binaryData", "immutable"] {
            if old.get(field) != new.get(field) {
                changed.push(field.to_string());
            }
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn set_once_fields() {
        let unbound = json!({"spec": {"accessModes": ["ReadWriteOnce"]}});
        let bound = json!({"spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv1"}});
        assert!(violations("", "persistentvolumeclaims", &unbound, &bound).is_empty());
        let rebound = json!({"spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv2"}});
        assert_eq!(
            violations("", "persistentvolumeclaims", &bound, &rebound),
            ["spec.volumeName"]
        );
        let ds = json!({"spec": {"selector": {"matchLabels": {"a": "1"}}}});
        let other = json!({"spec": {"selector": {"matchLabels": {"a": "2"}}}});
        assert_eq!(violations("apps", "daemonsets", &ds, &other), ["spec.selector"]);
        assert!(violations("apps", "daemonsets", &ds, &ds).is_empty());
        let rb = json!({"roleRef": {"name": "a"}});
        assert_eq!(
            violations(
                "rbac.authorization.k8s.io",
                "rolebindings",
                &rb,
                &json!({"roleRef": {"name": "b"}})
            )
            .len(),
            1
        );
        let cm = json!({"immutable": true, "data": {"k": "v"}});
        assert_eq!(
            violations("", "configmaps", &cm, &json!({"immutable": true, "data": {"k": "w"}})),
            ["data"]
        );
        assert!(violations("", "configmaps", &json!({"data": {}}), &json!({"data": {"k": "w"}})).is_empty());
    }
}
