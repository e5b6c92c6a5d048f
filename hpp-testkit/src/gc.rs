//! What the cluster's controllers do to the store when objects go away: owner-reference
//! garbage collection (background, foreground, orphan), the namespace controller emptying a
//! deleted namespace, and CRDs registering and unregistering the kinds they define.

use kube::core::ApiResource;
use serde_json::{Value, json};

use super::kinds::KindInfo;
use super::store::{ObjKey, Propagation, State, meta_str, now, owner_uids};

/// The finalizer a foreground deletion holds its owner with.
const FOREGROUND: &str = "foregroundDeletion";

impl State {
    fn key_of_uid(&self, uid: &str) -> Option<ObjKey> {
        self.uids.get(uid).cloned()
    }

    fn dependents_of(&self, uid: &str, blocking_only: bool) -> Vec<ObjKey> {
        let Some(keys) = self.dependents.get(uid) else {
            return Vec::new();
        };
        keys.iter()
            .filter(|key| {
                self.objects
                    .get(key)
                    .and_then(|o| o.pointer("/metadata/ownerReferences"))
                    .and_then(Value::as_array)
                    .is_some_and(|refs| {
                        refs.iter().any(|r| {
                            r.get("uid").and_then(Value::as_str) == Some(uid)
                                && (!blocking_only
                                    || r.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true))
                        })
                    })
            })
            .cloned()
            .collect()
    }

    /// Foreground deletion: the owner gets `deletionTimestamp` and the `foregroundDeletion`
    /// finalizer while its dependents are deleted; it goes once no dependent blocks it any more.
    /// Returns `None` when there is nothing to wait for (no dependents, or already deleting).
    pub(crate) fn begin_foreground(&mut self, key: &ObjKey) -> Option<(Value, bool)> {
        let obj = self.objects.get(key).cloned()?;
        let uid = meta_str(&obj, "uid")?.to_string();
        let dependents = self.dependents_of(&uid, false);
        if dependents.is_empty() || meta_str(&obj, "deletionTimestamp").is_some() {
            return None;
        }
        let mut holding = obj;
        let mut finalizers = holding
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        finalizers.push(json!(FOREGROUND));
        holding["metadata"]["finalizers"] = Value::Array(finalizers);
        holding["metadata"]["deletionTimestamp"] = json!(now());
        holding["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        self.pending_policy.insert(uid.clone(), Propagation::Foreground);
        let mut last = self.commit(key, holding);
        for dependent in dependents {
            self.delete_with(&dependent, Propagation::Foreground);
        }
        self.release_foreground(&uid);
        match self.objects.get(key) {
            Some(still) => Some((still.clone(), false)),
            None => {
                let rv = self.rv.to_string();
                last["metadata"]["resourceVersion"] = json!(rv);
                Some((last, true))
            }
        }
    }

    /// Drops the `foregroundDeletion` finalizer of owner `uid` once nothing blocks it.
    pub(crate) fn release_foreground(&mut self, uid: &str) {
        let Some(key) = self.key_of_uid(uid) else { return };
        let Some(obj) = self.objects.get(&key).cloned() else {
            return;
        };
        let held = obj
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| f.iter().any(|v| v == FOREGROUND));
        if !held || !self.dependents_of(uid, true).is_empty() {
            return;
        }
        let mut released = obj;
        if let Some(Value::Array(f)) = released.pointer_mut("/metadata/finalizers") {
            f.retain(|v| v != FOREGROUND);
        }
        self.commit(&key, released);
    }

    /// Garbage-collects dependents of the removed owner `uid`: with Orphan the owner reference
    /// is stripped; otherwise a dependent whose owners are all gone is deleted (finalizers
    /// honoured), recursively.
    pub(crate) fn collect_garbage(&mut self, uid: &str, policy: Propagation) {
        let dependents = self.dependents_of(uid, false);
        if dependents.is_empty() {
            return;
        }
        for key in dependents {
            let Some(obj) = self.objects.get(&key).cloned() else {
                continue;
            };
            if policy == Propagation::Orphan {
                let mut orphan = obj;
                if let Some(Value::Array(refs)) = orphan.pointer_mut("/metadata/ownerReferences") {
                    refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
                }
                self.commit(&key, orphan);
            } else if owner_uids(&obj).iter().all(|u| !self.uids.contains_key(u)) {
                self.begin_delete(&key, Propagation::Background);
            }
        }
    }

    /// What the namespace controller does once a Namespace is gone: delete everything in it
    /// (finalizers still hold objects until they are removed).
    pub(crate) fn empty_namespace(&mut self, namespace: &str) {
        let contents: Vec<ObjKey> = self
            .objects
            .keys()
            .filter(|k| k.namespace == namespace)
            .cloned()
            .collect();
        for key in contents {
            self.begin_delete(&key, Propagation::Background);
        }
    }

    /// A stored CustomResourceDefinition serves its kinds (every served version, with its scope
    /// and status subresource); a removed one stops serving them.
    pub(crate) fn sync_crd(&mut self, key: &ObjKey, crd: &Value, present: bool) {
        if key.group != "apiextensions.k8s.io" || key.plural != "customresourcedefinitions" {
            return;
        }
        for kind in crd_kinds(crd) {
            if present {
                self.kinds.insert(kind);
            } else {
                self.kinds.remove(&kind.ar.group, &kind.ar.version, &kind.ar.plural);
            }
        }
    }
}

/// The kinds a CustomResourceDefinition object defines.
fn crd_kinds(crd: &Value) -> Vec<KindInfo> {
    let spec = crd.get("spec").cloned().unwrap_or_default();
    let text = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or_default().to_string();
    let (group, kind, plural) = (
        text(&spec, "/group"),
        text(&spec, "/names/kind"),
        text(&spec, "/names/plural"),
    );
    let namespaced = text(&spec, "/scope") == "Namespaced";
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    versions
        .iter()
        .filter(|v| v.get("served").and_then(Value::as_bool) != Some(false))
        .map(|v| {
            let version = text(v, "/name");
            KindInfo {
                ar: ApiResource {
                    api_version: format!("{group}/{version}"),
                    group: group.clone(),
                    version,
                    kind: kind.clone(),
                    plural: plural.clone(),
                },
                namespaced,
                status: v.pointer("/subresources/status").is_some(),
                custom: true,
            }
        })
        .collect()
}
