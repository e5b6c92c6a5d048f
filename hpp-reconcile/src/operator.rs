//! One reconcile of a HostPathProvisioner: singleton check, finalizer, downgrade refusal, the
//! pipeline pass (or cleanup), then status and Events. No controller wiring here (see
//! `controller`), so tests can call `reconcile` directly and count requests.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hpp_api::HostPathProvisioner;
use hpp_api::constants::FINALIZER;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, instrument, warn};

use crate::apply::Applier;
use crate::cache::Cache;
use crate::changes::{ChangeLog, Scope, Taken, pass_inputs};
use crate::config::OperatorConfig;
use crate::echo::OwnStatus;
use crate::error::{Error, Result};
use crate::events::EventRecorder;
use crate::gather;
use crate::metrics::Metrics;
use crate::names;
use crate::pipeline::Pipeline;
use crate::reconcilers::storage_pools;
use crate::status::{self, Outcome, rfc3339};
use crate::status_write::{self, StatusPath, Written};
use crate::subreconciler::{ObjectEvent, ObjectWarning, Readiness};

/// Default [`Context::warning_grace`].
pub const DEFAULT_WARNING_GRACE: Duration = Duration::from_secs(60);

/// Event reason: a deletion waits for pool cleanup Jobs (published once, with the way out).
pub const REASON_CLEANUP_PENDING: &str = "CleanupPending";
/// Event reason: a deletion finished without some unmount Jobs (skip-cleanup annotation).
pub const REASON_CLEANUP_SKIPPED: &str = "CleanupSkipped";

pub use crate::status_write::STATUS_MANAGER;

/// Event reason: the CRD has no status subresource; status is written with the whole object.
pub const REASON_STATUS_SUBRESOURCE_MISSING: &str = "StatusSubresourceMissing";
/// Event reason: the CRD has the status subresource again.
pub const REASON_STATUS_SUBRESOURCE_PRESENT: &str = status::REASON_STATUS_SUBRESOURCE_PRESENT;

/// Shared state of the controller.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Operator configuration.
    pub config: OperatorConfig,
    /// The sub-reconcilers.
    pub pipeline: Pipeline,
    /// Metric handles.
    pub metrics: Metrics,
    /// Watch caches the controller fills; passes read from them once they are synced.
    pub cache: Cache,
    /// Event recorder (None disables Events).
    pub recorder: Option<EventRecorder>,
    /// First retry delay after an error; doubles per consecutive failure up to `max_backoff`.
    pub base_backoff: Duration,
    /// Longest retry delay.
    pub max_backoff: Duration,
    /// Source of the CSI DaemonSet's `--metrics-tls-version` (the cluster TLS policy), read
    /// every pass; `None` keeps `config.metrics_tls_version`.
    pub metrics_tls_version: Option<Arc<dyn Fn() -> String + Send + Sync>>,
    failures: Mutex<HashMap<String, u32>>,
    /// Step warnings already published (object, reason, message): each is published once while
    /// it lasts.
    warned: Mutex<BTreeSet<(String, String, String)>>,
    /// How long a CR that was never Available may be in a warning state before its Warning
    /// Events are published (a first deploy's transient errors and unbound pool claims are
    /// routine for a few seconds).
    pub warning_grace: Duration,
    held: Mutex<HashMap<String, HeldWarnings>>,
    clock: Clock,
    /// Whether status goes through `/status` or the whole object (KubeVirt's CRD).
    pub status_path: StatusPath,
    /// What the watches saw change since the last pass (see [`ChangeLog`]).
    pub(crate) changes: Arc<ChangeLog>,
    /// Least time between two passes started by watch events: changes that arrive closer
    /// together are taken by one pass (see [`crate::controller`]).
    pub pass_interval: Duration,
    /// Least time between two writes of the CR's status that change nothing but the pools'
    /// usage figures (`committed`, `available`), and between two passes started by
    /// CSIStorageCapacity changes alone. On a live cluster every node's csi-provisioner
    /// republishes its capacity each minute: at 1,000 nodes, without this, the whole status (a
    /// claim per node, about 120 KiB) was written up to ten times a second.
    pub usage_interval: Duration,
    /// When each CR's status was last written, by name (see [`Context::usage_interval`]).
    status_written: Mutex<HashMap<String, tokio::time::Instant>>,
    /// The status each CR was last written with: its watch event (the echo) starts no pass.
    pub(crate) own_status: OwnStatus,
}

/// The default [`Context::pass_interval`]: at most ten passes a second while watched objects
/// keep changing (a rollout across 1,000 nodes, where controller-manager rewrites a mounter's
/// status every few milliseconds), while a lone change is still taken at once.
pub const DEFAULT_PASS_INTERVAL: Duration = Duration::from_millis(100);

/// The default [`Context::usage_interval`]: the csi-provisioner's capacity poll interval, so
/// the figures written are at most two polls old.
pub const DEFAULT_USAGE_INTERVAL: Duration = Duration::from_secs(60);

/// The operator's clock: heartbeat times in status and the deadlines steps wait for (node
/// loss grace periods). Tests replace it ([`Context::with_clock`]) to move time by hand.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// Warning Events of a CR that was never Available, held back during the grace period.
struct HeldWarnings {
    since: Instant,
    events: Vec<(String, String)>,
}

impl Context {
    /// A context with Events from `hpp-operator` and KubeVirt-like backoff (1 s .. 5 min).
    pub fn new(client: Client, config: OperatorConfig, pipeline: Pipeline, metrics: Metrics) -> Self {
        let reporter = Reporter {
            controller: "hpp-operator".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Context {
            recorder: Some(EventRecorder::new(client.clone(), reporter)),
            client,
            config,
            pipeline,
            metrics,
            cache: Cache::new(),
            base_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
            metrics_tls_version: None,
            failures: Mutex::new(HashMap::new()),
            warned: Mutex::new(BTreeSet::new()),
            warning_grace: DEFAULT_WARNING_GRACE,
            held: Mutex::new(HashMap::new()),
            clock: Arc::new(Timestamp::now),
            status_path: StatusPath::default(),
            changes: Arc::default(),
            pass_interval: DEFAULT_PASS_INTERVAL,
            usage_interval: DEFAULT_USAGE_INTERVAL,
            status_written: Mutex::new(HashMap::new()),
            own_status: OwnStatus::default(),
        }
    }

    /// Replaces the least time between two status writes that change only the pools' usage
    /// figures (zero: every change is written at once; see [`Context::usage_interval`]).
    pub fn with_usage_interval(mut self, interval: Duration) -> Self {
        self.usage_interval = interval;
        self
    }

    /// How long a status write that changes only usage figures must wait (`None`: it may go
    /// now): the first after a quiet spell goes at once, later ones at most once per
    /// [`Context::usage_interval`].
    fn usage_write_wait(&self, name: &str) -> Option<Duration> {
        let last = self.status_written.lock().ok()?.get(name).copied();
        usage_wait(last, tokio::time::Instant::now(), self.usage_interval)
    }

    fn note_status_written(&self, name: &str) {
        if let Ok(mut written) = self.status_written.lock() {
            written.insert(name.to_owned(), tokio::time::Instant::now());
        }
    }

    /// Replaces the least time between passes started by watch events (zero: a pass per
    /// event, as long as passes keep up).
    pub fn with_pass_interval(mut self, interval: Duration) -> Self {
        self.pass_interval = interval;
        self
    }

    /// Replaces the clock (tests move time by hand; see [`Clock`]).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The clock's current reading.
    pub fn now(&self) -> Timestamp {
        (self.clock)()
    }

    /// Reads `--metrics-tls-version` for the CSI driver from `source` on every pass.
    pub fn with_metrics_tls_version(mut self, source: Arc<dyn Fn() -> String + Send + Sync>) -> Self {
        self.metrics_tls_version = Some(source);
        self
    }

    /// The configuration for this pass (with the current TLS policy applied).
    pub fn pass_config(&self) -> OperatorConfig {
        let mut cfg = self.config.clone();
        if let Some(source) = &self.metrics_tls_version {
            cfg.metrics_tls_version = source();
        }
        cfg
    }

    /// Replaces the retry delays (tests use milliseconds).
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.base_backoff = base;
        self.max_backoff = max;
        self
    }

    /// Replaces the grace period of Warning Events during a first deploy.
    pub fn with_warning_grace(mut self, grace: Duration) -> Self {
        self.warning_grace = grace;
        self
    }

    /// Holds a Warning Event of a CR that was never Available; returns false (publish now)
    /// once the CR's warning state has outlasted the grace period, or when it was Available.
    fn hold(&self, hpp: &HostPathProvisioner, reason: &str, message: &str) -> bool {
        let never_available = hpp.status.as_ref().is_none_or(|s| s.observed_version.is_none());
        if !never_available || self.warning_grace.is_zero() {
            return false;
        }
        let Ok(mut held) = self.held.lock() else { return false };
        let entry = held.entry(hpp.name_any()).or_insert_with(|| HeldWarnings {
            since: Instant::now(),
            events: Vec::new(),
        });
        if entry.since.elapsed() >= self.warning_grace {
            return false;
        }
        entry.events.push((reason.to_owned(), message.to_owned()));
        true
    }

    /// After a pass in a warning state: the held Events whose grace ran out (to publish now),
    /// and how long until the rest are due. A pass out of the warning state drops them.
    fn due_warnings(&self, hpp: &HostPathProvisioner, warning: bool) -> (Vec<(String, String)>, Option<Duration>) {
        let Ok(mut held) = self.held.lock() else {
            return (Vec::new(), None);
        };
        let name = hpp.name_any();
        if !warning {
            held.remove(&name);
            return (Vec::new(), None);
        }
        match held.get(&name) {
            Some(h) if h.since.elapsed() >= self.warning_grace => {
                let due = held.remove(&name).map(|h| h.events).unwrap_or_default();
                // Keep the clock running, so later warnings of this episode are not held again.
                held.insert(
                    name,
                    HeldWarnings {
                        since: Instant::now()
                            .checked_sub(self.warning_grace)
                            .unwrap_or_else(Instant::now),
                        events: Vec::new(),
                    },
                );
                (due, None)
            }
            Some(h) if !h.events.is_empty() => (Vec::new(), Some(self.warning_grace.saturating_sub(h.since.elapsed()))),
            _ => (Vec::new(), None),
        }
    }

    /// Whether this (CR, reason, message) is new since the operator started: one-off Events
    /// about a condition that lasts (a stuck deletion) are published once.
    fn first_time(&self, hpp: &HostPathProvisioner, reason: &str, message: &str) -> bool {
        self.warned
            .lock()
            .map(|mut w| w.insert((format!("cr/{}", hpp.name_any()), reason.to_owned(), message.to_owned())))
            .unwrap_or(true)
    }

    /// Turns Events off.
    pub fn without_events(mut self) -> Self {
        self.recorder = None;
        self
    }

    /// The pipeline's pass: over the parts whose objects changed when only rendered objects
    /// changed since a successful pass over the same inputs, else over everything.
    async fn pass(
        &self,
        applier: &Applier,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &crate::ClusterFacts,
        taken: Taken,
    ) -> Result<crate::PassReport> {
        let inputs = pass_inputs(hpp, cfg, facts);
        let mut index = match taken.scope(hpp, inputs) {
            Scope::Changed(changed, mut index) => {
                match self
                    .pipeline
                    .apply_changed(applier, hpp, cfg, facts, &mut index, &changed)
                    .await?
                {
                    Some(report) => {
                        debug!(
                            objects = changed.objects.len(),
                            nodes = changed.nodes.len(),
                            indexed = index.len(),
                            "pass over the changed parts"
                        );
                        self.metrics.observe_scope(crate::metrics::SCOPE_CHANGED);
                        self.changes.keep(hpp, inputs, *index);
                        return Ok(report);
                    }
                    None => *index,
                }
            }
            Scope::Full => Default::default(),
        };
        let report = self
            .pipeline
            .apply_indexed(applier, hpp, cfg, facts, &mut index)
            .await?;
        self.metrics.observe_scope(crate::metrics::SCOPE_FULL);
        self.changes.keep(hpp, inputs, index);
        Ok(report)
    }

    fn applier(&self) -> Applier {
        Applier::new(self.client.clone()).with_cache(self.cache.clone())
    }

    fn record_result(&self, name: &str, failed: bool) -> u32 {
        let Ok(mut map) = self.failures.lock() else { return 0 };
        if failed {
            let n = map.entry(name.to_owned()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        } else {
            map.remove(name);
            0
        }
    }
}

/// Reconciles one CR; the entry point handed to the controller.
#[instrument(skip_all, fields(hpp = %hpp.name_any()))]
pub async fn reconcile(hpp: Arc<HostPathProvisioner>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    let result = reconcile_inner(hpp.clone(), &ctx).await;
    let category = result.as_ref().err().map(Error::category);
    ctx.metrics.observe(started.elapsed().as_secs_f64(), category);
    ctx.metrics.set_cache_sizes(&ctx.cache.sizes());
    ctx.record_result(&hpp.name_any(), result.is_err());
    result
}

/// Retry policy: exponential backoff per CR; deletion waits poll quickly; a downgrade waits for a change.
pub fn error_policy(hpp: Arc<HostPathProvisioner>, err: &Error, ctx: Arc<Context>) -> Action {
    warn!(hpp = %hpp.name_any(), category = err.category(), error = %err, "reconcile failed");
    // A miss: an optional API the last discovery reported may be gone; the retry asks again.
    ctx.cache.forget_discovery();
    match err.root() {
        Error::Downgrade { .. } => Action::await_change(),
        // Deletion waiting for cleanup Jobs backs off like any failure (the Jobs' watch
        // events still trigger a pass as soon as they finish), so a stuck deletion does not
        // warn twice a second.
        _ => {
            let attempts = ctx
                .failures
                .lock()
                .map(|m| m.get(&hpp.name_any()).copied().unwrap_or(1))
                .unwrap_or(1);
            let factor = 2u32.saturating_pow(attempts.saturating_sub(1).min(16));
            Action::requeue(ctx.base_backoff.saturating_mul(factor).min(ctx.max_backoff))
        }
    }
}

async fn reconcile_inner(hpp: Arc<HostPathProvisioner>, ctx: &Context) -> Result<Action> {
    if !ctx.cache.wait_settled(crate::cache::SETTLE_LIMIT).await {
        warn!(
            limit_seconds = crate::cache::SETTLE_LIMIT.as_secs(),
            "watches still listing after the limit; this pass reads what they miss from the API"
        );
    }
    let api: Api<HostPathProvisioner> = Api::all(ctx.client.clone());
    let all = gather::provisioners(&ctx.client, &ctx.cache).await?;
    let active = all
        .iter()
        .find(|h| h.metadata.deletion_timestamp.is_none())
        .or(all.first());
    if let Some(active) = active.filter(|a| a.name_any() != hpp.name_any()) {
        return refuse_second(&api, &hpp, active, all.len(), ctx).await;
    }
    let deleting = hpp.metadata.deletion_timestamp.is_some();
    let name = hpp.name_any();
    let result = finalizer(&api, FINALIZER, hpp, |event| async move {
        match event {
            FinalizerEvent::Apply(h) => apply(h, ctx).await,
            FinalizerEvent::Cleanup(h) => cleanup(h, ctx).await,
        }
    })
    .await;
    let action = match result {
        // The CR went away between our read and the finalizer patch: cleanup is done.
        Err(kube::runtime::finalizer::Error::RemoveFinalizer(kube::Error::Api(s))) if s.code == 404 => {
            debug!("CR already gone while removing the finalizer");
            Action::await_change()
        }
        other => other.map_err(Error::from)?,
    };
    if deleting {
        // No CR, no readiness: the gauge must not keep the deleted CR's last value.
        ctx.metrics.cr_ready.set(crate::metrics::CR_READY_UNKNOWN);
        ctx.own_status.forget(&name);
    }
    Ok(action)
}

/// A second CR is reported in its own status and otherwise left alone.
async fn refuse_second(
    api: &Api<HostPathProvisioner>,
    hpp: &HostPathProvisioner,
    active: &HostPathProvisioner,
    count: usize,
    ctx: &Context,
) -> Result<Action> {
    if hpp.metadata.deletion_timestamp.is_some() {
        if hpp.finalizers().iter().any(|f| f == FINALIZER) {
            // Merge patch guarded by resourceVersion: never drops someone else's finalizer.
            let keep: Vec<&String> = hpp.finalizers().iter().filter(|f| *f != FINALIZER).collect();
            let patch = json!({ "metadata": { "finalizers": keep, "resourceVersion": hpp.resource_version() } });
            match api
                .patch(&hpp.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                // Already gone: nothing left to release.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(Error::kube("remove finalizer", hpp.name_any(), e)),
            }
        }
        return Ok(Action::await_change());
    }
    let msg = format!(
        "there should be a single hostpath provisioner, {count} items found; {} is the one in use",
        active.name_any()
    );
    write_status(api, hpp, &Outcome::Refused(msg), ctx).await?;
    Ok(Action::requeue(Duration::from_secs(60)))
}

async fn apply(hpp: Arc<HostPathProvisioner>, ctx: &Context) -> Result<Action> {
    let api: Api<HostPathProvisioner> = Api::all(ctx.client.clone());
    let cfg = &ctx.pass_config();
    if let Some(observed) = hpp
        .status
        .as_ref()
        .and_then(|s| s.observed_version.as_deref())
        .filter(|o| status::is_downgrade(o, &cfg.version))
    {
        let err = Error::Downgrade {
            from: observed.to_owned(),
            to: cfg.version.clone(),
        };
        write_status(&api, &hpp, &Outcome::Refused(err.to_string()), ctx).await?;
        return Err(err);
    }
    let pass = async {
        // What changed is taken before the caches are read (see `ChangeLog::begin`).
        let taken = ctx.changes.begin();
        let applier = ctx.applier();
        let mut facts = gather::gather(&applier, &cfg.namespace).await?;
        facts.now = Some(ctx.now());
        ctx.pipeline.gather(&applier, cfg, &mut facts).await?;
        ctx.pass(&applier, &hpp, cfg, &facts, taken).await
    };
    match pass.await {
        Ok(report) => {
            // What steps did is recorded first: a failed status write must not lose it.
            record_actions(ctx, &report.readiness).await;
            let derived = write_status(&api, &hpp, &Outcome::Applied(&report.readiness), ctx).await?;
            publish_warnings(ctx, &report.readiness.warnings).await;
            // Come back when held Warning Events, a step's deadline or the status are due, even
            // if nothing changes.
            Ok(
                match earliest(
                    earliest(derived.warnings_due_in, report.readiness.requeue_after),
                    derived.status_due_in,
                ) {
                    Some(due) => Action::requeue(due),
                    None => Action::await_change(),
                },
            )
        }
        Err(e) => {
            match write_status(&api, &hpp, &Outcome::Failed(e.to_string()), ctx).await {
                // A new failure also gets a Warning Event whose reason is the bounded category.
                Ok(derived) if derived.transition => {
                    if !ctx.hold(&hpp, &e.event_reason(), &e.to_string()) {
                        publish(ctx, &hpp, EventType::Warning, e.event_reason(), e.to_string()).await
                    }
                }
                Ok(_) => {}
                Err(status_err) => warn!(error = %status_err, "could not record the failure in status"),
            }
            Err(e)
        }
    }
}

async fn cleanup(hpp: Arc<HostPathProvisioner>, ctx: &Context) -> Result<Action> {
    info!(hpp = %hpp.name_any(), "cleaning up");
    ctx.changes.forget();
    let cfg = &ctx.pass_config();
    let applier = ctx.applier();
    let mut facts = gather::gather(&applier, &cfg.namespace).await?;
    ctx.pipeline.gather(&applier, cfg, &mut facts).await?;
    let skipped = if storage_pools::skip_cleanup(&hpp) {
        storage_pools::uncleaned_mounts(&facts)
    } else {
        Vec::new()
    };
    let result = ctx.pipeline.cleanup(&applier, &hpp, cfg, &facts).await;
    // Objects RBAC forbids deleting stay; the deletion goes on without them (once each).
    for regarding in applier.take_left_behind() {
        let w = crate::apply::left_behind_warning(regarding);
        if ctx.first_time(&hpp, &w.reason, &w.message) {
            publish_warning(ctx, &w).await;
        }
    }
    match result {
        Err(Error::CleanupPending(what)) => {
            let note = format!(
                "Deletion is {what}. If they cannot run (a node is down or cannot pull the image), \
                 annotate the CR with {}=true to finish the deletion without them; the pool mounts \
                 and data on those nodes are then left in place",
                names::ANNOTATION_SKIP_CLEANUP
            );
            if ctx.first_time(&hpp, REASON_CLEANUP_PENDING, &note) {
                publish(ctx, &hpp, EventType::Warning, REASON_CLEANUP_PENDING.into(), note).await;
            }
            Err(Error::CleanupPending(what))
        }
        Err(e) => Err(e),
        Ok(()) => {
            if !skipped.is_empty() {
                let note = format!(
                    "Deleted without unmounting (annotation {}): {}. The mounts and the data under \
                     them were left in place; unmount them on those nodes by hand (umount <path>) \
                     or reinstall to reuse them",
                    names::ANNOTATION_SKIP_CLEANUP,
                    skipped.join(", ")
                );
                warn!("{note}");
                publish(ctx, &hpp, EventType::Warning, REASON_CLEANUP_SKIPPED.into(), note).await;
            }
            Ok(Action::await_change())
        }
    }
}

/// How long after `now` a usage-only status write may go, given the last status write: not
/// before `interval` has passed since it (`None`: now). A write due within [`USAGE_SLACK`]
/// goes now: the pass that finds it is the one the interval's end started (the capacity
/// throttle counts from its own trigger, a little before the write it led to).
fn usage_wait(last: Option<tokio::time::Instant>, now: tokio::time::Instant, interval: Duration) -> Option<Duration> {
    let due = last? + interval;
    (due > now + USAGE_SLACK.min(interval / 10)).then(|| due - now)
}

/// See [`usage_wait`].
const USAGE_SLACK: Duration = Duration::from_secs(1);

/// The earlier of two optional delays.
fn earliest(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Publishes the one-off Events of what steps did, counts the claims released after a node
/// loss and sets the volume audit's gauges.
async fn record_actions(ctx: &Context, readiness: &Readiness) {
    for storageclass in &readiness.node_loss_releases {
        ctx.metrics.node_loss_claim_released(storageclass);
    }
    ctx.metrics.set_volume_audit(readiness.volume_audit.as_ref());
    for e in &readiness.events {
        publish_event(ctx, e).await;
    }
}

/// Derives and writes the status (only when something besides heartbeats changed) and
/// publishes an Event on a condition transition; a Warning Event of a CR that was never
/// Available waits for [`Context::warning_grace`] and is dropped if the CR recovers first.
async fn write_status(
    api: &Api<HostPathProvisioner>,
    hpp: &HostPathProvisioner,
    outcome: &Outcome<'_>,
    ctx: &Context,
) -> Result<StatusWritten> {
    let none = Default::default();
    let prev = hpp.status.as_ref().unwrap_or(&none);
    let with_node_loss = matches!(outcome, Outcome::Applied(r) if r.node_loss.is_some());
    let derive = |via_main: bool| {
        let now = rfc3339(ctx.now());
        status::with_status_path(
            status::derive(prev, &ctx.config.version, outcome, &now),
            prev,
            via_main,
            &now,
        )
    };
    if status_write::recheck(&ctx.client, &ctx.status_path).await? {
        publish(
            ctx,
            hpp,
            EventType::Normal,
            REASON_STATUS_SUBRESOURCE_PRESENT.to_owned(),
            status::MESSAGE_STATUS_SUBRESOURCE_PRESENT.to_owned(),
        )
        .await;
    }
    let name = hpp.name_any();
    let mut derived = derive(ctx.status_path.via_main());
    // A change of the usage figures alone waits for its turn; the pass it is due in writes
    // whatever they are by then.
    let usage_due_in = match derived.changed && status::same_but_usage(prev, &derived.status) {
        true => ctx.usage_write_wait(&name),
        false => None,
    };
    // The status stays as it is, and is one this process would have written: its watch events
    // start no pass. Unless this pass read an older copy of the CR than the watch holds now:
    // then the newer one may be the echo of an own write the filter dropped, with a status
    // this pass did not judge; a pass over the newer copy goes at once.
    let unwritten = !derived.changed || usage_due_in.is_some();
    let stale_copy = unwritten && ctx.cache.has_newer_provisioner(hpp);
    if unwritten && !stale_copy {
        ctx.own_status.accept(hpp);
    }
    if let Some(wait) = usage_due_in {
        debug!(
            wait_ms = wait.as_millis() as u64,
            "only the pools' usage figures changed: written later"
        );
    } else if derived.changed {
        ctx.own_status.note(&name, &derived.status);
        if status_write::write_since(
            api,
            &name,
            &derived.status,
            Some(prev),
            with_node_loss,
            &ctx.status_path,
        )
        .await?
            == Written::SubresourceMissing
        {
            // Said once per process, then written the way KubeVirt's operator writes it.
            publish(
                ctx,
                hpp,
                EventType::Warning,
                REASON_STATUS_SUBRESOURCE_MISSING.to_owned(),
                status::MESSAGE_WITHOUT_STATUS_SUBRESOURCE.to_owned(),
            )
            .await;
            derived = derive(true);
            ctx.own_status.note(&name, &derived.status);
            status_write::write_whole_since(api, &name, &derived.status, Some(prev), with_node_loss).await?;
        }
        ctx.note_status_written(&name);
    }
    ctx.metrics.cr_ready.set(status::cr_ready_value(&derived.status));
    let warning = derived.state.is_warning();
    if derived.transition {
        if !warning {
            publish(
                ctx,
                hpp,
                EventType::Normal,
                derived.reason.clone(),
                derived.message.clone(),
            )
            .await;
        } else if !ctx.hold(hpp, &derived.reason, &derived.message) {
            publish(
                ctx,
                hpp,
                EventType::Warning,
                derived.reason.clone(),
                derived.message.clone(),
            )
            .await;
        }
    }
    let (due, due_in) = ctx.due_warnings(hpp, warning);
    for (reason, message) in due {
        publish(ctx, hpp, EventType::Warning, reason, message).await;
    }
    Ok(StatusWritten {
        transition: derived.transition,
        warnings_due_in: due_in,
        status_due_in: match stale_copy {
            true => Some(Duration::ZERO),
            false => usage_due_in,
        },
    })
}

/// What `write_status` did that its callers act on.
struct StatusWritten {
    /// The conditions changed.
    transition: bool,
    /// Held Warning Events are due in this long (reconcile again then).
    warnings_due_in: Option<Duration>,
    /// Reconcile again in this long for the status: when held usage figures are due, or at
    /// once (zero) when the pass read an older copy of the CR than the watch holds.
    status_due_in: Option<Duration>,
}

/// Updates the gauges fed by step warnings and publishes each new warning as a Warning Event
/// on its object; a warning that is no longer reported is forgotten, so it is published again
/// if it comes back.
async fn publish_warnings(ctx: &Context, warnings: &[ObjectWarning]) {
    ctx.metrics
        .set_unknown_pool_classes(&crate::reconcilers::storage_class_pools::flagged_classes(warnings));
    let key = |w: &ObjectWarning| {
        let r = &w.regarding;
        (
            format!(
                "{}/{}/{}",
                r.kind.as_deref().unwrap_or_default(),
                r.namespace.as_deref().unwrap_or_default(),
                r.name.as_deref().unwrap_or_default()
            ),
            w.reason.clone(),
            w.message.clone(),
        )
    };
    let current: BTreeSet<_> = warnings.iter().map(key).collect();
    let new: Vec<&ObjectWarning> = {
        let Ok(mut warned) = ctx.warned.lock() else { return };
        let new = warnings.iter().filter(|w| !warned.contains(&key(w))).collect();
        *warned = current;
        new
    };
    for w in new {
        publish_warning(ctx, w).await;
    }
}

/// Logs a warning and publishes it as a Warning Event on its object; failures are logged.
async fn publish_warning(ctx: &Context, w: &ObjectWarning) {
    warn!(object = ?w.regarding.name, reason = %w.reason, "{}", w.message);
    let Some(recorder) = &ctx.recorder else { return };
    let event = Event {
        type_: EventType::Warning,
        reason: w.reason.clone(),
        note: Some(w.message.clone()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &w.regarding).await {
        warn!(error = %e, "could not publish event");
    }
}

/// Publishes a step's one-off Event on its object; failures are logged, never fatal.
async fn publish_event(ctx: &Context, e: &ObjectEvent) {
    match e.type_ {
        EventType::Warning => warn!(object = ?e.regarding.name, reason = %e.reason, "{}", e.message),
        EventType::Normal => info!(object = ?e.regarding.name, reason = %e.reason, "{}", e.message),
    }
    let Some(recorder) = &ctx.recorder else { return };
    let event = Event {
        type_: e.type_,
        reason: e.reason.clone(),
        note: Some(e.message.clone()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(err) = recorder.publish(&event, &e.regarding).await {
        warn!(error = %err, "could not publish event");
    }
}

/// Publishes an Event about the CR; failures are logged, never fatal.
async fn publish(ctx: &Context, hpp: &HostPathProvisioner, type_: EventType, reason: String, note: String) {
    let Some(recorder) = &ctx.recorder else { return };
    let event = Event {
        type_,
        reason,
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &hpp.object_ref(&())).await {
        warn!(error = %e, "could not publish event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usage_write_waits_for_the_interval_since_the_last_write() {
        let written = tokio::time::Instant::now();
        let minute = Duration::from_secs(60);
        assert_eq!(usage_wait(None, written, minute), None, "no write yet: at once");
        assert_eq!(
            usage_wait(Some(written), written + Duration::from_secs(20), minute),
            Some(Duration::from_secs(40))
        );
        assert_eq!(usage_wait(Some(written), written + minute, minute), None);
        assert_eq!(
            usage_wait(Some(written), written + Duration::from_millis(59_500), minute),
            None,
            "due within the slack: now"
        );
        assert_eq!(
            usage_wait(Some(written), written, Duration::ZERO),
            None,
            "zero: every change at once"
        );
    }
}
