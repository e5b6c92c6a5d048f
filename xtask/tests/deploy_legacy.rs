//! deploy/legacy stays usable: every document parses into its Kubernetes type, StorageClass
//! parameters are ones the provisioner accepts, and RBAC grants what the provisioner calls.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::path::{Path, PathBuf};

use hpp_legacy::Mode;
use hpp_legacy::params::ClassParams;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{PodSpec, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::Value;

fn legacy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/legacy")
}

#[derive(Default)]
struct Parsed {
    classes: Vec<StorageClass>,
    pods: Vec<PodSpec>,
    cluster_rules: Vec<PolicyRule>,
    role_rules: Vec<PolicyRule>,
    accounts: Vec<String>,
}

fn parse_dir(dir: &Path) -> Parsed {
    let mut out = Parsed::default();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            // The example StorageClass lives in storageclass/, applied separately.
            let sub = parse_dir(&path);
            out.classes.extend(sub.classes);
            continue;
        }
        if path.extension().and_then(|e| e.to_str()) != Some("yaml")
            || path.file_name().is_some_and(|n| n == "kustomization.yaml")
        {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for doc in docs {
            let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
            let what = format!("{} in {}", kind, path.display());
            match kind.as_str() {
                "StorageClass" => out.classes.push(serde_json::from_value(doc).expect(&what)),
                "DaemonSet" => {
                    let ds: DaemonSet = serde_json::from_value(doc).expect(&what);
                    out.pods.push(ds.spec.unwrap().template.spec.unwrap());
                }
                "Deployment" => {
                    let d: Deployment = serde_json::from_value(doc).expect(&what);
                    out.pods.push(d.spec.unwrap().template.spec.unwrap());
                }
                "ServiceAccount" => {
                    let sa: ServiceAccount = serde_json::from_value(doc).expect(&what);
                    out.accounts.push(sa.metadata.name.unwrap());
                }
                "ClusterRole" => {
                    let r: ClusterRole = serde_json::from_value(doc).expect(&what);
                    out.cluster_rules.extend(r.rules.unwrap());
                }
                "Role" => {
                    let r: Role = serde_json::from_value(doc).expect(&what);
                    out.role_rules.extend(r.rules.unwrap());
                }
                "ClusterRoleBinding" => {
                    let _: ClusterRoleBinding = serde_json::from_value(doc).expect(&what);
                }
                "RoleBinding" => {
                    let _: RoleBinding = serde_json::from_value(doc).expect(&what);
                }
                other => panic!("unexpected kind {other:?} in {}", path.display()),
            }
        }
    }
    out
}

fn allows(rules: &[PolicyRule], group: &str, resource: &str, verb: &str) -> bool {
    rules.iter().any(|r| {
        r.api_groups.as_ref().is_some_and(|g| g.iter().any(|g| g == group))
            && r.resources.as_ref().is_some_and(|rs| rs.iter().any(|x| x == resource))
            && r.verbs.iter().any(|v| v == verb)
    })
}

fn env<'a>(pod: &'a PodSpec, name: &str) -> Option<&'a str> {
    pod.containers[0]
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)?
        .value
        .as_deref()
}

#[test]
fn every_mode_has_consistent_manifests() {
    for (dir, mode, leases) in [
        ("kubevirt", Mode::Kubevirt, false),
        ("single-node", Mode::SingleNode, false),
        ("shared", Mode::Shared, true),
    ] {
        let parsed = parse_dir(&legacy_dir().join(dir));
        assert_eq!(parsed.pods.len(), 1, "{dir}: one workload");
        let pod = &parsed.pods[0];
        let c = &pod.containers[0];
        assert_eq!(
            c.command.as_deref(),
            Some(&["/usr/bin/hpp-provisioner".to_owned()][..]),
            "{dir}"
        );
        assert_eq!(
            c.args.as_deref(),
            Some(&["--mode".to_owned(), mode.as_str().to_owned()][..]),
            "{dir}"
        );
        assert!(
            parsed.accounts.contains(pod.service_account_name.as_ref().unwrap()),
            "{dir}: service account"
        );
        let name = env(pod, "PROVISIONER_NAME").unwrap_or(mode.default_provisioner_name());
        assert!(!parsed.classes.is_empty(), "{dir}: example StorageClass");
        for class in &parsed.classes {
            assert_eq!(class.provisioner, name, "{dir}");
            ClassParams::parse(class.parameters.as_ref()).unwrap_or_else(|e| panic!("{dir}: {e}"));
        }
        if mode.is_node_local() {
            let pv_dir = env(pod, "PV_DIR").expect("PV_DIR");
            let mounts = c.volume_mounts.as_ref().unwrap();
            assert!(
                mounts.iter().any(|m| m.mount_path == pv_dir),
                "{dir}: PV_DIR mounted at the same path"
            );
        }
        let rules = &parsed.cluster_rules;
        for (group, resource, verb) in [
            ("", "persistentvolumes", "create"),
            ("", "persistentvolumes", "delete"),
            ("", "persistentvolumes", "watch"),
            ("", "persistentvolumeclaims", "watch"),
            ("storage.k8s.io", "storageclasses", "get"),
            ("events.k8s.io", "events", "create"),
            ("events.k8s.io", "events", "patch"),
        ] {
            assert!(allows(rules, group, resource, verb), "{dir}: {verb} {resource}");
        }
        if mode.is_node_local() {
            assert!(allows(rules, "", "nodes", "get"), "{dir}: nodes get");
        }
        if leases {
            for verb in ["get", "create", "patch"] {
                assert!(
                    allows(&parsed.role_rules, "coordination.k8s.io", "leases", verb),
                    "{dir}: leases {verb}"
                );
            }
        }
    }
}

#[test]
fn selinux_unit_is_kept() {
    let unit = std::fs::read_to_string(legacy_dir().join("selinux/hostpath-provisioner.service")).unwrap();
    assert!(unit.contains("chcon -Rt container_file_t"));
}
