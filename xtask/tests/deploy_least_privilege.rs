//! Least privilege of the RBAC hpp ships (`deploy/`) or renders: every mutating verb is restricted
//! with `resourceNames` unless it is on the allow-list below with a reason; the operator's
//! shipped RBAC lets it change and delete every object it renders, and nothing foreign; the
//! NetworkPolicy admits only what it must. (The rendered pods' privileges are checked in
//! hpp-reconcile/tests/least_privilege.rs.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::path::{Path, PathBuf};

use hpp_api::HostPathProvisioner;
use hpp_reconcile::OperatorConfig;
use hpp_reconcile::facts::ClusterFacts;
use hpp_reconcile::reconcilers::{csi_daemonset, prometheus, rbac};
use hpp_testkit::{Access, RbacPolicy};
use serde_json::Value;

/// Verbs that change objects or grant rights.
const MUTATING: [&str; 8] = [
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "escalate",
    "bind",
    "impersonate",
];

/// Why a rule may carry a mutating verb without `resourceNames`: (role, API group, resource,
/// verbs, reason). `create` is allowed everywhere: Kubernetes cannot restrict it by name.
const ALLOWED: &[(&str, &str, &str, &[&str], &str)] = &[
    // --- The operator (deploy/operator/rbac.yaml).
    (
        "hostpath-provisioner-operator",
        "hostpathprovisioner.kubevirt.io",
        "hostpathprovisioners",
        &["patch", "update"],
        "the CR is the operator's own API and its name is the user's",
    ),
    (
        "hostpath-provisioner-operator",
        "hostpathprovisioner.kubevirt.io",
        "hostpathprovisioners/status",
        &["patch", "update"],
        "status of the operator's own CR",
    ),
    (
        "hostpath-provisioner-operator",
        "hostpathprovisioner.kubevirt.io",
        "hostpathprovisioners/finalizers",
        &["update"],
        "owner references to the operator's own CR",
    ),
    (
        "hostpath-provisioner-operator",
        "events.k8s.io",
        "events",
        &["patch"],
        "Event names are generated per occurrence",
    ),
    (
        "hostpath-provisioner-operator",
        "",
        "events",
        &["patch"],
        "Event names are generated per occurrence",
    ),
    (
        "hostpath-provisioner-operator",
        "apps",
        "deployments",
        &["patch", "delete"],
        "pool mounter Deployments are named after pools and nodes, in the operator's namespace only",
    ),
    (
        "hostpath-provisioner-operator",
        "",
        "persistentvolumeclaims",
        &["delete"],
        "pool PVCs are named after pools and nodes, in the operator's namespace only",
    ),
    (
        "hostpath-provisioner-operator",
        "",
        "persistentvolumes",
        &["patch", "delete"],
        "node loss: PVs of a lost node are named per claim (pvc-<uid>); deleted with a uid precondition, \
         and only the external provisioner's finalizer is removed, by a patch testing uid and entry",
    ),
    (
        "hostpath-provisioner-operator",
        "",
        "persistentvolumeclaims",
        &["delete"],
        "node loss: claims of a lost node live in any namespace under users' names; deleted with the uid \
         the PV is bound to as a precondition",
    ),
    (
        "hostpath-provisioner-operator",
        "batch",
        "jobs",
        &["delete"],
        "cleanup Jobs are named after pools and nodes, in the operator's namespace only",
    ),
    // --- The CSI driver and its sidecars (rendered, and the standalone deploy/csi).
    (
        "*csi*",
        "",
        "persistentvolumes",
        &["patch", "delete"],
        "PV names are generated per claim (pvc-<uid>)",
    ),
    (
        "*csi*",
        "",
        "persistentvolumeclaims",
        &["update"],
        "the external provisioner annotates any claim of the driver",
    ),
    (
        "*csi*",
        "",
        "persistentvolumeclaims/status",
        &["patch"],
        "the external resizer records the size of any claim of the driver",
    ),
    (
        "*csi*",
        "",
        "events",
        &["update", "patch"],
        "Event names are generated per occurrence",
    ),
    (
        "*csi*",
        "events.k8s.io",
        "events",
        &["update", "patch"],
        "Event names are generated per occurrence",
    ),
    (
        "*csi*",
        "storage.k8s.io",
        "volumeattachments",
        &["patch"],
        "attachment names are hashes of PV and node",
    ),
    (
        "*csi*",
        "storage.k8s.io",
        "volumeattachments/status",
        &["patch"],
        "attachment names are hashes of PV and node",
    ),
    (
        "*csi*",
        "snapshot.storage.k8s.io",
        "volumesnapshotcontents",
        &["update", "patch", "delete"],
        "content names are generated per snapshot (snapcontent-<uid>)",
    ),
    (
        "*csi*",
        "snapshot.storage.k8s.io",
        "volumesnapshotcontents/status",
        &["update", "patch"],
        "content names are generated per snapshot",
    ),
    (
        "*csi*",
        "storage.k8s.io",
        "csistoragecapacities",
        &["update", "patch", "delete"],
        "capacity objects have generated names (csisc-*), namespaced",
    ),
    (
        "*csi*",
        "coordination.k8s.io",
        "leases",
        &["update", "patch", "delete"],
        "sidecar leader-election leases are named by the sidecar images, namespaced",
    ),
    // --- The legacy provisioner (rendered and deploy/legacy).
    (
        "*",
        "",
        "persistentvolumes",
        &["delete"],
        "PV names are generated per claim (pvc-<uid>)",
    ),
    (
        "hostpath-provisioner",
        "",
        "persistentvolumeclaims",
        &["update"],
        "KubeVirt's legacy role; claims of any name",
    ),
    (
        "*",
        "",
        "events",
        &["update", "patch"],
        "Event names are generated per occurrence",
    ),
    (
        "*",
        "events.k8s.io",
        "events",
        &["update", "patch"],
        "Event names are generated per occurrence",
    ),
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn role_matches(pattern: &str, role: &str) -> bool {
    match pattern {
        "*" => true,
        "*csi*" => role.contains("csi"),
        exact => exact == role,
    }
}

fn allowed(role: &str, group: &str, resource: &str, verb: &str) -> bool {
    verb == "create"
        || ALLOWED.iter().any(|(r, g, res, verbs, reason)| {
            assert!(!reason.is_empty());
            role_matches(r, role) && *g == group && *res == resource && verbs.contains(&verb)
        })
}

/// Every violation in one role: `role: verb group/resource`.
fn violations(role: &str, rules: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    for rule in rules {
        let named = rule["resourceNames"].as_array().is_some_and(|n| !n.is_empty());
        if named {
            continue;
        }
        let strs = |k: &str| -> Vec<String> {
            rule[k]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        };
        for verb in strs("verbs") {
            if verb != "*" && !MUTATING.contains(&verb.as_str()) {
                continue;
            }
            for group in strs("apiGroups") {
                for resource in strs("resources") {
                    if verb == "*" || !allowed(role, &group, &resource, &verb) {
                        out.push(format!("{role}: {verb} {group}/{resource}"));
                    }
                }
            }
        }
    }
    out
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

/// Every Role and ClusterRole in `deploy/**`.
fn shipped_roles() -> Vec<(String, Vec<Value>)> {
    let mut files = Vec::new();
    yaml_files(&repo().join("deploy"), &mut files);
    let mut roles = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let Ok(docs): Result<Vec<Value>, _> = serde_saphyr::from_str_multiple(&text) else {
            continue; // not Kubernetes YAML (kustomize patches parse; others are skipped)
        };
        for doc in docs {
            if matches!(doc["kind"].as_str(), Some("Role" | "ClusterRole")) {
                let name = doc["metadata"]["name"].as_str().unwrap().to_owned();
                roles.push((name, doc["rules"].as_array().cloned().unwrap_or_default()));
            }
        }
    }
    roles
}

fn example(name: &str) -> HostPathProvisioner {
    let path = repo().join(format!("deploy/examples/{name}.yaml"));
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn cfg() -> OperatorConfig {
    OperatorConfig::from_env([("OPERATOR_VERSION", "v1.0.0")])
}

/// Every Role and ClusterRole the operator renders, for every example CR.
fn rendered_roles() -> Vec<(String, Vec<Value>)> {
    let facts = ClusterFacts {
        has_prometheus: true,
        ..Default::default()
    };
    let mut roles = Vec::new();
    for ex in [
        "hostpathprovisioner_cr",
        "hostpathprovisioner_legacy_cr",
        "hostpathprovisioner_pvctemplate_cr",
        "hostpathprovisioner_overlay_csi_cr",
    ] {
        let mut hpp = example(ex);
        // Snapshotting with a snapshot provider adds the snapshotter's rules.
        hpp.spec.feature_gates = Some(vec!["Snapshotting".into()]);
        for pool in hpp.spec.storage_pools.iter_mut().flatten() {
            pool.snapshot_provider = Some("reflink".into());
        }
        let objs = rbac::desired_rbac(&hpp, &cfg())
            .unwrap()
            .into_iter()
            .chain(prometheus::desired_monitoring(&hpp, &cfg(), &facts).unwrap());
        for d in objs {
            let v = d.to_value().unwrap();
            if matches!(v["kind"].as_str(), Some("Role" | "ClusterRole")) {
                let name = v["metadata"]["name"].as_str().unwrap().to_owned();
                roles.push((name, v["rules"].as_array().cloned().unwrap_or_default()));
            }
        }
    }
    roles
}

#[test]
fn every_mutating_verb_is_restricted_by_name_or_allow_listed_with_a_reason() {
    let shipped = shipped_roles();
    let rendered = rendered_roles();
    assert!(shipped.len() >= 6, "{shipped:?}");
    assert!(rendered.iter().any(|(n, _)| n == "hostpath-provisioner-admin-csi"));
    let bad: Vec<String> = shipped
        .iter()
        .chain(&rendered)
        .flat_map(|(name, rules)| violations(name, rules))
        .collect();
    assert!(bad.is_empty(), "unrestricted mutating verbs:\n{}", bad.join("\n"));
}

#[test]
fn the_operator_cannot_touch_foreign_sccs_or_cluster_roles() {
    let shipped = shipped_roles();
    let (_, rules) = shipped
        .iter()
        .find(|(n, rules)| {
            n == "hostpath-provisioner-operator" && rules.iter().any(|r| r["resources"][0] == "hostpathprovisioners")
        })
        .unwrap();
    for resource in [
        "securitycontextconstraints",
        "clusterroles",
        "clusterrolebindings",
        "csidrivers",
        "storageclasses",
    ] {
        for rule in rules
            .iter()
            .filter(|r| r["resources"].as_array().unwrap().iter().any(|x| x == resource))
        {
            let mutating = rule["verbs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| matches!(v.as_str(), Some("update" | "patch" | "delete")));
            if mutating {
                let names = rule["resourceNames"].as_array().unwrap();
                assert!(!names.iter().any(|n| n == "restricted"), "{rule}");
                assert!(!names.is_empty(), "{rule}");
            }
        }
    }
}

/// The operator's shipped RBAC as the fake API server enforces it (one matcher, the testkit's,
/// for every check of rules against requests).
fn operator_policy() -> RbacPolicy {
    let path = repo().join("deploy/operator/rbac.yaml");
    RbacPolicy::from_yaml(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn the_operator_may_change_and_delete_every_object_it_renders() {
    use hpp_reconcile::Pipeline;
    use hpp_reconcile::facts::NodeFact;
    use hpp_reconcile::object::ApplyStrategy;
    let policy = operator_policy();
    let mut node = NodeFact::ready("n1");
    node.labels.insert("kubernetes.io/os".into(), "linux".into());
    let facts = ClusterFacts {
        nodes: vec![node].into(),
        has_scc: true,
        has_prometheus: true,
        ..Default::default()
    };
    let mut checked = 0;
    for ex in [
        "hostpathprovisioner_cr",
        "hostpathprovisioner_legacy_cr",
        "hostpathprovisioner_pvctemplate_cr",
        "hostpathprovisioner_overlay_csi_cr",
        "volume audit",
    ] {
        let hpp = if ex == "volume audit" {
            let mut hpp = example("hostpathprovisioner_cr");
            hpp.spec.volume_audit = Some(Default::default());
            hpp
        } else {
            example(ex)
        };
        for (_, objs) in Pipeline::standard().desired(&hpp, &cfg(), &facts).unwrap() {
            for d in objs {
                let name = d.object.metadata.name.clone().unwrap();
                let mut verbs = vec!["get", "delete"];
                if d.strategy == ApplyStrategy::ServerSideApply {
                    verbs.push("patch");
                }
                for verb in verbs {
                    let mut access = Access::new(verb, &d.kind.group, &d.kind.plural).named(&name);
                    if let Some(ns) = d.object.metadata.namespace.as_deref() {
                        access = access.in_namespace(ns);
                    }
                    assert!(policy.allows(&access), "{access:?} ({ex}) not granted");
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 30, "{checked}");
}

#[test]
fn network_policy_admits_monitoring_to_metrics_and_nothing_to_admin() {
    let root = repo().join("deploy");
    let kustomization = std::fs::read_to_string(root.join("kustomization.yaml")).unwrap();
    assert!(kustomization.contains("- networkpolicy.yaml"));
    let docs: Vec<Value> =
        serde_saphyr::from_str_multiple(&std::fs::read_to_string(root.join("networkpolicy.yaml")).unwrap()).unwrap();
    let operator = docs
        .iter()
        .find(|d| d["spec"]["podSelector"]["matchLabels"]["name"] == "hostpath-provisioner-operator")
        .unwrap();
    let rules = operator["spec"]["ingress"].as_array().unwrap();
    let ports: Vec<i64> = rules
        .iter()
        .flat_map(|r| {
            r["ports"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["port"].as_i64().unwrap())
        })
        .collect();
    assert!(ports.contains(&9443) && ports.contains(&8443), "{ports:?}");
    assert!(!ports.contains(&6060), "the admin port is for the kubelet only");
    let metrics = rules.iter().find(|r| r["ports"][0]["port"] == 8443).unwrap();
    assert_eq!(
        metrics["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"][0],
        "monitoring"
    );
    // The node pods the operator renders carry the selected label.
    let node = docs
        .iter()
        .find(|d| d["metadata"]["name"] == "hostpath-provisioner-node")
        .unwrap();
    let ds = csi_daemonset::desired_csi_daemonset(&example("hostpathprovisioner_cr"), &cfg())
        .unwrap()
        .to_value()
        .unwrap();
    for (k, v) in node["spec"]["podSelector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&ds["spec"]["template"]["metadata"]["labels"][k], v);
    }
    // The volume audit (spec.volumeAudit): the operator pod reaches the drivers' 8443, and only
    // that port.
    let from_operator: Vec<&Value> = node["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["from"][0]["podSelector"]["matchLabels"]["name"] == "hostpath-provisioner-operator")
        .collect();
    assert_eq!(from_operator.len(), 1, "{node:#}");
    assert_eq!(
        from_operator[0]["ports"],
        serde_json::json!([{"port": 8443, "protocol": "TCP"}])
    );
}
