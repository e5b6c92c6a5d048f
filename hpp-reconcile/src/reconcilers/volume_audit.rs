//! The volume audit (`spec.volumeAudit`): every interval, ask each node's CSI driver for its
//! volumes and compare them with the driver's PersistentVolumes. Report first, never delete on
//! a guess: orphans (directories no PV refers to) go to the `OrphanedVolumes` condition, the
//! pools' `volumeAudit` status and the `kubevirt_hpp_orphaned_*` gauges; missing volumes (a
//! Bound PV whose directory its node lacks) get a Warning Event on the PV and its claim. An
//! admin moves an orphan into its pool's trash with one command (the condition gives it).
//!
//! - **Off unless asked for**: without `spec.volumeAudit` the step renders nothing, reads
//!   nothing and reports nothing.
//! - **Token**: a Secret with a random bearer token ([`token`]), mounted into the driver
//!   container, which then serves `GET /volumes` on its metrics port (8443) to callers that
//!   present it.
//! - **When** ([`decide::due`]): one interval after the last audit (its time is kept in
//!   `status.volumeAudit.lastAuditTime`, so a restarted operator does not audit early), and
//!   the step asks for a pass then ([`Readiness::requeue_after`]). Right after the audit is
//!   turned on, it waits for the DaemonSet to roll the token out, and while no driver pod can
//!   be asked at all (a first install), at most one interval.
//! - **Who** ([`decide::targets`]): the CSI driver pods that are Running and ready on a Ready
//!   node with a pod IP; a pod that cannot be asked or does not answer makes its node "not
//!   audited", whose PVs are never called missing.
//! - **Cost**: per audit one HTTPS request per node (16 at a time, each within a timeout) and a
//!   second one to nodes holding orphans, to measure their bytes (`?usage=`, at most 64 ids);
//!   the driver pods and the PVs come from the watches the operator keeps anyway (the pool
//!   mounts step's pods, the PV watch the pool status and node loss use). Between audits a pass
//!   costs a clock comparison.

pub mod decide;
pub mod fetch;
pub mod report;
pub mod token;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use hpp_api::constants as c;
use hpp_api::inventory::{self, Inventory};
use hpp_api::v1beta1::NodeNotAudited;
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use tracing::{info, instrument, warn};

use self::decide::{AuditedPv, DriverPod, Findings, Missing};
use self::fetch::ReportClient;
pub use self::report::{
    CONDITION_ORPHANED_VOLUMES, REASON_AUDIT_PENDING, REASON_NO_NODE_AUDITED, REASON_NO_ORPHANS, REASON_ORPHANS_FOUND,
    REASON_VOLUME_MISSING,
};
use crate::apply::Applier;
use crate::config::OperatorConfig;
use crate::error::{Error, Result};
use crate::facts::ClusterFacts;
use crate::gather::typed;
use crate::names;
use crate::object::{DesiredObject, Kind};
use crate::permissions::{Permission, WRITE};
use crate::subreconciler::{Readiness, SubReconciler, VolumeAuditReport};

/// The port of the drivers' report (their metrics listener).
pub const DEFAULT_PORT: u16 = 8443;
/// How long one node's report may take (connect, handshake, answer). The driver gives its own
/// report 60 s; a node that takes longer is reported as not audited.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// How many nodes are asked at once.
pub const DEFAULT_CONCURRENCY: usize = 16;

/// An audit that ran: when, what it found, and the missing volumes to warn about.
#[derive(Clone, Debug)]
struct Done {
    at: Timestamp,
    report: VolumeAuditReport,
    missing: Vec<Missing>,
}

/// What the step remembers between passes.
#[derive(Debug, Default)]
struct Memory {
    last: Option<Done>,
    /// Since when a due audit waits for the driver pods to get the token.
    waiting_since: Option<Timestamp>,
}

/// The volume-audit step; see the module docs. Clones share what they remember.
#[derive(Clone, Debug)]
pub struct VolumeAudit {
    port: u16,
    timeout: Duration,
    concurrency: usize,
    grace: Duration,
    memory: Arc<Mutex<Memory>>,
}

impl Default for VolumeAudit {
    fn default() -> Self {
        VolumeAudit {
            port: DEFAULT_PORT,
            timeout: DEFAULT_TIMEOUT,
            concurrency: DEFAULT_CONCURRENCY,
            grace: decide::DEFAULT_GRACE,
            memory: Arc::default(),
        }
    }
}

impl VolumeAudit {
    /// Asks the drivers on this port instead of 8443.
    pub fn with_port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Gives each node's report this long instead of 30 s.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Asks this many nodes at once instead of 16.
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// Judges volumes and PVs only once they are this old instead of 10 minutes.
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    fn recall(&self) -> (Option<Done>, Option<Timestamp>) {
        self.memory
            .lock()
            .map(|m| (m.last.clone(), m.waiting_since))
            .unwrap_or_default()
    }

    fn remember(&self, last: Option<Done>, waiting_since: Option<Timestamp>) {
        if let Ok(mut m) = self.memory.lock() {
            m.last = last;
            m.waiting_since = waiting_since;
        }
    }

    /// The live token, from the Secret this pass applied.
    async fn token(&self, applier: &Applier, cfg: &OperatorConfig) -> Result<Option<String>> {
        let live = applier
            .get(&token::secret_kind(), Some(&cfg.namespace), names::VOLUME_REPORT_SECRET)
            .await?;
        Ok(live.as_ref().and_then(token::token_of))
    }

    /// Asks every target for its report; the reports that came back and the nodes that did not
    /// answer.
    async fn first_round(
        &self,
        client: &ReportClient,
        targets: &[DriverPod],
    ) -> (BTreeMap<String, Inventory>, Vec<NodeNotAudited>) {
        let requests = targets
            .iter()
            .map(|t| {
                (
                    t.node.clone(),
                    fetch::address(t.ip, self.port),
                    inventory::PATH.to_owned(),
                )
            })
            .collect();
        let mut reports = BTreeMap::new();
        let mut failed = Vec::new();
        for (node, answer) in fetch::fetch_all(client, requests, self.concurrency).await {
            match answer {
                Ok(report) => {
                    reports.insert(node, report);
                }
                Err(e) => {
                    warn!(node = %node, error = %e, "volume audit: no report from the node's driver");
                    failed.push(NodeNotAudited {
                        name: node,
                        reason: e.to_string(),
                    });
                }
            }
        }
        (reports, failed)
    }

    /// Asks the nodes holding orphans for their usage (`?usage=`) and fills in their bytes; a
    /// node that does not answer this time leaves its orphans unmeasured.
    async fn measure(&self, client: &ReportClient, targets: &[DriverPod], findings: &mut Findings) {
        let mut by_node: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for o in &findings.orphans {
            by_node.entry(&o.node).or_default().push(&o.id);
        }
        let requests = targets
            .iter()
            .filter_map(|t| {
                let ids = by_node.get(t.node.as_str())?;
                Some((
                    t.node.clone(),
                    fetch::address(t.ip, self.port),
                    inventory::usage_target(ids.iter().copied()),
                ))
            })
            .collect();
        let answers = fetch::fetch_all(client, requests, self.concurrency).await;
        let mut used: BTreeMap<(String, String, String), u64> = BTreeMap::new();
        for (node, answer) in answers {
            match answer {
                Ok(report) => {
                    for pool in report.pools {
                        for v in pool.volumes {
                            if let Some(bytes) = v.used_bytes {
                                used.insert((node.clone(), pool.name.clone(), v.id), bytes);
                            }
                        }
                    }
                }
                Err(e) => warn!(node = %node, error = %e, "volume audit: could not measure the node's orphans"),
            }
        }
        for o in &mut findings.orphans {
            o.used_bytes = used.get(&(o.node.clone(), o.pool.clone(), o.id.clone())).copied();
        }
    }

    /// The driver's PVs, from the PV watch's cache when it is synced.
    /// Each is parsed and kept as an [`AuditedPv`] one at a time: the cluster's PVs are never
    /// all held parsed at once.
    async fn volumes(&self, applier: &Applier, cfg: &OperatorConfig) -> Result<Vec<AuditedPv>> {
        applier
            .list_map(
                &Kind::of::<PersistentVolume>(),
                "",
                &cfg.namespace,
                |pv: PersistentVolume| decide::audited_pv(&pv),
            )
            .await
    }

    /// The driver pods, from the pod watch's cache when it is synced.
    async fn pods(&self, applier: &Applier, cfg: &OperatorConfig) -> Result<Vec<Pod>> {
        applier
            .list(&pod_kind(), &pod_selector(), &cfg.namespace)
            .await?
            .into_iter()
            .map(typed)
            .collect()
    }

    /// One audit of the `targets`, with the nodes already known not to be auditable.
    async fn audit(
        &self,
        applier: &Applier,
        cfg: &OperatorConfig,
        token: &str,
        targets: &decide::Targets,
        now: Timestamp,
    ) -> Result<Done> {
        let client = ReportClient::new(token, self.timeout).map_err(|e| Error::VolumeAudit(e.to_string()))?;
        let (reports, failed) = self.first_round(&client, &targets.ready).await;
        // Read after the reports: a PV made since is younger than the grace and not judged.
        let volumes = self.volumes(applier, cfg).await?;
        let mut findings = decide::compare(&reports, &volumes, now, self.grace);
        if !findings.orphans.is_empty() {
            self.measure(&client, &targets.ready, &mut findings).await;
        }
        let mut not_audited = targets.not_audited.clone();
        not_audited.extend(failed);
        let report = report::summarize(&findings, &reports, not_audited, now);
        info!(
            nodes = reports.len(),
            not_audited = report.status.nodes_not_audited,
            orphans = findings.orphans.len(),
            missing = findings.missing.len(),
            "volume audit done"
        );
        Ok(Done {
            at: now,
            report,
            missing: findings.missing,
        })
    }
}

fn pod_kind() -> Kind {
    Kind::of::<Pod>()
}

/// The selector of the pod watch the pool-mounts step keeps (every pod of hpp's DaemonSets).
fn pod_selector() -> String {
    format!("{}={}", c::LABEL_APP, c::LABEL_APP_VALUE)
}

/// What a pass publishes: the last audit (or that none ran yet), and when to come back.
fn publish(last: Option<&Done>, namespace: &str, requeue: Option<Duration>) -> Readiness {
    let report = last.map(|d| d.report.clone()).unwrap_or_default();
    Readiness {
        conditions: vec![report::condition(last.map(|d| &d.report), namespace)],
        warnings: last.map(|d| report::missing_warnings(&d.missing)).unwrap_or_default(),
        volume_audit: Some(report),
        requeue_after: requeue,
        ..Readiness::ready()
    }
}

/// How long from `now` until `then` (zero when it is past).
fn until(now: Timestamp, then: Timestamp) -> Duration {
    Duration::try_from(then.duration_since(now)).unwrap_or_default()
}

#[async_trait]
impl SubReconciler for VolumeAudit {
    fn name(&self) -> &str {
        names::STEP_VOLUME_AUDIT
    }

    /// The token Secret: the sweep removes it when the audit is turned off.
    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        vec![token::secret_kind()]
    }

    fn permissions(&self, _facts: &ClusterFacts) -> Vec<Permission> {
        vec![
            Permission::on(&token::secret_kind(), &WRITE)
                .named([names::VOLUME_REPORT_SECRET])
                .because(
                    "volume-audit (spec.volumeAudit): the bearer token's Secret, made, read back and deleted when \
                 the audit is turned off; without the audit the operator only watches (and finds no) Secrets.",
                ),
        ]
    }

    fn watches(&self) -> Vec<(Kind, String)> {
        vec![(pod_kind(), pod_selector())]
    }

    /// The token Secret, without its token (added when it is applied: see [`token`]).
    fn desired(
        &self,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        _facts: &ClusterFacts,
    ) -> Result<Vec<DesiredObject>> {
        let Some(audit) = &hpp.spec.volume_audit else {
            return Ok(Vec::new());
        };
        audit
            .interval()
            .map_err(|e| Error::InvalidSpec(format!("spec.volumeAudit.interval: {e}")))?;
        Ok(vec![token::desired_secret(hpp, cfg, None)?])
    }

    /// Applies the token Secret with the token it holds, or a new one when it holds none.
    async fn apply(&self, applier: &Applier, desired: &[DesiredObject]) -> Result<Vec<DynamicObject>> {
        let mut live = Vec::with_capacity(desired.len());
        for d in desired {
            let mut d = d.clone();
            if d.kind == token::secret_kind() && d.object.data.get("data").is_none() {
                let key = d.key();
                let existing = applier.get(&d.kind, key.namespace.as_deref(), &key.name).await?;
                let token = match existing.as_ref().and_then(token::token_of) {
                    Some(t) => t,
                    None => {
                        info!(secret = %key, "making the volume report token");
                        token::new_token()?
                    }
                };
                token::set_token(&mut d, &token)?;
            }
            live.push(applier.apply(&self.field_manager(), &d).await?);
        }
        Ok(live)
    }

    #[instrument(skip_all, fields(step = names::STEP_VOLUME_AUDIT))]
    async fn act(
        &self,
        applier: &Applier,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
    ) -> Result<Readiness> {
        let Some(spec) = &hpp.spec.volume_audit else {
            self.remember(None, None);
            return Ok(Readiness::ready());
        };
        let Some(now) = facts.now else {
            return Ok(Readiness::ready());
        };
        let interval = spec
            .interval()
            .map_err(|e| Error::InvalidSpec(format!("spec.volumeAudit.interval: {e}")))?;
        let (mut last, waiting_since) = self.recall();
        if last.is_none() {
            // A restarted operator goes on from the stored status.
            last = hpp
                .status
                .as_ref()
                .and_then(report::from_status)
                .map(|(at, report)| Done {
                    at,
                    report,
                    missing: Vec::new(),
                });
        }
        if let Some(next) = decide::due(now, last.as_ref().map(|d| d.at), interval) {
            self.remember(last.clone(), waiting_since);
            return Ok(publish(last.as_ref(), &cfg.namespace, Some(until(now, next))));
        }
        let targets = decide::targets(&self.pods(applier, cfg).await?, &facts.nodes);
        // No pod to ask yet (a first install) counts as a rollout under way.
        let not_yet = targets.rolling_out || targets.ready.is_empty();
        if let Some(wait) = decide::wait_for_rollout(now, not_yet, waiting_since, interval) {
            info!("volume audit: waiting for the CSI driver pods to run with the report token");
            self.remember(last.clone(), Some(waiting_since.unwrap_or(now)));
            return Ok(publish(last.as_ref(), &cfg.namespace, Some(until(now, wait))));
        }
        let Some(token) = self.token(applier, cfg).await? else {
            // Applied earlier in this pass; a cache that has not seen it yet catches up.
            self.remember(last.clone(), waiting_since);
            return Ok(publish(last.as_ref(), &cfg.namespace, Some(Duration::from_secs(5))));
        };
        let done = self.audit(applier, cfg, &token, &targets, now).await?;
        let readiness = publish(Some(&done), &cfg.namespace, Some(interval));
        self.remember(Some(done), None);
        Ok(readiness)
    }
}
