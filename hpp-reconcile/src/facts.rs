//! What the operator knows about the cluster at the start of a pass: optional APIs found by
//! discovery, nodes, and the pool objects already present. Gathered by I/O once per pass (see
//! `gather`), consumed by the pure builders, and constructible by hand for `render` and tests.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Taint;

/// One node and what placement decisions need from it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFact {
    /// Node name.
    pub name: String,
    /// Node labels.
    pub labels: BTreeMap<String, String>,
    /// Node taints.
    pub taints: Vec<Taint>,
    /// Whether the node's Ready condition is True.
    pub ready: bool,
}

impl NodeFact {
    /// A Ready node without labels or taints (for `render` and tests).
    pub fn ready(name: &str) -> Self {
        NodeFact {
            name: name.into(),
            ready: true,
            ..Default::default()
        }
    }
}

/// An existing mounter Deployment of a pvcTemplate pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MounterFact {
    /// Deployment name.
    pub name: String,
    /// Pool label value (`<pool>-hpp`).
    pub pool_label: String,
    /// Node it is pinned to (its `pool-node` annotation).
    pub node: String,
    /// Its mount path (`<pool path>/csi`, the `pool-mount-path` annotation), needed to unmount
    /// after the pool is gone.
    pub mount_path: String,
}

/// An existing cleanup Job (one the operator annotated as `pool-action: unmount`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CleanupJobFact {
    /// Job name.
    pub name: String,
    /// Node it is pinned to.
    pub node: String,
    /// Pool label value (`<pool>-hpp`), empty for KubeVirt-created Jobs.
    pub pool_label: String,
    /// Its `--mountPath`.
    pub mount_path: String,
    /// Whether it has completed (`status.succeeded > 0`).
    pub succeeded: bool,
}

/// An existing pool PVC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimFact {
    /// PVC name.
    pub name: String,
    /// Pool label value (`<pool>-hpp`).
    pub pool_label: String,
}

/// Facts a plugged-in step gathered for itself, one value per type (a type map), so a step
/// can read what it needs in its own `gather` and use it in `desired` and `readiness` without
/// a field in [`ClusterFacts`].
#[derive(Clone, Default)]
pub struct FactMap {
    values: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl FactMap {
    /// Stores a fact, replacing an earlier one of the same type.
    pub fn insert<T: Any + Send + Sync>(&mut self, value: T) {
        self.values.insert(TypeId::of::<T>(), Arc::new(value));
    }

    /// The fact of type `T`, if a step stored one.
    pub fn get<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.values.get(&TypeId::of::<T>())?.downcast_ref()
    }

    /// How many facts are stored.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether no fact is stored.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

impl std::fmt::Debug for FactMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FactMap").field("len", &self.values.len()).finish()
    }
}

/// Two maps are equal when they hold the very same values (facts are not required to be
/// comparable).
impl PartialEq for FactMap {
    fn eq(&self, other: &Self) -> bool {
        self.values.len() == other.values.len()
            && self
                .values
                .iter()
                .all(|(k, v)| other.values.get(k).is_some_and(|o| Arc::ptr_eq(v, o)))
    }
}

/// Bound PersistentVolumes of the hpp CSI driver with one `storagePool` volume attribute, for
/// the pool status's `committed`. Gathered facts hold one per pool (the PVs' capacities
/// summed); hand-built facts may hold one per PV: readers sum them either way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeFact {
    /// The `storagePool` volume attribute (`None`: absent, the driver's default pool).
    pub pool: Option<String>,
    /// Their capacity in bytes.
    pub bytes: u64,
}

/// A StorageClass of the hpp CSI driver and the pool it selects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassFact {
    /// Class name.
    pub name: String,
    /// Its `storagePool` parameter (`None`: absent, the driver's default pool).
    pub pool: Option<String>,
}

/// A CSIStorageCapacity object (what the csi-provisioner learnt from GetCapacity).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityFact {
    /// The StorageClass it is for.
    pub storage_class: String,
    /// The node of its topology segment (empty when it has none).
    pub node: String,
    /// Its capacity in bytes.
    pub bytes: u64,
}

/// A list of facts shared between passes: cloning one (as every pass does with what the
/// watch caches derived) is a reference count, not a copy of 1,000 nodes' labels. It reads as
/// a `Vec` and is changed as one too (`push`, `retain`, assignment from a `Vec` with `.into()`),
/// copying the list first if another pass still shares it.
#[derive(Debug)]
pub struct FactList<T>(Arc<Vec<T>>);

impl<T> FactList<T> {
    /// Whether both are the very same list (a clone of one another, unchanged since).
    pub fn ptr_eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl<T> Clone for FactList<T> {
    fn clone(&self) -> Self {
        FactList(self.0.clone())
    }
}

impl<T> Default for FactList<T> {
    fn default() -> Self {
        FactList(Arc::default())
    }
}

impl<T: PartialEq> PartialEq for FactList<T> {
    fn eq(&self, other: &Self) -> bool {
        self.ptr_eq(other) || self.0 == other.0
    }
}

impl<T: Eq> Eq for FactList<T> {}

impl<T> std::ops::Deref for FactList<T> {
    type Target = Vec<T>;

    fn deref(&self) -> &Vec<T> {
        &self.0
    }
}

/// Copy on write: a list another pass still shares is copied before it changes.
impl<T: Clone> std::ops::DerefMut for FactList<T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        Arc::make_mut(&mut self.0)
    }
}

impl<T> From<Vec<T>> for FactList<T> {
    fn from(list: Vec<T>) -> Self {
        FactList(Arc::new(list))
    }
}

impl<T> FromIterator<T> for FactList<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        FactList(Arc::new(iter.into_iter().collect()))
    }
}

impl<'a, T> IntoIterator for &'a FactList<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<'a, T: Clone> IntoIterator for &'a mut FactList<T> {
    type Item = &'a mut T;
    type IntoIter = std::slice::IterMut<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        Arc::make_mut(&mut self.0).iter_mut()
    }
}

/// Everything the builders may depend on besides the CR and the configuration: the facts the
/// HPP distribution needs, plus [`FactMap`] extensions any step can add.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterFacts {
    /// `security.openshift.io/v1` SecurityContextConstraints is served.
    pub has_scc: bool,
    /// `monitoring.coreos.com/v1` PrometheusRule and ServiceMonitor are served.
    pub has_prometheus: bool,
    /// Every node in the cluster.
    pub nodes: FactList<NodeFact>,
    /// Mounter Deployments that exist now, with their recorded node and mount path.
    pub mounters: FactList<MounterFact>,
    /// Names of mounter Deployments without the recorded node and mount path (written by an
    /// older operator): unknown, so they are re-rendered (and annotated) if still wanted and
    /// otherwise removed by the sweep without an unmount Job.
    pub unrecorded_mounters: Vec<String>,
    /// Cleanup Jobs that exist now.
    pub cleanup_jobs: FactList<CleanupJobFact>,
    /// Pool PVCs that exist now.
    pub claims: FactList<ClaimFact>,
    /// Names of the other HostPathProvisioner objects (a second one is reported, not served).
    pub other_provisioners: Vec<String>,
    /// Bound PersistentVolumes of the hpp CSI driver, summed per pool (see [`VolumeFact`]).
    pub volumes: FactList<VolumeFact>,
    /// StorageClasses of the hpp CSI driver.
    pub classes: FactList<ClassFact>,
    /// CSIStorageCapacity objects in the operator's namespace (where the driver's sidecar
    /// publishes them).
    pub capacities: FactList<CapacityFact>,
    /// Facts plugged-in steps gathered for themselves (see `SubReconciler::gather`).
    pub extensions: FactMap,
    /// The pass's reading of the operator's clock, for steps that wait for deadlines (node
    /// loss); `None` offline (`render`, hand-built facts), where no step acts.
    pub now: Option<k8s_openapi::jiff::Timestamp>,
}

impl ClusterFacts {
    /// Facts for offline rendering: the given Ready nodes, optional APIs as told.
    pub fn offline(nodes: &[String], has_scc: bool, has_prometheus: bool) -> Self {
        ClusterFacts {
            has_scc,
            has_prometheus,
            nodes: nodes.iter().map(|n| NodeFact::ready(n)).collect(),
            ..Default::default()
        }
    }

    /// The fact of type `T` a step gathered, if any.
    pub fn get<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.extensions.get()
    }

    /// The node with this name, if it exists.
    pub fn node(&self, name: &str) -> Option<&NodeFact> {
        self.nodes.iter().find(|n| n.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct QuotaFact(u64);

    #[test]
    fn steps_store_facts_of_their_own_type() {
        let mut facts = ClusterFacts::default();
        assert!(facts.get::<QuotaFact>().is_none());
        facts.extensions.insert(QuotaFact(7));
        facts.extensions.insert(String::from("other"));
        assert_eq!(facts.get::<QuotaFact>(), Some(&QuotaFact(7)));
        assert_eq!(facts.extensions.len(), 2);
        let copy = facts.clone();
        assert_eq!(copy, facts, "clones share the values");
        facts.extensions.insert(QuotaFact(8));
        assert_ne!(copy, facts);
    }
}
