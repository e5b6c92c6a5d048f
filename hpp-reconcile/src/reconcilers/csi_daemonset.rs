//! The CSI DaemonSet `hostpath-provisioner-csi`: driver, registrar, liveness probe, external
//! provisioner and (with `Snapshotting`) snapshotter, with one host mount per storage pool.

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use hpp_api::constants as c;
use kube::api::DynamicObject;
use serde::Serialize;
use serde_json::{Value, json};

use super::common::{self, daemonset_kind};
use crate::config::OperatorConfig;
use crate::error::{Error, Result};
use crate::facts::ClusterFacts;
use crate::names;
use crate::object::{DesiredObject, Kind};
use crate::subreconciler::{Readiness, SubReconciler};

/// Socket path inside the pods.
const CSI_SOCKET: &str = "/csi/csi.sock";

/// One `--datadir` entry, fields in KubeVirt's JSON order.
#[derive(Serialize, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DataDirEntry {
    /// Pool name (`legacy` for a pathConfig CR).
    pub name: String,
    /// `<mountName>/csi`, relative to the container's `/`.
    pub path: String,
    /// `<mountName>/csi/snapshots` when the pool has a snapshot provider.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_path: Option<String>,
    /// Snapshot provider of the pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_provider: Option<String>,
    /// Whether the pool is one shared ReadWriteMany PVC.
    pub shared: bool,
    /// hpp's mount guard: the driver refuses to place volumes in the pool until the pool
    /// directory is a mount point. Set for pvcTemplate pools, whose `<mountName>/csi` is where the
    /// mounter mounts the pool PVC, so volumes never land on the node's root disk while the
    /// mounter is not done (KubeVirt operator PR #278). Omitted (false) otherwise, keeping the
    /// JSON byte-identical to KubeVirt's for plain pools.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub require_mount_point: bool,
}

/// A pool as the DaemonSet mounts it: volume name, host path, datadir entry.
#[derive(Debug, PartialEq, Eq)]
pub struct PoolMount {
    /// Volume and mount-directory name.
    pub mount_name: String,
    /// Host directory.
    pub host_path: String,
    /// Entry in `--datadir`.
    pub entry: DataDirEntry,
}

/// Volume/mount name of a pool: `<pool>-data-dir`, hashed beyond 63 characters.
pub fn mount_name(pool: &str) -> String {
    let plain = names::pool_mount_name(pool);
    if plain.len() <= names::MAX_NAME_LENGTH {
        plain
    } else {
        names::name_with_max_length(pool, "data-dir", names::MAX_NAME_LENGTH)
    }
}

/// The pools the CSI driver serves, in spec order.
pub fn pool_mounts(hpp: &HostPathProvisioner) -> Vec<PoolMount> {
    if let Some(pc) = &hpp.spec.path_config {
        let mount_name = names::LEGACY_DATA_DIR.to_owned();
        return vec![PoolMount {
            host_path: pc.path.clone(),
            entry: DataDirEntry {
                name: c::DEFAULT_POOL_NAME.into(),
                path: format!("{mount_name}/csi"),
                snapshot_path: None,
                snapshot_provider: None,
                shared: false,
                require_mount_point: false,
            },
            mount_name,
        }];
    }
    hpp.spec
        .storage_pools
        .iter()
        .flatten()
        .map(|p| {
            let mount_name = mount_name(&p.name);
            PoolMount {
                host_path: p.path.clone(),
                entry: DataDirEntry {
                    name: p.name.clone(),
                    path: format!("{mount_name}/csi"),
                    snapshot_path: p
                        .snapshot_provider
                        .as_ref()
                        .map(|_| format!("{mount_name}/csi/snapshots")),
                    snapshot_provider: p.snapshot_provider.clone(),
                    shared: p.is_shared(),
                    require_mount_point: p.pvc_template.is_some(),
                },
                mount_name,
            }
        })
        .collect()
}

/// The `--datadir` / `PV_DIR` JSON.
pub fn datadir_json(hpp: &HostPathProvisioner) -> Result<String> {
    let entries: Vec<DataDirEntry> = pool_mounts(hpp).into_iter().map(|m| m.entry).collect();
    serde_json::to_string(&entries).map_err(|source| Error::Serialize {
        what: "datadir".into(),
        source,
    })
}

fn env_field(name: &str, path: &str) -> Value {
    json!({ "name": name, "valueFrom": { "fieldRef": { "apiVersion": "v1", "fieldPath": path } } })
}

fn requests() -> Value {
    json!({ "requests": { "cpu": "10m", "memory": "150Mi" } })
}

/// The desired CSI DaemonSet.
pub fn desired_csi_daemonset(hpp: &HostPathProvisioner, cfg: &OperatorConfig) -> Result<DesiredObject> {
    let pull = common::pull_policy(hpp);
    let img = &cfg.images;
    let v = cfg.verbosity;
    let mounts = pool_mounts(hpp);
    let pool_volume_mounts: Vec<Value> = mounts
        .iter()
        .map(|m| json!({ "name": m.mount_name, "mountPath": format!("/{}", m.mount_name), "mountPropagation": "HostToContainer" }))
        .collect();
    let mut driver_mounts = vec![
        json!({ "name": "plugins-dir", "mountPath": "/var/lib/kubelet/plugins", "mountPropagation": "Bidirectional" }),
        json!({ "name": "mountpoint-dir", "mountPath": "/var/lib/kubelet/pods", "mountPropagation": "Bidirectional" }),
        json!({ "name": "socket-dir", "mountPath": "/csi" }),
    ];
    driver_mounts.extend(pool_volume_mounts.iter().cloned());
    let mut registrar_mounts = vec![
        json!({ "name": "socket-dir", "mountPath": "/csi" }),
        json!({ "name": "registration-dir", "mountPath": "/registration" }),
    ];
    registrar_mounts.extend(pool_volume_mounts.iter().cloned());
    let privileged = json!({ "privileged": true });
    let mut containers = vec![
        json!({
            "name": "hostpath-provisioner",
            "image": img.csi_driver,
            "imagePullPolicy": pull,
            "args": [
                format!("--drivername={}", c::DRIVER_NAME),
                format!("--v={v}"),
                "--endpoint=$(CSI_ENDPOINT)",
                "--nodeid=$(NODE_NAME)",
                "--version=$(VERSION)",
                "--datadir=$(PV_DIR)",
                format!("--metrics-tls-version={}", cfg.metrics_tls_version),
            ],
            "env": [
                { "name": "CSI_ENDPOINT", "value": format!("unix://{CSI_SOCKET}") },
                env_field("NODE_NAME", "spec.nodeName"),
                { "name": "PV_DIR", "value": datadir_json(hpp)? },
                { "name": "VERSION", "value": cfg.version },
                env_field("POD_IP", "status.podIP"),
                env_field("POD_NAMESPACE", "metadata.namespace"),
                { "name": "SERVICE_NAME", "value": names::METRICS_SERVICE },
            ],
            "ports": [
                { "name": "healthz", "containerPort": 9898, "protocol": "TCP" },
                { "name": "metrics", "containerPort": 8443, "protocol": "TCP" },
            ],
            // The driver's own /livez, not the livenessprobe sidecar on 9898: the sidecar fails
            // on Probe `ready: false`, which the driver answers while a guarded pool waits for
            // its mount, and a restart loop would not bring the mount any sooner.
            "livenessProbe": {
                "httpGet": { "path": "/livez", "port": "metrics", "scheme": "HTTPS" },
                "failureThreshold": 5, "initialDelaySeconds": 10, "timeoutSeconds": 3, "periodSeconds": 2,
            },
            "securityContext": privileged,
            "resources": requests(),
            "volumeMounts": driver_mounts,
        }),
        json!({
            "name": "node-driver-registrar",
            "image": img.node_driver_registrar,
            "imagePullPolicy": pull,
            "args": [
                format!("--v={v}"),
                format!("--csi-address={CSI_SOCKET}"),
                "--kubelet-registration-path=/var/lib/kubelet/plugins/csi-hostpath/csi.sock",
            ],
            "env": [env_field("KUBE_NODE_NAME", "spec.nodeName")],
            "securityContext": privileged,
            "resources": requests(),
            "volumeMounts": registrar_mounts,
        }),
        json!({
            "name": "liveness-probe",
            "image": img.liveness_probe,
            "imagePullPolicy": pull,
            "args": [format!("--csi-address={CSI_SOCKET}"), "--health-port=9898"],
            "securityContext": privileged,
            "resources": requests(),
            "volumeMounts": [{ "name": "socket-dir", "mountPath": "/csi" }],
        }),
        json!({
            "name": "csi-provisioner",
            "image": img.csi_provisioner,
            "imagePullPolicy": pull,
            "args": [
                format!("--v={v}"),
                format!("--csi-address={CSI_SOCKET}"),
                "--feature-gates=Topology=true",
                "--enable-capacity=true",
                "--capacity-for-immediate-binding=true",
                "--extra-create-metadata=true",
                "--immediate-topology=false",
                "--strict-topology=true",
                "--node-deployment=true",
                "--default-fstype=xfs",
                // Clones and restores copy data: far longer than the 10 s default.
                "--timeout=5m",
            ],
            "env": [
                env_field("NODE_NAME", "spec.nodeName"),
                env_field("NAMESPACE", "metadata.namespace"),
                env_field("POD_NAME", "metadata.name"),
            ],
            "securityContext": privileged,
            "resources": requests(),
            "volumeMounts": [{ "name": "socket-dir", "mountPath": "/csi" }],
        }),
    ];
    if common::snapshotting(hpp) {
        containers.push(json!({
            "name": "csi-snapshotter",
            "image": img.csi_snapshotter,
            "imagePullPolicy": pull,
            "args": [format!("--v={v}"), format!("--csi-address={CSI_SOCKET}"), "--leader-election", "--timeout=5m"],
            "securityContext": privileged,
            "volumeMounts": [{ "name": "socket-dir", "mountPath": "/csi" }],
        }));
    }
    let host = |name: &str, path: &str, ty: &str| json!({ "name": name, "hostPath": { "path": path, "type": ty } });
    let mut volumes = vec![
        host(
            "socket-dir",
            "/var/lib/kubelet/plugins/csi-hostpath",
            "DirectoryOrCreate",
        ),
        host("mountpoint-dir", "/var/lib/kubelet/pods", "DirectoryOrCreate"),
        host("registration-dir", "/var/lib/kubelet/plugins_registry", "Directory"),
        host("plugins-dir", "/var/lib/kubelet/plugins", "Directory"),
    ];
    volumes.extend(
        mounts
            .iter()
            .map(|m| host(&m.mount_name, &m.host_path, "DirectoryOrCreate")),
    );
    let mut pod_spec = json!({
        "serviceAccountName": names::CSI_SERVICE_ACCOUNT,
        "containers": containers,
        "volumes": volumes,
    });
    if let Value::Object(spec) = &mut pod_spec {
        spec.extend(common::placement(hpp));
    }
    let extra = [(c::LABEL_PROMETHEUS, "true")];
    let obj = json!({
        "metadata": common::meta(names::CSI_DAEMONSET, Some(&cfg.namespace), cfg, &extra, Some(hpp)),
        "spec": {
            "selector": { "matchLabels": { c::LABEL_APP: c::LABEL_APP_VALUE } },
            "updateStrategy": { "type": "RollingUpdate", "rollingUpdate": { "maxUnavailable": "10%", "maxSurge": 0 } },
            "revisionHistoryLimit": 10,
            "template": {
                "metadata": {
                    "labels": common::labels_value(cfg, &extra),
                    "annotations": { "openshift.io/required-scc": names::CSI_SCC },
                },
                "spec": pod_spec,
            },
        },
    });
    common::ssa(daemonset_kind(), obj)
}

/// Whether a live DaemonSet is ready the way KubeVirt judges it.
pub fn daemonset_ready(live: &DynamicObject) -> (bool, String) {
    let status = live.data.get("status");
    let n = |k: &str| status.and_then(|s| s.get(k)).and_then(Value::as_i64).unwrap_or(0);
    let (ready, desired) = (n("numberReady"), n("desiredNumberScheduled"));
    let name = live.metadata.name.as_deref().unwrap_or_default();
    (
        ready > 0 && ready >= desired,
        format!("DaemonSet {name} has {ready} of {desired} pods ready"),
    )
}

/// Sub-reconciler for the CSI DaemonSet.
pub struct CsiDaemonSet;

#[async_trait]
impl SubReconciler for CsiDaemonSet {
    fn name(&self) -> &str {
        "csi-daemonset"
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        vec![daemonset_kind()]
    }

    fn desired(&self, hpp: &HostPathProvisioner, cfg: &OperatorConfig, _: &ClusterFacts) -> Result<Vec<DesiredObject>> {
        Ok(vec![desired_csi_daemonset(hpp, cfg)?])
    }

    fn readiness(&self, _hpp: &HostPathProvisioner, live: &[DynamicObject]) -> Readiness {
        let mut r = Readiness::ready();
        for ds in live {
            let (ok, msg) = daemonset_ready(ds);
            if !ok {
                r.workloads_not_ready.push(msg);
            }
        }
        r
    }
}
