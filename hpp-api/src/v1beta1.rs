//! `hostpathprovisioner.kubevirt.io/v1beta1`: the storage version, field-for-field wire compatible
//! with the KubeVirt operator's CRD so existing objects deserialize unchanged.

use std::collections::BTreeMap;

use garde::Validate;
use k8s_openapi::api::core::v1::{Affinity, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, Toleration};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::quota::QuotaMode;
use crate::validation::rules;

/// Desired state of the hostpath provisioner. Exactly one of `pathConfig` or `storagePools` is set.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema, Validate)]
#[kube(
    group = "hostpathprovisioner.kubevirt.io",
    version = "v1beta1",
    kind = "HostPathProvisioner",
    plural = "hostpathprovisioners",
    singular = "hostpathprovisioner",
    shortname = "hpp",
    derive = "PartialEq",
    status = "HostPathProvisionerStatus",
    printcolumn = r#"{"name":"Available","type":"string","jsonPath":".status.conditions[?(@.type==\"Available\")].status"}"#,
    printcolumn = r#"{"name":"Progressing","type":"string","jsonPath":".status.conditions[?(@.type==\"Progressing\")].status"}"#,
    printcolumn = r#"{"name":"Degraded","type":"string","jsonPath":".status.conditions[?(@.type==\"Degraded\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct HostPathProvisionerSpec {
    /// Pull policy copied to every container the operator deploys: Always, IfNotPresent or Never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[garde(custom(rules::image_pull_policy))]
    pub image_pull_policy: Option<String>,
    /// Deprecated single-directory configuration: runs the legacy provisioner beside the CSI driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[garde(dive)]
    pub path_config: Option<PathConfig>,
    /// Storage pools served by the CSI driver, selected by the StorageClass `storagePool` parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"), length(max = 64))]
    #[garde(dive)]
    pub storage_pools: Option<Vec<StoragePool>>,
    /// Where the provisioner DaemonSets run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[garde(skip)]
    pub workload: Option<NodePlacement>,
    /// Optional features: `Snapshotting` deploys the csi-snapshotter sidecar (when a pool has a
    /// `snapshotProvider`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "set"), length(max = 16), inner(length(max = 64)))]
    #[garde(skip)]
    pub feature_gates: Option<Vec<String>>,
    /// Periodic audit of every node's volumes against the PersistentVolumes of the driver:
    /// directories no PV refers to (orphans) and PVs whose directory is gone (missing volumes)
    /// are reported in status, metrics and Events, never deleted. Absent: no audit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[garde(dive)]
    pub volume_audit: Option<VolumeAudit>,
}

/// The volume audit: how often the operator asks every node's driver for its volumes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema, Validate)]
#[serde(rename_all = "camelCase")]
pub struct VolumeAudit {
    /// Time between two audits, a duration such as `10m` or `1h` (default `10m`, at least
    /// `1m`). Each audit costs one or two HTTPS requests per node; nothing runs between audits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[garde(custom(rules::audit_interval))]
    pub interval: Option<String>,
}

impl VolumeAudit {
    /// [`VolumeAudit::interval`] when absent.
    pub const DEFAULT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(600);
    /// The shortest [`VolumeAudit::interval`] accepted.
    pub const MIN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

    /// The time between audits; the error says what is wrong with `interval`.
    pub fn interval(&self) -> Result<std::time::Duration, String> {
        let Some(text) = &self.interval else {
            return Ok(Self::DEFAULT_INTERVAL);
        };
        let d = crate::duration::parse(text).map_err(|e| e.to_string())?;
        if d < Self::MIN_INTERVAL {
            return Err(format!(
                "{text:?} is shorter than the minimum of 1m; each audit asks every node for its volumes"
            ));
        }
        Ok(d)
    }
}

/// Legacy single-directory configuration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema, Validate)]
#[serde(rename_all = "camelCase")]
pub struct PathConfig {
    /// Absolute host directory volumes are created in.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[garde(custom(rules::host_path))]
    pub path: String,
    /// Name volume directories `<pvc name>-<pv name>` instead of `<pv name>` (legacy provisioner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[garde(skip)]
    pub use_naming_prefix: Option<bool>,
}

/// One storage pool: a host directory, optionally backed by a PVC per node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema, Validate)]
#[serde(rename_all = "camelCase")]
pub struct StoragePool {
    /// Pool name, referenced by the StorageClass `storagePool` parameter.
    #[garde(length(min = 1, max = 50), custom(rules::pool_name))]
    pub name: String,
    /// Absolute host directory of the pool.
    #[garde(length(min = 1, max = 255), custom(rules::host_path))]
    pub path: String,
    /// When set, a PVC from this template is mounted at `<path>/csi` on each node (one shared PVC
    /// for ReadWriteMany templates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[garde(skip)]
    pub pvc_template: Option<PersistentVolumeClaimSpec>,
    /// Snapshot implementation for volumes of this pool: `reflink`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[garde(custom(rules::snapshot_provider))]
    pub snapshot_provider: Option<String>,
    /// StorageClass created for a ReadWriteMany pvcTemplate pool (default `hpp-overlay`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[garde(custom(rules::overlay_class_name))]
    pub overlay_class_name: Option<String>,
    /// Inline ephemeral volumes (`csi.storage.k8s.io/ephemeral`) in this pool: allowed or not,
    /// and how big one may be. Absent: allowed without a cap, as in KubeVirt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[garde(dive)]
    pub ephemeral: Option<EphemeralVolumes>,
    /// How volume sizes are enforced: `none` (default, KubeVirt's behaviour: sizes are recorded,
    /// not enforced), `btrfs`, `xfs-project`, `ext4-project`, `image` or `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[garde(skip)]
    pub quota: Option<QuotaMode>,
    /// How much of the pool's filesystem may be promised to volumes, in percent of its size
    /// (1 to 1000, default 100). Only meaningful with a `quota` backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("minimum" = 1, "maximum" = 1000, "format" = "int32"))]
    #[garde(custom(rules::overcommit_percent))]
    pub overcommit_percent: Option<u32>,
    /// Deleted volumes kept for a while in a trash inside the pool, so a claim deleted by
    /// mistake can be restored. Absent: a deleted volume is removed at once, as in KubeVirt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[garde(dive)]
    pub trash: Option<PoolTrash>,
}

/// The trash of one pool: how long deleted volumes are kept, and how much free space the pool
/// keeps by purging them early.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema, Validate)]
#[serde(rename_all = "camelCase")]
pub struct PoolTrash {
    /// How long a deleted volume is kept before it is purged, as a duration such as `72h`,
    /// `90m` or `7d`. Absent or `0`: no trash, a deleted volume is removed at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[garde(custom(rules::trash_retention))]
    pub retention: Option<String>,
    /// Free space the pool's filesystem keeps, in percent (0 to 99, default 10 with a
    /// retention): below it, trashed volumes are purged early, oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("minimum" = 0, "maximum" = 99, "format" = "int32"))]
    #[garde(custom(rules::trash_min_free_percent))]
    pub min_free_percent: Option<u32>,
}

impl PoolTrash {
    /// Default of [`PoolTrash::min_free_percent`] when a retention is set.
    pub const DEFAULT_MIN_FREE_PERCENT: u32 = 10;

    /// Whether deleted volumes go to the trash: a retention that parses and is not zero.
    pub fn is_on(&self) -> bool {
        self.retention
            .as_deref()
            .and_then(|r| crate::duration::parse(r).ok())
            .is_some_and(|d| !d.is_zero())
    }
}

/// Inline ephemeral volumes in one pool. Any pod creator can ask for one, so an admin may refuse
/// them or cap their size per pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema, Validate)]
#[serde(rename_all = "camelCase")]
pub struct EphemeralVolumes {
    /// Whether inline ephemeral volumes may use this pool (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[garde(skip)]
    pub allowed: Option<bool>,
    /// Largest size an inline ephemeral volume may ask for (its `size` volume attribute), as a
    /// quantity such as `10Gi`. Absent: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[garde(custom(rules::max_size))]
    pub max_size: Option<String>,
}

impl EphemeralVolumes {
    /// Whether inline ephemeral volumes are allowed (absent means yes).
    pub fn is_allowed(&self) -> bool {
        self.allowed.unwrap_or(true)
    }

    /// The size cap in bytes; `None` without a cap or when `maxSize` does not parse (the
    /// validation rejects that).
    pub fn max_bytes(&self) -> Option<u64> {
        self.max_size.as_deref().and_then(crate::quantity::parse_bytes)
    }
}

impl StoragePool {
    /// Whether the driver keeps snapshots in this pool: it has a `snapshotProvider`, so the
    /// operator gives it a snapshot path in the driver's `--datadir`. The driver offers snapshots
    /// only when some pool does, whatever the `Snapshotting` gate says.
    pub fn takes_snapshots(&self) -> bool {
        self.snapshot_provider.is_some()
    }

    /// Whether the pool is backed by one ReadWriteMany PVC shared by every node.
    pub fn is_shared(&self) -> bool {
        self.pvc_template
            .as_ref()
            .and_then(|t| t.access_modes.as_ref())
            .is_some_and(|modes| modes.iter().any(|m| m == "ReadWriteMany"))
    }
}

/// Scheduling constraints for the provisioner DaemonSets.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePlacement {
    /// Node labels a node must carry to run the provisioner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Taints the provisioner pods tolerate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Affinity rules for the provisioner pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
}

/// Observed state of the hostpath provisioner.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostPathProvisionerStatus {
    /// Available, Progressing and Degraded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Version the deployment last completed for; empty while deploying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_version: Option<String>,
    /// Version of the running operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_version: Option<String>,
    /// Version being deployed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<String>,
    /// One entry per storage pool, sorted by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub storage_pool_statuses: Vec<StoragePoolStatus>,
    /// Nodes lost while claims of a StorageClass with `nodeLossPolicy: Recreate` were pinned to
    /// them, and the claims released so far. Absent until that first happens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_loss: Option<NodeLossStatus>,
    /// The last volume audit (`spec.volumeAudit`): when it ran and which nodes answered.
    /// Absent while the audit is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_audit: Option<VolumeAuditStatus>,
}

/// Most entries of a name list in the volume audit's status (`orphans`, `missing`,
/// `notAudited`); the counts beside them are complete.
pub const MAX_AUDIT_NAMES: usize = 10;

/// What the last volume audit covered.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeAuditStatus {
    /// When the last audit ran (RFC 3339); absent until the first one. The next one is due an
    /// interval later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_audit_time: Option<String>,
    /// Nodes whose driver answered the last audit.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nodes_audited: i64,
    /// Nodes with a driver pod whose driver did not answer the last audit (not judged: none of
    /// their PVs counts as missing).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nodes_not_audited: i64,
    /// The first of those nodes by name, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_audited: Vec<NodeNotAudited>,
}

/// A node the volume audit could not judge.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeNotAudited {
    /// Node name.
    pub name: String,
    /// Why, e.g. `connection refused` or `HTTP 401 Unauthorized`.
    pub reason: String,
}

/// The volume audit's findings in one storage pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolVolumeAudit {
    /// Directories in the pool no PersistentVolume refers to, not mounted, older than the grace
    /// period.
    #[serde(default)]
    pub orphaned_volumes: i64,
    /// Bytes those orphans use, as measured by their nodes (at most 64 per node and audit).
    #[serde(default)]
    pub orphaned_bytes: i64,
    /// The first orphans as `<node>/<volume id>`, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub orphans: Vec<String>,
    /// Bound PersistentVolumes of the pool whose directory is missing on their node.
    #[serde(default)]
    pub missing_volumes: i64,
    /// The first of those PersistentVolumes by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
}

/// What the operator did about lost nodes (StorageClass parameter `nodeLossPolicy`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeLossStatus {
    /// Claims released (PVC and PV deleted) after a node loss, in total.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub claims_released: i64,
    /// Lost nodes that still have claims of a `Recreate` class pinned to them, sorted by name;
    /// a node leaves the list when it comes back or when its last such claim is released.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost_nodes: Vec<LostNode>,
}

impl NodeLossStatus {
    /// Whether there is nothing to report (the field is then left out).
    pub fn is_empty(&self) -> bool {
        self.claims_released == 0 && self.lost_nodes.is_empty()
    }
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// A lost node whose claims are being released or wait for their grace period.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LostNode {
    /// Node name.
    pub name: String,
    /// `NodeDeleted` (no Node object) or `OutOfService` (the `node.kubernetes.io/out-of-service`
    /// taint).
    pub reason: NodeLossReason,
    /// When the operator first saw the loss (RFC 3339); grace periods count from here, also
    /// across operator restarts.
    pub since: String,
    /// Claims of this node released so far.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub claims_released: i64,
}

/// Why a node counts as lost.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum NodeLossReason {
    /// The Node object is gone while PVs are still pinned to it.
    #[default]
    NodeDeleted,
    /// The Node carries the `node.kubernetes.io/out-of-service` taint (non-graceful shutdown).
    OutOfService,
}

impl NodeLossReason {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeLossReason::NodeDeleted => "NodeDeleted",
            NodeLossReason::OutOfService => "OutOfService",
        }
    }
}

/// A status condition in the openshift custom-resource-status shape the KubeVirt operator uses.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Available, Progressing or Degraded.
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: String,
    /// CamelCase reason for the last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Last time the condition was evaluated (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<String>,
    /// Last time the status changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// Readiness of one storage pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoragePoolStatus {
    /// Pool name (`legacy` for a `pathConfig` CR).
    pub name: String,
    /// Preparing, Mounting or Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Mounter Deployments that are ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_ready: Option<i32>,
    /// Mounter Deployments wanted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_ready: Option<i32>,
    /// Status of each pool PVC.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claim_statuses: Vec<ClaimStatus>,
    /// Why the pool is not Ready, naming the nodes it cannot serve (absent when Ready).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The configured `quota` mode of the pool (absent: `none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaMode>,
    /// Sum of the capacities of the Bound PersistentVolumes of this pool (a quantity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed: Option<String>,
    /// What the driver reports it can still provision, from the CSIStorageCapacity objects of
    /// the pool's StorageClasses, summed over nodes (a quantity; absent without capacity
    /// tracking).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<String>,
    /// What the last volume audit found in this pool (absent while the audit is off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_audit: Option<PoolVolumeAudit>,
}

/// Status of one pool PVC.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimStatus {
    /// PVC name.
    pub name: String,
    /// The PVC's status as the API server reports it.
    pub status: PersistentVolumeClaimStatus,
}
