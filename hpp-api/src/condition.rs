//! Status condition types and reasons, identical to the KubeVirt operator's so dashboards and
//! `kubectl wait --for=condition=Available` keep working.

/// Condition type: the provisioner is serving volumes.
pub const AVAILABLE: &str = "Available";
/// Condition type: a deploy or upgrade is under way.
pub const PROGRESSING: &str = "Progressing";
/// Condition type: something is wrong and needs attention.
pub const DEGRADED: &str = "Degraded";

/// Reason: first deployment started.
pub const REASON_DEPLOY_STARTED: &str = "DeployStarted";
/// Reason: an upgrade to a newer operator version, or a rollout of a new pod template (a
/// DaemonSet or a pool mounter Deployment), is under way; it stays until the updated pods are
/// available.
pub const REASON_UPGRADE_STARTED: &str = "UpgradeStarted";
/// Reason: every owned object is ready.
pub const REASON_COMPLETE: &str = "Complete";
/// Reason: deployed, but the DaemonSets or the pool mounter Deployments are not ready.
pub const REASON_DEGRADED: &str = "Degraded";
/// Reason: a pvcTemplate pool claim is not bound.
pub const REASON_STORAGE_POOL_NOT_READY: &str = "StoragePoolNotReady";
/// Reason: a reconcile step failed.
pub const REASON_RECONCILE_FAILED: &str = "ReconcileFailed";
