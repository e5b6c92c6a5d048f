//! Monitoring objects (PrometheusRule with KubeVirt's alerts, metrics Service, ServiceMonitor and
//! the monitoring Role/Binding), only when discovery finds the prometheus-operator API.

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use hpp_api::constants as c;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding, Subject};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::rbac::{role_ref, rule};

use super::common::{self, prometheus_rule_kind, role_binding_kind, role_kind, service_kind, service_monitor_kind};
use crate::config::OperatorConfig;
use crate::error::Result;
use crate::facts::ClusterFacts;
use crate::names;
use crate::object::{DesiredObject, Kind};
use crate::permissions::{Permission, WRITE};
use crate::subreconciler::SubReconciler;

/// Service account Prometheus scrapes with.
pub const PROMETHEUS_SERVICE_ACCOUNT: &str = "prometheus-k8s";

fn alert(
    cfg: &OperatorConfig,
    name: &str,
    expr: &str,
    for_: &str,
    summary: &str,
    severity: &str,
    impact: &str,
) -> Value {
    json!({
        "alert": name,
        "expr": expr,
        "for": for_,
        "annotations": { "summary": summary, "runbook_url": cfg.runbook_url(name) },
        "labels": {
            "severity": severity,
            "operator_health_impact": impact,
            "kubernetes_operator_part_of": "kubevirt",
            "kubernetes_operator_component": "hostpath-provisioner-operator",
        },
    })
}

/// The rule groups of `prometheus-hpp-rules`.
pub fn rule_groups(cfg: &OperatorConfig) -> Value {
    let up = format!(
        "sum(up{{namespace='{}', pod=~'hostpath-provisioner-operator-.*'}} or vector(0))",
        cfg.namespace
    );
    json!([
        {
            "name": "recordingRules.rules",
            "rules": [
                { "record": "kubevirt_hpp_operator_up", "expr": up },
                { "record": "cluster:kubevirt_hpp_operator_up:sum", "expr": up },
            ],
        },
        {
            "name": "alerts.rules",
            "rules": [
                alert(cfg, "HPPOperatorDown", "cluster:kubevirt_hpp_operator_up:sum == 0", "5m",
                    "Hostpath Provisioner operator is down", "warning", "critical"),
                alert(cfg, "HPPNotReady", "kubevirt_hpp_cr_ready == 0", "5m",
                    "Hostpath Provisioner is not available to use", "warning", "critical"),
                alert(cfg, "HPPSharingPoolPathWithOS", "kubevirt_hpp_pool_path_shared_with_os == 1", "1m",
                    "HPP pool path sharing a filesystem with OS, fix to prevent HPP PVs from causing disk pressure and affecting node operation",
                    "warning", "warning"),
            ],
        },
    ])
}

/// The desired monitoring objects, or none without the prometheus-operator API.
pub fn desired_monitoring(
    hpp: &HostPathProvisioner,
    cfg: &OperatorConfig,
    facts: &ClusterFacts,
) -> Result<Vec<DesiredObject>> {
    if !facts.has_prometheus {
        return Ok(vec![]);
    }
    let ns = cfg.namespace.as_str();
    let prom = [(c::LABEL_PROMETHEUS, "true")];
    Ok(vec![
        common::ssa(
            prometheus_rule_kind(),
            json!({ "metadata": common::meta(names::PROMETHEUS_RULE, Some(ns), cfg, &prom, Some(hpp)), "spec": { "groups": rule_groups(cfg) } }),
        )?,
        common::typed_ssa(&Role {
            metadata: common::object_meta(names::MONITORING_ROLE, Some(ns), cfg, &[], Some(hpp)),
            rules: Some(vec![rule(
                &[""],
                &["services", "endpoints", "pods"],
                &["get", "list", "watch"],
            )]),
        })?,
        common::typed_ssa(&RoleBinding {
            metadata: common::object_meta(names::MONITORING_ROLE, Some(ns), cfg, &[], Some(hpp)),
            role_ref: role_ref("Role", names::MONITORING_ROLE),
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: PROMETHEUS_SERVICE_ACCOUNT.into(),
                namespace: Some(cfg.monitoring_namespace.clone()),
                ..Default::default()
            }]),
        })?,
        common::typed_ssa(&Service {
            metadata: common::object_meta(names::METRICS_SERVICE, Some(ns), cfg, &prom, Some(hpp)),
            spec: Some(ServiceSpec {
                type_: Some("ClusterIP".into()),
                selector: Some(BTreeMap::from([(c::LABEL_PROMETHEUS.to_owned(), "true".to_owned())])),
                ports: Some(vec![ServicePort {
                    name: Some("metrics".into()),
                    port: 8443,
                    protocol: Some("TCP".into()),
                    target_port: Some(IntOrString::String("metrics".into())),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        })?,
        common::ssa(
            service_monitor_kind(),
            json!({
                "metadata": common::meta(names::SERVICE_MONITOR, Some(ns), cfg,
                    &[(c::LABEL_PROMETHEUS, "true"), ("openshift.io/cluster-monitoring", "")], Some(hpp)),
                "spec": {
                    "namespaceSelector": { "matchNames": [ns] },
                    "selector": { "matchLabels": { c::LABEL_PROMETHEUS: "true" } },
                    // No `tlsConfig.minVersion`: ServiceMonitor CRDs of older prometheus-operators
                    // do not declare it, and server-side apply then fails the whole pass
                    // ("field not declared in schema"). The driver enforces its own minimum
                    // (`--metrics-tls-version`, which may be TLS 1.2 under the cluster policy).
                    "endpoints": [{
                        "port": "metrics",
                        "scheme": "https",
                        "tlsConfig": { "insecureSkipVerify": true },
                    }],
                },
            }),
        )?,
    ])
}

/// Sub-reconciler for the monitoring objects.
pub struct Prometheus;

#[async_trait]
impl SubReconciler for Prometheus {
    fn name(&self) -> &str {
        crate::names::STEP_PROMETHEUS
    }

    fn kinds(&self, facts: &ClusterFacts) -> Vec<Kind> {
        let mut kinds = vec![role_kind(), role_binding_kind(), service_kind()];
        if facts.has_prometheus {
            kinds.extend([prometheus_rule_kind(), service_monitor_kind()]);
        }
        kinds
    }

    fn permissions(&self, facts: &ClusterFacts) -> Vec<Permission> {
        let why = "prometheus: the metrics Service and the Role that lets Prometheus read it.";
        let mut out = vec![
            Permission::on(&service_kind(), &WRITE)
                .named([names::METRICS_SERVICE])
                .because(why),
            Permission::on(&role_kind(), &WRITE)
                .named([names::MONITORING_ROLE])
                .because(why),
            Permission::on(&role_binding_kind(), &WRITE)
                .named([names::MONITORING_ROLE])
                .because(why),
            Permission::on(&role_kind(), &["escalate", "bind"])
                .named([names::MONITORING_ROLE])
                .because(why),
        ];
        if facts.has_prometheus {
            let why = "prometheus: the alerting rules and the ServiceMonitor (Prometheus Operator).";
            out.push(
                Permission::on(&prometheus_rule_kind(), &WRITE)
                    .named([names::PROMETHEUS_RULE])
                    .because(why),
            );
            out.push(
                Permission::on(&service_monitor_kind(), &WRITE)
                    .named([names::SERVICE_MONITOR])
                    .because(why),
            );
        }
        out
    }

    fn desired(
        &self,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
    ) -> Result<Vec<DesiredObject>> {
        desired_monitoring(hpp, cfg, facts)
    }
}
