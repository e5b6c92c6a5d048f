//! pvcTemplate storage pools: which PVCs, mounter Deployments, overlay StorageClasses and
//! cleanup Jobs should exist given the nodes, and the deletion sequence that unmounts them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use hpp_api::constants as c;
use hpp_api::quantity::format_bytes;
use hpp_api::quota::QuotaMode;
use hpp_api::v1beta1::{ClaimStatus, StoragePoolStatus};
use k8s_openapi::api::core::v1::{PersistentVolumeClaimStatus, Toleration};
use kube::ResourceExt;
use kube::api::DynamicObject;

use super::common::{deployment_kind, job_kind, pvc_kind, storage_class_kind};
use super::pool_objects as obj;
use crate::apply::Applier;
use crate::config::OperatorConfig;
use crate::error::{Error, Result};
use crate::facts::{ClusterFacts, NodeFact};
use crate::names;
use crate::object::{DesiredObject, Kind};
use crate::permissions::{Permission, WRITE};
use crate::subreconciler::{Readiness, SubReconciler};

fn tolerates(tolerations: &[Toleration], taint: &k8s_openapi::api::core::v1::Taint) -> bool {
    tolerations.iter().any(|t| {
        let effect_ok = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == taint.effect);
        let key_ok = match t.key.as_deref() {
            None | Some("") => t.operator.as_deref() == Some("Exists"),
            Some(k) => k == taint.key,
        };
        let value_ok = t.operator.as_deref() == Some("Exists")
            || t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("");
        effect_ok && key_ok && value_ok
    })
}

/// Whether the CSI DaemonSet would run on this node: nodeSelector, required node affinity and
/// NoSchedule/NoExecute taints, as the scheduler decides.
pub fn runs_on(hpp: &HostPathProvisioner, node: &NodeFact) -> bool {
    let w = hpp.spec.workload.as_ref();
    let selector_ok = w
        .and_then(|w| w.node_selector.as_ref())
        .is_none_or(|sel| sel.iter().all(|(k, v)| node.labels.get(k) == Some(v)));
    let tolerations = w.and_then(|w| w.tolerations.as_deref()).unwrap_or_default();
    let taints_ok = node
        .taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|t| tolerates(tolerations, t));
    let affinity_ok = super::node_affinity::required_affinity_matches(w.and_then(|w| w.affinity.as_ref()), node);
    selector_ok && taints_ok && affinity_ok
}

/// Nodes the pools are prepared on, sorted by name.
pub fn pool_nodes<'a>(hpp: &HostPathProvisioner, facts: &'a ClusterFacts) -> Vec<&'a NodeFact> {
    let mut nodes: Vec<&NodeFact> = facts.nodes.iter().filter(|n| runs_on(hpp, n)).collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    nodes
}

/// Drops a live workload's pod template (the bulk of a mounter Deployment or a cleanup Job),
/// which no pool readiness reads.
fn drop_pod_template(obj: &mut DynamicObject) {
    if let Some(spec) = obj.data.get_mut("spec").and_then(serde_json::Value::as_object_mut) {
        spec.remove("template");
    }
}

/// Every pool object that should exist now.
pub fn desired_pool_objects(
    hpp: &HostPathProvisioner,
    cfg: &OperatorConfig,
    facts: &ClusterFacts,
) -> Result<Vec<DesiredObject>> {
    let nodes = pool_nodes(hpp, facts);
    let mut out = Vec::new();
    let mut wanted_mounters = BTreeSet::new();
    for pool in hpp
        .spec
        .storage_pools
        .iter()
        .flatten()
        .filter(|p| p.pvc_template.is_some())
    {
        let label = names::pool_label_value(&pool.name);
        let mut claims = BTreeSet::new();
        if pool.is_shared() {
            out.push(obj::overlay_storage_class(pool, cfg)?);
            if !nodes.is_empty() {
                claims.insert(names::pool_shared_claim_name(&pool.name));
            }
        } else {
            claims.extend(nodes.iter().map(|n| names::pool_node_name(&pool.name, &n.name)));
            // Claims of nodes that left stay: their data is still there if the node comes back.
            claims.extend(
                facts
                    .claims
                    .iter()
                    .filter(|cl| cl.pool_label == label)
                    .map(|cl| cl.name.clone()),
            );
        }
        for claim in &claims {
            out.push(obj::pool_claim(pool, claim, cfg)?);
        }
        for node in &nodes {
            let claim = if pool.is_shared() {
                names::pool_shared_claim_name(&pool.name)
            } else {
                names::pool_node_name(&pool.name, &node.name)
            };
            out.push(obj::mounter_deployment(hpp, pool, &node.name, &claim, cfg)?);
            wanted_mounters.insert((label.clone(), node.name.clone()));
        }
    }
    // A mounter that is no longer wanted leaves a mount behind: unmount it with a Job.
    out.extend(cleanup_jobs(hpp, cfg, facts, &wanted_mounters)?);
    Ok(out)
}

/// The part of [`pool_parts`] that holds what is not one node's: overlay StorageClasses,
/// shared claims, claims of nodes that left, and cleanup Jobs. Node names are never empty.
pub const CLUSTER_PART: &str = "";

/// The parts the pool objects are rendered in: [`CLUSTER_PART`], then one per node the pools
/// are prepared on (its claims and mounters). Together they are [`desired_pool_objects`].
pub fn pool_parts(hpp: &HostPathProvisioner, facts: &ClusterFacts) -> Vec<String> {
    std::iter::once(CLUSTER_PART.to_owned())
        .chain(pool_nodes(hpp, facts).into_iter().map(|n| n.name.clone()))
        .collect()
}

/// The pool objects of one of [`pool_parts`].
pub fn desired_pool_part(
    hpp: &HostPathProvisioner,
    cfg: &OperatorConfig,
    facts: &ClusterFacts,
    part: &str,
) -> Result<Vec<DesiredObject>> {
    let pvc_pools = || {
        hpp.spec
            .storage_pools
            .iter()
            .flatten()
            .filter(|p| p.pvc_template.is_some())
    };
    let mut out = Vec::new();
    if part != CLUSTER_PART {
        let Some(node) = facts.node(part).filter(|n| runs_on(hpp, n)) else {
            return Ok(out);
        };
        for pool in pvc_pools() {
            let claim = if pool.is_shared() {
                names::pool_shared_claim_name(&pool.name)
            } else {
                let claim = names::pool_node_name(&pool.name, &node.name);
                out.push(obj::pool_claim(pool, &claim, cfg)?);
                claim
            };
            out.push(obj::mounter_deployment(hpp, pool, &node.name, &claim, cfg)?);
        }
        return Ok(out);
    }
    let nodes = pool_nodes(hpp, facts);
    for pool in pvc_pools() {
        if pool.is_shared() {
            out.push(obj::overlay_storage_class(pool, cfg)?);
            if !nodes.is_empty() {
                out.push(obj::pool_claim(pool, &names::pool_shared_claim_name(&pool.name), cfg)?);
            }
            continue;
        }
        // Claims of nodes that left stay: their data is still there if the node comes back.
        let label = names::pool_label_value(&pool.name);
        let current: BTreeSet<String> = nodes
            .iter()
            .map(|n| names::pool_node_name(&pool.name, &n.name))
            .collect();
        let left: BTreeSet<&str> = facts
            .claims
            .iter()
            .filter(|cl| cl.pool_label == label && !current.contains(&cl.name))
            .map(|cl| cl.name.as_str())
            .collect();
        for claim in left {
            out.push(obj::pool_claim(pool, claim, cfg)?);
        }
    }
    let wanted_mounters: BTreeSet<(String, String)> = pvc_pools()
        .flat_map(|pool| {
            let label = names::pool_label_value(&pool.name);
            nodes.iter().map(move |n| (label.clone(), n.name.clone()))
        })
        .collect();
    out.extend(cleanup_jobs(hpp, cfg, facts, &wanted_mounters)?);
    Ok(out)
}

/// The cleanup Jobs that should exist: one per mounter no longer wanted (and per unfinished
/// Job of one), on a node that exists and is Ready (a Job elsewhere would never finish).
fn cleanup_jobs(
    hpp: &HostPathProvisioner,
    cfg: &OperatorConfig,
    facts: &ClusterFacts,
    wanted_mounters: &BTreeSet<(String, String)>,
) -> Result<Vec<DesiredObject>> {
    let node_ready = |name: &str| facts.node(name).is_some_and(|n| n.ready);
    let mut out = Vec::new();
    let mut jobs = BTreeSet::new();
    for m in &facts.mounters {
        if wanted_mounters.contains(&(m.pool_label.clone(), m.node.clone())) || !node_ready(&m.node) {
            continue;
        }
        let pool = m.pool_label.trim_end_matches("-hpp");
        let name = names::cleanup_job_name(pool, &m.node);
        let done = facts.cleanup_jobs.iter().any(|j| j.name == name && j.succeeded);
        if !done && jobs.insert(name.clone()) {
            out.push(obj::cleanup_job(
                hpp,
                &name,
                &m.pool_label,
                &m.node,
                &m.mount_path,
                cfg,
            )?);
        }
    }
    for j in &facts.cleanup_jobs {
        let pool_wanted = wanted_mounters.contains(&(j.pool_label.clone(), j.node.clone()));
        if !j.succeeded && node_ready(&j.node) && !pool_wanted && jobs.insert(j.name.clone()) {
            out.push(obj::cleanup_job(
                hpp,
                &j.name,
                &j.pool_label,
                &j.node,
                &j.mount_path,
                cfg,
            )?);
        }
    }
    Ok(out)
}

/// Phase of a pvcTemplate pool from facts: `Preparing` while it has no claim or a claim is not
/// Bound,
/// `Mounting` while a mounter Deployment is not rolled out and available (or none exists yet),
/// `Ready` once every one is.
fn pool_phase(claims_bound: bool, mounted: usize, mounters: usize) -> &'static str {
    if !claims_bound {
        PHASE_PREPARING
    } else if mounters == 0 || mounted < mounters {
        PHASE_MOUNTING
    } else {
        PHASE_READY
    }
}

/// Pool phase: its claims are not all Bound yet.
pub const PHASE_PREPARING: &str = "Preparing";
/// Pool phase: claims Bound, mounters not all ready.
pub const PHASE_MOUNTING: &str = "Mounting";
/// Pool phase: usable on every node it serves.
pub const PHASE_READY: &str = "Ready";

/// The pool the driver picks for a StorageClass or volume without a `storagePool`: `legacy`,
/// or the first pool when none is called that (as `DriverState::pool_for` in hpp-csi).
fn default_pool(pools: &[&str]) -> Option<String> {
    pools
        .iter()
        .find(|p| **p == c::DEFAULT_POOL_NAME)
        .or_else(|| pools.first())
        .map(|p| (*p).to_owned())
}

/// `committed` and `available` of pool `name` from the facts: the Bound hpp PersistentVolumes
/// of the pool, and the CSIStorageCapacity objects of its StorageClasses (per node the largest
/// value, as several classes may select one pool; summed over nodes, or the largest for a
/// shared pool, which every node sees whole). `available` is `None` without such objects.
fn pool_usage(name: &str, shared: bool, pools: &[&str], facts: &ClusterFacts) -> (u64, Option<u64>) {
    let fallback = default_pool(pools);
    let selects = |pool: &Option<String>| pool.as_ref().or(fallback.as_ref()).map(String::as_str) == Some(name);
    let committed = facts
        .volumes
        .iter()
        .filter(|v| selects(&v.pool))
        .fold(0u64, |sum, v| sum.saturating_add(v.bytes));
    let classes: BTreeSet<&str> = facts
        .classes
        .iter()
        .filter(|cl| selects(&cl.pool))
        .map(|cl| cl.name.as_str())
        .collect();
    let mut per_node: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for cap in facts
        .capacities
        .iter()
        .filter(|cap| classes.contains(cap.storage_class.as_str()))
    {
        let entry = per_node.entry(cap.node.as_str()).or_default();
        *entry = (*entry).max(cap.bytes);
    }
    let available = (!per_node.is_empty()).then(|| {
        if shared {
            per_node.values().copied().max().unwrap_or(0)
        } else {
            per_node.values().fold(0u64, |sum, b| sum.saturating_add(*b))
        }
    });
    (committed, available)
}

/// Fills in the configured quota mode and the `committed` / `available` bytes of a pool status.
fn with_usage(
    mut status: StoragePoolStatus,
    quota: Option<QuotaMode>,
    shared: bool,
    pools: &[&str],
    facts: &ClusterFacts,
) -> StoragePoolStatus {
    let (committed, available) = pool_usage(&status.name, shared, pools, facts);
    status.quota = quota;
    status.committed = Some(format_bytes(committed));
    status.available = available.map(format_bytes);
    status
}

/// What [`pool_readiness`] reads of the live pool objects: each mounter's rollout and each
/// claim's status, by pool label. Small, so the step keeps it between passes and a pass over a
/// few nodes updates only their entries: labels and claim statuses are shared texts (a
/// thousand Bound claims of one size hold one copy of their status), about 150 bytes a node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolLive {
    /// Mounter Deployments: (pool label, node) -> rollout.
    mounters: BTreeMap<(Arc<str>, String), super::rollout::Rollout>,
    /// Pool claims: (pool label, name) -> `status` as JSON.
    claims: BTreeMap<(Arc<str>, String), Arc<str>>,
    /// The distinct labels and status texts held.
    texts: std::collections::HashSet<Arc<str>>,
}

impl PoolLive {
    /// What the readiness reads of `live` (objects that are not pool claims or mounters are
    /// skipped).
    pub fn of(live: &[DynamicObject]) -> Self {
        let mut out = PoolLive::default();
        out.record(live);
        out
    }

    fn shared(&mut self, text: &str) -> Arc<str> {
        if let Some(held) = self.texts.get(text) {
            return held.clone();
        }
        let held: Arc<str> = Arc::from(text);
        self.texts.insert(held.clone());
        held
    }

    /// Records (or replaces) what the readiness reads of each of `live`.
    pub fn record(&mut self, live: &[DynamicObject]) {
        for o in live {
            let Some(label) = o.labels().get(c::LABEL_STORAGE_POOL) else {
                continue;
            };
            match o.types.as_ref().map(|t| t.kind.as_str()) {
                Some("Deployment") => {
                    let node = o
                        .annotations()
                        .get(names::ANNOTATION_POOL_NODE)
                        .cloned()
                        .unwrap_or_else(|| o.name_any());
                    let label = self.shared(label);
                    self.mounters.insert((label, node), super::rollout::deployment(o));
                }
                Some("PersistentVolumeClaim") => {
                    let status = o.data.get("status").map(|s| s.to_string()).unwrap_or_default();
                    let (label, status) = (self.shared(label), self.shared(&status));
                    self.claims.insert((label, o.name_any()), status);
                }
                _ => {}
            }
        }
        // Texts nothing holds any more (a claim's old status) go once there are a few hundred.
        if self.texts.len() > 256 {
            self.texts.retain(|t| Arc::strong_count(t) > 1);
        }
    }

    /// Forgets the mounters and per-node claims of `node` (before its part's live objects are
    /// recorded again: whatever the part holds now is in them).
    fn forget_node(&mut self, hpp: &HostPathProvisioner, node: &str) {
        // By the pools' labels (a pass over parts renders the pools of the last full pass'
        // spec, whose objects are all that is kept), not a walk over every node's mounters.
        for pool in hpp.spec.storage_pools.iter().flatten() {
            let label: Arc<str> = Arc::from(names::pool_label_value(&pool.name));
            self.mounters.remove(&(label.clone(), node.to_owned()));
            self.claims.remove(&(label, names::pool_node_name(&pool.name, node)));
        }
    }

    /// Forgets the claims the cluster part renders (shared claims, claims of nodes that left):
    /// every claim but those of the parts of `nodes`. Its live claims are recorded again after.
    fn forget_cluster_claims(&mut self, hpp: &HostPathProvisioner, nodes: &[&NodeFact]) {
        let of_nodes: std::collections::HashSet<String> = hpp
            .spec
            .storage_pools
            .iter()
            .flatten()
            .flat_map(|pool| nodes.iter().map(|n| names::pool_node_name(&pool.name, &n.name)))
            .collect();
        self.claims.retain(|(_, name), _| of_nodes.contains(name));
    }

    /// The mounters of the pool labelled `label`, by node.
    fn mounters_of<'a>(&'a self, label: &'a str) -> impl Iterator<Item = (&'a String, &'a super::rollout::Rollout)> {
        self.mounters
            .range((Arc::from(label), String::new())..)
            .take_while(move |((l, _), _)| &**l == label)
            .map(|((_, node), rollout)| (node, rollout))
    }

    /// The claims of the pool labelled `label`, by name, with their status. Each distinct
    /// status text is parsed once (a thousand Bound claims of one size share one).
    fn claims_of<'a>(&'a self, label: &'a str) -> impl Iterator<Item = (&'a String, PersistentVolumeClaimStatus)> {
        let mut parsed: HashMap<&'a str, PersistentVolumeClaimStatus> = HashMap::new();
        self.claims
            .range((Arc::from(label), String::new())..)
            .take_while(move |((l, _), _)| &**l == label)
            .map(move |((_, name), status)| {
                let status = parsed
                    .entry(&**status)
                    .or_insert_with(|| serde_json::from_str(status).unwrap_or_default())
                    .clone();
                (name, status)
            })
    }
}

/// `storagePoolStatuses` and PVC problems from the live pool objects and the facts.
pub fn pool_readiness(hpp: &HostPathProvisioner, facts: &ClusterFacts, live: &[DynamicObject]) -> Readiness {
    pool_readiness_of(hpp, facts, &PoolLive::of(live))
}

/// [`pool_readiness`] from what it reads of the live objects.
pub fn pool_readiness_of(hpp: &HostPathProvisioner, facts: &ClusterFacts, live: &PoolLive) -> Readiness {
    let mut r = Readiness::ready();
    if hpp.spec.path_config.is_some() {
        let status = StoragePoolStatus {
            name: c::DEFAULT_POOL_NAME.into(),
            phase: Some(PHASE_READY.into()),
            ..Default::default()
        };
        r.pool_statuses
            .push(with_usage(status, None, false, &[c::DEFAULT_POOL_NAME], facts));
        return r;
    }
    let names: Vec<&str> = hpp
        .spec
        .storage_pools
        .iter()
        .flatten()
        .map(|p| p.name.as_str())
        .collect();
    for pool in hpp.spec.storage_pools.iter().flatten() {
        let mut status = with_usage(
            StoragePoolStatus {
                name: pool.name.clone(),
                phase: Some(PHASE_READY.into()),
                ..Default::default()
            },
            pool.quota,
            pool.is_shared(),
            &names,
            facts,
        );
        if pool.pvc_template.is_some() {
            let label = names::pool_label_value(&pool.name);
            // By node, as the pass applies them (the parts are the nodes in name order).
            let mounters: Vec<(&String, &super::rollout::Rollout)> = live.mounters_of(&label).collect();
            // A mounter rolling out is reported like a DaemonSet rollout (Progressing); one that
            // is not ready makes its pool unusable on that node (Degraded, naming pool and node).
            let mut not_mounted: Vec<(String, String)> = Vec::new();
            let mut rolling_out: Vec<String> = Vec::new();
            for (node, rollout) in &mounters {
                match rollout {
                    super::rollout::Rollout::Done => {}
                    super::rollout::Rollout::InProgress(why) => {
                        not_mounted.push(((*node).clone(), why.clone()));
                        rolling_out.push(why.clone());
                    }
                    super::rollout::Rollout::NotReady(why) => not_mounted.push(((*node).clone(), why.clone())),
                }
            }
            let mounted = mounters.len() - not_mounted.len();
            status.desired_ready = Some(mounters.len() as i32);
            status.current_ready = Some(mounted as i32);
            let mut claims_bound = true;
            let mut claims = 0usize;
            // By name, whatever order the pass applied them in.
            for (name, pvc_status) in live.claims_of(&label) {
                let phase = pvc_status.phase.clone().unwrap_or_else(|| "Pending".into());
                claims += 1;
                if phase != "Bound" {
                    claims_bound = false;
                    r.pools_not_ready
                        .push(format!("error: Pool PVC {name} is {phase} instead of Bound"));
                }
                status.claim_statuses.push(ClaimStatus {
                    name: name.clone(),
                    status: pvc_status,
                });
            }
            let prepared = claims_bound && claims > 0;
            status.phase = Some(pool_phase(prepared, mounted, mounters.len()).into());
            if prepared {
                let rolling = !rolling_out.is_empty();
                r.workloads_rolling_out.extend(rolling_out);
                // Claims Bound but a mounter is not ready: that node's driver refuses the pool
                // (its mount guard), so say which nodes, here and in the Degraded condition +
                // Event. A rollout in progress is Progressing, not Degraded.
                if !rolling && let Some(problem) = mounters_not_ready(&pool.name, &not_mounted) {
                    status.message = Some(problem.clone());
                    r.pools_not_ready.push(problem);
                }
            } else {
                status.message = Some(format!("storage pool {}: waiting for its PVCs to be Bound", pool.name));
            }
        }
        r.pool_statuses.push(status);
    }
    r
}

/// Whether the admin asked to finish a deletion without the remaining unmount Jobs
/// ([`names::ANNOTATION_SKIP_CLEANUP`] = `"true"`).
pub fn skip_cleanup(hpp: &HostPathProvisioner) -> bool {
    hpp.annotations()
        .get(names::ANNOTATION_SKIP_CLEANUP)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The pool mounts a deletion leaves in place: every mounter whose unmount Job has not
/// succeeded, as `pool <pool> on node <node> (<mount path>)`.
pub fn uncleaned_mounts(facts: &ClusterFacts) -> Vec<String> {
    let mut out = BTreeSet::new();
    for m in &facts.mounters {
        let pool = m.pool_label.trim_end_matches("-hpp");
        let name = names::cleanup_job_name(pool, &m.node);
        if !facts.cleanup_jobs.iter().any(|j| j.name == name && j.succeeded) {
            out.insert(format!("pool {pool} on node {} ({})", m.node, m.mount_path));
        }
    }
    for j in facts.cleanup_jobs.iter().filter(|j| !j.succeeded) {
        let pool = j.pool_label.trim_end_matches("-hpp");
        out.insert(format!("pool {pool} on node {} ({})", j.node, j.mount_path));
    }
    out.into_iter().collect()
}

/// The problem of a pool whose mounters are not ready on some nodes, naming the pool and the
/// nodes; `None` when every mounter is ready. `not_mounted` is (node, rollout detail).
fn mounters_not_ready(pool: &str, not_mounted: &[(String, String)]) -> Option<String> {
    let (_, first_detail) = not_mounted.first()?;
    let nodes: Vec<&str> = not_mounted.iter().map(|(n, _)| n.as_str()).collect();
    let (noun, them) = if nodes.len() == 1 {
        ("node", "its mounter is")
    } else {
        ("nodes", "their mounters are")
    };
    Some(format!(
        "Storage pool {pool} is not usable on {noun} {}: {them} not ready ({first_detail}); \
         volumes of this pool cannot be created or published there, other pools are not affected",
        nodes.join(", ")
    ))
}

/// Sub-reconciler for pvcTemplate pools. Keeps what its readiness read of the live objects
/// ([`PoolLive`]) for a pass over a few nodes ([`SubReconciler::readiness_of_parts`]).
#[derive(Debug, Default)]
pub struct StoragePools {
    live: Mutex<PoolLive>,
    placed: Mutex<Option<Placed>>,
}

/// The step's parts as of one list of nodes and one placement: worked out again only when
/// either changed, not in every pass over one node's part (placing 1,000 nodes and sorting
/// them was a fifth of such a pass).
#[derive(Debug)]
struct Placed {
    nodes: crate::facts::FactList<NodeFact>,
    workload: Option<hpp_api::v1beta1::NodePlacement>,
    parts: Vec<String>,
}

impl StoragePools {
    fn parts_placed(&self, hpp: &HostPathProvisioner, facts: &ClusterFacts) -> Vec<String> {
        let Ok(mut placed) = self.placed.lock() else {
            return pool_parts(hpp, facts);
        };
        if let Some(p) = placed.as_ref()
            && p.nodes.ptr_eq(&facts.nodes)
            && p.workload == hpp.spec.workload
        {
            return p.parts.clone();
        }
        let parts = pool_parts(hpp, facts);
        *placed = Some(Placed {
            nodes: facts.nodes.clone(),
            workload: hpp.spec.workload.clone(),
            parts: parts.clone(),
        });
        parts
    }
}

#[async_trait]
impl SubReconciler for StoragePools {
    fn name(&self) -> &str {
        crate::names::STEP_STORAGE_POOLS
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        vec![pvc_kind(), deployment_kind(), job_kind(), storage_class_kind()]
    }

    fn permissions(&self, _facts: &ClusterFacts) -> Vec<Permission> {
        vec![
            Permission::on(&deployment_kind(), &WRITE).because(
                "storage-pools: pool mounter Deployments are named after pools and nodes \
                 (hpp-pool-<pool>-<node>), in the operator's namespace only.",
            ),
            Permission::on(&pvc_kind(), &["delete"]).because(
                "storage-pools: pool PVCs are created once, never changed, and named after pools and nodes, \
                 in the operator's namespace only.",
            ),
            Permission::on(&job_kind(), &["delete"]).because(
                "storage-pools: cleanup Jobs are created once, never changed, and named after pools and nodes, \
                 in the operator's namespace only.",
            ),
            Permission::on(&storage_class_kind(), &["delete"])
                .named([names::DEFAULT_OVERLAY_CLASS])
                .because(
                    "storage-pools: the overlay StorageClass of ReadWriteMany pools (created once). A pool with \
                     a custom `overlayClassName` needs that name added here, or the operator cannot delete the \
                     class when the pool goes away (it logs the 403, publishes a Warning Event DeleteForbidden \
                     on the class and leaves it; the pass and the CR's deletion carry on).",
                ),
        ]
    }

    fn desired(
        &self,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
    ) -> Result<Vec<DesiredObject>> {
        desired_pool_objects(hpp, cfg, facts)
    }

    /// One part per node: a pass holds a few nodes' mounters at a time, not a thousand.
    fn parts(&self, hpp: &HostPathProvisioner, _cfg: &OperatorConfig, facts: &ClusterFacts) -> Option<Vec<String>> {
        Some(self.parts_placed(hpp, facts))
    }

    fn desired_part(
        &self,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
        part: &str,
    ) -> Result<Vec<DesiredObject>> {
        desired_pool_part(hpp, cfg, facts, part)
    }

    /// Keeps of each live object what [`pool_readiness`] reads (metadata, `spec.replicas`,
    /// status): one claim and one mounter per node, and the mounters' pod templates would
    /// otherwise all be held until the pass ends.
    async fn apply(&self, applier: &Applier, desired: &[DesiredObject]) -> Result<Vec<DynamicObject>> {
        applier
            .apply_all_keeping(&self.field_manager(), desired, drop_pod_template)
            .await
    }

    fn readiness(&self, hpp: &HostPathProvisioner, facts: &ClusterFacts, live: &[DynamicObject]) -> Readiness {
        let live = PoolLive::of(live);
        let r = pool_readiness_of(hpp, facts, &live);
        if let Ok(mut kept) = self.live.lock() {
            *kept = live;
        }
        r
    }

    /// The node parts' mounters and claims replace what was kept of them; the rest is as the
    /// previous pass left it.
    fn readiness_of_parts(
        &self,
        hpp: &HostPathProvisioner,
        facts: &ClusterFacts,
        applied: &[String],
        live: &[DynamicObject],
    ) -> Option<Readiness> {
        let mut kept = self.live.lock().ok()?;
        for part in applied {
            if part == CLUSTER_PART {
                kept.forget_cluster_claims(hpp, &pool_nodes(hpp, facts));
            } else {
                kept.forget_node(hpp, part);
            }
        }
        kept.record(live);
        Some(pool_readiness_of(hpp, facts, &kept))
    }

    /// A node's part (its claims and mounters) reads the node; the cluster part reads which
    /// nodes there are (the shared claims, and the claims of nodes that left, which stay), so
    /// it is rendered again too when a node joins or leaves.
    fn parts_of_node(&self, _hpp: &HostPathProvisioner, _facts: &ClusterFacts, node: &str) -> Option<Vec<String>> {
        Some(vec![CLUSTER_PART.to_owned(), node.to_owned()])
    }

    /// The parts read the CR, the configuration, nodes, and the pool objects (claims, mounters,
    /// Jobs); the volumes and capacities feed only the readiness (each pool's usage).
    fn parts_read_storage(&self) -> bool {
        false
    }

    /// Unmount on every Ready node first (Jobs), then delete Jobs, PVCs and overlay classes.
    async fn cleanup(
        &self,
        applier: &Applier,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
    ) -> Result<()> {
        let ns = Some(cfg.namespace.as_str());
        let skip = skip_cleanup(hpp);
        let node_ready = |name: &str| facts.node(name).is_some_and(|n| n.ready);
        let mut pending = Vec::new();
        for m in &facts.mounters {
            let pool = m.pool_label.trim_end_matches("-hpp");
            let name = names::cleanup_job_name(pool, &m.node);
            let job = facts.cleanup_jobs.iter().find(|j| j.name == name);
            if !skip && node_ready(&m.node) && !job.is_some_and(|j| j.succeeded) {
                let desired = obj::cleanup_job(hpp, &name, &m.pool_label, &m.node, &m.mount_path, cfg)?;
                applier.apply(&self.field_manager(), &desired).await?;
                pending.push(name);
            }
            applier.delete(&deployment_kind(), ns, &m.name).await?;
        }
        for j in &facts.cleanup_jobs {
            if !skip && !j.succeeded && node_ready(&j.node) && !pending.contains(&j.name) {
                pending.push(j.name.clone());
            }
        }
        if !pending.is_empty() {
            return Err(Error::CleanupPending(format!(
                "waiting for cleanup Jobs {}",
                pending.join(", ")
            )));
        }
        for j in &facts.cleanup_jobs {
            applier.delete(&job_kind(), ns, &j.name).await?;
        }
        for cl in &facts.claims {
            applier.delete(&pvc_kind(), ns, &cl.name).await?;
        }
        for pool in hpp.spec.storage_pools.iter().flatten().filter(|p| p.is_shared()) {
            let name = pool
                .overlay_class_name
                .as_deref()
                .unwrap_or(names::DEFAULT_OVERLAY_CLASS);
            // A custom class RBAC does not let us delete is logged and left (see
            // `apply::may_stay_when_delete_is_forbidden`), so it never holds the finalizer.
            applier.delete(&storage_class_kind(), None, name).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::reconcilers::rollout::{self, Rollout};
    use serde_json::json;

    #[test]
    fn a_mounter_without_its_pod_template_is_judged_alike() {
        for (replicas, available) in [(1, 1), (1, 0), (2, 1)] {
            let mut d: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "hpp-pool-local-node01", "namespace": "hpp", "generation": 2},
                "spec": {"replicas": replicas, "selector": {"matchLabels": {"hpp-pool": "local-hpp"}},
                         "template": {"spec": {"containers": [{"name": "mounter", "image": "mounter:v1"}]}}},
                "status": {"observedGeneration": 2, "replicas": replicas, "updatedReplicas": replicas,
                           "availableReplicas": available},
            }))
            .unwrap();
            let judged = rollout::deployment(&d);
            drop_pod_template(&mut d);
            assert!(d.data.pointer("/spec/template").is_none());
            assert_eq!(d.data.pointer("/spec/replicas"), Some(&json!(replicas)));
            assert_eq!(rollout::deployment(&d), judged);
            assert_eq!(judged == Rollout::Done, available == replicas);
        }
    }

    #[test]
    fn parts_are_placed_again_only_when_the_nodes_or_the_placement_change() {
        let cfg = OperatorConfig::from_env([("POD_NAMESPACE", "hpp")]);
        let mut hpp = HostPathProvisioner::new("hpp", Default::default());
        let step = StoragePools::default();
        let mut facts = ClusterFacts {
            nodes: vec![NodeFact::ready("node-b"), NodeFact::ready("node-a")].into(),
            ..Default::default()
        };
        let parts = |hpp: &HostPathProvisioner, facts: &ClusterFacts| step.parts(hpp, &cfg, facts).unwrap();
        assert_eq!(parts(&hpp, &facts), [CLUSTER_PART, "node-a", "node-b"]);

        // A clone of the same list (the next pass's facts, nothing changed): the memo answers
        // (what it holds is marked to tell).
        step.placed
            .lock()
            .unwrap()
            .as_mut()
            .unwrap()
            .parts
            .push("from-the-memo".into());
        let shared = facts.clone();
        assert_eq!(
            parts(&hpp, &shared),
            [CLUSTER_PART, "node-a", "node-b", "from-the-memo"]
        );

        // A new node list (the watch's derived list after a Node changed) is placed again.
        let mut tainted = NodeFact::ready("node-a");
        tainted.taints.push(k8s_openapi::api::core::v1::Taint {
            key: "example.com/out".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        });
        facts.nodes = vec![NodeFact::ready("node-b"), tainted].into();
        assert_eq!(parts(&hpp, &facts), [CLUSTER_PART, "node-b"]);

        // So is a new placement over the same list.
        hpp.spec.workload = Some(hpp_api::v1beta1::NodePlacement {
            tolerations: Some(vec![Toleration {
                key: Some("example.com/out".into()),
                operator: Some("Exists".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert_eq!(parts(&hpp, &facts), [CLUSTER_PART, "node-a", "node-b"]);
        assert_eq!(parts(&hpp, &facts), pool_parts(&hpp, &facts));
    }
}
