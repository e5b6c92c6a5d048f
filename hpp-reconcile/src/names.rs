//! Object names and labels, identical to the KubeVirt operator's so an upgrade adopts the
//! objects it created instead of creating a second set.

use std::collections::BTreeMap;

use hpp_api::constants as c;

use crate::config::OperatorConfig;

/// The CSI DaemonSet, its SCC, and the name of the legacy ClusterRole/Binding.
pub const CSI_DAEMONSET: &str = "hostpath-provisioner-csi";
/// The legacy DaemonSet (and legacy ClusterRole/Binding and SCC).
pub const LEGACY_DAEMONSET: &str = "hostpath-provisioner";
/// Service account and RBAC objects of the CSI driver.
pub const CSI_SERVICE_ACCOUNT: &str = "hostpath-provisioner-admin-csi";
/// Service account of the legacy provisioner.
pub const LEGACY_SERVICE_ACCOUNT: &str = "hostpath-provisioner-admin";
/// ClusterRole/ClusterRoleBinding of the legacy provisioner.
pub const LEGACY_CLUSTER_ROLE: &str = "hostpath-provisioner";
/// SCC of the CSI driver.
pub const CSI_SCC: &str = "hostpath-provisioner-csi";
/// SCC of the legacy provisioner.
pub const LEGACY_SCC: &str = "hostpath-provisioner";
/// PrometheusRule name.
pub const PROMETHEUS_RULE: &str = "prometheus-hpp-rules";
/// Monitoring Role/RoleBinding name.
pub const MONITORING_ROLE: &str = "hostpath-provisioner-monitoring";
/// Metrics Service name (also the driver's `SERVICE_NAME`).
pub const METRICS_SERVICE: &str = "hpp-prometheus-metrics";
/// ServiceMonitor name.
pub const SERVICE_MONITOR: &str = "service-monitor-hpp";
/// Default overlay StorageClass of a ReadWriteMany pvcTemplate pool.
pub const DEFAULT_OVERLAY_CLASS: &str = "hpp-overlay";
/// Mount name of the legacy pool in the CSI DaemonSet.
pub const LEGACY_DATA_DIR: &str = "csi-data-dir";
/// Annotation on every applied object: hash of what the operator last applied, so a field the
/// operator stops sending is noticed even though the live object still "contains" the desired one.
pub const ANNOTATION_DESIRED_HASH: &str = "hostpathprovisioner.kubevirt.io/desired-hash";
/// On mounter Deployments and cleanup Jobs: the node the pod is pinned to, recorded so the
/// operator never has to recover it from the pod spec.
pub const ANNOTATION_POOL_NODE: &str = "hostpathprovisioner.kubevirt.io/pool-node";
/// On mounter Deployments and cleanup Jobs: the pool mount path (`<pool path>/csi`).
pub const ANNOTATION_POOL_MOUNT_PATH: &str = "hostpathprovisioner.kubevirt.io/pool-mount-path";
/// On mounter Deployments and cleanup Jobs: what the pod does to the pool, `mount` or `unmount`.
pub const ANNOTATION_POOL_ACTION: &str = "hostpathprovisioner.kubevirt.io/pool-action";
/// Set to `"true"` on a HostPathProvisioner stuck deleting because its pool cleanup Jobs cannot
/// run: the operator stops waiting for them, leaves those pool mounts and their data on the
/// nodes, names them in a Warning Event, and finishes the deletion.
pub const ANNOTATION_SKIP_CLEANUP: &str = "hostpathprovisioner.kubevirt.io/skip-cleanup";
/// [`ANNOTATION_POOL_ACTION`] of a mounter Deployment.
pub const POOL_ACTION_MOUNT: &str = "mount";
/// [`ANNOTATION_POOL_ACTION`] of a cleanup Job.
pub const POOL_ACTION_UNMOUNT: &str = "unmount";

/// Name of the step owning the service accounts of the driver and the legacy provisioner.
/// Every `STEP_*` name is also the suffix of the step's field manager `hpp-operator/<name>`,
/// so it never changes; [`STANDARD_STEPS`] lists them in `Pipeline::standard` order.
pub const STEP_SERVICE_ACCOUNTS: &str = "service-accounts";
/// Name of the step owning the ClusterRoles, Roles and their bindings of the driver and the
/// legacy provisioner.
pub const STEP_RBAC: &str = "rbac";
/// Name of the step owning the CSIDriver object.
pub const STEP_CSI_DRIVER: &str = "csi-driver";
/// Name of the step owning the SecurityContextConstraints (OpenShift only).
pub const STEP_SCC: &str = "scc";
/// Name of the step owning the CSI DaemonSet (the driver and its sidecars).
pub const STEP_CSI_DAEMONSET: &str = "csi-daemonset";
/// Name of the step owning the legacy (non-CSI) provisioner's DaemonSet.
pub const STEP_LEGACY_DAEMONSET: &str = "legacy-daemonset";
/// Name of the step owning the pool objects: pvcTemplate claims, mounter Deployments,
/// cleanup Jobs and the overlay StorageClass.
pub const STEP_STORAGE_POOLS: &str = "storage-pools";
/// Name of the step owning the monitoring objects (metrics Service, Role, PrometheusRule,
/// ServiceMonitor).
pub const STEP_PROMETHEUS: &str = "prometheus";
/// Name of the report-only step checking that StorageClasses name configured pools.
pub const STEP_STORAGE_CLASS_POOLS: &str = "storage-class-pools";
/// Name of the report-only step checking the driver pods' pool mounts.
pub const STEP_POOL_MOUNTS: &str = "pool-mounts";
/// Name of the node-loss step, which owns nothing and releases claims of lost nodes.
pub const STEP_NODE_LOSS: &str = "node-loss";
/// Name of the volume-audit step (`spec.volumeAudit`).
pub const STEP_VOLUME_AUDIT: &str = "volume-audit";

/// The steps of `Pipeline::standard`, in order.
pub const STANDARD_STEPS: [&str; 12] = [
    STEP_SERVICE_ACCOUNTS,
    STEP_RBAC,
    STEP_CSI_DRIVER,
    STEP_SCC,
    STEP_CSI_DAEMONSET,
    STEP_LEGACY_DAEMONSET,
    STEP_STORAGE_POOLS,
    STEP_PROMETHEUS,
    STEP_STORAGE_CLASS_POOLS,
    STEP_POOL_MOUNTS,
    STEP_NODE_LOSS,
    STEP_VOLUME_AUDIT,
];
/// Secret holding the bearer token the operator presents to the drivers' volume report
/// (`spec.volumeAudit`), mounted read-only into the driver container.
pub const VOLUME_REPORT_SECRET: &str = "hpp-volume-report-token";
/// Key of the token in [`VOLUME_REPORT_SECRET`].
pub const VOLUME_REPORT_TOKEN_KEY: &str = "token";
/// Where the driver container mounts [`VOLUME_REPORT_SECRET`].
pub const VOLUME_REPORT_MOUNT_DIR: &str = "/etc/hpp/volume-report";
/// Volume (and mount) name of [`VOLUME_REPORT_SECRET`] in the CSI DaemonSet.
pub const VOLUME_REPORT_VOLUME: &str = "volume-report-token";

/// Kubernetes name limit used for every generated name.
pub const MAX_NAME_LENGTH: usize = 63;

/// The labels every owned object carries.
pub fn common_labels(cfg: &OperatorConfig) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (c::LABEL_APP.to_owned(), c::LABEL_APP_VALUE.to_owned()),
        (c::LABEL_MANAGED_BY.to_owned(), c::LABEL_MANAGED_BY_VALUE.to_owned()),
        (c::LABEL_COMPONENT.to_owned(), c::LABEL_COMPONENT_VALUE.to_owned()),
    ]);
    labels.extend(cfg.installer_labels.clone());
    labels
}

/// Label selector matching every object the operator manages (used by the orphan sweep).
pub fn managed_selector() -> String {
    format!("{}={}", c::LABEL_MANAGED_BY, c::LABEL_MANAGED_BY_VALUE)
}

/// Whether `obj` carries the label [`managed_selector`] selects (so the watch caches hold it).
pub fn is_managed(obj: &kube::api::DynamicObject) -> bool {
    obj.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(c::LABEL_MANAGED_BY))
        .is_some_and(|v| v == c::LABEL_MANAGED_BY_VALUE)
}

/// FNV-1a 32-bit hash as 8 hex digits (KubeVirt's name hash); the workspace's one
/// implementation lives in `hpp_api::names`.
pub use hpp_api::names::fnv1a32_hex;

/// `<base>-<suffix>`, shortened with a hash exactly as KubeVirt does when longer than `max`.
pub fn name_with_max_length(base: &str, suffix: &str, max: usize) -> String {
    if max == 0 {
        return String::new();
    }
    let name = format!("{base}-{suffix}");
    if name.len() <= max {
        return name;
    }
    match max.checked_sub(10 + suffix.len()) {
        Some(base_len) => format!("{}-{}-{suffix}", prefix(base, base_len), fnv1a32_hex(base)),
        None => {
            let short = format!("{}-{}", prefix(base, max.saturating_sub(9)), fnv1a32_hex(&name));
            prefix(&short, max).to_owned()
        }
    }
}

/// The longest prefix of at most `n` bytes that ends on a character boundary.
fn prefix(s: &str, n: usize) -> &str {
    let mut end = n.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Name of a pool's PVC / mounter Deployment on one node: `hpp-pool-<pool>-<node>`.
pub fn pool_node_name(pool: &str, node: &str) -> String {
    name_with_max_length(&format!("hpp-pool-{pool}"), node, MAX_NAME_LENGTH)
}

/// Name of the one shared PVC of a ReadWriteMany pool: `hpp-pool-<pool>-shared`.
pub fn pool_shared_claim_name(pool: &str) -> String {
    name_with_max_length(&format!("hpp-pool-{pool}"), "shared", MAX_NAME_LENGTH)
}

/// Name of the cleanup Job of a pool on one node: `cleanup-pool-<pool>-<node>`.
pub fn cleanup_job_name(pool: &str, node: &str) -> String {
    name_with_max_length(&format!("cleanup-pool-{pool}"), node, MAX_NAME_LENGTH)
}

/// Value of the storage-pool and hpp-pool labels: `<pool>-hpp`.
pub fn pool_label_value(pool: &str) -> String {
    format!("{pool}-hpp")
}

/// Name of a pool's volume and mount directory in the CSI DaemonSet: `<pool>-data-dir`.
pub fn pool_mount_name(pool: &str) -> String {
    format!("{pool}-data-dir")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_plain() {
        assert_eq!(pool_node_name("local", "node01"), "hpp-pool-local-node01");
        assert_eq!(cleanup_job_name("local", "node01"), "cleanup-pool-local-node01");
        assert_eq!(pool_shared_claim_name("nfs"), "hpp-pool-nfs-shared");
        assert_eq!(pool_mount_name("local"), "local-data-dir");
    }

    #[test]
    fn fnv_matches_reference_vectors() {
        assert_eq!(fnv1a32_hex(""), "811c9dc5");
        assert_eq!(fnv1a32_hex("a"), "e40c292c");
        assert_eq!(fnv1a32_hex("foobar"), "bf9cf968");
    }

    #[test]
    fn long_names_are_hashed_and_bounded() {
        let node = "a-very-long-node-name.with.a.domain.example.com";
        let name = pool_node_name("some-long-pool-name", node);
        assert_eq!(name.len(), MAX_NAME_LENGTH);
        let base = "hpp-pool-some-long-pool-name";
        let expected = format!("{}-{}-{node}", &base[..63 - 10 - node.len()], fnv1a32_hex(base));
        assert_eq!(name, expected);
        // A suffix longer than the limit: base prefix + hash of the full name, cut at 63.
        let huge = "n".repeat(70);
        let name = pool_node_name("p", &huge);
        assert!(name.len() <= MAX_NAME_LENGTH);
        assert!(name.starts_with("hpp-pool-p-"));
        assert!(name.contains(&fnv1a32_hex(&format!("hpp-pool-p-{huge}"))));
        assert_eq!(name_with_max_length("a", "b", 0), "");
    }
}
