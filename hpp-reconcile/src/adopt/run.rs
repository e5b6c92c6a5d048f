//! Carrying adoptions out: for each claim, read its objects, let [`steps::next`] decide, do
//! that one step, and again, until it is adopted, refused (with what was done undone), or
//! cannot go on. Then an Event on the claim.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Client, Resource};
use serde_json::Value;
use tracing::{info, warn};

use super::assess::pods_using;
use super::build::claim_template;
use super::refusal::{Reason, Refusal};
use super::report::{Report, Row, Status};
use super::steps::{self, Ids, Next, Observed, Step, Undo};
use super::survey::{Survey, Unit};
use crate::apply::delete_exact;
use crate::events::EventRecorder;

/// Event reason on a claim that was adopted.
pub const REASON_ADOPTED: &str = "Adopted";
/// Event reason on a claim that was not (refused, undone, waiting, stuck or failed).
pub const REASON_ADOPTION_FAILED: &str = "AdoptionFailed";
/// The Events' reporting controller.
pub const EVENT_CONTROLLER: &str = "hpp-operator-adopt";
/// Longest Event note the API accepts is 1 kB.
const MAX_NOTE: usize = 1024;
/// How many times in a row a step may find its object changed since it was read.
const MAX_CONFLICTS: usize = 5;

/// What a step's call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acted {
    /// It took effect (or its effect was already there).
    Done,
    /// The object changed since it was read (409 on a patch carrying its resourceVersion).
    Conflict,
}

/// How a real run behaves.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Stop after this many steps, as if the process died there (tests of resumption).
    pub max_steps: Option<usize>,
    /// How long to wait for an old claim to go once deleted (the pvc-protection finalizer holds
    /// it while a pod uses it); after that the claim is reported `Waiting`.
    pub claim_wait: Duration,
    /// How often to look while waiting.
    pub poll: Duration,
    /// The Events' reporting instance (e.g. the host name).
    pub instance: Option<String>,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            max_steps: None,
            claim_wait: Duration::from_secs(60),
            poll: Duration::from_secs(1),
            instance: None,
        }
    }
}

/// What happened to one claim.
struct Outcome {
    status: Status,
    message: Option<String>,
    /// Refusals found while running (pods that started using the claim).
    refusals: Vec<Refusal>,
    /// Steps done on it by this run.
    steps: usize,
    /// The object the Event is about.
    regarding: Option<ObjectReference>,
}

impl Outcome {
    fn new(status: Status, message: Option<String>) -> Self {
        Self {
            status,
            message,
            refusals: Vec::new(),
            steps: 0,
            regarding: None,
        }
    }
}

/// Adopts every actionable claim of `survey`, one after the other, and reports each.
pub async fn adopt(client: &Client, survey: &Survey, opts: &RunOptions) -> Report {
    let recorder = EventRecorder::new(
        client.clone(),
        Reporter {
            controller: EVENT_CONTROLLER.into(),
            instance: opts.instance.clone(),
        },
    );
    let mut budget = opts.max_steps;
    let mut rows = Vec::with_capacity(survey.units.len());
    let mut stopped = false;
    for unit in &survey.units {
        let outcome = match (stopped, unit.actionable()) {
            (true, _) => Outcome::new(Status::Interrupted, Some("not started: the run stopped before".into())),
            (false, true) => carry_out(client, unit, opts, &mut budget).await,
            (false, false) => {
                let mut o = Outcome::new(Status::Refused, None);
                o.regarding = unit.ids.as_ref().map(|ids| claim_ref(ids, &ids.claim_uid));
                o
            }
        };
        let mut found = unit.row.clone();
        found.refusals.extend(outcome.refusals.iter().cloned());
        let mut row = Row {
            found,
            status: outcome.status,
            message: outcome.message.clone(),
        };
        if outcome.status == Status::Interrupted {
            stopped = true;
        } else if let Err(e) = publish(&recorder, &row, &outcome).await {
            let note = format!("its Event could not be recorded: {e}");
            row.message = Some(row.message.map_or(note.clone(), |m| format!("{m}; {note}")));
        }
        info!(
            namespace = %row.found.namespace, claim = %row.found.claim, status = row.status.as_str(),
            steps = outcome.steps, "adoption"
        );
        rows.push(row);
    }
    Report::new(false, rows)
}

/// Carries out one adoption until it ends one way or another.
async fn carry_out(client: &Client, unit: &Unit, opts: &RunOptions, budget: &mut Option<usize>) -> Outcome {
    let Some(ids) = unit.ids.as_ref() else {
        return Outcome::new(Status::Refused, None);
    };
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ids.namespace);
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ids.namespace);
    let refused = !unit.row.refusals.is_empty();
    let mut outcome = Outcome::new(Status::Failed, None);
    let mut undone = 0;
    let mut conflicts = 0;
    let mut waiting_since: Option<Instant> = None;
    let mut last: Option<Next> = None;
    loop {
        let o = match observe(&claims, &volumes, &pods, ids).await {
            Ok(o) => o,
            Err(e) => {
                outcome.message = Some(format!("reading the claim and its PersistentVolumes: {e}; run again"));
                return outcome;
            }
        };
        outcome.regarding = regarding(ids, &o);
        let in_use = o
            .claim
            .as_ref()
            .is_some_and(|c| c.metadata.deletion_timestamp.is_none())
            && !o.pods.is_empty();
        let next = steps::next(ids, refused || in_use, &o);
        if matches!(next, Next::Do(_) | Next::Undo(_)) && last.as_ref() == Some(&next) {
            outcome.message = Some(format!("{next:?} had no visible effect; run again"));
            return outcome;
        }
        match &next {
            Next::Do(_) | Next::Undo(_) => {
                if let Some(left) = budget {
                    if *left == 0 {
                        outcome.status = Status::Interrupted;
                        outcome.message = Some(format!("stopped before {next:?}"));
                        return outcome;
                    }
                    *left -= 1;
                }
                let done = match next {
                    Next::Do(step) => act(step, unit, ids, &o, &claims, &volumes).await,
                    Next::Undo(undo) => act_undo(undo, ids, &o, &volumes).await,
                    _ => Ok(Acted::Done),
                };
                match done {
                    Err(e) => {
                        outcome.message = Some(format!("{e}; run again"));
                        return outcome;
                    }
                    // Someone (the PV controller binding a claim, most likely) changed the
                    // object since it was read: read it again and decide again.
                    Ok(Acted::Conflict) if conflicts < MAX_CONFLICTS => {
                        conflicts += 1;
                        last = None;
                        continue;
                    }
                    Ok(Acted::Conflict) => {
                        outcome.message = Some(format!("{next:?}: the object kept changing under it; run again"));
                        return outcome;
                    }
                    Ok(Acted::Done) => {
                        outcome.steps += 1;
                        undone += usize::from(matches!(next, Next::Undo(_)));
                    }
                }
            }
            Next::Wait(users) => {
                let since = *waiting_since.get_or_insert_with(Instant::now);
                if since.elapsed() < opts.claim_wait {
                    tokio::time::sleep(opts.poll).await;
                    continue;
                }
                outcome.status = Status::Waiting;
                outcome.message = Some(format!(
                    "the old claim is being deleted, and pods still use it{}: stop them and run the same command again",
                    if users.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", users.join(", "))
                    }
                ));
                return outcome;
            }
            Next::Done => {
                outcome.status = Status::Adopted;
                return outcome;
            }
            Next::Refused => {
                if in_use && !unit.row.refusals.iter().any(|r| r.reason == Reason::InUse) {
                    outcome.refusals.push(Refusal::new(
                        Reason::InUse,
                        format!(
                            "pods started using the claim: {}; scale their workloads down (or stop the VMs) first",
                            o.pods.join(", ")
                        ),
                    ));
                }
                outcome.status = match undone > 0 || unit.status == Status::InProgress {
                    true => Status::RolledBack,
                    false => Status::Refused,
                };
                return outcome;
            }
            Next::Stuck(why) => {
                outcome.status = Status::Stuck;
                outcome.message = Some(why.clone());
                return outcome;
            }
        }
        last = Some(next);
    }
}

/// Reads the adoption's objects.
async fn observe(
    claims: &Api<PersistentVolumeClaim>,
    volumes: &Api<PersistentVolume>,
    pods: &Api<Pod>,
    ids: &Ids,
) -> Result<Observed, kube::Error> {
    let claim = claims.get_opt(&ids.claim).await?;
    let old_pv = volumes.get_opt(&ids.old_pv).await?;
    let new_pv = volumes.get_opt(&ids.new_pv).await?;
    let users = match &claim {
        Some(_) => pods_using(
            &pods.list(&ListParams::default()).await?.items,
            &ids.namespace,
            &ids.claim,
        ),
        None => Vec::new(),
    };
    Ok(Observed {
        claim,
        old_pv,
        new_pv,
        pods: users,
    })
}

/// Does `step`; an object that already is as the step makes it counts as done.
async fn act(
    step: Step,
    unit: &Unit,
    ids: &Ids,
    o: &Observed,
    claims: &Api<PersistentVolumeClaim>,
    volumes: &Api<PersistentVolume>,
) -> Result<Acted, String> {
    let what = |e: kube::Error| format!("{step:?}: {e}");
    match step {
        Step::RetainOldPv => {
            let old = o
                .old_pv
                .as_ref()
                .ok_or("RetainOldPv: the old PersistentVolume is gone")?;
            merge(volumes, &ids.old_pv, steps::retain_patch(old, ids))
                .await
                .map_err(what)
        }
        Step::CreateNewPv => {
            let plan = unit
                .plan()
                .ok_or("CreateNewPv: nothing to create (the claim was not assessed adoptable)")?;
            created(volumes.create(&PostParams::default(), &plan.new_pv).await).map_err(what)
        }
        Step::DeleteOldClaim => delete_exact(claims, &ids.claim, &ids.claim_uid)
            .await
            .map(|_| Acted::Done)
            .map_err(what),
        Step::CreateNewClaim => {
            let new = o
                .new_pv
                .as_ref()
                .ok_or("CreateNewClaim: the new PersistentVolume is gone")?;
            let template = claim_template(new).map_err(|e| format!("CreateNewClaim: {e}"))?;
            created(claims.create(&PostParams::default(), &template).await).map_err(what)
        }
        Step::DeleteOldPv => {
            let uid = o
                .old_pv
                .as_ref()
                .and_then(|p| p.metadata.uid.clone())
                .ok_or("DeleteOldPv: the old PersistentVolume is gone")?;
            delete_exact(volumes, &ids.old_pv, &uid)
                .await
                .map(|_| Acted::Done)
                .map_err(what)
        }
        Step::Finish => {
            let new = o.new_pv.as_ref().ok_or("Finish: the new PersistentVolume is gone")?;
            merge(volumes, &ids.new_pv, steps::finish_patch(new))
                .await
                .map_err(what)
        }
    }
}

/// Does `undo`.
async fn act_undo(undo: Undo, ids: &Ids, o: &Observed, volumes: &Api<PersistentVolume>) -> Result<Acted, String> {
    let what = |e: kube::Error| format!("{undo:?}: {e}");
    match undo {
        Undo::DeleteNewPv => {
            let uid = o
                .new_pv
                .as_ref()
                .and_then(|p| p.metadata.uid.clone())
                .ok_or("DeleteNewPv: the new PersistentVolume is gone")?;
            delete_exact(volumes, &ids.new_pv, &uid)
                .await
                .map(|_| Acted::Done)
                .map_err(what)
        }
        Undo::RestoreOldPv => {
            let old = o
                .old_pv
                .as_ref()
                .ok_or("RestoreOldPv: the old PersistentVolume is gone")?;
            merge(volumes, &ids.old_pv, steps::restore_patch(old))
                .await
                .map_err(what)
        }
    }
}

/// A merge patch carrying the resourceVersion it was computed from: a concurrent change fails
/// it with 409 ([`Acted::Conflict`]) instead of being overwritten.
async fn merge<K>(api: &Api<K>, name: &str, patch: Value) -> Result<Acted, kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(Acted::Done),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Acted::Conflict),
        Err(e) => Err(e),
    }
}

/// A create; one that finds the object already there (409) counts as done: the next look
/// decides whether it is the right one.
fn created<K>(result: Result<K, kube::Error>) -> Result<Acted, kube::Error> {
    match result {
        Ok(_) => Ok(Acted::Done),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Acted::Done),
        Err(e) => Err(e),
    }
}

fn claim_ref(ids: &Ids, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: Some(ids.namespace.clone()),
        name: Some(ids.claim.clone()),
        uid: Some(uid.to_owned()),
        ..ObjectReference::default()
    }
}

/// The claim if there is one, else the new PV, else the old PV.
fn regarding(ids: &Ids, o: &Observed) -> Option<ObjectReference> {
    if let Some(uid) = o.claim.as_ref().and_then(|c| c.metadata.uid.as_deref()) {
        return Some(claim_ref(ids, uid));
    }
    o.new_pv.as_ref().or(o.old_pv.as_ref()).map(|pv| ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolume".into()),
        name: pv.metadata.name.clone(),
        uid: pv.metadata.uid.clone(),
        ..ObjectReference::default()
    })
}

/// The Event for `row`: `Adopted` when this run adopted it, `AdoptionFailed` when it needs
/// attention; nothing for a claim this run found already adopted.
async fn publish(recorder: &EventRecorder, row: &Row, outcome: &Outcome) -> Result<(), kube::Error> {
    let Some(regarding) = &outcome.regarding else {
        return Ok(());
    };
    let f = &row.found;
    let (type_, reason, note) = match row.status {
        Status::Adopted if outcome.steps > 0 => (
            EventType::Normal,
            REASON_ADOPTED,
            format!(
                "Adopted PersistentVolume {} ({}, {}:{}) as volume {} of hpp pool {}: now bound to PersistentVolume {} of StorageClass {}; no data was copied",
                f.pv,
                f.source.map_or("?", |s| s.as_str()),
                f.node.as_deref().unwrap_or("any node"),
                f.directory.as_deref().unwrap_or("?"),
                f.volume_id.as_deref().unwrap_or("?"),
                f.pool.as_deref().unwrap_or("?"),
                f.new_pv.as_deref().unwrap_or("?"),
                f.storage_class.as_deref().unwrap_or("?"),
            ),
        ),
        Status::Adopted | Status::Adoptable | Status::InProgress | Status::Interrupted => return Ok(()),
        Status::Refused => (
            EventType::Warning,
            REASON_ADOPTION_FAILED,
            format!("Not adopted: {}", row.reason_text()),
        ),
        Status::RolledBack => (
            EventType::Warning,
            REASON_ADOPTION_FAILED,
            format!(
                "Not adopted, and the steps an earlier run did were undone: {}",
                row.reason_text()
            ),
        ),
        Status::Waiting | Status::Stuck | Status::Failed => (
            EventType::Warning,
            REASON_ADOPTION_FAILED,
            format!("Adoption not finished: {}", row.reason_text()),
        ),
    };
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(truncate(note)),
        action: "Adopt".into(),
        secondary: None,
    };
    recorder.publish(&event, regarding).await.inspect_err(|e| {
        warn!(error = %e, claim = %f.claim, namespace = %f.namespace, "could not record the adoption Event");
    })
}

fn truncate(mut note: String) -> String {
    if note.len() > MAX_NOTE {
        let mut end = MAX_NOTE - 3;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    note
}
