//! Node loss: claims of StorageClasses with `nodeLossPolicy: Recreate` pinned to a node that is
//! gone for good are released after a grace period, so a StatefulSet re-creates them (empty)
//! on another node instead of waiting forever. Off unless a class asks for it.
//!
//! - **Lost** is a node some of the driver's PVs are pinned to (node affinity on
//!   `topology.hostpath.csi/node`) that has no Node object, or whose Node carries the
//!   `node.kubernetes.io/out-of-service` taint (non-graceful shutdown). Asking from the PVs'
//!   side finds a node deleted while the operator was down.
//! - **Grace period**: from when the operator first saw the loss, recorded in
//!   `status.nodeLoss.lostNodes[].since`, so a restarted operator keeps the original deadline;
//!   the step asks for a pass at the earliest deadline ([`Readiness::requeue_after`]).
//! - **Release** (pure decision in [`decide()`], done here): a Warning Event on the PVC and the
//!   CR, the PVC deleted (uid precondition: the claim the PV is bound to, never a newer claim
//!   of the same name), the PV deleted (uid precondition), and then exactly the external
//!   provisioner's finalizer removed from it with a JSON patch that first tests the PV's uid
//!   and the finalizer's position: the lost node's csi-provisioner (node-deployment mode) would
//!   never run DeleteVolume nor remove it, so the PV would stay Terminating forever. No other
//!   finalizer is touched (`kubernetes.io/pv-protection` goes once the PVC is gone, as usual).
//!   The directory stays on the node; if the node ever comes back it is an orphan.
//! - **Cost**: the step owns nothing. It reads the StorageClasses (a handful, from the watch
//!   cache) and asks [`VolumeIndex`] which PVs of lost nodes may need it; the index is fed by
//!   the PV watch the operator keeps anyway for the pool status, at a few dozen bytes per PV,
//!   so a pass costs O(nodes with PVs + PVs on lost nodes), not O(PVs). Only while a node is
//!   lost does a pass read those PVs in full and the CR itself from the API (the controller's
//!   copy may predate the last status write, and a stale `since` would move a deadline).
//!   Without a running controller (the index is never filled) it lists PVs only when a class
//!   mentions node loss or the status lists a lost node.

pub mod decide;
pub mod index;
pub mod policy;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use hpp_api::constants as c;
use hpp_api::v1beta1::NodeLossStatus;
use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::{info, instrument, warn};

use self::decide::{Inputs, Plan, PolicySource, Release};
pub use self::decide::{REASON_INVALID_NODE_LOSS_POLICY, decide};
pub use self::index::VolumeIndex;
use super::common::storage_class_kind;
use crate::apply::{Applier, delete_exact};
use crate::config::OperatorConfig;
use crate::error::{Error, Result};
use crate::facts::{ClusterFacts, NodeFact};
use crate::gather::typed;
use crate::index::WatchIndex;
use crate::names;
use crate::object::{DesiredObject, Kind};
use crate::permissions::{Permission, WRITE};
use crate::subreconciler::{ObjectEvent, ObjectWarning, Readiness, SubReconciler};

/// Warning Event on the CR: a node is lost and claims will be released after their grace period.
pub const REASON_NODE_LOST: &str = "NodeLost";
/// Warning Event on the PVC and the CR: the claim and its PV were deleted after a node loss.
pub const REASON_CLAIM_RELEASED: &str = "ClaimReleasedAfterNodeLoss";
/// Normal Event on the CR: a lost node came back before its claims' grace period ended.
pub const REASON_NODE_LOSS_CANCELLED: &str = "NodeLossCancelled";
/// Warning Event on the CR: a release failed (an API error, e.g. RBAC); retried every pass.
pub const REASON_RELEASE_FAILED: &str = "NodeLossReleaseFailed";

/// The node-loss step; see the module docs. Clones share the index.
#[derive(Clone, Debug, Default)]
pub struct NodeLoss {
    index: Arc<VolumeIndex>,
}

impl NodeLoss {
    /// The PV index the controller feeds.
    pub fn index(&self) -> &Arc<VolumeIndex> {
        &self.index
    }
}

fn pv_kind() -> Kind {
    Kind::of::<PersistentVolume>()
}

/// What a release managed to do.
struct Released {
    /// Whether the PVC was there to delete (absent or replaced: nothing on a claim to report).
    claim_deleted: bool,
}

fn object_ref(api_version: &str, kind: &str, namespace: Option<&str>, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(api_version.into()),
        kind: Some(kind.into()),
        namespace: namespace.map(str::to_owned),
        name: Some(name.into()),
        uid: Some(uid.into()).filter(|u: &String| !u.is_empty()),
        ..Default::default()
    }
}

/// Removes the external provisioner's finalizer at `at`, testing the PV's uid and the entry
/// first, so no other finalizer and no newer PV of that name is ever touched. A PV already
/// gone is fine.
async fn remove_provisioner_finalizer(
    api: &Api<PersistentVolume>,
    pv: &str,
    uid: &str,
    at: usize,
) -> std::result::Result<(), kube::Error> {
    let ops = serde_json::json!([
        { "op": "test", "path": "/metadata/uid", "value": uid },
        { "op": "test", "path": format!("/metadata/finalizers/{at}"), "value": c::FINALIZER_EXTERNAL_PROVISIONER },
        { "op": "remove", "path": format!("/metadata/finalizers/{at}") },
    ]);
    let patch: json_patch::Patch = serde_json::from_value(ops).map_err(kube::Error::SerdeError)?;
    match api.patch(pv, &PatchParams::default(), &Patch::Json::<()>(patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Deletes the PVC, then the PV; the error says which call failed and why.
async fn release(applier: &Applier, r: &Release) -> std::result::Result<Released, String> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(applier.client().clone(), &r.claim.namespace);
    let claim_deleted = delete_exact(&claims, &r.claim.name, &r.claim.uid).await.map_err(|e| {
        format!(
            "could not delete PersistentVolumeClaim {}/{} (of PersistentVolume {} on lost node {}): {e}",
            r.claim.namespace, r.claim.name, r.pv, r.node
        )
    })?;
    let volumes: Api<PersistentVolume> = Api::all(applier.client().clone());
    delete_exact(&volumes, &r.pv, &r.pv_uid).await.map_err(|e| {
        format!(
            "deleted PersistentVolumeClaim {}/{} but could not delete its PersistentVolume {} (lost node {}): {e}",
            r.claim.namespace, r.claim.name, r.pv, r.node
        )
    })?;
    Ok(Released { claim_deleted })
}

fn grace_text(r: &Release) -> String {
    hpp_api::duration::format(r.grace)
}

fn source_text(r: &Release) -> String {
    match r.source {
        PolicySource::Class => format!("StorageClass {}", r.storage_class),
        PolicySource::VolumeAttributes => format!(
            "the volume's attributes (StorageClass {:?} no longer exists)",
            r.storage_class
        ),
    }
}

fn lost_text(reason: hpp_api::v1beta1::NodeLossReason) -> &'static str {
    match reason {
        hpp_api::v1beta1::NodeLossReason::NodeDeleted => "its Node object was deleted",
        hpp_api::v1beta1::NodeLossReason::OutOfService => "it carries the node.kubernetes.io/out-of-service taint",
    }
}

/// The Events and status of a plan carried out.
fn new_loss_events(plan: &Plan, cr: &ObjectReference) -> Vec<ObjectEvent> {
    let mut events = Vec::new();
    for loss in &plan.new_losses {
        const SHOWN: usize = 5;
        let mut claims = loss.claims.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
        if loss.claims.len() > SHOWN {
            claims.push_str(&format!(" and {} more", loss.claims.len() - SHOWN));
        }
        events.push(ObjectEvent {
            type_: EventType::Warning,
            regarding: cr.clone(),
            reason: REASON_NODE_LOST.into(),
            message: format!(
                "Node {} is lost ({}). {} claim(s) of StorageClasses with nodeLossPolicy Recreate are pinned to it \
                 ({claims}); unless the node comes back they are released (PVC and PV deleted, the data left on the \
                 node) from {}, when their grace period ends",
                loss.node,
                lost_text(loss.reason),
                loss.claims.len(),
                crate::status::rfc3339(loss.first_due)
            ),
        });
    }
    for back in &plan.cancelled {
        let already = if back.released > 0 {
            format!("; {} claim(s) had already been released", back.released)
        } else {
            String::new()
        };
        events.push(ObjectEvent {
            type_: EventType::Normal,
            regarding: cr.clone(),
            reason: REASON_NODE_LOSS_CANCELLED.into(),
            message: format!(
                "Node {} is back (its Node exists without the out-of-service taint) before the grace period of its \
                 claims ended: they are kept{already}",
                back.node
            ),
        });
    }
    events
}

/// Carries a plan out and reports it; failures become warnings (retried next pass), never
/// errors, so what was done is always recorded.
async fn execute(applier: &Applier, hpp: &HostPathProvisioner, plan: Plan, now: Timestamp) -> Readiness {
    let cr = hpp.object_ref(&());
    let mut r = Readiness {
        events: new_loss_events(&plan, &cr),
        warnings: plan.invalid.clone(),
        ..Readiness::ready()
    };
    let mut status: NodeLossStatus = plan.status.clone();
    let volumes: Api<PersistentVolume> = Api::all(applier.client().clone());
    let mut finalizers: Vec<(String, String, usize)> = plan
        .finalizers
        .iter()
        .map(|f| (f.pv.clone(), f.pv_uid.clone(), f.at))
        .collect();
    for rel in &plan.releases {
        match release(applier, rel).await {
            Ok(done) => {
                info!(node = %rel.node, pv = %rel.pv, claim = %format!("{}/{}", rel.claim.namespace, rel.claim.name),
                      "released a claim of a lost node");
                status.claims_released = status.claims_released.saturating_add(1);
                if let Some(entry) = status.lost_nodes.iter_mut().find(|n| n.name == rel.node) {
                    entry.claims_released = entry.claims_released.saturating_add(1);
                }
                r.node_loss_releases.push(rel.storage_class.clone());
                let what = format!(
                    "node {} was lost ({}) since {}, and {} says nodeLossPolicy Recreate with a grace period of {}",
                    rel.node,
                    lost_text(rel.reason),
                    rel.since,
                    source_text(rel),
                    grace_text(rel)
                );
                if done.claim_deleted {
                    r.events.push(ObjectEvent {
                        type_: EventType::Warning,
                        regarding: object_ref(
                            "v1",
                            "PersistentVolumeClaim",
                            Some(&rel.claim.namespace),
                            &rel.claim.name,
                            &rel.claim.uid,
                        ),
                        reason: REASON_CLAIM_RELEASED.into(),
                        message: format!(
                            "Deleted this claim and its PersistentVolume {}: {what}. A StatefulSet re-creates the claim \
                             on another node with an EMPTY volume; the old data stays on {} if it comes back",
                            rel.pv, rel.node
                        ),
                    });
                }
                r.events.push(ObjectEvent {
                    type_: EventType::Warning,
                    regarding: cr.clone(),
                    reason: REASON_CLAIM_RELEASED.into(),
                    message: format!(
                        "Released claim {}/{} (PersistentVolume {}): {what}",
                        rel.claim.namespace, rel.claim.name, rel.pv
                    ),
                });
                if let Some(at) = rel.finalizer_at {
                    finalizers.push((rel.pv.clone(), rel.pv_uid.clone(), at));
                }
            }
            Err(message) => {
                warn!(node = %rel.node, pv = %rel.pv, "{message}");
                r.warnings.push(ObjectWarning {
                    regarding: cr.clone(),
                    reason: REASON_RELEASE_FAILED.into(),
                    message: format!("{message}; retried on every pass"),
                });
            }
        }
    }
    for (pv, uid, at) in finalizers {
        if let Err(e) = remove_provisioner_finalizer(&volumes, &pv, &uid, at).await {
            warn!(pv = %pv, error = %e, "could not remove the external provisioner's finalizer");
            r.warnings.push(ObjectWarning {
                regarding: cr.clone(),
                reason: REASON_RELEASE_FAILED.into(),
                message: format!(
                    "could not remove finalizer {} from PersistentVolume {pv} of a lost node: {e}; retried on every pass",
                    c::FINALIZER_EXTERNAL_PROVISIONER
                ),
            });
        }
    }
    r.requeue_after = plan
        .next_due
        .and_then(|due| std::time::Duration::try_from(due.duration_since(now)).ok());
    r.node_loss = Some(status);
    r
}

/// The StorageClasses, from the watch cache when it is synced.
async fn classes(applier: &Applier, cfg: &OperatorConfig) -> Result<Vec<StorageClass>> {
    applier
        .list(&storage_class_kind(), "", &cfg.namespace)
        .await?
        .into_iter()
        .map(typed)
        .collect()
}

impl NodeLoss {
    /// The PVs the decision needs: those of lost nodes whose class (or, without one, volume
    /// attributes) may ask for `Recreate`, from the index; without a ready index, every PV,
    /// but only when something mentions node loss.
    async fn volumes(
        &self,
        applier: &Applier,
        cfg: &OperatorConfig,
        nodes: &[NodeFact],
        classes: &[StorageClass],
        stored: &NodeLossStatus,
    ) -> Result<Vec<PersistentVolume>> {
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        let by_name: HashMap<&str, &NodeFact> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let lost = |n: &str| decide::loss_reason(by_name.get(n).copied()).is_some();
        let (policies, _) = decide::class_policies(classes);
        let existing: HashSet<&str> = classes.iter().filter_map(|cl| cl.metadata.name.as_deref()).collect();
        let wanted = |class: Option<&str>, attribute: Option<&str>| match class {
            Some(cl) if existing.contains(cl) => policies.get(cl).is_some_and(|p| p.is_recreate()),
            _ => attribute.is_some(),
        };
        if let Some(names) = self.index.candidates(lost, wanted) {
            let api: Api<PersistentVolume> = Api::all(applier.client().clone());
            let mut out = Vec::with_capacity(names.len());
            for name in names {
                let found = match applier.cache().get(&pv_kind(), "", None, &name) {
                    Some(cached) => cached.map(|o| typed((*o).clone())).transpose()?,
                    None => api
                        .get_opt(&name)
                        .await
                        .map_err(|e| Error::kube("get", format!("persistentvolume {name}"), e))?,
                };
                out.extend(found);
            }
            return Ok(out);
        }
        let mentioned = classes
            .iter()
            .any(|cl| decide::is_our_class(cl) && policy::mentioned(cl.parameters.as_ref()));
        if !mentioned && stored.lost_nodes.is_empty() {
            return Ok(Vec::new());
        }
        applier
            .list(&pv_kind(), "", &cfg.namespace)
            .await?
            .into_iter()
            .map(typed)
            .collect()
    }
}

#[async_trait]
impl SubReconciler for NodeLoss {
    fn name(&self) -> &str {
        names::STEP_NODE_LOSS
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        Vec::new()
    }

    fn permissions(&self, _facts: &ClusterFacts) -> Vec<Permission> {
        let why = "node-loss (StorageClass parameter nodeLossPolicy: Recreate): after a node is lost for its grace \
                   period, the claims of such classes pinned to it are deleted, then their PVs, and the external \
                   provisioner's finalizer is removed from those PVs (the lost node's csi-provisioner never will). \
                   Cluster-wide because claims live in every namespace and PV names are generated per claim \
                   (pvc-<uid>), so resourceNames cannot narrow them; every call carries a uid precondition (a JSON \
                   patch test) naming the exact object. A cluster whose classes all keep the default \
                   nodeLossPolicy Retain can drop these two rules: the operator never calls them then.";
        vec![
            Permission::on(&pv_kind(), &WRITE).because(why),
            Permission::on(&Kind::of::<PersistentVolumeClaim>(), &["delete"])
                .cluster_wide()
                .because(why),
        ]
    }

    fn watches(&self) -> Vec<(Kind, String)> {
        vec![
            (Kind::of::<Node>(), String::new()),
            (pv_kind(), String::new()),
            (storage_class_kind(), String::new()),
        ]
    }

    fn indexes(&self) -> Vec<(Kind, String, Arc<dyn WatchIndex>)> {
        vec![(pv_kind(), String::new(), self.index.clone())]
    }

    fn desired(
        &self,
        _hpp: &HostPathProvisioner,
        _cfg: &OperatorConfig,
        _facts: &ClusterFacts,
    ) -> Result<Vec<DesiredObject>> {
        Ok(Vec::new())
    }

    #[instrument(skip_all, fields(step = names::STEP_NODE_LOSS))]
    async fn act(
        &self,
        applier: &Applier,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
    ) -> Result<Readiness> {
        let Some(now) = facts.now else {
            return Ok(Readiness::ready());
        };
        let classes = classes(applier, cfg).await?;
        let stored = hpp
            .status
            .as_ref()
            .and_then(|s| s.node_loss.clone())
            .unwrap_or_default();
        let volumes = self.volumes(applier, cfg, &facts.nodes, &classes, &stored).await?;
        if volumes.is_empty() && stored.lost_nodes.is_empty() {
            // Nothing is lost: only the check of the classes' parameters, and no status.
            return Ok(Readiness {
                warnings: decide::class_policies(&classes).1,
                ..Readiness::ready()
            });
        }
        // Decide from the status as stored now: the copy this pass started with may predate the
        // previous pass's write, and an older `since` must never be replaced by a newer one.
        let api: Api<HostPathProvisioner> = Api::all(applier.client().clone());
        let Some(current) = api
            .get_opt(&hpp.name_any())
            .await
            .map_err(|e| Error::kube("get", hpp.name_any(), e))?
        else {
            return Ok(Readiness::ready());
        };
        let previous = current.status.and_then(|s| s.node_loss).unwrap_or_default();
        let plan = decide(Inputs {
            nodes: &facts.nodes,
            volumes: &volumes,
            classes: &classes,
            previous: &previous,
            now,
        });
        Ok(execute(applier, hpp, plan, now).await)
    }

    /// Owns nothing, so deletes nothing.
    async fn cleanup(
        &self,
        _applier: &Applier,
        _hpp: &HostPathProvisioner,
        _cfg: &OperatorConfig,
        _facts: &ClusterFacts,
    ) -> Result<()> {
        Ok(())
    }
}
