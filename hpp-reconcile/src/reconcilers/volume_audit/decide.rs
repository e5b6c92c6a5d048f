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

/// Whether a pod is one of the CSI DaemonSet's: the app label of hpp's DaemonSets and the
/// Prometheus label only the CSI one's pods carry besides the operator's own.
fn is_driver_pod(pod: &Pod) -> bool {
    let labels = pod.metadata.labels.as_ref();
    let has = |k: &str, v: &str| labels.and_then(|l| l.get(k)).is_some_and(|x| x == v);
    has(c::LABEL_APP, c::LABEL_APP_VALUE) && has(c::LABEL_PROMETHEUS, "true")
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hpp_api::inventory::{PoolInventory, VolumeEntry};
    use serde_json::json;

    const NOW: i64 = 1_750_000_000;
    const HOUR: i64 = 3600;

    fn now() -> Timestamp {
        Timestamp::from_second(NOW).unwrap()
    }

    fn vol(id: &str, age: Option<i64>, published: bool) -> VolumeEntry {
        VolumeEntry {
            id: id.into(),
            created_at: age.map(|a| NOW - a),
            published,
            capacity_bytes: None,
            used_bytes: None,
        }
    }

    fn pool(name: &str, shared: bool, usable: bool, volumes: Vec<VolumeEntry>) -> PoolInventory {
        PoolInventory {
            name: name.into(),
            shared,
            usable,
            reason: (!usable).then(|| "not mounted".into()),
            volumes,
        }
    }

    fn reports(list: Vec<(&str, Vec<PoolInventory>)>) -> BTreeMap<String, Inventory> {
        list.into_iter()
            .map(|(node, pools)| {
                (
                    node.to_owned(),
                    Inventory {
                        node: node.into(),
                        pools,
                    },
                )
            })
            .collect()
    }

    fn pv(name: &str, pool: &str, node: Option<&str>, phase: &str, age: i64) -> AuditedPv {
        AuditedPv {
            name: name.into(),
            uid: format!("uid-{name}"),
            handle: name.into(),
            pool: pool.into(),
            node: node.map(Into::into),
            bound: phase == "Bound",
            deleting: false,
            created: Some(Timestamp::from_second(NOW - age).unwrap()),
            claim: Some(ClaimRef {
                namespace: "apps".into(),
                name: format!("claim-{name}"),
                uid: format!("cuid-{name}"),
            }),
        }
    }

    fn orphans(f: &Findings) -> Vec<String> {
        f.orphans
            .iter()
            .map(|o| format!("{}/{}/{}", o.pool, o.node, o.id))
            .collect()
    }

    fn missing(f: &Findings) -> Vec<&str> {
        f.missing.iter().map(|m| m.pv.as_str()).collect()
    }

    #[test]
    fn an_old_unmounted_volume_no_pv_refers_to_is_an_orphan_and_nothing_else_is() {
        let r = reports(vec![(
            "node01",
            vec![pool(
                "local",
                false,
                true,
                vec![
                    vol("pvc-bound", Some(HOUR), true),
                    vol("pvc-released", Some(HOUR), false),
                    vol("stray", Some(HOUR), false),
                    vol("young", Some(60), false),
                    vol("mounted-inline", Some(HOUR), true),
                    vol("unknown-age", None, false),
                ],
            )],
        )]);
        let pvs = [
            pv("pvc-bound", "local", Some("node01"), "Bound", HOUR),
            pv("pvc-released", "local", Some("node01"), "Released", HOUR),
        ];
        let f = compare(&r, &pvs, now(), DEFAULT_GRACE);
        assert_eq!(orphans(&f), ["local/node01/stray"]);
        assert!(f.missing.is_empty());
    }

    #[test]
    fn an_unreadable_pool_or_a_silent_node_judges_nothing() {
        let r = reports(vec![(
            "node01",
            vec![pool("local", false, false, vec![]), pool("other", false, true, vec![])],
        )]);
        let pvs = [
            pv("pvc-a", "local", Some("node01"), "Bound", HOUR),
            pv("pvc-b", "local", Some("node02"), "Bound", HOUR),
            pv("pvc-c", "gone-pool", Some("node01"), "Bound", HOUR),
            pv("pvc-d", "local", None, "Bound", HOUR),
        ];
        let f = compare(&r, &pvs, now(), DEFAULT_GRACE);
        assert_eq!(
            f,
            Findings::default(),
            "unusable pool, unanswered node, unknown pool, no node"
        );
        // An unusable pool lists no volumes: none of its orphans either.
        assert!(compare(&reports(vec![]), &pvs, now(), DEFAULT_GRACE).missing.is_empty());
    }

    #[test]
    fn a_bound_pv_whose_volume_its_node_lacks_is_missing() {
        let r = reports(vec![(
            "node01",
            vec![pool("local", false, true, vec![vol("pvc-here", Some(HOUR), true)])],
        )]);
        let mut deleting = pv("pvc-deleting", "local", Some("node01"), "Bound", HOUR);
        deleting.deleting = true;
        let pvs = [
            pv("pvc-here", "local", Some("node01"), "Bound", HOUR),
            pv("pvc-gone", "local", Some("node01"), "Bound", HOUR),
            pv("pvc-released", "local", Some("node01"), "Released", HOUR),
            pv("pvc-failed", "local", Some("node01"), "Failed", HOUR),
            pv("pvc-new", "local", Some("node01"), "Bound", 30),
            deleting,
        ];
        let f = compare(&r, &pvs, now(), DEFAULT_GRACE);
        assert_eq!(missing(&f), ["pvc-gone"]);
        let m = &f.missing[0];
        assert_eq!(m.node.as_deref(), Some("node01"));
        assert_eq!(m.claim.as_ref().unwrap().name, "claim-pvc-gone");
        assert!(f.orphans.is_empty());
    }

    #[test]
    fn the_default_pool_is_legacy() {
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "pvc-1", "uid": "u1", "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"csi": {"driver": c::DRIVER_NAME, "volumeHandle": "pvc-1"},
                     "claimRef": {"namespace": "apps", "name": "data", "uid": "c1"},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": c::TOPOLOGY_KEY, "operator": "In", "values": ["node01"]}]}]}}},
            "status": {"phase": "Bound"},
        }))
        .unwrap();
        let a = audited_pv(&pv).unwrap();
        assert_eq!(a.pool, c::DEFAULT_POOL_NAME);
        assert_eq!(a.node.as_deref(), Some("node01"));
        assert!(a.bound && !a.deleting);
        assert_eq!(a.claim.unwrap().uid, "c1");
        let mut other = pv.clone();
        other.spec.as_mut().unwrap().csi.as_mut().unwrap().driver = "other.example.com".into();
        assert_eq!(audited_pv(&other), None);
    }

    #[test]
    fn a_shared_pool_is_judged_on_the_union_of_its_reports() {
        let shared = |vols: Vec<VolumeEntry>| vec![pool("nfs", true, true, vols)];
        let r = reports(vec![
            (
                "node01",
                shared(vec![
                    vol("stray", Some(HOUR), false),
                    vol("used-on-02", Some(HOUR), false),
                    vol("pvc-a", Some(HOUR), false),
                ]),
            ),
            (
                "node02",
                shared(vec![
                    vol("stray", Some(HOUR), false),
                    vol("used-on-02", Some(HOUR), true),
                    vol("pvc-a", Some(HOUR), false),
                ]),
            ),
            ("node03", vec![pool("nfs", true, false, vec![])]),
        ]);
        let pvs = [
            pv("pvc-a", "nfs", None, "Bound", HOUR),
            pv("pvc-b", "nfs", None, "Bound", HOUR),
        ];
        let f = compare(&r, &pvs, now(), DEFAULT_GRACE);
        assert_eq!(
            orphans(&f),
            ["nfs/node01/stray"],
            "once, and not while mounted anywhere"
        );
        assert_eq!(missing(&f), ["pvc-b"]);
        assert_eq!(f.missing[0].node, None);
        // Only the node that cannot read the pool answered: nothing is judged.
        let r = reports(vec![("node03", vec![pool("nfs", true, false, vec![])])]);
        assert_eq!(compare(&r, &pvs, now(), DEFAULT_GRACE), Findings::default());
    }

    #[test]
    fn an_audit_is_due_one_interval_after_the_last_never_sooner() {
        let interval = Duration::from_secs(600);
        assert_eq!(due(now(), None, interval), None, "never ran: now");
        let last = Timestamp::from_second(NOW - 599).unwrap();
        assert_eq!(
            due(now(), Some(last), interval),
            Some(Timestamp::from_second(NOW + 1).unwrap())
        );
        let last = Timestamp::from_second(NOW - 600).unwrap();
        assert_eq!(due(now(), Some(last), interval), None);
    }

    #[test]
    fn a_due_audit_waits_for_the_rollout_at_most_one_interval() {
        let interval = Duration::from_secs(600);
        assert_eq!(wait_for_rollout(now(), false, None, interval), None);
        assert_eq!(
            wait_for_rollout(now(), true, None, interval),
            Some(Timestamp::from_second(NOW + 600).unwrap())
        );
        let since = Timestamp::from_second(NOW - 600).unwrap();
        assert_eq!(
            wait_for_rollout(now(), true, Some(since), interval),
            None,
            "waited enough"
        );
    }

    fn driver_pod(name: &str, node: &str, ip: &str, phase: &str, ready: bool, flag: bool) -> Pod {
        let mut args = vec!["--drivername=kubevirt.io.hostpath-provisioner".to_owned()];
        if flag {
            args.push(format!("{TOKEN_FLAG}=/etc/hpp/volume-report/token"));
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {c::LABEL_APP: c::LABEL_APP_VALUE, c::LABEL_PROMETHEUS: "true"}},
            "spec": {"nodeName": node, "containers": [{"name": DRIVER_CONTAINER, "args": args}]},
            "status": {"phase": phase, "podIP": ip,
                       "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }))
        .unwrap()
    }

    #[test]
    fn only_running_ready_driver_pods_with_the_token_on_ready_nodes_are_asked() {
        let mut legacy = driver_pod("legacy-x", "node01", "10.0.0.9", "Running", true, true);
        legacy.metadata.labels.as_mut().unwrap().remove(c::LABEL_PROMETHEUS);
        let pods = [
            driver_pod("csi-a", "node01", "10.0.0.1", "Running", true, true),
            driver_pod("csi-b", "node02", "10.0.0.2", "Pending", false, true),
            driver_pod("csi-c", "node03", "10.0.0.3", "Running", false, true),
            driver_pod("csi-d", "node04", "10.0.0.4", "Running", true, false),
            driver_pod("csi-e", "node05", "10.0.0.5", "Running", true, true),
            driver_pod("csi-f", "node06", "not-an-ip", "Running", true, true),
            legacy,
        ];
        let mut nodes: Vec<NodeFact> = ["node01", "node02", "node03", "node04", "node06"]
            .iter()
            .map(|n| NodeFact::ready(n))
            .collect();
        nodes.push(NodeFact {
            name: "node05".into(),
            ready: false,
            ..Default::default()
        });
        let t = targets(&pods, &nodes);
        assert_eq!(
            t.ready,
            [DriverPod {
                node: "node01".into(),
                pod: "csi-a".into(),
                ip: "10.0.0.1".parse().unwrap()
            }]
        );
        let why: Vec<(&str, &str)> = t
            .not_audited
            .iter()
            .map(|n| (n.name.as_str(), n.reason.as_str()))
            .collect();
        assert_eq!(
            why,
            [
                ("node02", "driver pod csi-b is Pending"),
                ("node03", "driver pod csi-c is not ready"),
                (
                    "node04",
                    "driver pod csi-d runs without --volume-report-token-file (its DaemonSet is rolling out the audit)"
                ),
                ("node05", "node node05 is not Ready"),
                ("node06", "driver pod csi-f has no pod IP"),
            ]
        );
        assert!(t.rolling_out);
    }
}
