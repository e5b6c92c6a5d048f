//! Service accounts, ClusterRoles/Bindings and the Role/Binding of the CSI driver and of the
//! legacy provisioner, with KubeVirt's names and rules.

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use serde_json::{Value, json};

use super::common::{
    self, cluster_role_binding_kind, cluster_role_kind, role_binding_kind, role_kind, service_account_kind,
};
use crate::config::OperatorConfig;
use crate::error::Result;
use crate::facts::ClusterFacts;
use crate::names;
use crate::object::{DesiredObject, Kind};
use crate::subreconciler::SubReconciler;

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({ "apiGroups": groups, "resources": resources, "verbs": verbs })
}

const READ: &[&str] = &["get", "list", "watch"];

/// Rules of the CSI driver's ClusterRole.
pub fn csi_cluster_rules(snapshotting: bool) -> Vec<Value> {
    let mut rules = vec![
        rule(
            &[""],
            &["persistentvolumes"],
            &["get", "list", "watch", "create", "delete", "patch"],
        ),
        rule(&[""], &["persistentvolumeclaims"], &["get", "list", "watch", "update"]),
        rule(
            &["storage.k8s.io"],
            &["storageclasses"],
            &["get", "list", "watch", "create"],
        ),
        rule(&[""], &["events"], &["list", "watch", "create", "patch", "update"]),
        rule(&["storage.k8s.io"], &["csinodes"], READ),
        rule(&[""], &["nodes"], READ),
        rule(
            &["storage.k8s.io"],
            &["volumeattachments"],
            &["get", "list", "watch", "patch"],
        ),
        rule(&["storage.k8s.io"], &["volumeattachments/status"], &["patch"]),
    ];
    if snapshotting {
        rules.extend([
            rule(&["snapshot.storage.k8s.io"], &["volumesnapshotclasses"], READ),
            rule(&["snapshot.storage.k8s.io"], &["volumesnapshots"], &["get"]),
            rule(
                &["snapshot.storage.k8s.io"],
                &["volumesnapshotcontents"],
                &["create", "get", "list", "watch", "update", "delete", "patch"],
            ),
            rule(
                &["snapshot.storage.k8s.io"],
                &["volumesnapshotcontents/status"],
                &["update", "patch"],
            ),
        ]);
    }
    rules
}

/// Rules of the CSI driver's namespaced Role (leader election, capacity objects, owner lookup).
pub fn csi_role_rules() -> Vec<Value> {
    vec![
        rule(&["coordination.k8s.io"], &["leases"], &["get", "update", "create"]),
        rule(
            &["storage.k8s.io"],
            &["csistoragecapacities"],
            &["get", "list", "watch", "delete", "update", "create"],
        ),
        rule(&[""], &["pods"], &["get"]),
    ]
}

/// Rules of the legacy provisioner's ClusterRole.
pub fn legacy_cluster_rules() -> Vec<Value> {
    vec![
        rule(
            &[""],
            &["persistentvolumes"],
            &["get", "list", "watch", "create", "delete"],
        ),
        rule(&[""], &["persistentvolumeclaims"], &["get", "list", "watch", "update"]),
        rule(&["storage.k8s.io"], &["storageclasses"], READ),
        rule(&[""], &["events"], &["list", "watch", "create", "update", "patch"]),
        // hpp-provisioner records Events through events.k8s.io/v1.
        rule(&["events.k8s.io"], &["events"], &["create", "patch", "update"]),
        rule(&[""], &["nodes"], &["get"]),
    ]
}

fn subject(sa: &str, ns: &str) -> Value {
    json!([{ "kind": "ServiceAccount", "name": sa, "namespace": ns }])
}

/// The ServiceAccounts: the CSI one always, the legacy one with `pathConfig`.
pub fn desired_service_accounts(hpp: &HostPathProvisioner, cfg: &OperatorConfig) -> Result<Vec<DesiredObject>> {
    let mut names_ = vec![names::CSI_SERVICE_ACCOUNT];
    if common::is_legacy(hpp) {
        names_.push(names::LEGACY_SERVICE_ACCOUNT);
    }
    names_
        .into_iter()
        .map(|n| {
            common::ssa(
                service_account_kind(),
                json!({ "metadata": common::meta(n, Some(&cfg.namespace), cfg, &[], Some(hpp)) }),
            )
        })
        .collect()
}

/// The RBAC objects of the CSI driver and, with `pathConfig`, of the legacy provisioner.
pub fn desired_rbac(hpp: &HostPathProvisioner, cfg: &OperatorConfig) -> Result<Vec<DesiredObject>> {
    let ns = cfg.namespace.as_str();
    let cluster_meta = |name: &str| common::meta(name, None, cfg, &[], Some(hpp));
    let ns_meta = |name: &str| common::meta(name, Some(ns), cfg, &[], Some(hpp));
    let role_ref =
        |kind: &str, name: &str| json!({ "apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name });
    let csi = names::CSI_SERVICE_ACCOUNT;
    let mut out = vec![
        common::ssa(
            cluster_role_kind(),
            json!({ "metadata": cluster_meta(csi), "rules": csi_cluster_rules(common::snapshotting(hpp)) }),
        )?,
        common::ssa(
            cluster_role_binding_kind(),
            json!({ "metadata": cluster_meta(csi), "roleRef": role_ref("ClusterRole", csi), "subjects": subject(csi, ns) }),
        )?,
        common::ssa(
            role_kind(),
            json!({ "metadata": ns_meta(csi), "rules": csi_role_rules() }),
        )?,
        common::ssa(
            role_binding_kind(),
            json!({ "metadata": ns_meta(csi), "roleRef": role_ref("Role", csi), "subjects": subject(csi, ns) }),
        )?,
    ];
    if common::is_legacy(hpp) {
        let legacy = names::LEGACY_CLUSTER_ROLE;
        out.push(common::ssa(
            cluster_role_kind(),
            json!({ "metadata": cluster_meta(legacy), "rules": legacy_cluster_rules() }),
        )?);
        out.push(common::ssa(
            cluster_role_binding_kind(),
            json!({
                "metadata": cluster_meta(legacy),
                "roleRef": role_ref("ClusterRole", legacy),
                "subjects": subject(names::LEGACY_SERVICE_ACCOUNT, ns),
            }),
        )?);
    }
    Ok(out)
}

/// Sub-reconciler for the ServiceAccounts.
pub struct ServiceAccounts;

#[async_trait]
impl SubReconciler for ServiceAccounts {
    fn name(&self) -> &str {
        "service-accounts"
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        vec![service_account_kind()]
    }

    fn desired(&self, hpp: &HostPathProvisioner, cfg: &OperatorConfig, _: &ClusterFacts) -> Result<Vec<DesiredObject>> {
        desired_service_accounts(hpp, cfg)
    }
}

/// Sub-reconciler for ClusterRoles, ClusterRoleBindings, Roles and RoleBindings.
pub struct Rbac;

#[async_trait]
impl SubReconciler for Rbac {
    fn name(&self) -> &str {
        "rbac"
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        vec![
            cluster_role_kind(),
            cluster_role_binding_kind(),
            role_kind(),
            role_binding_kind(),
        ]
    }

    fn desired(&self, hpp: &HostPathProvisioner, cfg: &OperatorConfig, _: &ClusterFacts) -> Result<Vec<DesiredObject>> {
        desired_rbac(hpp, cfg)
    }
}
