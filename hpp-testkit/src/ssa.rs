//! Server-side apply without `managedFields`: the fake remembers each field manager's last
//! applied configuration per object and derives ownership from it. A manager owns a field it
//! applied for as long as the live value is still the one it applied; a field it stops applying
//! is removed if it still owns it and no other applier sends it; changing a field another
//! applier owns is a conflict unless forced.
//!
//! For built-in kinds, the associative lists of the Kubernetes schema (containers, env,
//! volumes, volumeMounts, ports, conditions, ownerReferences, ... keyed by their merge key, and
//! `finalizers` as a set) are merged item by item, so items added by other writers survive an
//! apply as they do on a real cluster. Custom resources' lists are atomic (the CRD default).

use serde_json::{Map, Value, json};

use super::patch::{is_set_list, merge, merge_keys};

/// Path of a leaf inside an applied configuration.
type FieldPath = Vec<String>;

/// Marks an associative list converted into a map; the value is the merge key ("" for sets).
const ASSOC: &str = "\u{0}assoc";

/// Identity fields that the bookkeeping never treats as owned.
fn strip_identity(config: &Value) -> Value {
    let mut config = config.clone();
    if let Value::Object(map) = &mut config {
        map.remove("apiVersion");
        map.remove("kind");
        if let Some(Value::Object(meta)) = map.get_mut("metadata") {
            for field in [
                "name",
                "namespace",
                "resourceVersion",
                "uid",
                "creationTimestamp",
                "generation",
                "managedFields",
            ] {
                meta.remove(field);
            }
        }
    }
    config
}

/// The leaf paths of a configuration (objects are descended, everything else is a leaf).
fn leaves(config: &Value) -> Vec<(FieldPath, Value)> {
    fn walk(v: &Value, path: &mut FieldPath, out: &mut Vec<(FieldPath, Value)>) {
        match v {
            Value::Object(map) if !map.is_empty() => {
                for (k, child) in map {
                    if k == ASSOC {
                        continue;
                    }
                    path.push(k.clone());
                    walk(child, path, out);
                    path.pop();
                }
            }
            _ => out.push((path.clone(), v.clone())),
        }
    }
    let mut out = Vec::new();
    walk(&strip_identity(config), &mut Vec::new(), &mut out);
    out
}

fn lookup<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, k| cur.get(k))
}

fn remove_path(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for k in parents {
        match cur.get_mut(k) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Value::Object(map) = cur {
        map.remove(last);
    }
}

/// The map key of an associative-list item.
fn item_key(item: &Value, key: &str) -> String {
    if key.is_empty() {
        item.to_string()
    } else {
        item.get(key).map(Value::to_string).unwrap_or_default()
    }
}

/// Converts associative lists into maps keyed by their merge key, recursively.
fn to_assoc(v: &Value, field: Option<&str>) -> Value {
    match v {
        Value::Object(map) => Value::Object(map.iter().map(|(k, c)| (k.clone(), to_assoc(c, Some(k)))).collect()),
        Value::Array(items) => {
            let field = field.unwrap_or_default();
            let key = if is_set_list(field) && items.iter().all(|i| !i.is_object() && !i.is_array()) {
                Some("")
            } else {
                merge_keys(field)
                    .iter()
                    .find(|k| items.iter().all(|i| i.get(**k).is_some()))
                    .copied()
            };
            match key {
                Some(key) => {
                    let mut map = Map::new();
                    map.insert(ASSOC.into(), json!(key));
                    for item in items {
                        map.insert(item_key(item, key), to_assoc(item, None));
                    }
                    Value::Object(map)
                }
                None => Value::Array(items.iter().map(|i| to_assoc(i, None)).collect()),
            }
        }
        other => other.clone(),
    }
}

/// Position of the item with map key `k` in a reference list.
fn position(list: Option<&Value>, key: &str, k: &str) -> Option<usize> {
    list.and_then(Value::as_array)?
        .iter()
        .position(|i| item_key(i, key) == k)
}

/// The item with map key `k` in a reference list.
fn find_item<'a>(list: Option<&'a Value>, key: &str, k: &str) -> Option<&'a Value> {
    list.and_then(Value::as_array)?.iter().find(|i| item_key(i, key) == k)
}

/// Turns maps made by [`to_assoc`] back into lists: items keep their order in `before`
/// (the live list), new ones follow in `config` order.
fn from_assoc(v: &Value, before: Option<&Value>, config: Option<&Value>) -> Value {
    let Value::Object(map) = v else { return v.clone() };
    let Some(key) = map.get(ASSOC).and_then(Value::as_str) else {
        return Value::Object(
            map.iter()
                .map(|(k, c)| {
                    (
                        k.clone(),
                        from_assoc(c, before.and_then(|b| b.get(k)), config.and_then(|c| c.get(k))),
                    )
                })
                .collect(),
        );
    };
    let mut items: Vec<(usize, usize, Value)> = map
        .iter()
        .filter(|(k, _)| k.as_str() != ASSOC)
        .map(|(k, item)| {
            let rank = match (position(before, key, k), position(config, key, k)) {
                (Some(p), _) => (0, p),
                (None, Some(p)) => (1, p),
                (None, None) => (2, 0),
            };
            (
                rank.0,
                rank.1,
                from_assoc(item, find_item(before, key, k), find_item(config, key, k)),
            )
        })
        .collect();
    items.sort_by_key(|(group, pos, _)| (*group, *pos));
    Value::Array(items.into_iter().map(|(_, _, item)| item).collect())
}

/// Applies `f` to the associative forms of its arguments when `associative` is set.
fn prepare(v: &Value, associative: bool) -> Value {
    if associative { to_assoc(v, None) } else { v.clone() }
}

/// Fields another applier still owns that this configuration would change: a conflict
/// unless `force` is set. Returns one message per conflicting field and manager.
pub(crate) fn apply_conflicts<'a>(
    live: &Value,
    config: &Value,
    others: impl Iterator<Item = (&'a str, &'a Value)> + Clone,
    associative: bool,
) -> Vec<String> {
    let live = prepare(live, associative);
    let others: Vec<(&str, Value)> = others
        .map(|(m, o)| (m, strip_identity(&prepare(o, associative))))
        .collect();
    let mut conflicts = Vec::new();
    for (path, value) in leaves(&prepare(config, associative)) {
        let current = lookup(&live, &path);
        if current == Some(&value) {
            continue;
        }
        for (manager, other) in &others {
            if let Some(theirs) = lookup(other, &path)
                && !theirs.is_object()
                && current == Some(theirs)
            {
                conflicts.push(format!("conflict with \"{manager}\": .{}", path.join(".")));
            }
        }
    }
    conflicts
}

/// Applies `config` for a manager whose previous configuration was `previous` over `live`.
pub(crate) fn server_side_apply<'a>(
    live: &mut Value,
    previous: Option<&Value>,
    config: &Value,
    others: impl Iterator<Item = &'a Value>,
    associative: bool,
) {
    let before = live.clone();
    let mut work = prepare(live, associative);
    let new_config = strip_identity(&prepare(config, associative));
    let others: Vec<Value> = others.map(|o| strip_identity(&prepare(o, associative))).collect();
    if let Some(previous) = previous {
        for (path, applied) in leaves(&prepare(previous, associative)) {
            let still_sent = lookup(&new_config, &path).is_some();
            let still_owned = lookup(&work, &path) == Some(&applied);
            let kept_by_other = others.iter().any(|o| lookup(o, &path).is_some());
            if !still_sent && still_owned && !kept_by_other {
                remove_path(&mut work, &path);
                remove_emptied_item(&mut work, &path, previous, associative);
            }
        }
    }
    merge(&mut work, &prepare(config, associative));
    *live = if associative {
        from_assoc(&work, Some(&before), Some(config))
    } else {
        work
    };
}

/// When every field of an associative-list item this manager applied is gone, the item itself
/// goes (only its key field is left).
fn remove_emptied_item(work: &mut Value, path: &[String], previous: &Value, associative: bool) {
    if !associative {
        return;
    }
    for depth in (1..path.len()).rev() {
        let parent = &path[..depth - 1];
        let item_path = &path[..depth];
        let Some(Value::Object(list)) = lookup(work, parent) else {
            continue;
        };
        let Some(key) = list.get(ASSOC).and_then(Value::as_str) else {
            continue;
        };
        let key = key.to_string();
        let applied_item = lookup(&prepare(previous, true), item_path).cloned();
        let Some(Value::Object(item)) = lookup(work, item_path).cloned() else {
            continue;
        };
        let only_key = item.keys().all(|k| k == &key);
        if only_key && applied_item.is_some() {
            remove_path(work, item_path);
        }
        return;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_removes_fields_no_longer_sent() {
        let mut live = json!({"metadata": {"name": "x", "labels": {"a": "1", "b": "2", "c": "3"}}});
        let prev = json!({"metadata": {"name": "x", "labels": {"a": "1", "b": "2"}}});
        let other = json!({"metadata": {"labels": {"b": "2"}}});
        let next = json!({"metadata": {"name": "x", "labels": {"a": "9"}}});
        server_side_apply(&mut live, Some(&prev), &next, [&other].into_iter(), true);
        assert_eq!(
            live,
            json!({"metadata": {"name": "x", "labels": {"a": "9", "b": "2", "c": "3"}}})
        );
        let config = json!({"metadata": {"labels": {"b": "7"}}});
        assert_eq!(
            apply_conflicts(&live, &config, [("o", &other)].into_iter(), true).len(),
            1
        );
        // Once someone else changed the field, the applier no longer owns it.
        live["metadata"]["labels"]["b"] = json!("changed");
        assert!(apply_conflicts(&live, &config, [("o", &other)].into_iter(), true).is_empty());
    }

    #[test]
    fn associative_lists_keep_foreign_items_and_drop_unsent_own_items() {
        let prev = json!({"spec": {"containers": [
            {"name": "driver", "image": "d:1"}, {"name": "snapshotter", "image": "s:1"}
        ]}, "metadata": {"finalizers": ["mine"]}});
        let mut live = json!({"spec": {"containers": [
            {"name": "driver", "image": "d:1", "env": [{"name": "FOREIGN", "value": "x"}]},
            {"name": "snapshotter", "image": "s:1"},
            {"name": "sidecar", "image": "other:1"}
        ]}, "metadata": {"finalizers": ["theirs", "mine"]}});
        let next =
            json!({"spec": {"containers": [{"name": "driver", "image": "d:2"}]}, "metadata": {"finalizers": ["mine"]}});
        server_side_apply(&mut live, Some(&prev), &next, std::iter::empty(), true);
        assert_eq!(
            live,
            json!({"spec": {"containers": [
                {"name": "driver", "image": "d:2", "env": [{"name": "FOREIGN", "value": "x"}]},
                {"name": "sidecar", "image": "other:1"}
            ]}, "metadata": {"finalizers": ["theirs", "mine"]}})
        );

        // Atomic (custom resource) lists are replaced.
        let mut atomic = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        server_side_apply(
            &mut atomic,
            None,
            &json!({"spec": {"containers": [{"name": "a"}]}}),
            std::iter::empty(),
            false,
        );
        assert_eq!(atomic, json!({"spec": {"containers": [{"name": "a"}]}}));
    }
}
