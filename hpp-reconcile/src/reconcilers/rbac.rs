//! Service accounts, ClusterRoles/Bindings and the Role/Binding of the CSI driver and of the
//! legacy provisioner, with KubeVirt's names and rules.

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject};

use super::common::{
    self, cluster_role_binding_kind, cluster_role_kind, role_binding_kind, role_kind, service_account_kind,
};
use crate::config::OperatorConfig;
use crate::error::Result;
use crate::facts::ClusterFacts;
use crate::names;
use crate::object::{DesiredObject, Kind};
use crate::permissions::{Permission, WRITE};
use crate::subreconciler::SubReconciler;

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// A policy rule over `resources` in `groups`.
pub fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(strings(groups)),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        ..Default::default()
    }
}

const READ: &[&str] = &["get", "list", "watch"];

/// Rules of the CSI driver's ClusterRole; `snapshotter` adds the csi-snapshotter's (see
/// [`runs_snapshotter`](super::csi_daemonset::runs_snapshotter)).
pub fn csi_cluster_rules(snapshotter: bool) -> Vec<PolicyRule> {
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
        // csi-resizer: claim status (allocated size, resize conditions) and the
        // VolumeAttributesClasses behind ControllerModifyVolume.
        rule(&[""], &["persistentvolumeclaims/status"], &["patch"]),
        rule(&["storage.k8s.io"], &["volumeattributesclasses"], READ),
    ];
    if snapshotter {
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
pub fn csi_role_rules() -> Vec<PolicyRule> {
    vec![
        // Leader election of the csi-resizer and the snapshotter.
        rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "list", "watch", "create", "update", "patch"],
        ),
        rule(
            &["storage.k8s.io"],
            &["csistoragecapacities"],
            &["get", "list", "watch", "delete", "update", "create"],
        ),
        rule(&[""], &["pods"], &["get"]),
    ]
}

/// Rules of the legacy provisioner's ClusterRole.
pub fn legacy_cluster_rules() -> Vec<PolicyRule> {
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

fn subject(sa: &str, ns: &str) -> Option<Vec<Subject>> {
    Some(vec![Subject {
        kind: "ServiceAccount".into(),
        name: sa.to_owned(),
        namespace: Some(ns.to_owned()),
        ..Default::default()
    }])
}

/// A reference to a Role or ClusterRole.
pub fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: kind.to_owned(),
        name: name.to_owned(),
    }
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
            common::typed_ssa(&ServiceAccount {
                metadata: common::object_meta(n, Some(&cfg.namespace), cfg, &[], Some(hpp)),
                ..Default::default()
            })
        })
        .collect()
}

/// The RBAC objects of the CSI driver and, with `pathConfig`, of the legacy provisioner.
pub fn desired_rbac(hpp: &HostPathProvisioner, cfg: &OperatorConfig) -> Result<Vec<DesiredObject>> {
    let ns = cfg.namespace.as_str();
    let cluster_meta = |name: &str| common::object_meta(name, None, cfg, &[], Some(hpp));
    let ns_meta = |name: &str| common::object_meta(name, Some(ns), cfg, &[], Some(hpp));
    let csi = names::CSI_SERVICE_ACCOUNT;
    let mut out = vec![
        common::typed_ssa(&ClusterRole {
            metadata: cluster_meta(csi),
            rules: Some(csi_cluster_rules(super::csi_daemonset::runs_snapshotter(hpp)?)),
            ..Default::default()
        })?,
        common::typed_ssa(&ClusterRoleBinding {
            metadata: cluster_meta(csi),
            role_ref: role_ref("ClusterRole", csi),
            subjects: subject(csi, ns),
        })?,
        common::typed_ssa(&Role {
            metadata: ns_meta(csi),
            rules: Some(csi_role_rules()),
        })?,
        common::typed_ssa(&RoleBinding {
            metadata: ns_meta(csi),
            role_ref: role_ref("Role", csi),
            subjects: subject(csi, ns),
        })?,
    ];
    if common::is_legacy(hpp) {
        let legacy = names::LEGACY_CLUSTER_ROLE;
        out.push(common::typed_ssa(&ClusterRole {
            metadata: cluster_meta(legacy),
            rules: Some(legacy_cluster_rules()),
            ..Default::default()
        })?);
        out.push(common::typed_ssa(&ClusterRoleBinding {
            metadata: cluster_meta(legacy),
            role_ref: role_ref("ClusterRole", legacy),
            subjects: subject(names::LEGACY_SERVICE_ACCOUNT, ns),
        })?);
    }
    Ok(out)
}

/// Sub-reconciler for the ServiceAccounts.
pub struct ServiceAccounts;

#[async_trait]
impl SubReconciler for ServiceAccounts {
    fn name(&self) -> &str {
        crate::names::STEP_SERVICE_ACCOUNTS
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        vec![service_account_kind()]
    }

    fn permissions(&self, _facts: &ClusterFacts) -> Vec<Permission> {
        vec![
            Permission::on(&service_account_kind(), &WRITE)
                .named([names::CSI_SERVICE_ACCOUNT, names::LEGACY_SERVICE_ACCOUNT])
                .because("service-accounts: the driver's and the legacy provisioner's accounts."),
        ]
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
        crate::names::STEP_RBAC
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        vec![
            cluster_role_kind(),
            cluster_role_binding_kind(),
            role_kind(),
            role_binding_kind(),
        ]
    }

    fn permissions(&self, _facts: &ClusterFacts) -> Vec<Permission> {
        let cluster = [names::CSI_SERVICE_ACCOUNT, names::LEGACY_CLUSTER_ROLE];
        let why = "rbac: the driver's and the legacy provisioner's roles. The operator does not hold the \
                   permissions it grants them: it may create those roles and bindings because of `escalate` \
                   and `bind` on their names only.";
        vec![
            Permission::on(&cluster_role_kind(), &WRITE).named(cluster).because(why),
            Permission::on(&cluster_role_binding_kind(), &WRITE)
                .named(cluster)
                .because(why),
            Permission::on(&cluster_role_kind(), &["escalate", "bind"])
                .named(cluster)
                .because(why),
            Permission::on(&role_kind(), &WRITE)
                .named([names::CSI_SERVICE_ACCOUNT])
                .because(why),
            Permission::on(&role_binding_kind(), &WRITE)
                .named([names::CSI_SERVICE_ACCOUNT])
                .because(why),
            Permission::on(&role_kind(), &["escalate", "bind"])
                .named([names::CSI_SERVICE_ACCOUNT])
                .because(why),
        ]
    }

    fn desired(&self, hpp: &HostPathProvisioner, cfg: &OperatorConfig, _: &ClusterFacts) -> Result<Vec<DesiredObject>> {
        desired_rbac(hpp, cfg)
    }
}
