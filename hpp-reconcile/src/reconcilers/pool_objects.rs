//! Pure builders of the pvcTemplate pool objects: pool PVCs, the overlay StorageClass, the
//! per-node mounter Deployment and the cleanup Job.

use hpp_api::constants as c;
use hpp_api::{HostPathProvisioner, StoragePool};
use serde_json::{Value, json};

use super::common::{self, deployment_kind, job_kind, pvc_kind, storage_class_kind};
use crate::config::OperatorConfig;
use crate::error::Result;
use crate::names;
use crate::object::DesiredObject;

/// Path of the mounter executable inside the operator image.
pub const MOUNTER_COMMAND: &str = "/usr/bin/hpp-mounter";
/// Where a filesystem pool PVC is mounted in the mounter pod.
pub const SOURCE_FS: &str = "/source";
/// Where a block pool PVC appears in the mounter pod.
pub const SOURCE_BLOCK: &str = "/dev/data";
/// Prefix under which the mounter pod sees host paths (`--hostPath`). Only the parent of the
/// pool's mount point is mounted there, at its own host path, not the host's `/`.
pub const HOST_ROOT: &str = "/host";

/// The host directory a mounter or cleanup pod mounts (Bidirectional, so its mount reaches the
/// host): the parent of the mount point `mount_path`, i.e. the pool's `path`. `/` only for a
/// mount point directly under the root, which validation does not admit.
pub fn host_parent(mount_path: &str) -> String {
    let parent = std::path::Path::new(mount_path.trim_end_matches('/'))
        .parent()
        .map_or_else(|| "/".to_owned(), |p| p.to_string_lossy().into_owned());
    if parent.is_empty() { "/".to_owned() } else { parent }
}

/// The Bidirectional mount of `host_parent(mount_path)` at `/host<parent>` and its hostPath volume.
/// The pod is privileged (Kubernetes requires it for Bidirectional propagation) and keeps the
/// default SELinux type of privileged containers, `spc_t`, which may mount over `container_file_t`
/// and `var_lib_t` pool directories alike.
fn host_parent_mount(mount_path: &str) -> (Value, Value) {
    let parent = host_parent(mount_path);
    let in_pod = format!("{HOST_ROOT}{}", if parent == "/" { "" } else { parent.as_str() });
    (
        json!({ "name": "host-pool-parent", "mountPath": in_pod, "mountPropagation": "Bidirectional" }),
        json!({ "name": "host-pool-parent", "hostPath": { "path": parent, "type": "DirectoryOrCreate" } }),
    )
}

/// `<pool.path>/csi`: the directory the pool PVC is mounted on.
pub fn pool_mount_path(pool: &StoragePool) -> String {
    format!("{}/csi", pool.path.trim_end_matches('/'))
}

fn is_block(pool: &StoragePool) -> bool {
    pool.pvc_template.as_ref().and_then(|t| t.volume_mode.as_deref()) == Some("Block")
}

/// A pool PVC (create-only, no owner: data outlives a reinstall of the operator).
pub fn pool_claim(pool: &StoragePool, name: &str, cfg: &OperatorConfig) -> Result<DesiredObject> {
    let pool_label = names::pool_label_value(&pool.name);
    common::create_only(
        pvc_kind(),
        json!({
            "metadata": common::meta(name, Some(&cfg.namespace), cfg, &[(c::LABEL_STORAGE_POOL, &pool_label)], None),
            "spec": pool.pvc_template,
        }),
    )
}

/// The overlay StorageClass of a ReadWriteMany pool.
pub fn overlay_storage_class(pool: &StoragePool, cfg: &OperatorConfig) -> Result<DesiredObject> {
    let name = pool
        .overlay_class_name
        .as_deref()
        .unwrap_or(names::DEFAULT_OVERLAY_CLASS);
    common::create_only(
        storage_class_kind(),
        json!({
            "metadata": common::meta(name, None, cfg, &[], None),
            "provisioner": c::DRIVER_NAME,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
            "parameters": { c::PARAM_STORAGE_POOL: pool.name, c::PARAM_OVERLAY_CSI: "true" },
        }),
    )
}

fn mounter_container(
    image: &str,
    pull: &str,
    args: Vec<String>,
    volume_mounts: Value,
    devices: Option<Value>,
) -> Value {
    let mut container = json!({
        "name": "mounter",
        "image": image,
        "imagePullPolicy": pull,
        "command": [MOUNTER_COMMAND],
        "args": args,
        "securityContext": { "privileged": true, "runAsUser": 0 },
        "resources": { "requests": { "cpu": "10m", "memory": "100Mi" } },
        "volumeMounts": volume_mounts,
    });
    if let Some(d) = devices {
        container["volumeDevices"] = d;
    }
    container
}

/// The mounter Deployment of a pool on one node, bind-mounting `claim` onto `<path>/csi`.
pub fn mounter_deployment(
    hpp: &HostPathProvisioner,
    pool: &StoragePool,
    node: &str,
    claim: &str,
    cfg: &OperatorConfig,
) -> Result<DesiredObject> {
    let pool_label = names::pool_label_value(&pool.name);
    let block = is_block(pool);
    let source = if block { SOURCE_BLOCK } else { SOURCE_FS };
    let args = vec![
        "--storagePoolPath".into(),
        source.into(),
        "--mountPath".into(),
        pool_mount_path(pool),
        "--hostPath".into(),
        HOST_ROOT.into(),
    ];
    let (host_mount, host_volume) = host_parent_mount(&pool_mount_path(pool));
    let (mounts, devices) = if block {
        (
            json!([host_mount]),
            Some(json!([{ "name": "data", "devicePath": SOURCE_BLOCK }])),
        )
    } else {
        (json!([{ "name": "data", "mountPath": SOURCE_FS }, host_mount]), None)
    };
    let extra = [
        (c::LABEL_STORAGE_POOL, pool_label.as_str()),
        (c::LABEL_HPP_POOL, pool_label.as_str()),
    ];
    let name = names::pool_node_name(&pool.name, node);
    common::ssa(
        deployment_kind(),
        json!({
            "metadata": common::meta(&name, Some(&cfg.namespace), cfg, &extra, Some(hpp)),
            "spec": {
                "replicas": 1,
                "selector": { "matchLabels": { c::LABEL_HPP_POOL: pool_label } },
                "strategy": { "type": "RollingUpdate", "rollingUpdate": { "maxUnavailable": 1, "maxSurge": 2 } },
                "progressDeadlineSeconds": 600,
                "template": {
                    "metadata": {
                        "labels": common::labels_value(cfg, &extra),
                        "annotations": { "openshift.io/required-scc": names::CSI_SCC },
                    },
                    "spec": {
                        "serviceAccountName": names::CSI_SERVICE_ACCOUNT,
                        "affinity": common::pin_to_node(node),
                        "containers": [mounter_container(&cfg.images.operator, &common::pull_policy(hpp), args, mounts, devices)],
                        "volumes": [
                            { "name": "data", "persistentVolumeClaim": { "claimName": claim } },
                            host_volume,
                        ],
                    },
                },
            },
        }),
    )
}

/// The cleanup Job unmounting a pool (`mount_path` = `<path>/csi`) on one node.
pub fn cleanup_job(
    hpp: &HostPathProvisioner,
    name: &str,
    pool_label: &str,
    node: &str,
    mount_path: &str,
    cfg: &OperatorConfig,
) -> Result<DesiredObject> {
    let args = vec![
        "--unmount".to_owned(),
        "--mountPath".to_owned(),
        mount_path.to_owned(),
        "--hostPath".to_owned(),
        HOST_ROOT.to_owned(),
    ];
    let (host_mount, host_volume) = host_parent_mount(mount_path);
    let mounts = json!([host_mount]);
    let extra = [(c::LABEL_STORAGE_POOL, pool_label)];
    common::create_only(
        job_kind(),
        json!({
            "metadata": common::meta(name, Some(&cfg.namespace), cfg, &extra, None),
            "spec": {
                "template": {
                    "metadata": {
                        "labels": common::labels_value(cfg, &extra),
                        "annotations": { "openshift.io/required-scc": names::CSI_SCC },
                    },
                    "spec": {
                        "restartPolicy": "OnFailure",
                        "serviceAccountName": names::CSI_SERVICE_ACCOUNT,
                        "affinity": common::pin_to_node(node),
                        "containers": [mounter_container(&cfg.images.operator, &common::pull_policy(hpp), args, mounts, None)],
                        "volumes": [host_volume],
                    },
                },
            },
        }),
    )
}

/// The `--mountPath` argument of a mounter or cleanup pod spec (KubeVirt's or ours).
pub fn mount_path_arg(pod_spec: &Value) -> Option<String> {
    let container = pod_spec.pointer("/containers/0")?;
    let words: Vec<&str> = ["command", "args"]
        .iter()
        .filter_map(|k| container.get(*k).and_then(Value::as_array))
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    words
        .iter()
        .position(|w| *w == "--mountPath")
        .and_then(|i| words.get(i + 1))
        .map(|s| (*s).to_owned())
}
