//! Pure builders of the pvcTemplate pool objects: pool PVCs, the overlay StorageClass, the
//! per-node mounter Deployment and the cleanup Job.

use hpp_api::constants as c;
use hpp_api::{HostPathProvisioner, StoragePool};
use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec, SecurityContext,
    Volume, VolumeDevice, VolumeMount,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ObjectMeta;

use super::common;
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
fn host_parent_mount(mount_path: &str) -> (VolumeMount, Volume) {
    let parent = host_parent(mount_path);
    let in_pod = format!("{HOST_ROOT}{}", if parent == "/" { "" } else { parent.as_str() });
    (
        VolumeMount {
            name: "host-pool-parent".into(),
            mount_path: in_pod,
            mount_propagation: Some("Bidirectional".into()),
            ..Default::default()
        },
        common::host_path_volume("host-pool-parent", &parent, "DirectoryOrCreate"),
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
    common::typed_create_only(&PersistentVolumeClaim {
        metadata: common::object_meta(
            name,
            Some(&cfg.namespace),
            cfg,
            &[(c::LABEL_STORAGE_POOL, &pool_label)],
            None,
        ),
        spec: pool.pvc_template.clone(),
        ..Default::default()
    })
}

/// The overlay StorageClass of a ReadWriteMany pool. Claims of it may grow
/// (`allowVolumeExpansion`) when the pool enforces sizes with a quota backend; without one a
/// size means nothing, so the class does not pretend it can be changed (KubeVirt's class).
pub fn overlay_storage_class(pool: &StoragePool, cfg: &OperatorConfig) -> Result<DesiredObject> {
    let name = pool
        .overlay_class_name
        .as_deref()
        .unwrap_or(names::DEFAULT_OVERLAY_CLASS);
    common::typed_create_only(&StorageClass {
        metadata: common::object_meta(name, None, cfg, &[], None),
        provisioner: c::DRIVER_NAME.to_owned(),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some("Immediate".into()),
        allow_volume_expansion: pool.quota.filter(|q| !q.is_none()).map(|_| true),
        parameters: Some(BTreeMap::from([
            (c::PARAM_STORAGE_POOL.to_owned(), pool.name.clone()),
            (c::PARAM_OVERLAY_CSI.to_owned(), "true".to_owned()),
        ])),
        ..Default::default()
    })
}

/// What the operator later needs to know about a mounter or cleanup pod, recorded on the
/// object instead of being parsed back out of the pod spec.
fn pool_annotations(action: &str, node: &str, mount_path: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (names::ANNOTATION_POOL_ACTION.to_owned(), action.to_owned()),
        (names::ANNOTATION_POOL_NODE.to_owned(), node.to_owned()),
        (names::ANNOTATION_POOL_MOUNT_PATH.to_owned(), mount_path.to_owned()),
    ])
}

/// The pod of a mounter Deployment or cleanup Job: the mounter container pinned to `node`.
fn mounter_pod(
    hpp: &HostPathProvisioner,
    cfg: &OperatorConfig,
    node: &str,
    args: Vec<String>,
    volume_mounts: Vec<VolumeMount>,
    volume_devices: Option<Vec<VolumeDevice>>,
    volumes: Vec<Volume>,
) -> PodSpec {
    PodSpec {
        service_account_name: Some(names::CSI_SERVICE_ACCOUNT.into()),
        affinity: Some(common::node_pin(node)),
        containers: vec![mounter_container(
            &cfg.images.operator,
            &common::pull_policy(hpp),
            args,
            volume_mounts,
            volume_devices,
        )],
        volumes: Some(volumes),
        ..Default::default()
    }
}

fn mounter_container(
    image: &str,
    pull: &str,
    args: Vec<String>,
    volume_mounts: Vec<VolumeMount>,
    volume_devices: Option<Vec<VolumeDevice>>,
) -> Container {
    Container {
        name: "mounter".into(),
        image: Some(image.to_owned()),
        image_pull_policy: Some(pull.to_owned()),
        command: Some(vec![MOUNTER_COMMAND.to_owned()]),
        args: Some(args),
        security_context: Some(SecurityContext {
            privileged: Some(true),
            run_as_user: Some(0),
            ..Default::default()
        }),
        resources: Some(common::requests("10m", "100Mi")),
        volume_mounts: Some(volume_mounts),
        volume_devices,
        ..Default::default()
    }
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
            vec![host_mount],
            Some(vec![VolumeDevice {
                name: "data".into(),
                device_path: SOURCE_BLOCK.into(),
            }]),
        )
    } else {
        let data = VolumeMount {
            name: "data".into(),
            mount_path: SOURCE_FS.into(),
            ..Default::default()
        };
        (vec![data, host_mount], None)
    };
    let extra = [
        (c::LABEL_STORAGE_POOL, pool_label.as_str()),
        (c::LABEL_HPP_POOL, pool_label.as_str()),
    ];
    let name = names::pool_node_name(&pool.name, node);
    let data = Volume {
        name: "data".into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.to_owned(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mount_path = pool_mount_path(pool);
    common::typed_ssa(&Deployment {
        metadata: ObjectMeta {
            annotations: Some(pool_annotations(names::POOL_ACTION_MOUNT, node, &mount_path)),
            ..common::object_meta(&name, Some(&cfg.namespace), cfg, &extra, Some(hpp))
        },
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([(c::LABEL_HPP_POOL.to_owned(), pool_label.clone())])),
                ..Default::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(1)),
                    max_surge: Some(IntOrString::Int(2)),
                }),
            }),
            progress_deadline_seconds: Some(600),
            template: PodTemplateSpec {
                metadata: Some(common::template_meta(cfg, &extra)),
                spec: Some(mounter_pod(
                    hpp,
                    cfg,
                    node,
                    args,
                    mounts,
                    devices,
                    vec![data, host_volume],
                )),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
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
    let extra = [(c::LABEL_STORAGE_POOL, pool_label)];
    common::typed_create_only(&Job {
        metadata: ObjectMeta {
            annotations: Some(pool_annotations(names::POOL_ACTION_UNMOUNT, node, mount_path)),
            ..common::object_meta(name, Some(&cfg.namespace), cfg, &extra, None)
        },
        spec: Some(JobSpec {
            template: PodTemplateSpec {
                metadata: Some(common::template_meta(cfg, &extra)),
                spec: Some(PodSpec {
                    restart_policy: Some("OnFailure".into()),
                    ..mounter_pod(hpp, cfg, node, args, vec![host_mount], None, vec![host_volume])
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}
