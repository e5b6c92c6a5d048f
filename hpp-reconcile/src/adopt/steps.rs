//! The steps of one adoption and which comes next, decided from the objects alone. Pure.
//!
//! In order, each recorded on an object before the next depends on it:
//!
//! 1. [`Step::RetainOldPv`]: the old PV gets reclaim policy `Retain` and the annotations naming
//!    the new PV, the claim's uid and its own former policy. From here on neither Kubernetes
//!    nor the old provisioner deletes the directory, whatever happens to the claim.
//! 2. [`Step::CreateNewPv`]: the CSI PV, `Retain`, pre-bound to the claim's name, carrying the
//!    claim to re-create.
//! 3. [`Step::DeleteOldClaim`]: with the claim's uid as precondition. This is the point of no
//!    return: before it, a refusal (a pod started using the claim meanwhile, the pool went
//!    away) undoes steps 2 and 1 ([`Undo`]); after it, only going forward makes sense. The
//!    pvc-protection finalizer holds the claim while a pod uses it ([`Next::Wait`]).
//! 4. [`Step::CreateNewClaim`]: from the template on the new PV, naming the new PV.
//! 5. [`Step::DeleteOldPv`]: with its uid as precondition; its Retain policy keeps the
//!    directory.
//! 6. [`Step::Finish`]: the new PV gets the old PV's reclaim policy and `adopt-state: Adopted`.
//!
//! A run that stops after any step is picked up by the next from what the objects show; no step
//! is ever repeated once its effect is visible, and none deletes data.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use serde_json::{Value, json};

use super::keys;

/// Who one adoption is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ids {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name (the old and the new claim share it).
    pub claim: String,
    /// The old claim's uid.
    pub claim_uid: String,
    /// The old PV's name.
    pub old_pv: String,
    /// The new PV's name.
    pub new_pv: String,
}

/// The adoption's objects, as read just now.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// The claim of that namespace and name, old or new.
    pub claim: Option<PersistentVolumeClaim>,
    /// The PV named like the old PV.
    pub old_pv: Option<PersistentVolume>,
    /// The PV named like the new PV.
    pub new_pv: Option<PersistentVolume>,
    /// Pods (not finished) that use the claim.
    pub pods: Vec<String>,
}

/// A step forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Old PV: reclaim policy Retain, adoption annotations.
    RetainOldPv,
    /// Create the CSI PV.
    CreateNewPv,
    /// Delete the old claim (uid precondition).
    DeleteOldClaim,
    /// Create the new claim from the template.
    CreateNewClaim,
    /// Delete the old PV (uid precondition).
    DeleteOldPv,
    /// New PV: the old reclaim policy, state Adopted.
    Finish,
}

/// A step back, before the point of no return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Undo {
    /// Delete the new PV (Retain, never bound: the directory stays).
    DeleteNewPv,
    /// Give the old PV its reclaim policy back and drop the annotations.
    RestoreOldPv,
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// This step.
    Do(Step),
    /// This step back (the adoption is refused).
    Undo(Undo),
    /// The old claim is being deleted; these pods still use it.
    Wait(Vec<String>),
    /// Adopted.
    Done,
    /// Refused, and nothing of it is left done.
    Refused,
    /// Cannot go on, and why; nothing more is changed.
    Stuck(String),
}

fn annotation<'a>(meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

fn policy(pv: &PersistentVolume) -> Option<&str> {
    pv.spec.as_ref()?.persistent_volume_reclaim_policy.as_deref()
}

/// Whether `pv` is the old PV as step 1 left it for this adoption.
pub fn old_pv_marked(pv: &PersistentVolume, ids: &Ids) -> bool {
    annotation(&pv.metadata, keys::ADOPT_INTO) == Some(ids.new_pv.as_str())
        && annotation(&pv.metadata, keys::CLAIM_UID) == Some(ids.claim_uid.as_str())
}

/// Whether `pv` is the new PV this adoption made.
pub fn new_pv_ours(pv: &PersistentVolume, ids: &Ids) -> bool {
    annotation(&pv.metadata, keys::ADOPTED_FROM) == Some(ids.old_pv.as_str())
        && annotation(&pv.metadata, keys::CLAIM_UID) == Some(ids.claim_uid.as_str())
}

/// Whether the new PV has had its last step.
pub fn adopted(pv: &PersistentVolume) -> bool {
    annotation(&pv.metadata, keys::STATE) == Some(keys::STATE_ADOPTED)
}

/// What comes next for `ids`, seen as `o`. `refused`: the claim cannot be adopted (any
/// refusal, pods included); it only matters before the point of no return.
pub fn next(ids: &Ids, refused: bool, o: &Observed) -> Next {
    let new = o.new_pv.as_ref().filter(|p| new_pv_ours(p, ids));
    if o.new_pv.is_some() && new.is_none() {
        return Next::Stuck(format!(
            "PersistentVolume {} exists and was not made by this adoption",
            ids.new_pv
        ));
    }
    let old = o.old_pv.as_ref();
    let old_marked = old.filter(|p| old_pv_marked(p, ids));
    let old_claim = o
        .claim
        .as_ref()
        .filter(|c| c.metadata.uid.as_deref() == Some(ids.claim_uid.as_str()));
    match old_claim {
        Some(c) if c.metadata.deletion_timestamp.is_some() => match new {
            Some(_) => Next::Wait(o.pods.clone()),
            None => Next::Stuck(format!(
                "the claim is being deleted, not by adoption{}",
                keeps(old_marked, ids)
            )),
        },
        Some(_) if refused => match (new, old_marked) {
            (Some(pv), _) => match undoable(pv) {
                Ok(()) => Next::Undo(Undo::DeleteNewPv),
                Err(why) => Next::Stuck(why),
            },
            (None, Some(_)) => Next::Undo(Undo::RestoreOldPv),
            (None, None) => Next::Refused,
        },
        Some(_) => match (old, new) {
            (None, _) => Next::Stuck(format!("its PersistentVolume {} is gone", ids.old_pv)),
            (Some(pv), _) if policy(pv) != Some("Retain") || !old_pv_marked(pv, ids) => Next::Do(Step::RetainOldPv),
            (Some(_), None) => Next::Do(Step::CreateNewPv),
            (Some(_), Some(_)) => Next::Do(Step::DeleteOldClaim),
        },
        None => {
            let Some(new) = new else {
                return Next::Stuck(match &o.claim {
                    Some(_) => format!(
                        "claim {}/{} was deleted and made again, not by adoption, before the new PersistentVolume existed{}",
                        ids.namespace,
                        ids.claim,
                        keeps(old_marked, ids)
                    ),
                    None => format!(
                        "the claim was deleted, not by adoption, before the new PersistentVolume existed{}",
                        keeps(old_marked, ids)
                    ),
                });
            };
            match &o.claim {
                None => Next::Do(Step::CreateNewClaim),
                Some(c) if c.spec.as_ref().and_then(|s| s.volume_name.as_deref()) != Some(ids.new_pv.as_str()) => {
                    Next::Stuck(format!(
                        "claim {}/{} was made again, not by adoption, and does not name PersistentVolume {}; that PersistentVolume keeps the volume (reclaim policy Retain): delete the claim and run adopt again",
                        ids.namespace, ids.claim, ids.new_pv
                    ))
                }
                Some(_) => match old_marked.filter(|p| p.metadata.deletion_timestamp.is_none()) {
                    Some(pv) if policy(pv) != Some("Retain") => Next::Do(Step::RetainOldPv),
                    Some(_) => Next::Do(Step::DeleteOldPv),
                    None if !adopted(new) => Next::Do(Step::Finish),
                    None => Next::Done,
                },
            }
        }
    }
}

/// " (PersistentVolume X keeps the directory: reclaim policy Retain)" when step 1 was done.
fn keeps(old_marked: Option<&PersistentVolume>, ids: &Ids) -> String {
    match old_marked {
        Some(_) => format!(
            "; PersistentVolume {} keeps the directory (reclaim policy Retain)",
            ids.old_pv
        ),
        None => String::new(),
    }
}

/// Whether the new PV may be deleted to undo an adoption: Retain, bound to no claim yet.
fn undoable(pv: &PersistentVolume) -> Result<(), String> {
    let bound = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .is_some_and(|r| r.uid.is_some());
    match (policy(pv), bound) {
        (Some("Retain"), false) => Ok(()),
        _ => Err(format!(
            "the adoption cannot be undone: PersistentVolume {} is bound or no longer Retain",
            pv.metadata.name.clone().unwrap_or_default()
        )),
    }
}

/// The merge patch of step 1: `Retain`, and the annotations. The former policy is the one the
/// PV had before any adoption (kept when an earlier run recorded it already).
pub fn retain_patch(old_pv: &PersistentVolume, ids: &Ids) -> Value {
    let former = annotation(&old_pv.metadata, keys::RECLAIM_POLICY)
        .or_else(|| policy(old_pv))
        .unwrap_or("Delete");
    json!({
        "metadata": {
            "resourceVersion": old_pv.metadata.resource_version,
            "annotations": {
                keys::ADOPT_INTO: ids.new_pv,
                keys::CLAIM_UID: ids.claim_uid,
                keys::RECLAIM_POLICY: former,
            },
        },
        "spec": {"persistentVolumeReclaimPolicy": "Retain"},
    })
}

/// The merge patch that undoes step 1.
pub fn restore_patch(old_pv: &PersistentVolume) -> Value {
    let former = annotation(&old_pv.metadata, keys::RECLAIM_POLICY).unwrap_or("Retain");
    json!({
        "metadata": {
            "resourceVersion": old_pv.metadata.resource_version,
            "annotations": {keys::ADOPT_INTO: null, keys::CLAIM_UID: null, keys::RECLAIM_POLICY: null},
        },
        "spec": {"persistentVolumeReclaimPolicy": former},
    })
}

/// The merge patch of the last step: the old reclaim policy, `Adopted`, and the claim template
/// dropped (the claim exists now).
pub fn finish_patch(new_pv: &PersistentVolume) -> Value {
    let policy = annotation(&new_pv.metadata, keys::RECLAIM_POLICY).unwrap_or("Retain");
    json!({
        "metadata": {
            "resourceVersion": new_pv.metadata.resource_version,
            "annotations": {keys::STATE: keys::STATE_ADOPTED, keys::CLAIM_TEMPLATE: null},
        },
        "spec": {"persistentVolumeReclaimPolicy": policy},
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ids() -> Ids {
        Ids {
            namespace: "ns".into(),
            claim: "data".into(),
            claim_uid: "u-old".into(),
            old_pv: "pvc-1".into(),
            new_pv: "pvc-1-hpp".into(),
        }
    }

    fn claim(uid: &str, volume: &str, deleting: bool) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "ns", "uid": uid,
                         "deletionTimestamp": if deleting { json!("2025-01-01T00:00:00Z") } else { Value::Null }},
            "spec": {"volumeName": volume},
        }))
        .unwrap()
    }

    fn old_pv(policy: &str, marked: bool) -> PersistentVolume {
        let annotations = if marked {
            json!({keys::ADOPT_INTO: "pvc-1-hpp", keys::CLAIM_UID: "u-old", keys::RECLAIM_POLICY: "Delete"})
        } else {
            json!({})
        };
        serde_json::from_value(json!({
            "metadata": {"name": "pvc-1", "uid": "p-1", "resourceVersion": "5", "annotations": annotations},
            "spec": {"persistentVolumeReclaimPolicy": policy, "hostPath": {"path": "/p/csi/pvc-1"}},
        }))
        .unwrap()
    }

    fn new_pv(state: &str, bound: bool) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "pvc-1-hpp", "uid": "p-2", "resourceVersion": "9",
                         "annotations": {keys::ADOPTED_FROM: "pvc-1", keys::CLAIM_UID: "u-old", keys::STATE: state,
                                         keys::RECLAIM_POLICY: "Delete"}},
            "spec": {"persistentVolumeReclaimPolicy": "Retain",
                     "claimRef": {"namespace": "ns", "name": "data", "uid": if bound { json!("u-new") } else { Value::Null }}},
        }))
        .unwrap()
    }

    fn seen(
        claim: Option<PersistentVolumeClaim>,
        old: Option<PersistentVolume>,
        new: Option<PersistentVolume>,
    ) -> Observed {
        Observed {
            claim,
            old_pv: old,
            new_pv: new,
            pods: Vec::new(),
        }
    }

    /// Walking the steps from the start, each state leads to the step that makes the next.
    #[test]
    fn the_steps_follow_each_other_from_the_objects_alone() {
        let i = ids();
        let old_claim = || Some(claim("u-old", "pvc-1", false));
        let new_claim = || Some(claim("u-new", "pvc-1-hpp", false));
        let pending = || Some(new_pv(keys::STATE_PENDING, false));
        let walk = [
            (
                seen(old_claim(), Some(old_pv("Delete", false)), None),
                Next::Do(Step::RetainOldPv),
            ),
            (
                seen(old_claim(), Some(old_pv("Retain", false)), None),
                Next::Do(Step::RetainOldPv),
            ),
            (
                seen(old_claim(), Some(old_pv("Delete", true)), None),
                Next::Do(Step::RetainOldPv),
            ),
            (
                seen(old_claim(), Some(old_pv("Retain", true)), None),
                Next::Do(Step::CreateNewPv),
            ),
            (
                seen(old_claim(), Some(old_pv("Retain", true)), pending()),
                Next::Do(Step::DeleteOldClaim),
            ),
            (
                seen(
                    Some(claim("u-old", "pvc-1", true)),
                    Some(old_pv("Retain", true)),
                    pending(),
                ),
                Next::Wait(Vec::new()),
            ),
            (
                seen(None, Some(old_pv("Retain", true)), pending()),
                Next::Do(Step::CreateNewClaim),
            ),
            (
                seen(new_claim(), Some(old_pv("Retain", true)), pending()),
                Next::Do(Step::DeleteOldPv),
            ),
            (
                seen(new_claim(), Some(old_pv("Delete", true)), pending()),
                Next::Do(Step::RetainOldPv),
            ),
            (seen(new_claim(), None, pending()), Next::Do(Step::Finish)),
            (
                seen(new_claim(), None, Some(new_pv(keys::STATE_ADOPTED, true))),
                Next::Done,
            ),
        ];
        for (n, (observed, want)) in walk.into_iter().enumerate() {
            assert_eq!(next(&i, false, &observed), want, "state {n}");
        }
    }

    #[test]
    fn a_refusal_before_the_point_of_no_return_undoes_and_after_it_is_ignored() {
        let i = ids();
        let old_claim = || Some(claim("u-old", "pvc-1", false));
        assert_eq!(
            next(
                &i,
                true,
                &seen(
                    old_claim(),
                    Some(old_pv("Retain", true)),
                    Some(new_pv(keys::STATE_PENDING, false))
                )
            ),
            Next::Undo(Undo::DeleteNewPv)
        );
        assert_eq!(
            next(&i, true, &seen(old_claim(), Some(old_pv("Retain", true)), None)),
            Next::Undo(Undo::RestoreOldPv)
        );
        assert_eq!(
            next(&i, true, &seen(old_claim(), Some(old_pv("Delete", false)), None)),
            Next::Refused
        );
        // A new PV that got bound is never deleted to undo.
        assert!(matches!(
            next(
                &i,
                true,
                &seen(
                    old_claim(),
                    Some(old_pv("Retain", true)),
                    Some(new_pv(keys::STATE_PENDING, true))
                )
            ),
            Next::Stuck(_)
        ));
        // Once the old claim is being deleted there is no way back: wait for it.
        let mut waiting = seen(
            Some(claim("u-old", "pvc-1", true)),
            Some(old_pv("Retain", true)),
            Some(new_pv(keys::STATE_PENDING, false)),
        );
        waiting.pods = vec!["web-0".into()];
        assert_eq!(next(&i, true, &waiting), Next::Wait(vec!["web-0".into()]));
    }

    #[test]
    fn objects_changed_by_someone_else_stop_the_adoption_with_the_data_kept() {
        let i = ids();
        // A PV of the new name that is not ours.
        let mut foreign = new_pv(keys::STATE_PENDING, false);
        foreign.metadata.annotations = None;
        let stuck = next(
            &i,
            false,
            &seen(
                Some(claim("u-old", "pvc-1", false)),
                Some(old_pv("Retain", true)),
                Some(foreign),
            ),
        );
        assert!(
            matches!(&stuck, Next::Stuck(why) if why.contains("not made by this adoption")),
            "{stuck:?}"
        );
        // The user deleted the claim after step 1.
        let gone = next(&i, false, &seen(None, Some(old_pv("Retain", true)), None));
        assert!(
            matches!(&gone, Next::Stuck(why) if why.contains("keeps the directory")),
            "{gone:?}"
        );
        // Someone made a claim of the same name that names another PV.
        let other = next(
            &i,
            false,
            &seen(
                Some(claim("u-x", "elsewhere", false)),
                None,
                Some(new_pv(keys::STATE_PENDING, false)),
            ),
        );
        assert!(
            matches!(&other, Next::Stuck(why) if why.contains("delete the claim and run adopt again")),
            "{other:?}"
        );
        // The old PV gone while the old claim is bound to it.
        assert!(matches!(
            next(&i, false, &seen(Some(claim("u-old", "pvc-1", false)), None, None)),
            Next::Stuck(_)
        ));
    }

    #[test]
    fn patches_keep_the_first_recorded_policy_and_test_the_resource_version() {
        let i = ids();
        let p = retain_patch(&old_pv("Delete", false), &i);
        assert_eq!(p["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        assert_eq!(p["metadata"]["annotations"][keys::RECLAIM_POLICY], "Delete");
        assert_eq!(p["metadata"]["resourceVersion"], "5");
        // Already Retain from step 1 of an earlier run: the recorded policy stays.
        let again = retain_patch(&old_pv("Retain", true), &i);
        assert_eq!(again["metadata"]["annotations"][keys::RECLAIM_POLICY], "Delete");
        let back = restore_patch(&old_pv("Retain", true));
        assert_eq!(back["spec"]["persistentVolumeReclaimPolicy"], "Delete");
        assert_eq!(back["metadata"]["annotations"][keys::ADOPT_INTO], Value::Null);
        let done = finish_patch(&new_pv(keys::STATE_PENDING, true));
        assert_eq!(done["spec"]["persistentVolumeReclaimPolicy"], "Delete");
        assert_eq!(done["metadata"]["annotations"][keys::STATE], keys::STATE_ADOPTED);
    }
}
