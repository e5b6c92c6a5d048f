//! The extension point: one `SubReconciler` per owned object kind (or family of kinds), and
//! [`Decorate`], the one adapter that wraps a step to edit what it builds.

use std::sync::Arc;

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use hpp_api::v1beta1::StoragePoolStatus;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::DynamicObject;

use crate::apply::Applier;
use crate::config::OperatorConfig;
use crate::error::Result;
use crate::facts::ClusterFacts;
use crate::object::{DesiredObject, Kind};

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
            async fn gather(&self, applier: &Applier, cfg: &OperatorConfig, facts: &mut ClusterFacts) -> Result<()> {
                (**self).gather(applier, cfg, facts).await
            }
            fn desired(&self, hpp: &HostPathProvisioner, cfg: &OperatorConfig, facts: &ClusterFacts) -> Result<Vec<DesiredObject>> {
                (**self).desired(hpp, cfg, facts)
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
    fn field_manager(&self) -> String {
        self.inner.field_manager()
    }
    async fn apply(&self, applier: &Applier, desired: &[DesiredObject]) -> Result<Vec<DynamicObject>> {
        self.inner.apply(applier, desired).await
    }
    fn readiness(&self, hpp: &HostPathProvisioner, facts: &ClusterFacts, live: &[DynamicObject]) -> Readiness {
        self.inner.readiness(hpp, facts, live)
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
