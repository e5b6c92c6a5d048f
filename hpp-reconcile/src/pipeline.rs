//! An ordered list of sub-reconcilers run as one pass: apply each in order, sweep labelled
//! leftovers nobody claimed, and fold their readiness. Embedders edit the list in a few lines.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use hpp_api::HostPathProvisioner;
use tracing::{info, instrument};

use crate::apply::{Applier, Deleted, left_behind_warning};
use crate::changes::Changed;
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
            Box::new(reconcilers::StoragePools::default()),
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
    pub async fn apply(
        &self,
        applier: &Applier,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
    ) -> Result<PassReport> {
        self.apply_indexed(applier, hpp, cfg, facts, &mut PartIndex::default())
            .await
    }

    /// A full pass ([`apply`](Self::apply)) that records which part of which step each object
    /// came from in `index`, for [`apply_changed`](Self::apply_changed) after it.
    pub(crate) async fn apply_indexed(
        &self,
        applier: &Applier,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
        index: &mut PartIndex,
    ) -> Result<PassReport> {
        let report = self.pass(applier, hpp, cfg, facts, index, None).await?;
        // A full pass always has a plan.
        report.ok_or_else(|| Error::other("pipeline", "a full pass found nothing to apply"))
    }

    /// A pass after only the objects and Nodes in `changed` changed since the pass that left
    /// `index`: steps in parts render and apply only the parts those objects came from and the
    /// parts that read those Nodes ([`SubReconciler::parts_of_node`]; their readiness from
    /// [`SubReconciler::readiness_of_parts`]), every other step runs as in a full pass.
    /// `Ok(None)` when such a pass cannot stand for a full one: before any write for an object
    /// no pass rendered, parts that are no longer the same, or a step that did not answer
    /// `readiness_of_parts` after the last full pass (asked there once, not before every pass
    /// over parts); after its writes for a step that answered then but not now.
    pub(crate) async fn apply_changed(
        &self,
        applier: &Applier,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
        index: &mut PartIndex,
        changed: &Changed,
    ) -> Result<Option<PassReport>> {
        self.pass(applier, hpp, cfg, facts, index, Some(changed)).await
    }

    #[instrument(skip_all, fields(hpp = %hpp.metadata.name.as_deref().unwrap_or_default(), scope = if changed.is_some() { "changed parts" } else { "full" }))]
    async fn pass(
        &self,
        applier: &Applier,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
        index: &mut PartIndex,
        changed: Option<&Changed>,
    ) -> Result<Option<PassReport>> {
        let mut report = PassReport::default();
        let settled;
        let changed = match changed {
            Some(c) => {
                settled = self.without_gone_strays(applier, facts, index, c);
                Some(&settled)
            }
            None => None,
        };
        let Some(plan) = self.plan(hpp, cfg, facts, index, changed)? else {
            return Ok(None);
        };
        // From here on the pass writes: the index is rebuilt as it goes (what a re-rendered
        // part or step held before is forgotten first), and a failure leaves it to the caller
        // to discard.
        let mut next = match changed {
            None => PartIndex::default(),
            Some(_) => std::mem::take(index),
        };
        next.parts = plan.iter().map(|p| p.all_parts.clone()).collect();
        next.answers_in_parts.resize(self.steps.len(), false);
        // What the re-rendered parts and steps held before: forgotten once, re-learnt below.
        let mut forgotten = Vec::new();
        if changed.is_some() {
            let again: Vec<Owner> = plan
                .iter()
                .enumerate()
                .flat_map(|(i, p)| {
                    let step = u16::try_from(i).unwrap_or(u16::MAX);
                    match &p.rendered {
                        Rendered::Whole(_) => vec![Owner::Whole(step)],
                        Rendered::Parts(chosen) => {
                            let hashes = p.all_parts.as_ref().map(|a| a.hashes.as_slice()).unwrap_or_default();
                            chosen
                                .iter()
                                .filter_map(|n| hashes.get(*n).copied())
                                .chain(p.removed.iter().map(|name| part_hash(name)))
                                .map(|part| Owner::Part(step, part))
                                .collect()
                        }
                    }
                })
                .collect();
            forgotten = next.forget(&again);
        }
        let mut pending_readiness = Vec::with_capacity(plan.len());
        for (i, (step, planned)) in self.steps.iter().zip(plan).enumerate() {
            let step_no = u16::try_from(i).unwrap_or(u16::MAX);
            match planned.rendered {
                Rendered::Whole(desired) => {
                    next.own(&desired, Owner::Whole(step_no));
                    let live = step.apply(applier, &desired).await?;
                    pending_readiness.push(step.readiness(hpp, facts, &live));
                }
                Rendered::Parts(chosen) => {
                    let all = planned.all_parts.unwrap_or_default();
                    let mut live = Vec::new();
                    for batch in chosen.chunks(PARTS_AT_ONCE) {
                        let mut desired = Vec::new();
                        for &n in batch {
                            let (Some(part), Some(&hash)) = (all.names.get(n), all.hashes.get(n)) else {
                                continue;
                            };
                            let objects = step.desired_part(hpp, cfg, facts, part)?;
                            next.own(&objects, Owner::Part(step_no, hash));
                            desired.extend(objects);
                        }
                        check_namespaces(step.name(), &desired, &cfg.namespace)?;
                        live.extend(step.apply(applier, &desired).await?);
                    }
                    let readiness = match changed {
                        None => {
                            let readiness = step.readiness(hpp, facts, &live);
                            // Asked here, once a full pass, so a pass over parts knows before
                            // any write whether the step can report on them.
                            if let Some(answers) = next.answers_in_parts.get_mut(i) {
                                *answers = step.readiness_of_parts(hpp, facts, &[], &[]).is_some();
                            }
                            readiness
                        }
                        Some(_) => {
                            // The parts gone since the last pass count as applied, with no
                            // live objects: the step forgets them.
                            let applied: Vec<String> = chosen
                                .iter()
                                .filter_map(|&n| all.names.get(n).cloned())
                                .chain(planned.removed.iter().cloned())
                                .collect();
                            // It answered after the last full pass but not now: a full pass
                            // follows (the objects written so far are desired ones, and its
                            // index starts afresh).
                            let Some(readiness) = step.readiness_of_parts(hpp, facts, &applied, &live) else {
                                return Ok(None);
                            };
                            readiness
                        }
                    };
                    pending_readiness.push(readiness);
                }
            }
        }
        for readiness in pending_readiness {
            report.readiness.merge(readiness);
        }
        // A pass over parts reads every cached key of a kind only when an object it forgot is
        // owned by nothing now (a part gone, or rendering fewer objects): any other object no
        // pass rendered took a full pass when its watch event came (`plan`), so the scan would
        // find nothing, at O(objects) a pass. A kind without a synced watch has no watch
        // events: it is listed by every pass, as before.
        let orphans = changed.is_none() || forgotten.iter().any(|hash| !next.owners.contains_key(hash));
        *index = next;
        let left_behind = std::mem::take(&mut index.left_behind);
        let managed = crate::names::managed_selector();
        let mut leftovers = Vec::new();
        for kind in self.kinds(facts) {
            if !orphans && applier.cache().is_synced(&kind, &managed) {
                continue;
            }
            for key in applier.managed_keys(&kind, &cfg.namespace).await? {
                // Labelled objects of the steps' kinds that no step renders (as of this pass
                // for what it rendered, as of the pass before for the parts it left alone).
                if !index.owns(&key) {
                    leftovers.push((kind.clone(), key));
                }
            }
        }
        if !orphans {
            // What the last sweep had to leave (RBAC forbids deleting it) and is still a
            // leftover is tried again, as by every pass, so its warning lasts as long as the
            // object does.
            let again: Vec<(Kind, ObjectKey)> = left_behind
                .into_iter()
                .filter(|(kind, key)| {
                    !index.owns(key)
                        && !leftovers.iter().any(|(_, k)| k == key)
                        && applier.cache().holds(kind, key.namespace.as_deref(), &key.name) != Some(false)
                })
                .collect();
            leftovers.extend(again);
        }
        for (kind, key) in leftovers {
            info!(object = %key, "sweeping leftover");
            match applier.delete(&kind, key.namespace.as_deref(), &key.name).await? {
                Deleted::LeftForbidden => index.left_behind.push((kind, key)),
                _ => report.swept.push(key),
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
        Ok(Some(report))
    }

    /// `changed` without the objects no pass rendered that no watch cache of their kind holds
    /// (under any selector): a gone part's objects the last pass swept, or someone else's
    /// labelled object deleted. Nothing is left to do about them, where an object no pass
    /// rendered that is still there (a leftover to sweep, a pool object a fact reads) takes a
    /// full pass.
    fn without_gone_strays(
        &self,
        applier: &Applier,
        facts: &ClusterFacts,
        index: &PartIndex,
        changed: &Changed,
    ) -> Changed {
        let kinds = self.kinds(facts);
        let gone = |key: &ObjectKey| {
            kinds
                .iter()
                .find(|k| key.kind.split_once('/') == Some((k.group.as_str(), k.kind.as_str())))
                .and_then(|k| applier.cache().holds(k, key.namespace.as_deref(), &key.name))
                == Some(false)
        };
        Changed {
            objects: changed
                .objects
                .iter()
                .filter(|key| index.owner(key).is_some() || !gone(key))
                .cloned()
                .collect(),
            nodes: changed.nodes.clone(),
            storage: changed.storage,
        }
    }

    /// What each step renders in this pass: every object of a whole step (rendered now, so an
    /// object refused at render stops the pass before any write), and the parts of a step in
    /// parts to render as the pass goes (all of them, or for `changed` those its objects came
    /// from). `None` when `changed` cannot be handled by a pass over parts.
    fn plan(
        &self,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
        index: &PartIndex,
        changed: Option<&Changed>,
    ) -> Result<Option<Vec<Planned>>> {
        let mut dirty: BTreeSet<(u16, u64)> = BTreeSet::new();
        if let Some(changed) = changed {
            if index.parts.len() != self.steps.len() {
                return Ok(None);
            }
            for key in &changed.objects {
                match index.owner(key) {
                    Some(Owner::Part(step, part)) => {
                        dirty.insert((step, part));
                    }
                    Some(Owner::Whole(_)) => {}
                    // Not rendered by the last pass: a leftover, or someone else's object.
                    None => return Ok(None),
                }
            }
        }
        let mut plan = Vec::with_capacity(self.steps.len());
        for (i, step) in self.steps.iter().enumerate() {
            let step_no = u16::try_from(i).unwrap_or(u16::MAX);
            let planned = match step.parts(hpp, cfg, facts) {
                Some(names) => {
                    let last = index.parts.get(i).and_then(Option::as_ref);
                    // The same parts as the last pass (as almost always): their hashes are known.
                    let parts = match last {
                        Some(last) if last.names == names => last.clone(),
                        _ => Arc::new(Parts::new(names)),
                    };
                    let (chosen, removed) = match changed {
                        None => ((0..parts.names.len()).collect(), Vec::new()),
                        Some(changed) => {
                            let Some(last) = last else {
                                return Ok(None);
                            };
                            if !index.answers_in_parts.get(i).copied().unwrap_or(false) {
                                return Ok(None);
                            }
                            match changed_parts(&**step, hpp, facts, changed, &parts, last, step_no, &dirty) {
                                Some(scope) => scope,
                                None => return Ok(None),
                            }
                        }
                    };
                    Planned {
                        all_parts: Some(parts),
                        rendered: Rendered::Parts(chosen),
                        removed,
                    }
                }
                None => {
                    if changed.is_some() && index.parts[i].is_some() {
                        return Ok(None);
                    }
                    let desired = step.desired(hpp, cfg, facts)?;
                    check_namespaces(step.name(), &desired, &cfg.namespace)?;
                    Planned {
                        all_parts: None,
                        rendered: Rendered::Whole(desired),
                        removed: Vec::new(),
                    }
                }
            };
            plan.push(planned);
        }
        Ok(Some(plan))
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

/// For a pass over parts, the parts of one step (`parts` now, `last` as of the last pass) to
/// render (positions in `parts`) and the parts gone since: those whose objects changed
/// (`dirty`) and those that read a changed Node ([`SubReconciler::parts_of_node`]). Parts that
/// came or went must be among the latter (a Node that joined or left); anything else that
/// changed the parts came from somewhere else, and `None` asks for a full pass, as does a
/// changed Node the step cannot place.
#[allow(clippy::too_many_arguments)]
fn changed_parts(
    step: &dyn SubReconciler,
    hpp: &HostPathProvisioner,
    facts: &ClusterFacts,
    changed: &Changed,
    parts: &Parts,
    last: &Parts,
    step_no: u16,
    dirty: &BTreeSet<(u16, u64)>,
) -> Option<(Vec<usize>, Vec<String>)> {
    if changed.storage && step.parts_read_storage() {
        return None;
    }
    // The parts that read a changed Node.
    let mut named: Vec<String> = Vec::new();
    for node in &changed.nodes {
        named.extend(step.parts_of_node(hpp, facts, node)?);
    }
    let reading: HashSet<&str> = named.iter().map(String::as_str).collect();
    // Parts are known by a hash of their name: two names of one hash (never seen, but a gone
    // part's objects are forgotten by it) take the full pass.
    if !parts.distinct {
        return None;
    }
    let removed: Vec<String> = if parts.names == last.names {
        Vec::new()
    } else {
        let now: HashSet<&str> = parts.names.iter().map(String::as_str).collect();
        let before: HashSet<&str> = last.names.iter().map(String::as_str).collect();
        let came = now.difference(&before);
        let went: Vec<&str> = before.difference(&now).copied().collect();
        if !came.chain(&went).all(|p| reading.contains(p)) {
            return None;
        }
        // A gone part's hash must not be a part's of now either.
        if went.iter().any(|p| parts.hashes.contains(&part_hash(p))) {
            return None;
        }
        went.into_iter().map(str::to_owned).collect()
    };
    // The parts whose objects changed.
    let dirty: HashSet<u64> = dirty
        .range((step_no, 0)..=(step_no, u64::MAX))
        .map(|(_, part)| *part)
        .collect();
    let chosen = parts
        .names
        .iter()
        .zip(&parts.hashes)
        .enumerate()
        .filter(|(_, (name, hash))| reading.contains(name.as_str()) || dirty.contains(hash))
        .map(|(n, _)| n)
        .collect();
    Some((chosen, removed))
}

/// A step's parts (see [`SubReconciler::parts`]) with the hash each is known by in
/// [`Owner::Part`], made once and shared by the passes while the parts stay the same: a pass
/// over one node's part does not hash 1,000 names.
#[derive(Debug, Default)]
pub(crate) struct Parts {
    names: Vec<String>,
    hashes: Vec<u64>,
    /// Whether no two names share a hash.
    distinct: bool,
}

impl Parts {
    fn new(names: Vec<String>) -> Self {
        let hashes: Vec<u64> = names.iter().map(|n| part_hash(n)).collect();
        let distinct = hashes.iter().collect::<HashSet<_>>().len() == hashes.len();
        Parts {
            names,
            hashes,
            distinct,
        }
    }
}

/// Parts of a step (see [`SubReconciler::parts`]) rendered and applied together: enough
/// objects to keep [`APPLY_CONCURRENCY`](crate::apply::APPLY_CONCURRENCY) writes in flight
/// during a first install, few enough that a pass holds a few dozen rendered objects, not
/// thousands.
pub const PARTS_AT_ONCE: usize = 16;

/// A step's objects, rendered before any write or, for a step in parts, the parts to render
/// as the pass goes (positions in [`Planned::all_parts`]).
enum Rendered {
    Whole(Vec<DesiredObject>),
    Parts(Vec<usize>),
}

/// One step's share of a pass.
struct Planned {
    /// Every part of a step in parts (`None` for a whole step).
    all_parts: Option<Arc<Parts>>,
    rendered: Rendered,
    /// In a pass over parts, the parts of the last pass that are gone (their objects are no
    /// longer owned, so the sweep deletes them).
    removed: Vec<String>,
}

/// Where an object of the last pass came from: a whole step (by position) or one part of a
/// step in parts (the step by position, the part by a hash of its name: a part keeps its
/// place in the index when parts before it come or go).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Owner {
    Whole(u16),
    Part(u16, u64),
}

/// The hash an object is known by in the [`PartIndex`], and a part in [`Owner::Part`].
fn index_hash<T: std::hash::Hash + ?Sized>(value: &T) -> u64 {
    use std::hash::Hasher;
    let mut h = std::hash::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// The hash a part is known by in [`Owner::Part`].
fn part_hash(name: &str) -> u64 {
    index_hash(name)
}

/// Which step and part rendered each object in the passes so far: lets a pass after a change
/// to a few objects render only their parts, and the sweep tell leftovers from the objects of
/// parts it did not render. Keyed by a hash of the object's key (16 bytes an object, not its
/// name), with each step's parts as of the last pass.
#[derive(Debug, Default)]
pub(crate) struct PartIndex {
    owners: HashMap<u64, Owner>,
    /// The objects of each owner, as hashes into `owners` (an object that moved to another
    /// owner stays listed under the old one until it is forgotten): a pass over one part
    /// forgets that part's objects without visiting every object.
    by_owner: HashMap<Owner, Vec<u64>>,
    parts: Vec<Option<Arc<Parts>>>,
    /// Whether each step answered [`SubReconciler::readiness_of_parts`] after the last full
    /// pass (asked there, not before every pass over parts: the standard pools step answers
    /// with the status of every pool, which costs as much as its readiness).
    answers_in_parts: Vec<bool>,
    /// Leftovers the last sweep could not delete (RBAC forbids it).
    left_behind: Vec<(Kind, ObjectKey)>,
}

impl PartIndex {
    fn owner(&self, key: &ObjectKey) -> Option<Owner> {
        self.owners.get(&index_hash(key)).copied()
    }

    fn owns(&self, key: &ObjectKey) -> bool {
        self.owners.contains_key(&index_hash(key))
    }

    fn own(&mut self, desired: &[DesiredObject], owner: Owner) {
        for d in desired {
            let hash = index_hash(&d.key());
            if self.owners.insert(hash, owner) != Some(owner) {
                self.by_owner.entry(owner).or_default().push(hash);
            }
        }
    }

    /// Forgets the objects of `which` owners, and says which they were.
    fn forget(&mut self, which: &[Owner]) -> Vec<u64> {
        let mut forgotten = Vec::new();
        for owner in which {
            for hash in self.by_owner.remove(owner).unwrap_or_default() {
                if self.owners.get(&hash) == Some(owner) {
                    self.owners.remove(&hash);
                    forgotten.push(hash);
                }
            }
        }
        forgotten
    }

    /// Objects the index holds.
    pub(crate) fn len(&self) -> usize {
        self.owners.len()
    }
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

    fn config_map(name: &str) -> DesiredObject {
        let cfg = OperatorConfig::from_env([("POD_NAMESPACE", "hpp")]);
        typed_ssa(&k8s_openapi::api::core::v1::ConfigMap {
            metadata: object_meta(name, None, &cfg, &[], None),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn forgetting_an_owner_forgets_its_objects_and_says_which_and_not_those_owned_since_by_another() {
        let (a, b) = (Owner::Part(0, part_hash("node-a")), Owner::Part(0, part_hash("node-b")));
        let mut index = PartIndex::default();
        index.own(&[config_map("one"), config_map("two")], a);
        index.own(&[config_map("three")], b);
        // "two" moves to b: forgetting a leaves it.
        index.own(&[config_map("two")], b);
        let forgotten = index.forget(&[a]);
        assert_eq!(forgotten, [index_hash(&config_map("one").key())]);
        assert!(!index.owns(&config_map("one").key()));
        assert_eq!(index.owner(&config_map("two").key()), Some(b));
        assert_eq!(index.len(), 2);
        // Owned again after being forgotten: forgotten again with its owner.
        index.own(&[config_map("one")], a);
        assert_eq!(index.forget(&[a, b]).len(), 3);
        assert_eq!(index.len(), 0);
        assert!(index.forget(&[a]).is_empty(), "nothing left to forget");
    }

    #[test]
    fn parts_know_their_hashes_and_whether_two_share_one() {
        let parts = Parts::new(vec![String::new(), "node-a".into(), "node-b".into()]);
        assert!(parts.distinct);
        assert_eq!(parts.hashes, [part_hash(""), part_hash("node-a"), part_hash("node-b")]);
        assert!(!Parts::new(vec!["node-a".into(), "node-a".into()]).distinct);
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
