//! An ordered list of sub-reconcilers run as one pass: apply each in order, sweep labelled
//! leftovers nobody claimed, and fold their readiness. Embedders edit the list in a few lines.

use std::collections::BTreeSet;
use std::sync::Arc;

use hpp_api::HostPathProvisioner;
use tracing::{info, instrument};

use crate::apply::{Applier, Deleted, left_behind_warning};
use crate::config::OperatorConfig;
use crate::error::Result;
use crate::facts::ClusterFacts;
use crate::index::WatchIndex;
use crate::object::{DesiredObject, Kind, ObjectKey};
use crate::reconcilers;
use crate::subreconciler::{Decorate, Edit, Readiness, SubReconciler};

/// The sub-reconcilers of a distribution, in apply order (cleanup runs in reverse).
#[derive(Default)]
pub struct Pipeline {
    steps: Vec<Box<dyn SubReconciler>>,
}

/// Result of one applied pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PassReport {
    /// Folded readiness of every step.
    pub readiness: Readiness,
    /// Objects the sweep deleted.
    pub swept: Vec<ObjectKey>,
}

impl Pipeline {
    /// An empty pipeline.
    pub fn new() -> Self {
        Self::default()
    }

    /// The KubeVirt-compatible set, in KubeVirt's order.
    pub fn standard() -> Self {
        Self::new()
            .with(reconcilers::ServiceAccounts)
            .with(reconcilers::Rbac)
            .with(reconcilers::CsiDriver)
            .with(reconcilers::Scc)
            .with(reconcilers::CsiDaemonSet)
            .with(reconcilers::LegacyDaemonSet)
            .with(reconcilers::StoragePools)
            .with(reconcilers::Prometheus)
            .with(reconcilers::StorageClassPools)
            .with(reconcilers::PoolMounts)
            .with(reconcilers::NodeLoss::default())
            .with(reconcilers::VolumeAudit::default())
    }

    /// Appends a step.
    pub fn with(mut self, step: impl SubReconciler + 'static) -> Self {
        self.steps.push(Box::new(step));
        self
    }

    /// Appends a step.
    pub fn push(&mut self, step: Box<dyn SubReconciler>) {
        self.steps.push(step);
    }

    /// Inserts a step before the named one (appends if there is none by that name).
    pub fn insert_before(&mut self, name: &str, step: Box<dyn SubReconciler>) {
        let at = self.position(name).unwrap_or(self.steps.len());
        self.steps.insert(at, step);
    }

    /// Replaces the named step, keeping its position; returns whether it existed.
    pub fn replace(&mut self, name: &str, step: Box<dyn SubReconciler>) -> bool {
        match self.position(name) {
            Some(i) => {
                self.steps[i] = step;
                true
            }
            None => false,
        }
    }

    /// Wraps the named step in place so its desired objects pass through `edit` (a
    /// [`Decorate`]); returns whether it existed. Name, field manager, kinds, readiness and
    /// cleanup stay the step's own, so live objects are adopted as they are.
    pub fn decorate(&mut self, name: &str, edit: impl Edit + 'static) -> bool {
        let Some(i) = self.position(name) else {
            return false;
        };
        let step = self.steps.remove(i);
        self.steps.insert(i, Box::new(Decorate::new(step, edit)));
        true
    }

    /// Removes the named step; returns whether it existed.
    pub fn remove(&mut self, name: &str) -> bool {
        let before = self.steps.len();
        self.steps.retain(|s| s.name() != name);
        self.steps.len() != before
    }

    /// Step names in order.
    pub fn names(&self) -> Vec<&str> {
        self.steps.iter().map(|s| s.name()).collect()
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.steps.iter().position(|s| s.name() == name)
    }

    /// Every kind any step manages (what the sweep lists and the controller watches).
    pub fn kinds(&self, facts: &ClusterFacts) -> Vec<Kind> {
        let set: BTreeSet<Kind> = self.steps.iter().flat_map(|s| s.kinds(facts)).collect();
        set.into_iter().collect()
    }

    /// Every (kind, label selector) the steps read without owning (see
    /// [`SubReconciler::watches`]).
    pub fn watches(&self) -> Vec<(Kind, String)> {
        let set: BTreeSet<(Kind, String)> = self.steps.iter().flat_map(|s| s.watches()).collect();
        set.into_iter().collect()
    }

    /// Every index the steps keep over watched objects (see [`SubReconciler::indexes`]).
    pub fn indexes(&self) -> Vec<(Kind, String, Arc<dyn WatchIndex>)> {
        self.steps.iter().flat_map(|s| s.indexes()).collect()
    }

    /// Every desired object, grouped by step: pure, used by `render` and tests.
    pub fn desired(
        &self,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
    ) -> Result<Vec<(String, Vec<DesiredObject>)>> {
        self.steps
            .iter()
            .map(|s| Ok((s.name().to_owned(), s.desired(hpp, cfg, facts)?)))
            .collect()
    }

    /// Every step's own facts, gathered in step order into `facts.extensions`.
    pub async fn gather(&self, applier: &Applier, cfg: &OperatorConfig, facts: &mut ClusterFacts) -> Result<()> {
        for step in &self.steps {
            step.gather(applier, cfg, facts).await?;
        }
        Ok(())
    }

    /// One pass: apply every step in order, delete labelled objects nobody claimed, then let
    /// every step [act](SubReconciler::act) on objects it does not own.
    #[instrument(skip_all, fields(hpp = %hpp.metadata.name.as_deref().unwrap_or_default()))]
    pub async fn apply(
        &self,
        applier: &Applier,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
    ) -> Result<PassReport> {
        let mut report = PassReport::default();
        let mut claimed = BTreeSet::new();
        for step in &self.steps {
            let desired = step.desired(hpp, cfg, facts)?;
            claimed.extend(desired.iter().map(DesiredObject::key));
            let live = step.apply(applier, &desired).await?;
            report.readiness.merge(step.readiness(hpp, facts, &live));
        }
        for kind in self.kinds(facts) {
            for (key, _) in applier.list_managed(&kind, &cfg.namespace).await? {
                if !claimed.contains(&key) {
                    info!(object = %key, "sweeping leftover");
                    if applier.delete(&kind, key.namespace.as_deref(), &key.name).await? != Deleted::LeftForbidden {
                        report.swept.push(key);
                    }
                }
            }
        }
        report
            .readiness
            .warnings
            .extend(applier.take_left_behind().into_iter().map(left_behind_warning));
        report.readiness.warnings.extend(applier.take_kept_stale());
        // Last, so nothing after an action can fail the pass and lose the record of it.
        for step in &self.steps {
            report.readiness.merge(step.act(applier, hpp, cfg, facts).await?);
        }
        report.readiness.pool_statuses.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(report)
    }

    /// Deletion: every step's cleanup in reverse order. Stops at the first step still pending.
    #[instrument(skip_all)]
    pub async fn cleanup(
        &self,
        applier: &Applier,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
    ) -> Result<()> {
        for step in self.steps.iter().rev() {
            step.cleanup(applier, hpp, cfg, facts).await?;
        }
        // Anything labelled that an earlier version or a removed step left behind.
        for kind in self.kinds(facts) {
            for (key, _) in applier.list_managed(&kind, &cfg.namespace).await? {
                applier.delete(&kind, key.namespace.as_deref(), &key.name).await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcilers::common::{daemonset_kind, object_meta, typed_ssa};

    #[test]
    fn decorate_edits_one_step_in_place_and_keeps_the_rest() {
        let mut pipeline = Pipeline::standard();
        let names_before: Vec<String> = pipeline.names().iter().map(|n| (*n).to_owned()).collect();
        assert!(!pipeline.decorate(
            "no-such-step",
            |_: &HostPathProvisioner, _: &OperatorConfig, _: &ClusterFacts, _: &mut Vec<DesiredObject>| Ok(())
        ));
        assert!(pipeline.decorate(
            "csi-driver",
            |_: &HostPathProvisioner, cfg: &OperatorConfig, _: &ClusterFacts, objects: &mut Vec<DesiredObject>| {
                let extra = k8s_openapi::api::core::v1::ConfigMap {
                    metadata: object_meta("extra", Some(&cfg.namespace), cfg, &[], None),
                    ..Default::default()
                };
                objects.push(typed_ssa(&extra)?);
                Ok(())
            },
        ));
        assert_eq!(pipeline.names(), names_before, "same names, same positions");
        let hpp = HostPathProvisioner::new("hpp", Default::default());
        let desired = pipeline
            .desired(&hpp, &OperatorConfig::default(), &ClusterFacts::default())
            .unwrap();
        let (_, driver) = desired.iter().find(|(n, _)| n == "csi-driver").unwrap();
        assert_eq!(driver.len(), 2);
        assert_eq!(driver[1].key().name, "extra");
        let (_, ds) = desired.iter().find(|(n, _)| n == "csi-daemonset").unwrap();
        assert!(ds.iter().all(|o| o.kind == daemonset_kind()), "other steps untouched");
    }
}
