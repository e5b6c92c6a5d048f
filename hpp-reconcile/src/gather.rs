//! Reads the cluster facts a pass needs (discovery, nodes, existing pool objects), from the
//! watch caches when the controller keeps them, else from the API. Reads only.

use std::collections::BTreeMap;
use std::sync::Arc;

use hpp_api::HostPathProvisioner;
use hpp_api::constants as c;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::warn;

use crate::apply::Applier;
use crate::cache::{Cache, Fold, OptionalApis};
use crate::error::{Error, Result};
use crate::facts::{
    CapacityFact, ClaimFact, ClassFact, CleanupJobFact, ClusterFacts, FactList, MounterFact, NodeFact, VolumeFact,
};
use crate::names;
use crate::object::Kind;
use crate::reconcilers::common::{deployment_kind, job_kind, pvc_kind, storage_class_kind};
use hpp_api::quantity::parse_bytes;

/// Whether the API server serves `kind` in `group` (any version).
pub async fn has_api(client: &Client, group: &str, plural: &str) -> Result<bool> {
    match kube::discovery::group(client, group).await {
        Ok(g) => Ok(g.recommended_resources().iter().any(|(ar, _)| ar.plural == plural)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(kube::Error::Discovery(_)) => Ok(false),
        Err(e) => Err(Error::kube("discover", group, e)),
    }
}

/// Asks the API server which optional APIs it serves.
pub async fn optional_apis(client: &Client) -> Result<OptionalApis> {
    Ok(OptionalApis {
        scc: has_api(client, "security.openshift.io", "securitycontextconstraints").await?,
        prometheus: has_api(client, "monitoring.coreos.com", "prometheusrules").await?
            && has_api(client, "monitoring.coreos.com", "servicemonitors").await?,
    })
}

/// [`optional_apis`] as facts, answered from the cache's memo while it is fresh (see
/// [`DISCOVERY_REFRESH`](crate::cache::DISCOVERY_REFRESH)).
async fn discover_cached(applier: &Applier) -> Result<ClusterFacts> {
    let cache = applier.cache();
    if let Some(apis) = cache.discovered() {
        return Ok(apis.into());
    }
    let apis = optional_apis(applier.client()).await?;
    cache.record_discovery(apis);
    Ok(apis.into())
}

impl From<OptionalApis> for ClusterFacts {
    fn from(apis: OptionalApis) -> Self {
        ClusterFacts {
            has_scc: apis.scc,
            has_prometheus: apis.prometheus,
            ..Default::default()
        }
    }
}

/// A kind and the label selector its objects are read with.
type Source = (Kind, String);

fn node_source() -> Source {
    (Kind::of::<Node>(), String::new())
}

fn mounter_source() -> Source {
    (deployment_kind(), c::LABEL_HPP_POOL.to_owned())
}

fn job_source() -> Source {
    (job_kind(), crate::names::managed_selector())
}

fn claim_source() -> Source {
    (pvc_kind(), c::LABEL_STORAGE_POOL.to_owned())
}

fn volume_source() -> Source {
    (Kind::of::<PersistentVolume>(), String::new())
}

fn class_source() -> Source {
    (storage_class_kind(), String::new())
}

fn capacity_source() -> Source {
    (Kind::of::<CSIStorageCapacity>(), String::new())
}

/// The (kind, label selector) pairs `gather` reads; the controller keeps a watch cache of each.
pub fn fact_sources() -> Vec<Source> {
    vec![
        node_source(),
        mounter_source(),
        job_source(),
        claim_source(),
        volume_source(),
        class_source(),
        capacity_source(),
    ]
}

/// What the pools' usage reads of a PersistentVolume: its phase, driver, capacity and
/// `storagePool` attribute. Parsed instead of the whole object, as every PV of the cluster
/// is read after any of them changed: 10,000 typed PVs held at once were tens of MiB.
#[derive(Debug, Default, serde::Deserialize)]
struct VolumeUsageView {
    #[serde(default)]
    spec: Option<VolumeUsageSpec>,
    #[serde(default)]
    status: Option<VolumeUsageStatus>,
}

/// See [`VolumeUsageView`].
#[derive(Debug, Default, serde::Deserialize)]
struct VolumeUsageSpec {
    #[serde(default)]
    capacity: Option<VolumeUsageCapacity>,
    #[serde(default)]
    csi: Option<VolumeUsageCsi>,
}

/// See [`VolumeUsageView`].
#[derive(Debug, Default, serde::Deserialize)]
struct VolumeUsageCapacity {
    #[serde(default)]
    storage: Option<String>,
}

/// See [`VolumeUsageView`].
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct VolumeUsageCsi {
    #[serde(default)]
    driver: String,
    #[serde(default)]
    volume_attributes: Option<VolumeUsageAttributes>,
}

/// See [`VolumeUsageView`].
#[derive(Debug, Default, serde::Deserialize)]
struct VolumeUsageStatus {
    #[serde(default)]
    phase: Option<String>,
}

/// See [`VolumeUsageView`]; the key is [`c::PARAM_STORAGE_POOL`].
#[derive(Debug, Default, serde::Deserialize)]
struct VolumeUsageAttributes {
    #[serde(default, rename = "storagePool")]
    storage_pool: Option<String>,
}

/// A bound PersistentVolume of the hpp CSI driver: its pool and capacity.
fn hpp_volume(pv: VolumeUsageView) -> Option<VolumeFact> {
    if pv.status.and_then(|s| s.phase).as_deref() != Some("Bound") {
        return None;
    }
    let spec = pv.spec?;
    let csi = spec.csi.filter(|csi| csi.driver == c::DRIVER_NAME)?;
    let bytes = spec
        .capacity
        .and_then(|cap| cap.storage)
        .and_then(|q| parse_bytes(&q))
        .unwrap_or(0);
    Some(VolumeFact {
        pool: csi.volume_attributes.and_then(|attrs| attrs.storage_pool),
        bytes,
    })
}

/// The capacities of the hpp CSI driver's bound PersistentVolumes summed per pool, with how
/// many PVs each sum holds (a pool whose last PV went is left out, as a sum of none is not
/// listed). Kept between passes and updated from the PVs that changed ([`fold_volumes`]): a
/// pass after one of 10,000 PVs changed costs that PV, not a visit of every PV's fact. Exact
/// in `u128`, so taking a PV out undoes adding it even past `u64::MAX`.
#[derive(Clone, Debug, Default, PartialEq)]
struct PoolSums(BTreeMap<Option<String>, (u128, usize)>);

impl PoolSums {
    fn add(&mut self, pv: VolumeFact) {
        let (sum, count) = self.0.entry(pv.pool).or_default();
        *sum += u128::from(pv.bytes);
        *count += 1;
    }

    fn remove(&mut self, pv: &VolumeFact) {
        if let Some((sum, count)) = self.0.get_mut(&pv.pool) {
            *sum = sum.saturating_sub(u128::from(pv.bytes));
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.0.remove(&pv.pool);
            }
        }
    }

    /// One fact per pool, in the order of the pools' names (the attribute-less first).
    fn facts(&self) -> FactList<VolumeFact> {
        self.0
            .iter()
            .map(|(pool, (sum, _))| VolumeFact {
                pool: pool.clone(),
                bytes: u64::try_from(*sum).unwrap_or(u64::MAX),
            })
            .collect()
    }
}

/// The sums kept with the changed PVs applied, or the sums of every PV.
fn fold_volumes(fold: Fold<'_, PoolSums, VolumeFact>) -> PoolSums {
    match fold {
        Fold::Update(last, changed) => {
            let mut sums = last.clone();
            for (before, after) in changed {
                if let Some(before) = before {
                    sums.remove(&before);
                }
                if let Some(after) = after {
                    sums.add(after);
                }
            }
            sums
        }
        Fold::Rebuild(all) => hpp_volumes(all),
    }
}

/// The sums of `pvs`.
fn hpp_volumes(pvs: Vec<VolumeFact>) -> PoolSums {
    let mut sums = PoolSums::default();
    for pv in pvs {
        sums.add(pv);
    }
    sums
}

/// The hpp PVs' capacities summed per pool: from the watch cache, updated from the PVs that
/// changed since the last pass ([`Cache::derived_fold`]); else from the API.
async fn volume_facts(applier: &Applier, namespace: &str) -> Result<FactList<VolumeFact>> {
    let (kind, selector) = volume_source();
    let cached = applier
        .cache()
        .derived_fold(&kind, &selector, "hpp volumes", |_| true, hpp_volume, fold_volumes);
    Ok(match cached {
        Some(sums) => sums.facts(),
        None => hpp_volumes(
            list::<VolumeUsageView>(applier, &volume_source(), namespace)
                .await?
                .into_iter()
                .filter_map(hpp_volume)
                .collect(),
        )
        .facts(),
    })
}

/// A StorageClass of the hpp CSI driver, with the pool it selects.
fn hpp_class(sc: StorageClass) -> Option<ClassFact> {
    (sc.provisioner == c::DRIVER_NAME).then(|| ClassFact {
        pool: sc
            .parameters
            .as_ref()
            .and_then(|p| p.get(c::PARAM_STORAGE_POOL).cloned()),
        name: sc.name_any(),
    })
}

/// A CSIStorageCapacity object with a capacity.
fn capacity(o: CSIStorageCapacity) -> Option<CapacityFact> {
    let bytes = parse_bytes(&o.capacity.as_ref()?.0)?;
    let node = o
        .node_topology
        .as_ref()
        .and_then(|t| t.match_labels.as_ref())
        .and_then(|l| l.get(c::TOPOLOGY_KEY).cloned())
        .unwrap_or_default();
    Some(CapacityFact {
        storage_class: o.storage_class_name,
        node,
        bytes,
    })
}

/// A watched object as its typed k8s-openapi struct.
pub(crate) fn typed<K: DeserializeOwned>(obj: DynamicObject) -> Result<K> {
    let what = obj.name_any();
    serde_json::to_value(obj)
        .and_then(serde_json::from_value)
        .map_err(|source| Error::Serialize { what, source })
}

async fn list<K: DeserializeOwned>(applier: &Applier, source: &Source, namespace: &str) -> Result<Vec<K>> {
    // From the cache, each object parses straight into `K`, one at a time.
    if let Some(cached) = applier.cache().list_typed::<K>(&source.0, &source.1, Some(namespace)) {
        return Ok(cached);
    }
    applier
        .list(&source.0, &source.1, namespace)
        .await?
        .into_iter()
        .map(typed)
        .collect()
}

/// The node and mount path the operator recorded on a pool object doing `action`; `None` when
/// the object does another action or was written without them.
fn recorded(annotations: &BTreeMap<String, String>, action: &str) -> Option<(String, String)> {
    (annotations.get(names::ANNOTATION_POOL_ACTION)?.as_str() == action).then_some(())?;
    Some((
        annotations.get(names::ANNOTATION_POOL_NODE)?.clone(),
        annotations.get(names::ANNOTATION_POOL_MOUNT_PATH)?.clone(),
    ))
}

/// What `make` makes of what `each` makes of every `K` object of `source` in `namespace`:
/// from the watch cache, worked out again only after the store changed and then parsing only
/// the object versions not seen before (`Cache::derived_each`), so a pass after one node,
/// mounter or claim changed parses that one object; else from the API. `what` names the
/// derived value.
async fn facts_of<K, F, T>(
    applier: &Applier,
    source: &Source,
    namespace: &str,
    what: &'static str,
    each: fn(K) -> Option<F>,
    make: fn(Vec<F>) -> T,
) -> Result<T>
where
    K: DeserializeOwned,
    F: Clone + PartialEq + Send + 'static,
    T: Clone + Send + Sync + 'static,
{
    let (kind, selector) = source;
    let namespaced = kind.namespaced;
    let keep = |ns: &str| !namespaced || ns == namespace;
    match applier.cache().derived_each(kind, selector, what, keep, each, make) {
        Some(value) => Ok((*value).clone()),
        None => Ok(make(
            list::<K>(applier, source, namespace)
                .await?
                .into_iter()
                .filter_map(each)
                .collect(),
        )),
    }
}

/// The facts as they are: what `each` made of every object, shared with the passes that read
/// them until the store changes.
fn all<F>(facts: Vec<F>) -> FactList<F> {
    facts.into()
}

fn node_fact(n: Node) -> Option<NodeFact> {
    Some(NodeFact {
        name: n.name_any(),
        labels: n.labels().clone(),
        taints: n.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default(),
        ready: n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
    })
}

/// What the facts read of a pool workload (a mounter Deployment, a cleanup Job): its metadata
/// and a Job's `status.succeeded`. Parsed instead of the whole object (a mounter's pod template
/// is most of its 3 KB): after one of 1,000 mounters changed, their facts cost a scan of the
/// cached text, not 1,000 typed Deployments.
#[derive(Debug, Default, serde::Deserialize)]
struct WorkloadMeta {
    #[serde(default)]
    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    #[serde(default)]
    status: Option<WorkloadStatus>,
}

/// See [`WorkloadMeta`].
#[derive(Debug, Default, serde::Deserialize)]
struct WorkloadStatus {
    #[serde(default)]
    succeeded: Option<i32>,
}

impl WorkloadMeta {
    fn name(&self) -> String {
        self.metadata.name.clone().unwrap_or_default()
    }

    fn label(&self, key: &str) -> Option<&String> {
        self.metadata.labels.as_ref()?.get(key)
    }

    fn recorded(&self, action: &str) -> Option<(String, String)> {
        recorded(self.metadata.annotations.as_ref()?, action)
    }
}

/// A mounter with its recorded node and mount path, or the name of one without (an older
/// operator's).
fn mounter_fact(d: WorkloadMeta) -> Option<Result<MounterFact, String>> {
    let pool_label = d.label(c::LABEL_HPP_POOL).cloned()?;
    Some(match d.recorded(names::POOL_ACTION_MOUNT) {
        Some((node, mount_path)) => Ok(MounterFact {
            name: d.name(),
            pool_label,
            node,
            mount_path,
        }),
        None => Err(d.name()),
    })
}

/// Mounters with their recorded node and mount path, and the names of those without.
fn mounter_facts(deployments: Vec<Result<MounterFact, String>>) -> (FactList<MounterFact>, Vec<String>) {
    let mut unrecorded_mounters = Vec::new();
    let mut mounters = Vec::new();
    for d in deployments {
        match d {
            Ok(m) => mounters.push(m),
            Err(name) => {
                warn!(deployment = %name, "mounter without recorded node and mount path (older operator)");
                unrecorded_mounters.push(name);
            }
        }
    }
    (mounters.into(), unrecorded_mounters)
}

fn cleanup_job_fact(j: WorkloadMeta) -> Option<CleanupJobFact> {
    let (node, mount_path) = j.recorded(names::POOL_ACTION_UNMOUNT)?;
    Some(CleanupJobFact {
        name: j.name(),
        node,
        pool_label: j.label(c::LABEL_STORAGE_POOL).cloned().unwrap_or_default(),
        mount_path,
        succeeded: j.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0) > 0,
    })
}

fn claim_fact(p: PersistentVolumeClaim) -> Option<ClaimFact> {
    Some(ClaimFact {
        name: p.name_any(),
        pool_label: p.labels().get(c::LABEL_STORAGE_POOL)?.clone(),
    })
}

/// Reads every fact for a pass in `namespace`.
pub async fn gather(applier: &Applier, namespace: &str) -> Result<ClusterFacts> {
    let nodes = facts_of(applier, &node_source(), namespace, "node facts", node_fact, all).await?;
    let (mounters, unrecorded_mounters) = facts_of(
        applier,
        &mounter_source(),
        namespace,
        "mounter facts",
        mounter_fact,
        mounter_facts,
    )
    .await?;
    let cleanup_jobs = facts_of(
        applier,
        &job_source(),
        namespace,
        "cleanup job facts",
        cleanup_job_fact,
        all,
    )
    .await?;
    let claims = facts_of(applier, &claim_source(), namespace, "claim facts", claim_fact, all).await?;
    // Every PV of the cluster is watched: after one changed, only it is parsed, taken out of
    // its pool's sum as it was and added as it is.
    let volumes = volume_facts(applier, namespace).await?;
    let classes = facts_of(applier, &class_source(), namespace, "hpp classes", hpp_class, all).await?;
    // Capacity objects only feed the pool status: a cluster without the API (or a read that
    // fails) leaves `available` out rather than failing the pass.
    let capacities = match facts_of(applier, &capacity_source(), namespace, "capacities", capacity, all).await {
        Ok(capacities) => capacities,
        Err(e) => {
            warn!(error = %e, "cannot read CSIStorageCapacity objects; pool status shows no available bytes");
            FactList::default()
        }
    };
    Ok(ClusterFacts {
        nodes,
        mounters,
        unrecorded_mounters,
        cleanup_jobs,
        claims,
        other_provisioners: Vec::new(),
        volumes,
        classes,
        capacities,
        ..discover_cached(applier).await?
    })
}

/// Every HostPathProvisioner, oldest first (then by name): the first one is served.
pub async fn provisioners(client: &Client, cache: &Cache) -> Result<Vec<Arc<HostPathProvisioner>>> {
    let mut all = match cache.provisioners() {
        Some(all) => all,
        None => Api::<HostPathProvisioner>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| Error::kube("list", "hostpathprovisioners", e))?
            .items
            .into_iter()
            .map(Arc::new)
            .collect(),
    };
    sort_provisioners(&mut all);
    Ok(all)
}

/// Orders CRs oldest first, then by name, skipping none.
pub fn sort_provisioners<H: std::borrow::Borrow<HostPathProvisioner>>(all: &mut [H]) {
    all.sort_by(|a, b| {
        let (a, b) = (a.borrow(), b.borrow());
        let ts = |h: &HostPathProvisioner| h.metadata.creation_timestamp.as_ref().map(|t| t.0);
        ts(a).cmp(&ts(b)).then_with(|| a.name_any().cmp(&b.name_any()))
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn pv(driver: &str, phase: &str, size: &str, pool: Option<&str>) -> VolumeUsageView {
        let attributes = match pool {
            Some(p) => json!({ "storagePool": p, "other": "x" }),
            None => json!({ "other": "x" }),
        };
        serde_json::from_value(json!({
            "metadata": { "name": "pv", "labels": { "a": "b" } },
            "spec": { "capacity": { "storage": size }, "accessModes": ["ReadWriteOnce"],
                      "csi": { "driver": driver, "volumeHandle": "pvc-1", "volumeAttributes": attributes } },
            "status": { "phase": phase },
        }))
        .unwrap()
    }

    #[test]
    fn the_drivers_bound_volumes_are_summed_per_pool() {
        let ours = c::DRIVER_NAME;
        let facts = hpp_volumes(
            vec![
                pv(ours, "Bound", "1Gi", Some("fast")),
                pv(ours, "Bound", "2Gi", Some("fast")),
                pv(ours, "Bound", "1Mi", None),
                pv(ours, "Released", "5Gi", Some("fast")),
                pv("other.csi.example.com", "Bound", "7Gi", Some("fast")),
                pv(ours, "Bound", "4Gi", Some("slow")),
                VolumeUsageView::default(),
            ]
            .into_iter()
            .filter_map(hpp_volume)
            .collect(),
        )
        .facts();
        let gib = 1u64 << 30;
        assert_eq!(
            *facts,
            vec![
                VolumeFact {
                    pool: None,
                    bytes: 1 << 20
                },
                VolumeFact {
                    pool: Some("fast".into()),
                    bytes: 3 * gib
                },
                VolumeFact {
                    pool: Some("slow".into()),
                    bytes: 4 * gib
                },
            ]
        );
    }
    /// After PVs change, the sums updated from the changes are the sums of every PV as they
    /// are now: a changed capacity, a PV that goes, a new one, a pool whose last PV went, and
    /// sums past `u64::MAX` taken back under it.
    #[test]
    fn pool_sums_updated_from_the_changes_are_the_sums_of_every_pv() {
        let fact = |pool: Option<&str>, bytes: u64| VolumeFact {
            pool: pool.map(str::to_owned),
            bytes,
        };
        let before = vec![
            fact(Some("fast"), 1 << 30),
            fact(Some("fast"), 2 << 30),
            fact(None, 1 << 20),
            fact(Some("slow"), 4 << 30),
            fact(Some("huge"), u64::MAX),
            fact(Some("huge"), u64::MAX),
        ];
        let last = fold_volumes(Fold::Rebuild(before));
        assert_eq!(last.facts()[2], fact(Some("huge"), u64::MAX), "saturated when read");
        let changed = fold_volumes(Fold::Update(
            &last,
            vec![
                (Some(fact(Some("fast"), 2 << 30)), Some(fact(Some("fast"), 3 << 30))),
                (Some(fact(Some("slow"), 4 << 30)), None),
                (None, Some(fact(Some("new"), 5))),
                (Some(fact(Some("huge"), u64::MAX)), None),
            ],
        ));
        let now = vec![
            fact(Some("fast"), 1 << 30),
            fact(Some("fast"), 3 << 30),
            fact(None, 1 << 20),
            fact(Some("new"), 5),
            fact(Some("huge"), u64::MAX),
        ];
        assert_eq!(changed, hpp_volumes(now));
        assert!(
            !changed.facts().iter().any(|f| f.pool.as_deref() == Some("slow")),
            "a pool without PVs is not listed"
        );
    }
}
