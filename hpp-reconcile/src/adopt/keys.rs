//! The annotations adoption records its progress in, and the new PV's name. Every step leaves
//! its mark on an object before the next step depends on it, so a run that stops anywhere is
//! finished (or undone) by the next run from what the objects say.

/// On the old PV (with the Retain policy, step 1): the new PV it is being adopted into.
pub const ADOPT_INTO: &str = "hostpathprovisioner.kubevirt.io/adopt-into";
/// On the old PV (step 1) and the new PV: the reclaim policy the old PV had, which the new PV
/// takes once adopted, and the old PV gets back if the adoption is undone.
pub const RECLAIM_POLICY: &str = "hostpathprovisioner.kubevirt.io/adopt-reclaim-policy";
/// On the old and new PVs: the uid of the claim being adopted (the claim as it was).
pub const CLAIM_UID: &str = "hostpathprovisioner.kubevirt.io/adopt-claim-uid";
/// On the new PV: the claim to create, as JSON (name, labels, annotations, owners, spec),
/// written before the old claim is deleted so that nothing of it is lost in between.
pub const CLAIM_TEMPLATE: &str = "hostpathprovisioner.kubevirt.io/adopt-claim";
/// On the new PV: `Pending` until the last step, then `Adopted`.
pub const STATE: &str = "hostpathprovisioner.kubevirt.io/adopt-state";
/// [`STATE`] until the last step.
pub const STATE_PENDING: &str = "Pending";
/// [`STATE`] once adopted.
pub const STATE_ADOPTED: &str = "Adopted";
/// On the new PV and claim: the old PV's name.
pub const ADOPTED_FROM: &str = "hostpathprovisioner.kubevirt.io/adopted-from";
/// On the new PV: who made the volume (`kubevirt-legacy`, `local-path-provisioner`, ...).
pub const ADOPTED_SOURCE: &str = "hostpathprovisioner.kubevirt.io/adopted-source";
/// On the new PV: `<node>:<directory>` (`:<directory>` on a shared pool), where the old PV
/// had the volume.
pub const ADOPTED_DIRECTORY: &str = "hostpathprovisioner.kubevirt.io/adopted-directory";
/// Set by a user on the old PV after renaming its directory into a pool's directory on the
/// node (the old PV's path cannot be changed): where the directory is now.
pub const MOVED_TO: &str = "hostpathprovisioner.kubevirt.io/adopt-directory";

/// Claim annotations that belong to the old binding or the old provisioner, dropped from the
/// re-created claim: the PV controller's binding marks, provisioner addressing (a claim that
/// names its volume is never provisioned), the resizer's, the beta class annotation (it would
/// override `storageClassName`) and KubeVirt's node request.
pub const BINDING_ANNOTATIONS: &[&str] = &[
    "pv.kubernetes.io/bind-completed",
    "pv.kubernetes.io/bound-by-controller",
    "pv.kubernetes.io/migrated-to",
    "volume.beta.kubernetes.io/storage-provisioner",
    "volume.kubernetes.io/storage-provisioner",
    "volume.kubernetes.io/selected-node",
    "volume.kubernetes.io/storage-resizer",
    "volume.beta.kubernetes.io/storage-class",
    "kubevirt.io/provisionOnNode",
];

/// Longest PV name (a DNS subdomain).
const MAX_PV_NAME: usize = 253;

/// The new PV's name: `<old PV>-hpp`, shortened with a hash when that would be too long. The
/// old and new PVs exist side by side for a while, so the name differs, and it is derived from
/// the old one so that a second run finds the PV the first one made.
pub fn new_pv_name(old_pv: &str) -> String {
    crate::names::name_with_max_length(old_pv, "hpp", MAX_PV_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_pv_names_are_derived_and_bounded() {
        assert_eq!(new_pv_name("pvc-0a1b"), "pvc-0a1b-hpp");
        let long = "p".repeat(260);
        let name = new_pv_name(&long);
        assert!(name.len() <= MAX_PV_NAME && name.ends_with("-hpp"), "{name}");
        assert_eq!(name, new_pv_name(&long));
        assert_ne!(name, new_pv_name(&"q".repeat(260)));
    }
}
