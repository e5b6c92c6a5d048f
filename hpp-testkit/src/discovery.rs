//! Discovery documents for the served kinds (`/api`, `/apis`, `/api/v1`, `/apis/{g}/{v}`,
//! the aggregated v2 form, and `/version`), so `kube::Discovery` and API-presence checks see
//! exactly the registered kinds.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::kinds::{KindInfo, Kinds};

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// group → versions (in registration-sorted order) → kinds.
fn grouped(kinds: &Kinds) -> BTreeMap<&str, BTreeMap<&str, Vec<&KindInfo>>> {
    let mut groups: BTreeMap<&str, BTreeMap<&str, Vec<&KindInfo>>> = BTreeMap::new();
    for k in kinds.all() {
        groups
            .entry(k.ar.group.as_str())
            .or_default()
            .entry(k.ar.version.as_str())
            .or_default()
            .push(k);
    }
    groups
}

/// Kubernetes version priority: GA before beta before alpha, higher numbers first.
fn priority(version: &str) -> (u8, u32, u32) {
    let rest = version.strip_prefix('v').unwrap_or(version);
    let digits = |s: &str| s.chars().take_while(char::is_ascii_digit).collect::<String>();
    let major = digits(rest);
    let tail = &rest[major.len()..];
    let major = major.parse().unwrap_or(0);
    let (stability, minor) = match (tail.strip_prefix("beta"), tail.strip_prefix("alpha")) {
        _ if tail.is_empty() => (2, 0),
        (Some(n), _) => (1, n.parse().unwrap_or(0)),
        (_, Some(n)) => (0, n.parse().unwrap_or(0)),
        _ => (0, 0),
    };
    (stability, major, minor)
}

/// Versions of one group, preferred first.
fn by_priority<'a, T>(versions: &'a BTreeMap<&'a str, T>) -> Vec<(&'a str, &'a T)> {
    let mut list: Vec<(&str, &T)> = versions.iter().map(|(v, t)| (*v, t)).collect();
    list.sort_by_key(|(v, _)| std::cmp::Reverse(priority(v)));
    list
}

fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

/// `/version`: a Kubernetes 1.33 server.
pub(crate) fn version() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-hpp-testkit",
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// `/api`.
pub(crate) fn core_versions() -> Value {
    json!({
        "kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}]
    })
}

fn group_entry(name: &str, versions: &BTreeMap<&str, Vec<&KindInfo>>) -> Value {
    let list: Vec<Value> = by_priority(versions)
        .into_iter()
        .map(|(v, _)| json!({"groupVersion": group_version(name, v), "version": v}))
        .collect();
    let preferred = list.first().cloned().unwrap_or(Value::Null);
    json!({"name": name, "versions": list, "preferredVersion": preferred})
}

/// `/apis`: every non-core group with at least one registered kind.
pub(crate) fn groups(kinds: &Kinds) -> Value {
    let groups: Vec<Value> = grouped(kinds)
        .iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, versions)| group_entry(g, versions))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/{group}`.
pub(crate) fn group(kinds: &Kinds, name: &str) -> Option<Value> {
    let all = grouped(kinds);
    let versions = all.get(name).filter(|_| !name.is_empty())?;
    let mut entry = group_entry(name, versions);
    entry["kind"] = json!("APIGroup");
    entry["apiVersion"] = json!("v1");
    Some(entry)
}

/// `/api/v1` or `/apis/{group}/{version}`.
pub(crate) fn resources(kinds: &Kinds, group: &str, version: &str) -> Option<Value> {
    let all = grouped(kinds);
    let list = all.get(group)?.get(version)?;
    let mut resources = Vec::new();
    for k in list {
        resources.push(json!({
            "name": k.ar.plural, "singularName": k.ar.kind.to_lowercase(), "namespaced": k.namespaced,
            "kind": k.ar.kind, "verbs": VERBS
        }));
        if k.status {
            resources.push(json!({
                "name": format!("{}/status", k.ar.plural), "singularName": "", "namespaced": k.namespaced,
                "kind": k.ar.kind, "verbs": ["get", "patch", "update"]
            }));
        }
    }
    Some(json!({
        "kind": "APIResourceList", "apiVersion": "v1",
        "groupVersion": group_version(group, version), "resources": resources
    }))
}

/// Aggregated discovery (`Accept: ...;as=APIGroupDiscoveryList`): `core` selects the `/api`
/// document, otherwise `/apis`.
pub(crate) fn aggregated(kinds: &Kinds, core: bool) -> Value {
    let items: Vec<Value> = grouped(kinds)
        .iter()
        .filter(|(g, _)| g.is_empty() == core)
        .map(|(g, versions)| {
            let versions: Vec<Value> = by_priority(versions)
                .into_iter()
                .map(|(v, list)| {
                    let resources: Vec<Value> = list
                        .iter()
                        .map(|k| {
                            let gvk = json!({"group": g, "version": v, "kind": k.ar.kind});
                            let subresources: Vec<Value> = if k.status {
                                vec![json!({"subresource": "status", "responseKind": gvk, "verbs": ["get", "patch", "update"]})]
                            } else {
                                vec![]
                            };
                            json!({
                                "resource": k.ar.plural, "responseKind": gvk,
                                "scope": if k.namespaced { "Namespaced" } else { "Cluster" },
                                "singularResource": k.ar.kind.to_lowercase(), "verbs": VERBS,
                                "subresources": subresources
                            })
                        })
                        .collect();
                    json!({"version": v, "resources": resources, "freshness": "Current"})
                })
                .collect();
            json!({"metadata": {"name": g}, "versions": versions})
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_priority() {
        let mut v = vec!["v1alpha1", "v1", "v1beta1", "v2beta1", "v1beta2"];
        v.sort_by_key(|v| std::cmp::Reverse(priority(v)));
        assert_eq!(v, ["v1", "v2beta1", "v1beta2", "v1beta1", "v1alpha1"]);
    }
}
