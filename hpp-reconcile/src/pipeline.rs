//! An ordered list of sub-reconcilers run as one pass: apply each in order, sweep labelled
//! leftovers nobody claimed, and fold their readiness. Embedders edit the list in a few lines.

use std::collections::BTreeSet;
use std::sync::Arc;

use hpp_api::HostPathProvisioner;
use tracing::{info, instrument};

use crate::apply::{Applier, Deleted, left_behind_warning};
use crate::config::OperatorConfig;
use crate::error::{Error, Result};
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

/// A pipeline edit that names a step the pipeline does not have, or adds a second step of a
/// name (two steps of one name would share a field manager and fight over their objects).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// No step has this name.
    #[error("no step named {name:?} in the pipeline; its steps are: {}", known.join(", "))]
    UnknownStep {
        /// The name asked for.
        name: String,
        /// The pipeline's step names, in order.
        known: Vec<String>,
    },
    /// A step of this name is already in the pipeline.
    #[error(
        "the pipeline already has a step named {name:?} (step names are field managers and must be unique); \
         replace or decorate it instead"
    )]
    DuplicateStep {
        /// The name of the step being added.
        name: String,
    },
}

impl Pipeline {
    /// An empty pipeline.
    pub fn new() -> Self {
        Self::default()
    }

    /// The KubeVirt-compatible set, in KubeVirt's order (names in
    /// [`names::STANDARD_STEPS`](crate::names::STANDARD_STEPS)).
    pub fn standard() -> Self {
        let steps: Vec<Box<dyn SubReconciler>> = vec![
            Box::new(reconcilers::ServiceAccounts),
            Box::new(reconcilers::Rbac),
            Box::new(reconcilers::CsiDriver),
            Box::new(reconcilers::Scc),
            Box::new(reconcilers::CsiDaemonSet),
            Box::new(reconcilers::LegacyDaemonSet),
            Box::new(reconcilers::StoragePools),
            Box::new(reconcilers::Prometheus),
            Box::new(reconcilers::StorageClassPools),
            Box::new(reconcilers::PoolMounts),
            Box::new(reconcilers::NodeLoss::default()),
            Box::new(reconcilers::VolumeAudit::default()),
        ];
        // Distinct names by construction (a unit test checks them against STANDARD_STEPS).
        Pipeline { steps }
    }

    /// This pipeline with `step` appended; fails if a step of that name is already in it.
    pub fn with(mut self, step: impl SubReconciler + 'static) -> Result<Self, PipelineError> {
        self.push(Box::new(step))?;
        Ok(self)
    }

    /// Appends a step; fails if a step of that name is already in the pipeline.
    pub fn push(&mut self, step: Box<dyn SubReconciler>) -> Result<(), PipelineError> {
        self.check_new(step.name(), None)?;
        self.steps.push(step);
        Ok(())
    }

    /// Inserts a step before the step named `before`; fails if there is none by that name or
    /// if a step of the new step's name is already in the pipeline.
    pub fn insert_before(&mut self, before: &str, step: Box<dyn SubReconciler>) -> Result<(), PipelineError> {
        let at = self.position(before)?;
        self.check_new(step.name(), None)?;
        self.steps.insert(at, step);
        Ok(())
    }

    /// Replaces the step named `name`, keeping its position; fails if there is none, or if the
    /// new step takes the name of another step.
    pub fn replace(&mut self, name: &str, step: Box<dyn SubReconciler>) -> Result<(), PipelineError> {
        let i = self.position(name)?;
        self.check_new(step.name(), Some(i))?;
        self.steps[i] = step;
        Ok(())
    }

    /// Wraps the step named `name` in place so its desired objects pass through `edit` (a
    /// [`Decorate`]); fails if there is none. Name, field manager, kinds, readiness and
    /// cleanup stay the step's own, so live objects are adopted as they are.
    pub fn decorate(&mut self, name: &str, edit: impl Edit + 'static) -> Result<(), PipelineError> {
        let i = self.position(name)?;
        let step = self.steps.remove(i);
        self.steps.insert(i, Box::new(Decorate::new(step, edit)));
        Ok(())
    }

    /// Removes the step named `name`; fails if there is none.
    pub fn remove(&mut self, name: &str) -> Result<(), PipelineError> {
        let i = self.position(name)?;
        self.steps.remove(i);
        Ok(())
    }

    /// Whether a step of this name is in the pipeline.
    pub fn contains(&self, name: &str) -> bool {
        self.steps.iter().any(|s| s.name() == name)
    }

    /// The steps, in order.
    pub(crate) fn steps(&self) -> impl Iterator<Item = &dyn SubReconciler> {
        self.steps.iter().map(|s| &**s as &dyn SubReconciler)
    }

    /// Step names in order.
    pub fn names(&self) -> Vec<&str> {
        self.steps.iter().map(|s| s.name()).collect()
    }

    /// Where the step named `name` is, or the error naming it and the known steps.
    fn position(&self, name: &str) -> Result<usize, PipelineError> {
        self.steps
            .iter()
            .position(|s| s.name() == name)
            .ok_or_else(|| PipelineError::UnknownStep {
                name: name.to_owned(),
                known: self.names().iter().map(|n| (*n).to_owned()).collect(),
            })
    }

    /// Fails if a step other than the one at `replacing` is named `name`.
    fn check_new(&self, name: &str, replacing: Option<usize>) -> Result<(), PipelineError> {
        match self.steps.iter().position(|s| s.name() == name) {
            Some(i) if Some(i) != replacing => Err(PipelineError::DuplicateStep { name: name.to_owned() }),
            _ => Ok(()),
        }
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

    /// Every desired object, grouped by step: pure, used by `render`, tests and every pass.
    /// Fails with [`Error::ForeignNamespace`] when a step wants a namespaced object outside
    /// `cfg.namespace` (or without a namespace): the controller watches and sweeps owned
    /// objects only there, so such an object would be neither repaired nor deleted.
    pub fn desired(
        &self,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
    ) -> Result<Vec<(String, Vec<DesiredObject>)>> {
        self.steps
            .iter()
            .map(|s| {
                let desired = s.desired(hpp, cfg, facts)?;
                check_namespaces(s.name(), &desired, &cfg.namespace)?;
                Ok((s.name().to_owned(), desired))
            })
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
        // Every step's objects first, so an object refused at render stops the pass before
        // any write; a step in parts renders them as it goes (see `SubReconciler::parts`).
        let mut all = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            all.push(match step.parts(hpp, cfg, facts) {
                Some(parts) => Rendered::Parts(parts),
                None => {
                    let desired = step.desired(hpp, cfg, facts)?;
                    check_namespaces(step.name(), &desired, &cfg.namespace)?;
                    Rendered::Whole(desired)
                }
            });
        }
        for (step, rendered) in self.steps.iter().zip(all) {
            let live = match rendered {
                Rendered::Whole(desired) => {
                    claimed.extend(desired.iter().map(DesiredObject::key));
                    step.apply(applier, &desired).await?
                }
                Rendered::Parts(parts) => {
                    let mut live = Vec::new();
                    for batch in parts.chunks(PARTS_AT_ONCE) {
                        let mut desired = Vec::new();
                        for part in batch {
                            desired.extend(step.desired_part(hpp, cfg, facts, part)?);
                        }
                        check_namespaces(step.name(), &desired, &cfg.namespace)?;
                        claimed.extend(desired.iter().map(DesiredObject::key));
                        live.extend(step.apply(applier, &desired).await?);
                    }
                    live
                }
            };
            report.readiness.merge(step.readiness(hpp, facts, &live));
        }
        for kind in self.kinds(facts) {
            for key in applier.managed_keys(&kind, &cfg.namespace).await? {
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

/// Parts of a step (see [`SubReconciler::parts`]) rendered and applied together: enough
/// objects to keep [`APPLY_CONCURRENCY`](crate::apply::APPLY_CONCURRENCY) writes in flight
/// during a first install, few enough that a pass holds a few dozen rendered objects, not
/// thousands.
pub const PARTS_AT_ONCE: usize = 16;

/// A step's objects, rendered before any write or, for a step in parts, as the pass goes.
enum Rendered {
    Whole(Vec<DesiredObject>),
    Parts(Vec<String>),
}

/// Refuses a namespaced object outside `namespace` or without a namespace.
fn check_namespaces(step: &str, desired: &[DesiredObject], namespace: &str) -> Result<()> {
    let foreign = desired
        .iter()
        .find(|d| d.kind.namespaced && d.object.metadata.namespace.as_deref() != Some(namespace));
    match foreign {
        None => Ok(()),
        Some(d) => Err(Error::ForeignNamespace {
            step: step.to_owned(),
            object: match d.object.metadata.namespace {
                Some(_) => d.key().to_string(),
                None => format!("{} (no namespace)", d.key()),
            },
            namespace: namespace.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names;
    use crate::reconcilers::common::{daemonset_kind, object_meta, typed_ssa};

    fn noop(_: &HostPathProvisioner, _: &OperatorConfig, _: &ClusterFacts, _: &mut Vec<DesiredObject>) -> Result<()> {
        Ok(())
    }

    #[test]
    fn the_standard_steps_are_the_named_ones_in_order() {
        assert_eq!(Pipeline::standard().names(), names::STANDARD_STEPS);
    }

    #[test]
    fn decorate_edits_one_step_in_place_and_keeps_the_rest() {
        let mut pipeline = Pipeline::standard();
        let names_before: Vec<String> = pipeline.names().iter().map(|n| (*n).to_owned()).collect();
        pipeline
            .decorate(
                names::STEP_CSI_DRIVER,
                |_: &HostPathProvisioner, cfg: &OperatorConfig, _: &ClusterFacts, objects: &mut Vec<DesiredObject>| {
                    let extra = k8s_openapi::api::core::v1::ConfigMap {
                        metadata: object_meta("extra", Some(&cfg.namespace), cfg, &[], None),
                        ..Default::default()
                    };
                    objects.push(typed_ssa(&extra)?);
                    Ok(())
                },
            )
            .unwrap();
        assert_eq!(pipeline.names(), names_before, "same names, same positions");
        let hpp = HostPathProvisioner::new("hpp", Default::default());
        let desired = pipeline
            .desired(&hpp, &OperatorConfig::default(), &ClusterFacts::default())
            .unwrap();
        let (_, driver) = desired.iter().find(|(n, _)| n == names::STEP_CSI_DRIVER).unwrap();
        assert_eq!(driver.len(), 2);
        assert_eq!(driver[1].key().name, "extra");
        let (_, ds) = desired.iter().find(|(n, _)| n == names::STEP_CSI_DAEMONSET).unwrap();
        assert!(ds.iter().all(|o| o.kind == daemonset_kind()), "other steps untouched");
    }

    #[test]
    fn a_namespaced_object_outside_the_operators_namespace_is_refused_at_render() {
        let cfg = OperatorConfig::from_env([("POD_NAMESPACE", "hpp")]);
        let hpp = HostPathProvisioner::new("hpp", Default::default());
        let in_namespace = |ns: Option<&str>| {
            let ns = ns.map(str::to_owned);
            move |_: &HostPathProvisioner, cfg: &OperatorConfig, _: &ClusterFacts, objects: &mut Vec<DesiredObject>| {
                let mut meta = object_meta("team-settings", None, cfg, &[], None);
                meta.namespace.clone_from(&ns);
                objects.push(typed_ssa(&k8s_openapi::api::core::v1::ConfigMap {
                    metadata: meta,
                    ..Default::default()
                })?);
                Ok(())
            }
        };
        let mut pipeline = Pipeline::standard();
        pipeline
            .decorate(names::STEP_CSI_DRIVER, in_namespace(Some("hpp")))
            .unwrap();
        assert!(pipeline.desired(&hpp, &cfg, &ClusterFacts::default()).is_ok());

        let mut pipeline = Pipeline::standard();
        pipeline
            .decorate(names::STEP_CSI_DRIVER, in_namespace(Some("team-a")))
            .unwrap();
        let err = pipeline.desired(&hpp, &cfg, &ClusterFacts::default()).unwrap_err();
        assert!(matches!(err, Error::ForeignNamespace { .. }));
        let message = err.to_string();
        assert!(
            message.starts_with(
                "step csi-driver wants /ConfigMap team-a/team-settings, outside the operator's namespace hpp"
            ),
            "{message}"
        );
        assert_eq!(err.category(), "foreign_namespace");

        let mut pipeline = Pipeline::standard();
        pipeline.decorate(names::STEP_CSI_DRIVER, in_namespace(None)).unwrap();
        let err = pipeline.desired(&hpp, &cfg, &ClusterFacts::default()).unwrap_err();
        assert!(
            err.to_string()
                .contains("wants /ConfigMap team-settings (no namespace), outside"),
            "{err}"
        );
    }

    #[test]
    fn an_edit_naming_a_missing_step_fails_and_lists_the_known_ones() {
        let mut pipeline = Pipeline::standard();
        let err = pipeline.decorate("csi-deamonset", noop).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("\"csi-deamonset\""), "{message}");
        for name in names::STANDARD_STEPS {
            assert!(message.contains(name), "{message}");
        }
        assert!(matches!(
            pipeline.remove("nope"),
            Err(PipelineError::UnknownStep { name, known }) if name == "nope" && known.len() == 12
        ));
        assert!(pipeline.replace("nope", Box::new(reconcilers::Scc)).is_err());
        assert!(
            pipeline
                .insert_before("nope", Box::new(reconcilers::PoolMounts))
                .is_err()
        );
        assert_eq!(pipeline.names(), names::STANDARD_STEPS, "failed edits change nothing");
        // Through the crate's error, for `?` in a function returning `hpp_reconcile::Result`.
        let err: crate::Error = pipeline.remove("nope").unwrap_err().into();
        assert_eq!(err.category(), "pipeline");
    }

    #[test]
    fn a_second_step_of_a_name_is_refused_wherever_it_is_added() {
        let duplicate = |r: Result<(), PipelineError>| matches!(r, Err(PipelineError::DuplicateStep { name }) if name == names::STEP_CSI_DRIVER);
        let mut pipeline = Pipeline::standard();
        assert!(duplicate(pipeline.push(Box::new(reconcilers::CsiDriver))));
        assert!(duplicate(
            pipeline.insert_before(names::STEP_RBAC, Box::new(reconcilers::CsiDriver))
        ));
        assert!(duplicate(
            pipeline.replace(names::STEP_SCC, Box::new(reconcilers::CsiDriver))
        ));
        assert!(Pipeline::standard().with(reconcilers::CsiDriver).is_err());
        assert_eq!(pipeline.names(), names::STANDARD_STEPS, "refused edits change nothing");
        // Replacing a step by one of the same name is what replace is for.
        pipeline
            .replace(names::STEP_CSI_DRIVER, Box::new(reconcilers::CsiDriver))
            .unwrap();
        pipeline.remove(names::STEP_PROMETHEUS).unwrap();
        pipeline
            .insert_before(names::STEP_RBAC, Box::new(reconcilers::Prometheus))
            .unwrap();
        assert_eq!(
            pipeline.names()[..3],
            [names::STEP_SERVICE_ACCOUNTS, names::STEP_PROMETHEUS, names::STEP_RBAC]
        );
        assert!(pipeline.contains(names::STEP_PROMETHEUS));
    }
}
