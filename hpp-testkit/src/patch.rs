//! The patch flavours the API server accepts: JSON merge patch, strategic merge patch (keyed
//! list merge for the common Kubernetes lists) and JSON patch. Server-side apply is in `ssa`.

use serde_json::{Map, Value};

/// Applies an RFC 7386 JSON merge patch (`application/merge-patch+json`).
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// The merge key the real server uses for a list field, if it merges that list by key.
///
/// `ports` is keyed by `containerPort` inside containers and by `port` in Services; the first
/// key present on the patch elements wins.
pub(crate) fn merge_keys(field: &str) -> &'static [&'static str] {
    match field {
        "containers" | "initContainers" | "ephemeralContainers" | "env" | "volumes" | "imagePullSecrets" => &["name"],
        "volumeMounts" => &["mountPath"],
        "volumeDevices" => &["devicePath"],
        "conditions" => &["type"],
        "ownerReferences" => &["uid"],
        "ports" => &["containerPort", "port"],
        "hostAliases" => &["ip"],
        "topologySpreadConstraints" => &["topologyKey"],
        _ => &[],
    }
}

/// Lists of scalars the real server unions instead of replacing.
pub(crate) fn is_set_list(field: &str) -> bool {
    field == "finalizers"
}

/// Applies a strategic merge patch (`application/strategic-merge-patch+json`).
///
/// Objects merge recursively, `null` deletes, lists of containers/env/volumes/... merge by
/// their key (`name`, `mountPath`, `type`, ...), `finalizers` merge as a set, other lists are
/// replaced. The directives `$patch: replace` and `$patch: delete` are honoured; other `$`
/// directives (`$setElementOrder`, `$retainKeys`, `$deleteFromPrimitiveList`) are ignored.
pub(crate) fn strategic_merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    match patch_map.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut replaced = patch_map.clone();
            replaced.remove("$patch");
            *target = Value::Object(replaced);
            return;
        }
        Some("delete") => {
            *target = Value::Object(Map::new());
            return;
        }
        _ => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(target_map) = target else { return };
    for (key, value) in patch_map {
        if key.starts_with('$') {
            continue;
        }
        if value.is_null() {
            target_map.remove(key);
            continue;
        }
        let slot = target_map.entry(key.clone()).or_insert(Value::Null);
        match (value, slot.is_array()) {
            (Value::Array(items), true) if is_set_list(key) => {
                if let Value::Array(existing) = slot {
                    for item in items {
                        if !existing.contains(item) {
                            existing.push(item.clone());
                        }
                    }
                }
            }
            (Value::Array(items), true) => {
                let key_field = merge_keys(key)
                    .iter()
                    .find(|k| items.iter().all(|i| i.get(**k).is_some()))
                    .copied();
                match (key_field, slot) {
                    (Some(k), Value::Array(existing)) if !items.is_empty() => {
                        merge_keyed_list(existing, items, k);
                    }
                    (_, slot) => *slot = Value::Array(strip_directives(items)),
                }
            }
            (Value::Array(items), false) => *slot = Value::Array(strip_directives(items)),
            (Value::Object(_), _) => strategic_merge(slot, value),
            _ => *slot = value.clone(),
        }
    }
}

fn strip_directives(items: &[Value]) -> Vec<Value> {
    items.iter().filter(|i| i.get("$patch").is_none()).cloned().collect()
}

fn merge_keyed_list(existing: &mut Vec<Value>, items: &[Value], key: &str) {
    for item in items {
        let id = item.get(key).cloned();
        let pos = existing.iter().position(|e| e.get(key).cloned() == id);
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(p), true) => {
                existing.remove(p);
            }
            (Some(p), false) => strategic_merge(&mut existing[p], item),
            (None, true) => {}
            (None, false) => existing.push(item.clone()),
        }
    }
}

/// Applies a JSON patch (`application/json-patch+json`) atomically.
///
/// Like the real server (evanphx/json-patch), a `test` of `null` against a missing path
/// passes: kube-runtime's finalizer helper relies on that when it adds the first finalizer.
pub(crate) fn json_patch(target: &mut Value, ops: &json_patch::Patch) -> Result<(), String> {
    let mut doc = target.clone();
    for op in &ops.0 {
        if let json_patch::PatchOperation::Test(t) = op
            && t.value.is_null()
            && doc.pointer(t.path.as_str()).is_none_or(Value::is_null)
        {
            continue;
        }
        json_patch::patch(&mut doc, std::slice::from_ref(op)).map_err(|e| e.to_string())?;
    }
    *target = doc;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merges_containers_by_name() {
        let mut live = json!({"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
            {"name": "b", "image": "b:1"}
        ], "args": ["x"]}, "metadata": {"finalizers": ["f1"]}});
        strategic_merge(
            &mut live,
            &json!({"spec": {"containers": [
                {"name": "a", "image": "a:2", "env": [{"name": "Y", "value": "2"}]},
                {"name": "b", "$patch": "delete"},
                {"name": "c", "image": "c:1"}
            ], "args": ["y"]}, "metadata": {"finalizers": ["f2", "f1"]}}),
        );
        assert_eq!(
            live,
            json!({"spec": {"containers": [
                {"name": "a", "image": "a:2", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]},
                {"name": "c", "image": "c:1"}
            ], "args": ["y"]}, "metadata": {"finalizers": ["f1", "f2"]}})
        );
    }

    #[test]
    fn json_patch_null_test_passes_on_missing_path() {
        let mut doc = json!({"metadata": {}});
        let ops: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["f"]}
        ]))
        .unwrap();
        json_patch(&mut doc, &ops).unwrap();
        assert_eq!(doc, json!({"metadata": {"finalizers": ["f"]}}));
        let failing: json_patch::Patch =
            serde_json::from_value(json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "x"}])).unwrap();
        assert!(json_patch(&mut doc, &failing).is_err());
    }
}
