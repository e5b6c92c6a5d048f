//! The extension point: one `SubReconciler` per owned object kind (or family of kinds).

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use hpp_api::v1beta1::StoragePoolStatus;
use kube::api::DynamicObject;

use crate::apply::Applier;
use crate::config::OperatorConfig;
use crate::error::Result;
use crate::facts::ClusterFacts;
use crate::object::{DesiredObject, Kind};

/// What a sub-reconciler found not ready after applying its objects.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Readiness {
    /// Workloads (DaemonSets) that are not fully ready, with a message each.
    pub workloads_not_ready: Vec<String>,
    /// Storage pool problems (a pool PVC not Bound), with a message each.
    pub pools_not_ready: Vec<String>,
    /// Per-pool status entries to publish in `status.storagePoolStatuses`.
    pub pool_statuses: Vec<StoragePoolStatus>,
}

impl Readiness {
    /// Everything ready, nothing to report.
    pub fn ready() -> Self {
        Self::default()
    }

    /// Folds another report into this one.
    pub fn merge(&mut self, other: Readiness) {
        self.workloads_not_ready.extend(other.workloads_not_ready);
        self.pools_not_ready.extend(other.pools_not_ready);
        self.pool_statuses.extend(other.pool_statuses);
    }
}

/// One step of the operator. Implementations keep `desired` pure so it can be unit tested and
/// rendered offline; the default `apply` and `cleanup` cover most kinds.
#[async_trait]
pub trait SubReconciler: Send + Sync {
    /// Stable short name; also the suffix of the SSA field manager `hpp-operator/<name>`.
    fn name(&self) -> &str;

    /// Kinds this sub-reconciler creates: labelled objects of these kinds that nobody claimed in
    /// a pass are deleted by the pipeline's sweep.
    fn kinds(&self, facts: &ClusterFacts) -> Vec<Kind>;

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

    /// Reads readiness from the live objects `apply` returned.
    fn readiness(&self, _hpp: &HostPathProvisioner, _live: &[DynamicObject]) -> Readiness {
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
