//! The extension point: one `SubReconciler` per owned object kind (or family of kinds), and
//! [`Decorate`], the one adapter that wraps a step to edit what it builds. A step may also act
//! on objects it does not own ([`SubReconciler::act`]) and keep an index over watched objects
//! ([`SubReconciler::indexes`]).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use hpp_api::v1beta1::{NodeLossStatus, PoolVolumeAudit, StoragePoolStatus, VolumeAuditStatus};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::DynamicObject;
use kube::runtime::events::EventType;

use crate::apply::Applier;
use crate::config::OperatorConfig;
use crate::error::Result;
use crate::facts::ClusterFacts;
use crate::index::WatchIndex;
use crate::object::{DesiredObject, Kind};
use crate::permissions::{Permission, WRITE};

/// A status condition a step contributes to `status.conditions`, beside the operator's
/// Available / Progressing / Degraded. Transition and heartbeat times are filled in by the
/// status derivation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepCondition {
    /// Condition type, e.g. `QuotaReady`; must not be one of the three operator conditions.
    pub type_: String,
    /// Whether the condition holds.
    pub status: bool,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable detail.
    pub message: String,
}

/// A problem a step found on some object (the CR, a StorageClass, ...): the operator publishes
/// it as a Warning Event on that object once, when it first appears, and again only after it
/// went away and came back.
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectWarning {
    /// The object the Event is about.
    pub regarding: ObjectReference,
    /// CamelCase Event reason.
    pub reason: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// Something a step did, published as an Event on `regarding` every time it is reported
/// (unlike an [`ObjectWarning`], which describes a lasting problem and is published once).
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectEvent {
    /// Normal or Warning.
    pub type_: EventType,
    /// The object the Event is about.
    pub regarding: ObjectReference,
    /// CamelCase Event reason.
    pub reason: String,
    /// What happened, in words.
    pub message: String,
}

/// What the volume audit publishes (`spec.volumeAudit`): `status.volumeAudit` and, per pool,
/// `storagePoolStatuses[].volumeAudit` (merged into the pool statuses other steps report) and
/// the audit's gauges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeAuditReport {
    /// The next `status.volumeAudit`.
    pub status: VolumeAuditStatus,
    /// Findings by pool name.
    pub pools: std::collections::BTreeMap<String, PoolVolumeAudit>,
}

/// What a sub-reconciler found after applying its objects.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Readiness {
    /// Workloads (DaemonSets) that are not fully ready, with a message each.
    pub workloads_not_ready: Vec<String>,
    /// Workloads whose rollout is under way (spec not observed yet, or old pods still
    /// running), with a message each.
    pub workloads_rolling_out: Vec<String>,
    /// Storage pool problems (a pool PVC not Bound), with a message each.
    pub pools_not_ready: Vec<String>,
    /// Per-pool status entries to publish in `status.storagePoolStatuses`.
    pub pool_statuses: Vec<StoragePoolStatus>,
    /// Conditions of the step's own, published in `status.conditions`.
    pub conditions: Vec<StepCondition>,
    /// Problems on objects, published as Warning Events.
    pub warnings: Vec<ObjectWarning>,
    /// One-off Events about what a step did (see [`SubReconciler::act`]).
    pub events: Vec<ObjectEvent>,
    /// Run the next pass within this long even if nothing changes (a deadline the step waits
    /// for); the earliest of all steps wins.
    pub requeue_after: Option<Duration>,
    /// The next `status.nodeLoss`; `None` leaves the stored one as it is (the field is then
    /// not written at all, so a pass with nothing to say cannot overwrite a newer value).
    pub node_loss: Option<NodeLossStatus>,
    /// The StorageClass of each claim released after a node loss in this pass (for
    /// `kubevirt_hpp_node_loss_claims_released_total`).
    pub node_loss_releases: Vec<String>,
    /// The volume audit's status; `None` (the audit is off) removes `status.volumeAudit` and
    /// the pools' `volumeAudit`.
    pub volume_audit: Option<VolumeAuditReport>,
}

impl Readiness {
    /// Everything ready, nothing to report.
    pub fn ready() -> Self {
        Self::default()
    }

    /// Folds another report into this one.
    pub fn merge(&mut self, other: Readiness) {
        self.workloads_not_ready.extend(other.workloads_not_ready);
        self.workloads_rolling_out.extend(other.workloads_rolling_out);
        self.pools_not_ready.extend(other.pools_not_ready);
        self.pool_statuses.extend(other.pool_statuses);
        self.conditions.extend(other.conditions);
        self.warnings.extend(other.warnings);
        self.events.extend(other.events);
        self.requeue_after = match (self.requeue_after, other.requeue_after) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if other.node_loss.is_some() {
            self.node_loss = other.node_loss;
        }
        self.node_loss_releases.extend(other.node_loss_releases);
        if other.volume_audit.is_some() {
            self.volume_audit = other.volume_audit;
        }
    }
}

/// One step of the operator. Implementations keep `desired` pure so it can be unit tested and
/// rendered offline; the default `apply` and `cleanup` cover most kinds, and the controller
/// watches every kind `kinds` returns, so a plugged-in step gets drift repair like a built-in one.
#[async_trait]
pub trait SubReconciler: Send + Sync {
    /// Stable short name; also the suffix of the SSA field manager `hpp-operator/<name>`.
    fn name(&self) -> &str;

    /// Kinds this sub-reconciler creates: the controller watches them, and labelled objects of
    /// these kinds that nobody claimed in a pass are deleted by the pipeline's sweep.
    fn kinds(&self, facts: &ClusterFacts) -> Vec<Kind>;

    /// Objects the step reads but does not own, as (kind, label selector; empty for every
    /// object): the controller watches them so a change triggers a pass, and
    /// [`Applier::list`] with the same kind and selector reads them from that watch cache.
    fn watches(&self) -> Vec<(Kind, String)> {
        Vec::new()
    }

    /// Indexes the step keeps over watched objects, as (kind, label selector, index): the
    /// controller watches that kind and selector (as for [`watches`](Self::watches)) and feeds
    /// every event to the index, so a pass can ask it instead of scanning the cache. The same
    /// index must be returned on every call (the step holds it, e.g. in an `Arc`).
    fn indexes(&self) -> Vec<(Kind, String, Arc<dyn WatchIndex>)> {
        Vec::new()
    }

    /// The RBAC the step needs besides what the framework derives from it (`get`, `list`,
    /// `watch`, `create` on its [`kinds`](Self::kinds); `get`, `list`, `watch` on what it
    /// [`watches`](Self::watches) and [`indexes`](Self::indexes)): its writes, narrowed to the
    /// names it owns where it can be, and whatever `gather`, `apply`, `act` and `cleanup` call
    /// besides. The default: `patch` and `delete` on objects of any name of every kind of
    /// `kinds` (what the default `apply`, the sweep and `cleanup` do). Rendered by
    /// [`OperatorRules`](crate::OperatorRules) (`hpp-operator render --rbac`).
    fn permissions(&self, facts: &ClusterFacts) -> Vec<Permission> {
        let name = self.name();
        self.kinds(facts)
            .iter()
            .map(|k| {
                Permission::on(k, &WRITE).because(format!("{name}: applies and deletes its {} (any name).", k.plural))
            })
            .collect()
    }

    /// Reads facts of the step's own before a pass (the default reads nothing). Store them in
    /// `facts.extensions` by type; `desired`, `readiness` and `cleanup` see them. Reads only.
    async fn gather(&self, _applier: &Applier, _cfg: &OperatorConfig, _facts: &mut ClusterFacts) -> Result<()> {
        Ok(())
    }

    /// The objects that should exist for this CR (empty when the feature is off).
    fn desired(
        &self,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
    ) -> Result<Vec<DesiredObject>>;

    /// The parts this step's objects split into (one per node for a step with objects per
    /// node), each rendered by [`desired_part`](Self::desired_part): a pass renders and applies
    /// a few parts at a time and never holds all of a thousand nodes' objects at once. `None`
    /// (the default): the step is one part, [`desired`](Self::desired). Together the parts
    /// must be exactly `desired`'s objects. A part refused at render (an object outside the
    /// operator's namespace) stops the pass before that part's writes, not before the step's.
    ///
    /// With [`readiness_of_parts`](Self::readiness_of_parts), a pass after a change to some
    /// parts' objects only renders those parts again: a part's objects must then not depend
    /// on the live state of other parts' objects (they may depend on the CR, the configuration
    /// and facts of any other object: a change to those runs a full pass).
    fn parts(&self, _hpp: &HostPathProvisioner, _cfg: &OperatorConfig, _facts: &ClusterFacts) -> Option<Vec<String>> {
        None
    }

    /// The desired objects of one of [`parts`](Self::parts). The default: every object.
    fn desired_part(
        &self,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
        _part: &str,
    ) -> Result<Vec<DesiredObject>> {
        self.desired(hpp, cfg, facts)
    }

    /// SSA field manager; one per sub-reconciler so each owns exactly the fields it sends.
    fn field_manager(&self) -> String {
        format!("hpp-operator/{}", self.name())
    }

    /// Makes the desired objects exist; returns the live objects in the same order.
    async fn apply(&self, applier: &Applier, desired: &[DesiredObject]) -> Result<Vec<DynamicObject>> {
        applier.apply_all(&self.field_manager(), desired).await
    }

    /// Readiness, conditions and status from the live objects `apply` returned.
    fn readiness(&self, _hpp: &HostPathProvisioner, _facts: &ClusterFacts, _live: &[DynamicObject]) -> Readiness {
        Readiness::ready()
    }

    /// For a step in [`parts`](Self::parts): its readiness after a pass that rendered and
    /// applied again only the parts in `applied` (their live objects in `live`, in part order),
    /// every other part unchanged since the pass before. The operator runs such a pass after a
    /// change to the objects of some parts only (a deleted mounter, a claim that became Bound),
    /// so a change to one node's objects costs a pass over that node; `applied` is empty when
    /// only other steps' objects changed. A step that answers keeps what its readiness needs of
    /// each part from the previous [`readiness`](Self::readiness) (called with every part's live
    /// objects in a full pass) or `readiness_of_parts` call. `None` (the default): the operator
    /// runs a full pass instead.
    fn readiness_of_parts(
        &self,
        _hpp: &HostPathProvisioner,
        _facts: &ClusterFacts,
        _applied: &[String],
        _live: &[DynamicObject],
    ) -> Option<Readiness> {
        None
    }

    /// For a step in [`parts`](Self::parts) that answers
    /// [`readiness_of_parts`](Self::readiness_of_parts): the parts (by name) whose objects
    /// depend on the Node `node` or on which nodes there are, so a change to the Node (its
    /// labels, taints or readiness, or its deletion) costs a pass over those parts. Parts that
    /// come or go with the change must be among them: their objects are rendered, or left to
    /// the sweep, and the others are not looked at, so a part left out here that still wants an
    /// object a gone part rendered loses it. `None` (the default): the operator runs a full
    /// pass after any Node change.
    fn parts_of_node(&self, _hpp: &HostPathProvisioner, _facts: &ClusterFacts, _node: &str) -> Option<Vec<String>> {
        None
    }

    /// For a step in [`parts`](Self::parts) that answers
    /// [`readiness_of_parts`](Self::readiness_of_parts): whether its parts read what
    /// PersistentVolumes and CSIStorageCapacity objects feed (`ClusterFacts::volumes`,
    /// `capacities`, or its own facts from them). `true` (the default): a change to one runs a
    /// full pass. `false`: such a change (a volume provisioned, a capacity republished) costs a
    /// pass over none of this step's parts; its readiness is still asked for.
    fn parts_read_storage(&self) -> bool {
        true
    }

    /// Changes to objects the step does not own (deleting or patching them), after every step
    /// applied and the sweep ran: decide with a pure function of the CR, the facts and the
    /// stored status, then act. What the step did comes back as [`Readiness`] (one-off
    /// [`events`](Readiness::events), status, a requeue). Once something was changed, a failure
    /// should be reported in the returned `Readiness` (a warning, an Event) rather than as an
    /// error, so what was done is still recorded. The default does nothing.
    async fn act(
        &self,
        _applier: &Applier,
        _hpp: &HostPathProvisioner,
        _cfg: &OperatorConfig,
        _facts: &ClusterFacts,
    ) -> Result<Readiness> {
        Ok(Readiness::ready())
    }

    /// Removes what this sub-reconciler created when the CR is deleted. Must be idempotent and
    /// work even if `apply` never ran. Return `Error::CleanupPending` to be called again later.
    async fn cleanup(
        &self,
        applier: &Applier,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
    ) -> Result<()> {
        let desired = self.desired(hpp, cfg, facts)?;
        applier.delete_all(&desired).await
    }
}

macro_rules! delegate {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl<T: SubReconciler + ?Sized> SubReconciler for $ty {
            fn name(&self) -> &str {
                (**self).name()
            }
            fn kinds(&self, facts: &ClusterFacts) -> Vec<Kind> {
                (**self).kinds(facts)
            }
            fn watches(&self) -> Vec<(Kind, String)> {
                (**self).watches()
            }
            fn indexes(&self) -> Vec<(Kind, String, Arc<dyn WatchIndex>)> {
                (**self).indexes()
            }
            fn permissions(&self, facts: &ClusterFacts) -> Vec<Permission> {
                (**self).permissions(facts)
            }
            async fn gather(&self, applier: &Applier, cfg: &OperatorConfig, facts: &mut ClusterFacts) -> Result<()> {
                (**self).gather(applier, cfg, facts).await
            }
            fn desired(&self, hpp: &HostPathProvisioner, cfg: &OperatorConfig, facts: &ClusterFacts) -> Result<Vec<DesiredObject>> {
                (**self).desired(hpp, cfg, facts)
            }
            fn parts(&self, hpp: &HostPathProvisioner, cfg: &OperatorConfig, facts: &ClusterFacts) -> Option<Vec<String>> {
                (**self).parts(hpp, cfg, facts)
            }
            fn desired_part(&self, hpp: &HostPathProvisioner, cfg: &OperatorConfig, facts: &ClusterFacts, part: &str) -> Result<Vec<DesiredObject>> {
                (**self).desired_part(hpp, cfg, facts, part)
            }
            fn field_manager(&self) -> String {
                (**self).field_manager()
            }
            async fn apply(&self, applier: &Applier, desired: &[DesiredObject]) -> Result<Vec<DynamicObject>> {
                (**self).apply(applier, desired).await
            }
            fn readiness(&self, hpp: &HostPathProvisioner, facts: &ClusterFacts, live: &[DynamicObject]) -> Readiness {
                (**self).readiness(hpp, facts, live)
            }
            fn readiness_of_parts(&self, hpp: &HostPathProvisioner, facts: &ClusterFacts, applied: &[String], live: &[DynamicObject]) -> Option<Readiness> {
                (**self).readiness_of_parts(hpp, facts, applied, live)
            }
            fn parts_of_node(&self, hpp: &HostPathProvisioner, facts: &ClusterFacts, node: &str) -> Option<Vec<String>> {
                (**self).parts_of_node(hpp, facts, node)
            }
            fn parts_read_storage(&self) -> bool {
                (**self).parts_read_storage()
            }
            async fn act(&self, applier: &Applier, hpp: &HostPathProvisioner, cfg: &OperatorConfig, facts: &ClusterFacts) -> Result<Readiness> {
                (**self).act(applier, hpp, cfg, facts).await
            }
            async fn cleanup(&self, applier: &Applier, hpp: &HostPathProvisioner, cfg: &OperatorConfig, facts: &ClusterFacts) -> Result<()> {
                (**self).cleanup(applier, hpp, cfg, facts).await
            }
        }
    )*};
}

delegate!(Box<T>, Arc<T>);

/// A step whose desired objects pass through an edit: everything else (name, field manager,
/// kinds, gather, apply, readiness, cleanup) is the wrapped step's. Build it with
/// [`SubReconcilerExt::decorate`] or replace a step in place with
/// [`Pipeline::decorate`](crate::Pipeline::decorate).
pub struct Decorate<S, F> {
    inner: S,
    edit: F,
}

impl<S, F> Decorate<S, F> {
    /// Wraps `inner`; `edit` sees the CR, the configuration, the facts and the objects.
    pub fn new(inner: S, edit: F) -> Self {
        Decorate { inner, edit }
    }
}

/// The edit a [`Decorate`] applies to the wrapped step's desired objects.
pub trait Edit:
    Fn(&HostPathProvisioner, &OperatorConfig, &ClusterFacts, &mut Vec<DesiredObject>) -> Result<()> + Send + Sync
{
}

impl<F> Edit for F where
    F: Fn(&HostPathProvisioner, &OperatorConfig, &ClusterFacts, &mut Vec<DesiredObject>) -> Result<()> + Send + Sync
{
}

#[async_trait]
impl<S: SubReconciler, F: Edit> SubReconciler for Decorate<S, F> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn kinds(&self, facts: &ClusterFacts) -> Vec<Kind> {
        self.inner.kinds(facts)
    }
    fn watches(&self) -> Vec<(Kind, String)> {
        self.inner.watches()
    }
    fn indexes(&self) -> Vec<(Kind, String, Arc<dyn WatchIndex>)> {
        self.inner.indexes()
    }
    fn permissions(&self, facts: &ClusterFacts) -> Vec<Permission> {
        self.inner.permissions(facts)
    }
    async fn gather(&self, applier: &Applier, cfg: &OperatorConfig, facts: &mut ClusterFacts) -> Result<()> {
        self.inner.gather(applier, cfg, facts).await
    }
    fn desired(
        &self,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
    ) -> Result<Vec<DesiredObject>> {
        let mut objects = self.inner.desired(hpp, cfg, facts)?;
        (self.edit)(hpp, cfg, facts, &mut objects)?;
        Ok(objects)
    }
    /// One part: the edit sees all of the wrapped step's objects at once, as it was written to.
    fn parts(&self, _hpp: &HostPathProvisioner, _cfg: &OperatorConfig, _facts: &ClusterFacts) -> Option<Vec<String>> {
        None
    }
    fn field_manager(&self) -> String {
        self.inner.field_manager()
    }
    async fn apply(&self, applier: &Applier, desired: &[DesiredObject]) -> Result<Vec<DynamicObject>> {
        self.inner.apply(applier, desired).await
    }
    fn readiness(&self, hpp: &HostPathProvisioner, facts: &ClusterFacts, live: &[DynamicObject]) -> Readiness {
        self.inner.readiness(hpp, facts, live)
    }
    async fn act(
        &self,
        applier: &Applier,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
    ) -> Result<Readiness> {
        self.inner.act(applier, hpp, cfg, facts).await
    }
    /// The wrapped step's cleanup (which deletes by name, so edited objects go too).
    async fn cleanup(
        &self,
        applier: &Applier,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
    ) -> Result<()> {
        self.inner.cleanup(applier, hpp, cfg, facts).await
    }
}

/// Adapters on any step.
pub trait SubReconcilerExt: SubReconciler + Sized {
    /// This step with its desired objects passed through `edit`.
    fn decorate<F: Edit>(self, edit: F) -> Decorate<Self, F> {
        Decorate::new(self, edit)
    }
}

impl<S: SubReconciler + Sized> SubReconcilerExt for S {}
