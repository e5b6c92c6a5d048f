//! Helpers shared by the builders: kinds, metadata, owner references and placement.

use std::collections::BTreeMap;

use hpp_api::HostPathProvisioner;
use hpp_api::constants as c;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, EnvVarSource, HostPathVolumeSource, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, ObjectFieldSelector, PersistentVolumeClaim, PodSpec, ResourceRequirements, Service,
    ServiceAccount, Volume,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Resource;
use kube::api::ObjectMeta;
use serde_json::{Value, json};

use crate::config::OperatorConfig;
use crate::error::Result;
use crate::names;
use crate::object::{ApplyStrategy, DesiredObject, Kind, StaticScope};

/// Namespaced DaemonSets.
pub fn daemonset_kind() -> Kind {
    Kind::of::<DaemonSet>()
}
/// Namespaced Deployments.
pub fn deployment_kind() -> Kind {
    Kind::of::<Deployment>()
}
/// Namespaced Jobs.
pub fn job_kind() -> Kind {
    Kind::of::<Job>()
}
/// Namespaced PVCs.
pub fn pvc_kind() -> Kind {
    Kind::of::<PersistentVolumeClaim>()
}
/// Namespaced ServiceAccounts.
pub fn service_account_kind() -> Kind {
    Kind::of::<ServiceAccount>()
}
/// Namespaced Services.
pub fn service_kind() -> Kind {
    Kind::of::<Service>()
}
/// ClusterRoles.
pub fn cluster_role_kind() -> Kind {
    Kind::of::<ClusterRole>()
}
/// ClusterRoleBindings.
pub fn cluster_role_binding_kind() -> Kind {
    Kind::of::<ClusterRoleBinding>()
}
/// Namespaced Roles.
pub fn role_kind() -> Kind {
    Kind::of::<Role>()
}
/// Namespaced RoleBindings.
pub fn role_binding_kind() -> Kind {
    Kind::of::<RoleBinding>()
}
/// CSIDrivers.
pub fn csi_driver_kind() -> Kind {
    Kind::of::<CSIDriver>()
}
/// StorageClasses.
pub fn storage_class_kind() -> Kind {
    Kind::of::<StorageClass>()
}
/// OpenShift SecurityContextConstraints (found by discovery).
pub fn scc_kind() -> Kind {
    Kind::dynamic(
        "security.openshift.io",
        "v1",
        "SecurityContextConstraints",
        "securitycontextconstraints",
        false,
    )
}
/// prometheus-operator PrometheusRule (found by discovery).
pub fn prometheus_rule_kind() -> Kind {
    Kind::dynamic("monitoring.coreos.com", "v1", "PrometheusRule", "prometheusrules", true)
}
/// prometheus-operator ServiceMonitor (found by discovery).
pub fn service_monitor_kind() -> Kind {
    Kind::dynamic("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors", true)
}

/// Controller owner reference to the CR, when it has a UID (absent when rendering offline).
pub fn owner_refs(hpp: &HostPathProvisioner) -> Value {
    match hpp.controller_owner_ref(&()) {
        Some(r) => json!([r]),
        None => Value::Null,
    }
}

/// Object metadata as JSON with the common labels plus `extra`, for kinds without types.
pub fn meta(
    name: &str,
    namespace: Option<&str>,
    cfg: &OperatorConfig,
    extra: &[(&str, &str)],
    owner: Option<&HostPathProvisioner>,
) -> Value {
    let mut labels = names::common_labels(cfg);
    for (k, v) in extra {
        labels.insert((*k).to_owned(), (*v).to_owned());
    }
    let mut m = json!({ "name": name, "labels": labels });
    if let Some(ns) = namespace {
        m["namespace"] = json!(ns);
    }
    if let Some(hpp) = owner {
        let refs = owner_refs(hpp);
        if !refs.is_null() {
            m["ownerReferences"] = refs;
        }
    }
    m
}

/// Common labels as a JSON map (for pod templates).
pub fn labels_value(cfg: &OperatorConfig, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut labels = names::common_labels(cfg);
    for (k, v) in extra {
        labels.insert((*k).to_owned(), (*v).to_owned());
    }
    labels
}

/// Builds a server-side-applied object of a kind without k8s-openapi types (SCC, Prometheus).
pub fn ssa(kind: Kind, value: Value) -> Result<DesiredObject> {
    DesiredObject::from_value(kind, value, ApplyStrategy::ServerSideApply)
}

/// The CR's image pull policy, or IfNotPresent.
pub fn pull_policy(hpp: &HostPathProvisioner) -> String {
    hpp.spec
        .image_pull_policy
        .clone()
        .unwrap_or_else(|| "IfNotPresent".into())
}

/// Whether the CR runs the legacy provisioner (`pathConfig` set).
pub fn is_legacy(hpp: &HostPathProvisioner) -> bool {
    hpp.spec.path_config.is_some()
}

/// Whether a feature gate is on.
pub fn gate(hpp: &HostPathProvisioner, name: &str) -> bool {
    hpp.spec
        .feature_gates
        .as_ref()
        .is_some_and(|g| g.iter().any(|x| x == name))
}

/// Whether the `Snapshotting` gate is on.
pub fn snapshotting(hpp: &HostPathProvisioner) -> bool {
    gate(hpp, c::FEATURE_GATE_SNAPSHOTTING)
}

/// A pod spec with the placement fields of `spec.workload` (nodeSelector, tolerations, affinity).
pub fn placed(hpp: &HostPathProvisioner, spec: PodSpec) -> PodSpec {
    let w = hpp.spec.workload.clone().unwrap_or_default();
    PodSpec {
        node_selector: w.node_selector,
        tolerations: w.tolerations,
        affinity: w.affinity,
        ..spec
    }
}

/// An environment variable from a field of the pod (`spec.nodeName`, `status.podIP`, ...).
pub fn env_from_field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: Some("v1".into()),
                field_path: path.to_owned(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An environment variable with a literal value.
pub fn env_value(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        ..Default::default()
    }
}

/// Typed object metadata with the common labels plus `extra`, and the CR as controller owner
/// when `owner` is given (and has a UID).
pub fn object_meta(
    name: &str,
    namespace: Option<&str>,
    cfg: &OperatorConfig,
    extra: &[(&str, &str)],
    owner: Option<&HostPathProvisioner>,
) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(labels_value(cfg, extra)),
        owner_references: owner.and_then(|h| h.controller_owner_ref(&())).map(|r| vec![r]),
        ..Default::default()
    }
}

/// The selector of hpp's DaemonSets: the `app` label every pod of theirs carries.
pub fn app_selector() -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(
            c::LABEL_APP.to_owned(),
            c::LABEL_APP_VALUE.to_owned(),
        )])),
        ..Default::default()
    }
}

/// Pod template metadata: the common labels plus `extra`, and the SCC the pods need.
pub fn template_meta(cfg: &OperatorConfig, extra: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        labels: Some(labels_value(cfg, extra)),
        annotations: Some(BTreeMap::from([(
            "openshift.io/required-scc".to_owned(),
            names::CSI_SCC.to_owned(),
        )])),
        ..Default::default()
    }
}

/// A typed object kept in line by server-side apply.
pub fn typed_ssa<K>(obj: &K) -> Result<DesiredObject>
where
    K: Resource<DynamicType = ()> + serde::Serialize,
    K::Scope: StaticScope,
{
    DesiredObject::typed(obj, ApplyStrategy::ServerSideApply)
}

/// A typed object created once and never changed.
pub fn typed_create_only<K>(obj: &K) -> Result<DesiredObject>
where
    K: Resource<DynamicType = ()> + serde::Serialize,
    K::Scope: StaticScope,
{
    DesiredObject::typed(obj, ApplyStrategy::CreateOnly)
}

/// A required node affinity pinning a pod to one node by hostname, typed.
pub fn node_pin(node: &str) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: "kubernetes.io/hostname".into(),
                        operator: "In".into(),
                        values: Some(vec![node.to_owned()]),
                    }]),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A `hostPath` volume.
pub fn host_path_volume(name: &str, path: &str, type_: &str) -> Volume {
    Volume {
        name: name.to_owned(),
        host_path: Some(HostPathVolumeSource {
            path: path.to_owned(),
            type_: Some(type_.to_owned()),
        }),
        ..Default::default()
    }
}

/// Resource requests of `cpu` and `memory`.
pub fn requests(cpu: &str, memory: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.to_owned())),
            ("memory".to_owned(), Quantity(memory.to_owned())),
        ])),
        ..Default::default()
    }
}
