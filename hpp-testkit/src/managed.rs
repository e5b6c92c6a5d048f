//! Opt-in `metadata.managedFields`, so objects have the size they have on a real API server
//! (see [`FakeApiServer::track_managed_fields`](crate::FakeApiServer::track_managed_fields)).
//!
//! A real server keeps one entry per field manager, operation and subresource, whose
//! `fieldsV1` names every field that manager set: `{"f:metadata":{"f:labels":{".":{},"f:app":{}}}}`,
//! list items by key (`k:{"name":"x"}`) or value (`v:"x"`). The fake records, for each write,
//! the fields of the part written (the status for `/status`, the rest otherwise) under the
//! writer's entry, which gives entries of the real shape and size. Ownership is not split
//! between managers (two managers writing one field both list it): the entries are for bytes
//! on the wire and in watch caches, not for conflict detection, which `ssa` does.

use serde_json::{Map, Value, json};

/// Who writes: the request's field manager (or `testkit` for [`seed`](crate::FakeApiServer::seed)
/// and [`set_status`](crate::FakeApiServer::set_status)), `Apply` or `Update`, and whether the
/// write went through `/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Writer {
    pub manager: String,
    pub operation: &'static str,
    pub status: bool,
}

impl Default for Writer {
    fn default() -> Self {
        Self {
            manager: "testkit".into(),
            operation: "Update",
            status: false,
        }
    }
}

/// Metadata fields no manager owns.
const SYSTEM_METADATA: [&str; 7] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "generation",
    "managedFields",
];

/// The `fieldsV1` set of a value: every object key as `f:<key>`, list items keyed by their
/// `name`, `type`, `key` or `containerPort` (as the built-in kinds' merge keys do) or by value.
pub(crate) fn fields_v1(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            if !map.is_empty() {
                out.insert(".".into(), json!({}));
            }
            for (k, v) in map {
                out.insert(format!("f:{k}"), fields_v1(v));
            }
            Value::Object(out)
        }
        Value::Array(items) => {
            let mut out = Map::new();
            for item in items {
                let key = ["name", "type", "key", "containerPort", "mountPath"]
                    .iter()
                    .find_map(|k| item.get(*k).map(|v| json!({ *k: v })));
                match key {
                    Some(key) => {
                        out.insert(format!("k:{key}"), fields_v1(item));
                    }
                    None => {
                        out.insert(format!("v:{item}"), json!({}));
                    }
                }
            }
            Value::Object(out)
        }
        _ => json!({}),
    }
}

/// The part of `obj` a writer owns: its status for a `/status` write, else everything but the
/// status and the system metadata.
fn written_part(obj: &Value, status: bool) -> Value {
    if status {
        return json!({ "status": obj.get("status").cloned().unwrap_or_else(|| json!({})) });
    }
    let mut part = obj.clone();
    if let Value::Object(map) = &mut part {
        map.remove("status");
        map.remove("apiVersion");
        map.remove("kind");
        if let Some(Value::Object(meta)) = map.get_mut("metadata") {
            for field in SYSTEM_METADATA {
                meta.remove(field);
            }
        }
    }
    part
}

/// Sets `new`'s `managedFields`: `old`'s entries with the writer's replaced by one for what
/// it wrote now, at `time`.
pub(crate) fn stamp(old: Option<&Value>, new: &mut Value, writer: &Writer, time: &str) {
    let api_version = new.get("apiVersion").cloned().unwrap_or(Value::Null);
    let subresource = writer.status.then_some("status");
    let same = |e: &Value| {
        e.get("manager").and_then(Value::as_str) == Some(writer.manager.as_str())
            && e.get("operation").and_then(Value::as_str) == Some(writer.operation)
            && e.get("subresource").and_then(Value::as_str) == subresource
    };
    let mut entries: Vec<Value> = old
        .and_then(|o| o.pointer("/metadata/managedFields"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter(|e| !same(e)).cloned().collect())
        .unwrap_or_default();
    let mut entry = json!({
        "manager": writer.manager,
        "operation": writer.operation,
        "apiVersion": api_version,
        "time": time,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields_v1(&written_part(new, writer.status)),
    });
    if let Some(sub) = subresource {
        entry["subresource"] = json!(sub);
    }
    entries.push(entry);
    if let Some(Value::Object(meta)) = new.get_mut("metadata") {
        meta.insert("managedFields".into(), Value::Array(entries));
    }
}

/// `obj` without its `managedFields` (what a write is compared with to see whether it changes
/// anything).
pub(crate) fn without(obj: &Value) -> Value {
    let mut obj = obj.clone();
    if let Some(Value::Object(meta)) = obj.get_mut("metadata") {
        meta.remove("managedFields");
    }
    obj
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn entries_name_the_fields_each_writer_set() {
        let mut obj = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "uid": "u", "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "c", "args": ["a", "b"]}]},
            "status": {"phase": "Running"},
        });
        let kubelet = Writer {
            manager: "kubelet".into(),
            operation: "Update",
            status: true,
        };
        stamp(None, &mut obj, &Writer::default(), "t0");
        let first = obj.clone();
        stamp(Some(&first), &mut obj, &kubelet, "t1");
        let entries = obj["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(
            entries[0]["fieldsV1"],
            json!({".": {}, "f:metadata": {".": {}, "f:labels": {".": {}, "f:app": {}}},
                   "f:spec": {".": {}, "f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:name": {},
                       "f:args": {"v:\"a\"": {}, "v:\"b\"": {}}}}}})
        );
        assert_eq!(entries[1]["subresource"], "status");
        assert_eq!(
            entries[1]["fieldsV1"],
            json!({".": {}, "f:status": {".": {}, "f:phase": {}}})
        );
        // The same writer again replaces its entry.
        let second = obj.clone();
        stamp(Some(&second), &mut obj, &kubelet, "t2");
        assert_eq!(obj["metadata"]["managedFields"].as_array().unwrap().len(), 2);
        assert_eq!(without(&obj)["metadata"].get("managedFields"), None);
    }
}
