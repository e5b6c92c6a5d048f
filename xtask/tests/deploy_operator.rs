//! `deploy/operator/`: the manifests parse into their types, the operator's RBAC grants every
//! call the operator makes on the kinds its pipeline manages, and no wildcard, and the metrics
//! scrape reaches the operator Deployment as the operator renders the rest.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::net::SocketAddr;
use std::path::PathBuf;

use hpp_reconcile::Pipeline;
use hpp_reconcile::facts::ClusterFacts;
use hpp_testkit::{Access, RbacPolicy};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn docs(file: &str) -> Vec<Value> {
    let path = repo().join("deploy/operator").join(file);
    serde_saphyr::from_str_multiple(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn of_kind<T: serde::de::DeserializeOwned>(docs: &[Value], kind: &str) -> T {
    let doc = docs
        .iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"));
    serde_json::from_value(doc.clone()).unwrap()
}

/// Whether `rules` grant `verb` on every object of `group/resource` (no `resourceNames`), by
/// the testkit's matcher, the one the fake API server enforces.
fn allows(rules: &[PolicyRule], group: &str, resource: &str, verb: &str) -> bool {
    RbacPolicy::new()
        .cluster_rules(rules.iter().cloned())
        .allows(&Access::new(verb, group, resource))
}

#[test]
fn rbac_covers_every_managed_kind_without_wildcards() {
    let rbac = docs("rbac.yaml");
    let cluster: ClusterRole = of_kind(&rbac, "ClusterRole");
    let role: Role = of_kind(&rbac, "Role");
    let cluster_rules = cluster.rules.unwrap();
    let role_rules = role.rules.unwrap();
    for r in cluster_rules.iter().chain(&role_rules) {
        assert!(!r.verbs.iter().any(|v| v == "*"), "wildcard verb in {r:?}");
        assert!(
            !r.resources.iter().flatten().any(|x| x == "*"),
            "wildcard resource in {r:?}"
        );
    }
    let facts = ClusterFacts {
        has_scc: true,
        has_prometheus: true,
        ..Default::default()
    };
    let kinds = Pipeline::standard().kinds(&facts);
    assert!(kinds.len() >= 14, "{kinds:?}");
    for kind in kinds {
        let rules = if kind.namespaced { &role_rules } else { &cluster_rules };
        for verb in ["get", "list", "watch", "create"] {
            assert!(
                allows(rules, &kind.group, &kind.plural, verb),
                "{verb} {}/{} not granted",
                kind.group,
                kind.plural
            );
        }
        // patch/delete are granted on hpp's own names: deploy_least_privilege.rs checks them for
        // every object the operator renders.
    }
    for (group, resource, verb) in [
        ("hostpathprovisioner.kubevirt.io", "hostpathprovisioners", "patch"),
        (
            "hostpathprovisioner.kubevirt.io",
            "hostpathprovisioners/status",
            "patch",
        ),
        ("", "nodes", "watch"),
        ("events.k8s.io", "events", "create"),
    ] {
        assert!(
            allows(&cluster_rules, group, resource, verb),
            "{verb} {group}/{resource}"
        );
    }
    // Leader election reads, creates and updates its Lease (never patches it).
    let lease = |verb| {
        let access = Access::new(verb, "coordination.k8s.io", "leases")
            .in_namespace("hostpath-provisioner")
            .named("hostpath-provisioner-operator-lock");
        RbacPolicy::new()
            .namespace_rules("hostpath-provisioner", role_rules.iter().cloned())
            .allows(&access)
    };
    assert!(lease("get") && lease("create") && lease("update") && !lease("patch"));
    // Every fact source is read and watched (PVs, StorageClasses and CSIStorageCapacity feed
    // the pool status).
    for (kind, _selector) in hpp_reconcile::fact_sources() {
        let rules = if kind.namespaced { &role_rules } else { &cluster_rules };
        for verb in ["get", "list", "watch"] {
            assert!(
                allows(rules, &kind.group, &kind.plural, verb),
                "{verb} {}/{} not granted for the facts",
                kind.group,
                kind.plural
            );
        }
    }
    // The operator never holds the driver's PersistentVolume write permissions itself.
    assert!(!allows(&cluster_rules, "", "persistentvolumes", "create"));
    assert!(!allows(&cluster_rules, "", "persistentvolumes", "update"));
    // Node loss: delete claims and PVs of lost nodes, patch the provisioner's finalizer away,
    // read the CR's stored status; cluster-wide (see the rule's comment).
    for (resource, verb) in [
        ("persistentvolumes", "delete"),
        ("persistentvolumes", "patch"),
        ("persistentvolumeclaims", "delete"),
    ] {
        assert!(
            allows(&cluster_rules, "", resource, verb),
            "{verb} {resource} (node loss)"
        );
    }
    assert!(allows(
        &cluster_rules,
        "hostpathprovisioner.kubevirt.io",
        "hostpathprovisioners",
        "get"
    ));
}

#[test]
fn deployment_runs_the_operator_with_an_optional_webhook_secret() {
    let dep: Deployment = of_kind(&docs("deployment.yaml"), "Deployment");
    let pod = dep.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("hostpath-provisioner-operator")
    );
    let c = &pod.containers[0];
    assert_eq!(c.command.as_ref().unwrap()[..2], ["/usr/bin/hpp-operator", "run"]);
    let env: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
    for var in [
        "CSI_PROVISIONER_IMAGE",
        "NODE_DRIVER_REG_IMAGE",
        "LIVENESS_PROBE_IMAGE",
        "CSI_SIG_STORAGE_PROVISIONER_IMAGE",
        "CSI_SNAPSHOT_IMAGE",
        "CSI_RESIZER_IMAGE",
        "PROVISIONER_IMAGE",
        "OPERATOR_IMAGE",
        "POD_NAMESPACE",
    ] {
        assert!(env.contains(&var), "{var}");
    }
    // The default version (hpp-v…), which neither operator reads as a downgrade of the other.
    assert!(
        !env.contains(&"OPERATOR_VERSION"),
        "an explicit semver OPERATOR_VERSION would strand KubeVirt's operator on the way back"
    );
    let secret = pod.volumes.unwrap()[0].secret.clone().unwrap();
    assert_eq!(secret.optional, Some(true));
    assert_eq!(
        secret.secret_name.as_deref(),
        Some("hostpath-provisioner-operator-webhook-service-cert")
    );
}

/// The scrape path end to end, from the manifests: the metrics Service's selector picks the
/// operator Deployment and the CSI DaemonSet, each exposes the Service's `targetPort` by name
/// on the port its HTTPS listener uses by default, no container opts out of HTTPS, and the
/// ServiceMonitor asks for nothing the servers refuse (they always accept TLS 1.3).
#[test]
fn prometheus_objects_reach_an_https_metrics_port_on_every_scraped_pod() {
    use clap::Parser;
    let example = repo().join("deploy/examples/hostpathprovisioner_cr.yaml");
    let args = hpp_bin::operator::Args::parse_from([
        "hpp-operator",
        "render",
        "--prometheus",
        "-f",
        example.to_str().unwrap(),
    ]);
    let Some(hpp_bin::operator::Command::Render(r)) = args.command else {
        panic!("render expected")
    };
    let rendered: Vec<Value> = hpp_bin::operator::render::render(&r).unwrap().objects;
    let operator = of_kind::<Value>(&docs("deployment.yaml"), "Deployment");
    let find = |kind: &str, name: &str| {
        rendered
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name} not rendered"))
            .clone()
    };
    let service = find("Service", hpp_reconcile::names::METRICS_SERVICE);
    let port = &service["spec"]["ports"][0];
    let target = port["targetPort"].as_str().unwrap();
    let monitor = find("ServiceMonitor", hpp_reconcile::names::SERVICE_MONITOR);
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], port["name"]);
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(endpoint["tlsConfig"]["insecureSkipVerify"], true);
    // No minVersion: older ServiceMonitor CRDs do not declare it, and server-side apply
    // would fail the whole pass; the driver enforces its own TLS minimum.
    assert!(endpoint["tlsConfig"].get("minVersion").is_none());
    let selector = service["spec"]["selector"].as_object().unwrap();
    let daemonset = rendered
        .iter()
        .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["name"] == hpp_reconcile::names::CSI_DAEMONSET)
        .unwrap()
        .clone();
    let defaults = hpp_bin::operator::Args::parse_from(["hpp-operator"]).run;
    for (workload, default_port) in [(&operator, defaults.metrics.addr.port()), (&daemonset, 8443)] {
        let pod = &workload["spec"]["template"];
        for (k, v) in selector {
            assert_eq!(&pod["metadata"]["labels"][k], v, "{}", workload["metadata"]["name"]);
        }
        let containers = pod["spec"]["containers"].as_array().unwrap();
        let exposing: Vec<&Value> = containers
            .iter()
            .filter(|c| {
                c["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["name"] == target && p["containerPort"] == default_port)
            })
            .collect();
        assert_eq!(exposing.len(), 1, "{}: port {target}", workload["metadata"]["name"]);
        let command_line = serde_json::to_string(&exposing[0]["args"]).unwrap();
        assert!(!command_line.contains("insecure-http"), "{command_line}");
        assert!(
            !command_line.contains("--metrics-address"),
            "keeps the default port: {command_line}"
        );
        for env in exposing[0]["env"].as_array().into_iter().flatten() {
            if env["name"] == "HPP_METRICS_ADDR" {
                let addr: SocketAddr = env["value"].as_str().unwrap().parse().unwrap();
                assert_eq!(addr.port(), default_port);
            }
        }
    }
}
