//! The operator's RBAC, derived from what it runs: the framework and the standard pipeline
//! ([`hpp_reconcile::permissions`]), the admission webhook it serves in-process, the OpenShift
//! TLS profile it follows and its leader election Lease. `hpp-operator render --rbac` prints
//! it; `deploy/operator/rbac.yaml` is that output (`xtask/tests/deploy_operator_rbac.rs` keeps
//! them equal).

use hpp_reconcile::permissions::{READ, Scope};
use hpp_reconcile::{OperatorRules, Permission, Pipeline};

/// Name of the operator's ServiceAccount, ClusterRole, Role and bindings.
pub const ACCOUNT: &str = "hostpath-provisioner-operator";

/// The comment at the top of the rendered RBAC.
const HEADER: &str = "\
RBAC of the hpp operator, generated from what it runs: the framework, the standard pipeline's
steps (what each owns, reads and declares it calls), the admission webhook it serves, the
OpenShift TLS profile it follows and its leader election. Do not edit: `hpp-operator render
--rbac` prints it, and `HPP_BLESS=1 cargo test -p xtask --test deploy_operator_rbac` rewrites
this file (the test fails while they differ).

The operator does not hold the permissions it grants to the CSI driver and the legacy
provisioner: it may create those roles and bindings because of `escalate`/`bind` on their
names only.

Least privilege (checked by xtask/tests/deploy_least_privilege.rs): update, patch and delete
are restricted with `resourceNames` to hpp's own objects. Reads are not (the operator lists and
watches whole kinds), and neither is `create`: Kubernetes cannot restrict create by name,
because the name is not part of the authorization request for a create. Objects whose names
derive from pool and node names (mounter Deployments, pool PVCs, cleanup Jobs) live in the
operator's own namespace and are listed in the test's allow-list with that reason.";

/// What the operator process calls besides its pipeline: the webhook's cluster checks, the
/// OpenShift TLS profile and the leader election Lease in `namespace`.
pub fn process_permissions(namespace: &str) -> Vec<Permission> {
    let mut out = vec![
        Permission::resource(
            "hostpathprovisioner.kubevirt.io",
            "hostpathprovisioners",
            Scope::Cluster,
            &["list"],
        )
        .because("The admission webhook refuses a second HostPathProvisioner (it lists them)."),
        Permission::resource("", "persistentvolumes", Scope::Cluster, &["list"])
            .because("The admission webhook's delete guard: PersistentVolumes still provisioned by hpp."),
        Permission::resource("config.openshift.io", "apiservers", Scope::Cluster, &READ)
            .because("OpenShift: the cluster's TLS profile, for the webhook and the driver's --metrics-tls-version."),
    ];
    out.extend(super::leader::settings(namespace, "").permissions());
    out
}

/// Every rule the operator needs, with `namespace` as its own.
pub fn rules(namespace: &str) -> OperatorRules {
    OperatorRules::for_pipeline(&Pipeline::standard()).with(process_permissions(namespace))
}

/// The operator's ServiceAccount, roles and bindings in `namespace`, as commented YAML.
pub fn yaml(namespace: &str) -> String {
    rules(namespace).to_yaml(ACCOUNT, namespace, HEADER)
}
