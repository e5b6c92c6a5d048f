//! Storage object in-use protection for claims, opt-in
//! ([`FakeApiServer::protect_claims_in_use`](super::FakeApiServer::protect_claims_in_use)):
//! what the `StorageObjectInUseProtection` admission plugin and kube-controller-manager's
//! pvc-protection controller do together. Code that deletes a claim must cope with a delete
//! that does not complete while a pod uses the claim; without this a test never sees that.
//!
//! - Admission: every PersistentVolumeClaim created (or seeded) gets the
//!   `kubernetes.io/pvc-protection` finalizer.
//! - Controller: a claim being deleted loses that finalizer once no pod of its namespace uses
//!   it (a pod that is not `Succeeded` or `Failed` and names the claim in a
//!   `persistentVolumeClaim` volume, or owns it as the claim of a generic ephemeral volume,
//!   `<pod>-<volume>`), and is then removed. Checked whenever a claim or a pod of that namespace
//!   changes, so deleting the last pod lets the claim go, as the real controller does.
//!
//! The PV side (`kubernetes.io/pv-protection`) is left out: it follows the PV's `status.phase`,
//! which only the PV controller (absent here) moves.

use serde_json::{Value, json};

use super::store::{ObjKey, State, meta_str};

/// The finalizer the admission plugin adds to claims.
pub(crate) const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";

fn is_claim(key: &ObjKey) -> bool {
    key.group.is_empty() && key.plural == "persistentvolumeclaims"
}

fn is_pod(key: &ObjKey) -> bool {
    key.group.is_empty() && key.plural == "pods"
}

/// Adds the pvc-protection finalizer to a claim about to be created.
pub(crate) fn admit(key: &ObjKey, obj: &mut Value) {
    if !is_claim(key) {
        return;
    }
    let mut finalizers = obj
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !finalizers.iter().any(|f| f == PVC_PROTECTION) {
        finalizers.push(json!(PVC_PROTECTION));
        obj["metadata"]["finalizers"] = Value::Array(finalizers);
    }
}

/// Whether `pod` (not terminated) uses the claim `claim`.
fn pod_uses(pod: &Value, claim: &str) -> bool {
    let phase = pod.pointer("/status/phase").and_then(Value::as_str);
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return false;
    }
    let pod_name = meta_str(pod, "name").unwrap_or_default();
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|v| {
            let named = v.pointer("/persistentVolumeClaim/claimName").and_then(Value::as_str) == Some(claim);
            let ephemeral = v.get("ephemeral").is_some()
                && v.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| format!("{pod_name}-{n}") == claim);
            named || ephemeral
        })
}

impl State {
    /// After `key` changed: lets go of the deleting claims of its namespace no pod uses any more.
    pub(crate) fn after_storage_change(&mut self, key: &ObjKey) {
        if !self.protect_claims || self.protection_running || !(is_claim(key) || is_pod(key)) {
            return;
        }
        self.protection_running = true;
        let namespace = key.namespace.clone();
        let released: Vec<(ObjKey, Value)> = self
            .objects
            .iter()
            .filter(|(k, o)| {
                is_claim(k)
                    && k.namespace == namespace
                    && meta_str(o, "deletionTimestamp").is_some()
                    && o.pointer("/metadata/finalizers")
                        .and_then(Value::as_array)
                        .is_some_and(|f| f.iter().any(|f| f == PVC_PROTECTION))
            })
            .filter(|(k, _)| {
                !self
                    .objects
                    .iter()
                    .any(|(pk, pod)| is_pod(pk) && pk.namespace == namespace && pod_uses(pod, &k.name))
            })
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect();
        for (claim_key, mut claim) in released {
            if let Some(Value::Array(finalizers)) = claim.pointer_mut("/metadata/finalizers") {
                finalizers.retain(|f| f != PVC_PROTECTION);
            }
            self.commit(&claim_key, claim);
        }
        self.protection_running = false;
    }
}
