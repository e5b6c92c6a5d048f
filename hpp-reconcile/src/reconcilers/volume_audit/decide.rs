//! The volume audit's decisions, pure: when the next audit is due, which driver pods to ask,
//! and what the nodes' reports say against the PersistentVolumes (orphans and missing volumes).
//! Never a guess: a node that did not answer, a pool it could not read and a volume too young
//! to have its PV yet are not judged at all.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use hpp_api::constants as c;
use hpp_api::inventory::Inventory;
use hpp_api::v1beta1::NodeNotAudited;
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::facts::NodeFact;
use crate::reconcilers::node_loss::decide::{is_ours, pinned_node};

/// How old a volume (its directory's birth time) or a PersistentVolume must be before the audit
/// judges it: CreateVolume answers before the PV object exists, and a PV can be read before
/// its volume shows in a report taken a moment earlier.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(600);

/// The container of the driver in the CSI DaemonSet's pods.
pub const DRIVER_CONTAINER: &str = "hostpath-provisioner";

/// The argument that turns the driver's report on.
const TOKEN_FLAG: &str = "--volume-report-token-file";

/// The claim a PersistentVolume is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Uid.
    pub uid: String,
}

/// What the audit reads of a PersistentVolume of the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditedPv {
    /// PV name.
    pub name: String,
    /// PV uid.
    pub uid: String,
    /// `spec.csi.volumeHandle`: the volume id on its node.
    pub handle: String,
    /// Its `storagePool` volume attribute, or the driver's default pool.
    pub pool: String,
    /// The node its affinity pins it to (none in a shared pool).
    pub node: Option<String>,
    /// `status.phase` is `Bound`.
    pub bound: bool,
    /// It has a deletion timestamp.
    pub deleting: bool,
    /// Its creation timestamp.
    pub created: Option<Timestamp>,
    /// The claim it is bound to.
    pub claim: Option<ClaimRef>,
}

/// The audit's reading of a PV; `None` for another driver's.
pub fn audited_pv(pv: &PersistentVolume) -> Option<AuditedPv> {
    if !is_ours(pv) {
        return None;
    }
    let spec = pv.spec.as_ref()?;
    let csi = spec.csi.as_ref()?;
    let pool = csi
        .volume_attributes
        .as_ref()
        .and_then(|a| a.get(c::PARAM_STORAGE_POOL))
        .filter(|p| !p.is_empty())
        .cloned()
        .unwrap_or_else(|| c::DEFAULT_POOL_NAME.to_owned());
    let claim = spec.claim_ref.as_ref().and_then(|r| {
        Some(ClaimRef {
            namespace: r.namespace.clone()?,
            name: r.name.clone()?,
            uid: r.uid.clone().unwrap_or_default(),
        })
    });
    Some(AuditedPv {
        name: pv.metadata.name.clone().unwrap_or_default(),
        uid: pv.metadata.uid.clone().unwrap_or_default(),
        handle: csi.volume_handle.clone(),
        pool,
        node: pinned_node(pv).map(str::to_owned),
        bound: pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"),
        deleting: pv.metadata.deletion_timestamp.is_some(),
        created: pv.metadata.creation_timestamp.as_ref().map(|t| t.0),
        claim,
    })
}

/// When the next audit may run: `None` now, else the time it is due (one interval after the
/// last, never sooner).
pub fn due(now: Timestamp, last: Option<Timestamp>, interval: Duration) -> Option<Timestamp> {
    let next = last? + SignedDuration::try_from(interval).ok()?;
    (next > now).then_some(next)
}

/// While driver pods still run without the report token (the DaemonSet rolls out after the
/// audit was turned on), an audit that is due waits for them, at most one interval from when it
/// first waited: `Some(until)` to wait, `None` to audit now with the pods that can answer.
pub fn wait_for_rollout(
    now: Timestamp,
    rolling_out: bool,
    waiting_since: Option<Timestamp>,
    interval: Duration,
) -> Option<Timestamp> {
    if !rolling_out {
        return None;
    }
    let limit = waiting_since.unwrap_or(now) + SignedDuration::try_from(interval).ok()?;
    (limit > now).then_some(limit)
}

/// A driver pod to ask for its node's report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverPod {
    /// Its node.
    pub node: String,
    /// Pod name.
    pub pod: String,
    /// Pod IP.
    pub ip: IpAddr,
}

/// Which driver pods can be asked, which cannot (and why), and whether some still run without
/// the report token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Targets {
    /// One pod per node, sorted by node.
    pub ready: Vec<DriverPod>,
    /// Nodes with a driver pod that cannot be asked, sorted by node.
    pub not_audited: Vec<NodeNotAudited>,
    /// Some pod runs without `--volume-report-token-file` (a rollout is under way).
    pub rolling_out: bool,
}

/// Whether a pod is one of the CSI DaemonSet's (the label only its pods carry).
fn is_driver_pod(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(c::LABEL_PROMETHEUS))
        .is_some_and(|v| v == "true")
}

fn has_token_flag(pod: &Pod) -> bool {
    pod.spec.iter().flat_map(|s| &s.containers).any(|ct| {
        ct.name == DRIVER_CONTAINER
            && ct
                .args
                .iter()
                .flatten()
                .any(|a| a == TOKEN_FLAG || a.starts_with(&format!("{TOKEN_FLAG}=")))
    })
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|cond| cond.type_ == "Ready" && cond.status == "True"))
}

/// Why a driver pod cannot be asked, or its address.
fn judge_pod(pod: &Pod, nodes: &BTreeMap<&str, &NodeFact>) -> Result<IpAddr, String> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if pod.metadata.deletion_timestamp.is_some() {
        return Err(format!("driver pod {name} is terminating"));
    }
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default();
    if !nodes.get(node).is_some_and(|n| n.ready) {
        return Err(format!("node {node} is not Ready"));
    }
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    if phase != "Running" {
        return Err(format!("driver pod {name} is {phase}"));
    }
    if !pod_ready(pod) {
        return Err(format!("driver pod {name} is not ready"));
    }
    if !has_token_flag(pod) {
        return Err(format!(
            "driver pod {name} runs without {TOKEN_FLAG} (its DaemonSet is rolling out the audit)"
        ));
    }
    status
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(|| format!("driver pod {name} has no pod IP"))
}

/// The driver pods to ask: of the CSI DaemonSet, on a Ready node, Running and ready, started
/// with the report token, with a pod IP. A node with several such pods (a moment of a rollout)
/// is asked once.
pub fn targets(pods: &[Pod], nodes: &[NodeFact]) -> Targets {
    let nodes: BTreeMap<&str, &NodeFact> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut ready: BTreeMap<String, DriverPod> = BTreeMap::new();
    let mut problems: BTreeMap<String, String> = BTreeMap::new();
    let mut rolling_out = false;
    for pod in pods.iter().filter(|p| is_driver_pod(p)) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue; // not scheduled yet: no node to audit
        };
        rolling_out |= pod.metadata.deletion_timestamp.is_none() && !has_token_flag(pod);
        match judge_pod(pod, &nodes) {
            Ok(ip) => {
                ready.entry(node.clone()).or_insert(DriverPod {
                    node,
                    pod: pod.metadata.name.clone().unwrap_or_default(),
                    ip,
                });
            }
            Err(reason) => {
                problems.entry(node).or_insert(reason);
            }
        }
    }
    Targets {
        not_audited: problems
            .into_iter()
            .filter(|(node, _)| !ready.contains_key(node))
            .map(|(name, reason)| NodeNotAudited { name, reason })
            .collect(),
        ready: ready.into_values().collect(),
        rolling_out,
    }
}

/// A volume in a node's report that no PersistentVolume refers to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Orphan {
    /// Its pool.
    pub pool: String,
    /// The node that reported it (for a shared pool, the first by name).
    pub node: String,
    /// Volume id.
    pub id: String,
    /// Bytes used, once measured.
    pub used_bytes: Option<u64>,
}

/// A Bound PersistentVolume whose volume its node's report lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    /// PV name.
    pub pv: String,
    /// PV uid.
    pub pv_uid: String,
    /// Volume id.
    pub handle: String,
    /// Its pool.
    pub pool: String,
    /// The node it is pinned to (none in a shared pool).
    pub node: Option<String>,
    /// The claim it is bound to.
    pub claim: Option<ClaimRef>,
}

/// What the reports say against the PVs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// Orphans, sorted by pool, node and id.
    pub orphans: Vec<Orphan>,
    /// Missing volumes, sorted by PV name.
    pub missing: Vec<Missing>,
}

/// A shared pool's volume as the reports show it: the first node (by name) listing it, whether
/// any node has it mounted, and its birth time.
type SharedVolume<'a> = (&'a str, bool, Option<i64>);

fn older_than(created: i64, now: Timestamp, grace: Duration) -> bool {
    now.as_second()
        .checked_sub(created)
        .is_some_and(|age| u64::try_from(age).is_ok_and(|age| age >= grace.as_secs()))
}

/// Compares the reports of the nodes that answered (by node name) with the driver's PVs.
///
/// - **Orphan**: a volume in a usable pool that no PV of the driver refers to (by
///   `volumeHandle`, whatever the PV's phase), not published (an inline ephemeral volume in use
///   has no PV), and known to be older than `grace`. A shared pool's volume is reported once.
/// - **Missing**: a Bound PV, not being deleted and older than `grace`, whose node answered with
///   its pool usable but without the volume; for a shared pool, whose volume no usable report
///   of that pool has. A PV whose node did not answer, or whose pool that node does not serve
///   or could not read, is not judged.
pub fn compare(reports: &BTreeMap<String, Inventory>, pvs: &[AuditedPv], now: Timestamp, grace: Duration) -> Findings {
    let handles: BTreeSet<&str> = pvs.iter().map(|pv| pv.handle.as_str()).collect();
    let shared: BTreeSet<&str> = reports
        .values()
        .flat_map(|r| &r.pools)
        .filter(|p| p.shared)
        .map(|p| p.name.as_str())
        .collect();
    // Volumes of each shared pool seen by any usable report: the first node (by name) that
    // lists it, whether any node has it mounted, and its birth time.
    let mut shared_volumes: BTreeMap<&str, BTreeMap<&str, SharedVolume<'_>>> = BTreeMap::new();
    let mut found: Vec<Orphan> = Vec::new();
    let orphan = |id: &str, published: bool, created_at: Option<i64>| {
        !handles.contains(id) && !published && created_at.is_some_and(|t| older_than(t, now, grace))
    };
    for (node, report) in reports {
        for pool in report.pools.iter().filter(|p| p.usable) {
            if shared.contains(pool.name.as_str()) {
                let seen = shared_volumes.entry(&pool.name).or_default();
                for v in &pool.volumes {
                    let entry = seen.entry(&v.id).or_insert((node, false, v.created_at));
                    entry.1 |= v.published;
                }
                continue;
            }
            found.extend(
                pool.volumes
                    .iter()
                    .filter(|v| orphan(&v.id, v.published, v.created_at))
                    .map(|v| Orphan {
                        pool: pool.name.clone(),
                        node: node.clone(),
                        id: v.id.clone(),
                        used_bytes: None,
                    }),
            );
        }
    }
    for (pool, volumes) in &shared_volumes {
        for (id, (node, published, created_at)) in volumes {
            if orphan(id, *published, *created_at) {
                found.push(Orphan {
                    pool: (*pool).to_owned(),
                    node: (*node).to_owned(),
                    id: (*id).to_owned(),
                    used_bytes: None,
                });
            }
        }
    }
    found.sort();
    let mut missing: Vec<Missing> = pvs
        .iter()
        .filter(|pv| pv.bound && !pv.deleting)
        .filter(|pv| pv.created.is_some_and(|t| older_than(t.as_second(), now, grace)))
        .filter(|pv| {
            if shared.contains(pv.pool.as_str()) {
                // Judged when some node could read the pool.
                shared_volumes
                    .get(pv.pool.as_str())
                    .is_some_and(|ids| !ids.contains_key(pv.handle.as_str()))
            } else {
                let Some(report) = pv.node.as_deref().and_then(|n| reports.get(n)) else {
                    return false;
                };
                report
                    .pools
                    .iter()
                    .find(|p| p.name == pv.pool)
                    .is_some_and(|p| p.usable && !p.volumes.iter().any(|v| v.id == pv.handle))
            }
        })
        .map(|pv| Missing {
            pv: pv.name.clone(),
            pv_uid: pv.uid.clone(),
            handle: pv.handle.clone(),
            pool: pv.pool.clone(),
            node: pv.node.clone(),
            claim: pv.claim.clone(),
        })
        .collect();
    missing.sort_by(|a, b| a.pv.cmp(&b.pv));
    Findings {
        orphans: found,
        missing,
    }
}
