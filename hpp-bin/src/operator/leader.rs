//! The operator's Lease (KubeVirt's lock name), so only one operator replica reconciles. The
//! election itself is `hpp_reconcile::leader`, shared with the legacy provisioner.

use hpp_reconcile::leader::LeaseSettings;

/// KubeVirt's leader-election lock name, kept so an upgrade does not run two leaders.
pub const LEASE_NAME: &str = "hostpath-provisioner-operator-lock";

/// The operator's lease in `namespace`, held by `identity` (15 s lease, renewed 5 s early).
pub fn settings(namespace: &str, identity: &str) -> LeaseSettings {
    LeaseSettings::new(LEASE_NAME, namespace, identity).with_field_manager("hpp-operator/leader")
}
