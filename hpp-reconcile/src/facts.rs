//! What the operator knows about the cluster at the start of a pass: optional APIs found by
//! discovery, nodes, and the pool objects already present. Gathered by I/O once per pass (see
//! `gather`), consumed by the pure builders, and constructible by hand for `render` and tests.

use std::collections::BTreeMap;

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
    /// Node it is pinned to (from its required node affinity).
    pub node: String,
    /// Its `--mountPath` (`<pool path>/csi`), needed to unmount after the pool is gone.
    pub mount_path: String,
}

/// An existing cleanup Job.
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

/// Everything the builders may depend on besides the CR and the configuration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterFacts {
    /// `security.openshift.io/v1` SecurityContextConstraints is served.
    pub has_scc: bool,
    /// `monitoring.coreos.com/v1` PrometheusRule and ServiceMonitor are served.
    pub has_prometheus: bool,
    /// Every node in the cluster.
    pub nodes: Vec<NodeFact>,
    /// Mounter Deployments that exist now.
    pub mounters: Vec<MounterFact>,
    /// Cleanup Jobs that exist now.
    pub cleanup_jobs: Vec<CleanupJobFact>,
    /// Pool PVCs that exist now.
    pub claims: Vec<ClaimFact>,
    /// Names of the other HostPathProvisioner objects (a second one is reported, not served).
    pub other_provisioners: Vec<String>,
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

    /// The node with this name, if it exists.
    pub fn node(&self, name: &str) -> Option<&NodeFact> {
        self.nodes.iter().find(|n| n.name == name)
    }
}
