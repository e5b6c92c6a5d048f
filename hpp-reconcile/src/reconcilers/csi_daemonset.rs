//! The CSI DaemonSet `hostpath-provisioner-csi`: driver, registrar, liveness probe, external
//! provisioner, resizer and (with `Snapshotting` and a pool with a `snapshotProvider`)
//! snapshotter, with one host mount per storage pool.

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use hpp_api::constants as c;
use hpp_api::quota::QuotaMode;
use kube::Resource;
use kube::api::DynamicObject;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, HTTPGetAction, PodSpec, PodTemplateSpec, Probe, SELinuxOptions,
    SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;

use super::common::{self, daemonset_kind};
use crate::config::OperatorConfig;
use crate::error::{Error, Result};
use crate::facts::ClusterFacts;
use crate::names;
use crate::object::{DesiredObject, Kind};
use crate::permissions::{Permission, WRITE};
use crate::subreconciler::{ObjectWarning, Readiness, SubReconciler};

/// Event reason when the `Snapshotting` gate is on but no pool has a snapshot provider.
pub const REASON_SNAPSHOTS_DISABLED: &str = "SnapshotsDisabled";

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
    /// `false` when the CR refuses inline ephemeral volumes in this pool (`ephemeral.allowed`);
    /// omitted when they are allowed, the driver's default.
    #[serde(skip_serializing_if = "is_true")]
    pub ephemeral: bool,
    /// The CR's `ephemeral.maxSize` in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ephemeral_max_bytes: Option<u64>,
    /// The CR's `quota`; omitted for `none` (the default), so plain pools render as in KubeVirt.
    #[serde(skip_serializing_if = "QuotaMode::is_none")]
    pub quota: QuotaMode,
    /// The CR's `overcommitPercent`, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overcommit_percent: Option<u32>,
    /// The CR's `trash.retention` as written (trimmed); absent without one, so a pool without
    /// a trash renders as before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trash_retention: Option<String>,
    /// The CR's `trash.minFreePercent`, only when the CR gives it (the driver has the default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trash_min_free_percent: Option<u32>,
}

fn is_true(b: &bool) -> bool {
    *b
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

/// The pools the CSI driver serves, in spec order. An `ephemeral.maxSize` that is not a
/// quantity (the webhook refuses it; it can only arrive with the webhook off) is an error rather
/// than a pool without its cap.
pub fn pool_mounts(hpp: &HostPathProvisioner) -> Result<Vec<PoolMount>> {
    if let Some(pc) = &hpp.spec.path_config {
        let mount_name = names::LEGACY_DATA_DIR.to_owned();
        return Ok(vec![PoolMount {
            host_path: pc.path.clone(),
            entry: DataDirEntry {
                name: c::DEFAULT_POOL_NAME.into(),
                path: format!("{mount_name}/csi"),
                snapshot_path: None,
                snapshot_provider: None,
                shared: false,
                require_mount_point: false,
                ephemeral: true,
                ephemeral_max_bytes: None,
                quota: QuotaMode::None,
                overcommit_percent: None,
                trash_retention: None,
                trash_min_free_percent: None,
            },
            mount_name,
        }]);
    }
    hpp.spec
        .storage_pools
        .iter()
        .flatten()
        .map(|p| {
            let mount_name = mount_name(&p.name);
            let ephemeral = p.ephemeral.clone().unwrap_or_default();
            let ephemeral_max_bytes = match &ephemeral.max_size {
                None => None,
                Some(q) => Some(ephemeral.max_bytes().ok_or_else(|| {
                    Error::InvalidSpec(format!(
                        "storage pool {}: ephemeral.maxSize {q:?} is not a storage quantity such as 10Gi",
                        p.name
                    ))
                })?),
            };
            let (trash_retention, trash_min_free_percent) = trash_settings(p)?;
            Ok(PoolMount {
                host_path: p.path.clone(),
                entry: DataDirEntry {
                    name: p.name.clone(),
                    path: format!("{mount_name}/csi"),
                    snapshot_path: p.takes_snapshots().then(|| format!("{mount_name}/csi/snapshots")),
                    snapshot_provider: p.snapshot_provider.clone(),
                    shared: p.is_shared(),
                    require_mount_point: p.pvc_template.is_some(),
                    ephemeral: ephemeral.is_allowed(),
                    ephemeral_max_bytes,
                    quota: p.quota.unwrap_or_default(),
                    overcommit_percent: p.overcommit_percent,
                    trash_retention,
                    trash_min_free_percent,
                },
                mount_name,
            })
        })
        .collect()
}

/// A pool's `trash` as `--datadir` carries it: the retention trimmed, the percentage as given.
/// Values the webhook refuses (they can only arrive with the webhook off) are an error rather
/// than a driver that refuses its `--datadir` at start.
fn trash_settings(p: &hpp_api::StoragePool) -> Result<(Option<String>, Option<u32>)> {
    let Some(trash) = &p.trash else {
        return Ok((None, None));
    };
    let retention = match &trash.retention {
        None => None,
        Some(r) => {
            hpp_api::duration::parse(r)
                .map_err(|e| Error::InvalidSpec(format!("storage pool {}: trash.retention: {e}", p.name)))?;
            Some(r.trim().to_owned())
        }
    };
    if let Some(pct) = trash.min_free_percent.filter(|pct| *pct > 99) {
        return Err(Error::InvalidSpec(format!(
            "storage pool {}: trash.minFreePercent {pct} is out of range 0 to 99",
            p.name
        )));
    }
    Ok((retention, trash.min_free_percent))
}

/// Whether the driver snapshots in some pool: only then does it advertise
/// CREATE_DELETE_SNAPSHOT, and csi-snapshotter exits at startup against a driver without it.
fn any_snapshot_path(mounts: &[PoolMount]) -> bool {
    mounts.iter().any(|m| m.entry.snapshot_path.is_some())
}

/// Whether the csi-snapshotter sidecar and its RBAC are deployed: the `Snapshotting` gate is
/// on and some pool's `--datadir` entry has a snapshot path (a `snapshotProvider`).
pub fn runs_snapshotter(hpp: &HostPathProvisioner) -> Result<bool> {
    Ok(runs_snapshotter_with(hpp, &pool_mounts(hpp)?))
}

/// [`runs_snapshotter`] for pool mounts already built.
fn runs_snapshotter_with(hpp: &HostPathProvisioner, mounts: &[PoolMount]) -> bool {
    common::snapshotting(hpp) && any_snapshot_path(mounts)
}

/// Why snapshots are off although the `Snapshotting` gate is on (no pool has a
/// `snapshotProvider`), or `None` when they are on or the gate is off.
pub fn snapshots_off_reason(hpp: &HostPathProvisioner) -> Option<String> {
    let off = common::snapshotting(hpp) && pool_mounts(hpp).is_ok_and(|m| !any_snapshot_path(&m));
    // The webhook's admission warning, so the user reads the same words in both places.
    off.then(|| hpp_api::validation::WARNING_SNAPSHOTS_OFF.to_owned())
}

/// The `--datadir` / `PV_DIR` JSON.
pub fn datadir_json(hpp: &HostPathProvisioner) -> Result<String> {
    let entries: Vec<DataDirEntry> = pool_mounts(hpp)?.into_iter().map(|m| m.entry).collect();
    serde_json::to_string(&entries).map_err(|source| Error::Serialize {
        what: "datadir".into(),
        source,
    })
}

fn mount(name: &str, path: &str, propagation: Option<&str>) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        mount_propagation: propagation.map(str::to_owned),
        ..Default::default()
    }
}

fn socket_mount() -> VolumeMount {
    mount("socket-dir", "/csi", None)
}

fn privileged() -> Option<SecurityContext> {
    Some(SecurityContext {
        privileged: Some(true),
        ..Default::default()
    })
}

fn port(name: &str, number: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_owned()),
        container_port: number,
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

/// A sidecar or driver container: image, pull policy, args, privileged, the given mounts.
fn container(name: &str, image: &str, pull: &str, args: Vec<String>, mounts: Vec<VolumeMount>) -> Container {
    Container {
        name: name.to_owned(),
        image: Some(image.to_owned()),
        image_pull_policy: Some(pull.to_owned()),
        args: Some(args),
        security_context: privileged(),
        resources: Some(common::requests("10m", "150Mi")),
        volume_mounts: Some(mounts),
        ..Default::default()
    }
}

/// SELinux type of the unprivileged CSI sidecars (see docs/user-guide.md, "SELinux").
pub const SIDECAR_SELINUX_TYPE: &str = "spc_t";

/// Security context of the sidecars that only use the CSI socket: no privilege, no capability.
/// `spc_t` lets them connect to the socket the privileged driver (itself `spc_t`) creates in a
/// hostPath directory on SELinux hosts; ignored elsewhere.
fn sidecar_security_context() -> Option<SecurityContext> {
    Some(SecurityContext {
        privileged: Some(false),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            ..Default::default()
        }),
        se_linux_options: Some(SELinuxOptions {
            type_: Some(SIDECAR_SELINUX_TYPE.to_owned()),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The file the driver reads the volume report's bearer token from (`spec.volumeAudit`): the
/// token key of the mounted Secret. Kubelet refreshes the file when the Secret changes, and the
/// driver reads it per request, so a new token takes effect without a restart.
pub fn volume_report_token_path() -> String {
    format!("{}/{}", names::VOLUME_REPORT_MOUNT_DIR, names::VOLUME_REPORT_TOKEN_KEY)
}

/// The desired CSI DaemonSet. With `spec.volumeAudit` the driver container also gets
/// `--volume-report-token-file` and the token Secret mounted read-only, appended after
/// everything else so a CR without the audit renders exactly as before.
pub fn desired_csi_daemonset(hpp: &HostPathProvisioner, cfg: &OperatorConfig) -> Result<DesiredObject> {
    let pull = common::pull_policy(hpp);
    let img = &cfg.images;
    let v = cfg.verbosity;
    let mounts = pool_mounts(hpp)?;
    let pool_volume_mounts: Vec<VolumeMount> = mounts
        .iter()
        .map(|m| mount(&m.mount_name, &format!("/{}", m.mount_name), Some("HostToContainer")))
        .collect();
    let mut driver_mounts = vec![
        mount("plugins-dir", "/var/lib/kubelet/plugins", Some("Bidirectional")),
        mount("mountpoint-dir", "/var/lib/kubelet/pods", Some("Bidirectional")),
        socket_mount(),
    ];
    driver_mounts.extend(pool_volume_mounts.iter().cloned());
    let audit = hpp.spec.volume_audit.is_some();
    if audit {
        driver_mounts.push(VolumeMount {
            read_only: Some(true),
            ..mount(names::VOLUME_REPORT_VOLUME, names::VOLUME_REPORT_MOUNT_DIR, None)
        });
    }
    let mut registrar_mounts = vec![socket_mount(), mount("registration-dir", "/registration", None)];
    registrar_mounts.extend(pool_volume_mounts.iter().cloned());
    let mut driver_args = vec![
        format!("--drivername={}", c::DRIVER_NAME),
        format!("--v={v}"),
        "--endpoint=$(CSI_ENDPOINT)".into(),
        "--nodeid=$(NODE_NAME)".into(),
        "--version=$(VERSION)".into(),
        "--datadir=$(PV_DIR)".into(),
        // Volumes are node-local: kubelet expands them on their node (see the resizer).
        "--expansion=node".into(),
        format!("--metrics-tls-version={}", cfg.metrics_tls_version),
    ];
    if audit {
        driver_args.push(format!("--volume-report-token-file={}", volume_report_token_path()));
    }
    let driver = Container {
        env: Some(vec![
            common::env_value("CSI_ENDPOINT", &format!("unix://{CSI_SOCKET}")),
            common::env_from_field("NODE_NAME", "spec.nodeName"),
            common::env_value("PV_DIR", &datadir_json(hpp)?),
            common::env_value("VERSION", &cfg.version),
            common::env_from_field("POD_IP", "status.podIP"),
            common::env_from_field("POD_NAMESPACE", "metadata.namespace"),
            common::env_value("SERVICE_NAME", names::METRICS_SERVICE),
        ]),
        ports: Some(vec![port("healthz", 9898), port("metrics", 8443)]),
        // The driver's own /livez, not the livenessprobe sidecar on 9898: the sidecar fails
        // on Probe `ready: false` (older drivers answered it while a guarded pool waited for
        // its mount), and a restart loop would not bring the mount any sooner.
        liveness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/livez".into()),
                port: IntOrString::String("metrics".into()),
                scheme: Some("HTTPS".into()),
                ..Default::default()
            }),
            failure_threshold: Some(5),
            initial_delay_seconds: Some(10),
            timeout_seconds: Some(3),
            period_seconds: Some(2),
            ..Default::default()
        }),
        ..container(
            "hostpath-provisioner",
            &img.csi_driver,
            &pull,
            driver_args,
            driver_mounts,
        )
    };
    let registrar = Container {
        env: Some(vec![common::env_from_field("KUBE_NODE_NAME", "spec.nodeName")]),
        ..container(
            "node-driver-registrar",
            &img.node_driver_registrar,
            &pull,
            vec![
                format!("--v={v}"),
                format!("--csi-address={CSI_SOCKET}"),
                "--kubelet-registration-path=/var/lib/kubelet/plugins/csi-hostpath/csi.sock".into(),
            ],
            registrar_mounts,
        )
    };
    let liveness = Container {
        security_context: sidecar_security_context(),
        ..container(
            "liveness-probe",
            &img.liveness_probe,
            &pull,
            vec![format!("--csi-address={CSI_SOCKET}"), "--health-port=9898".into()],
            vec![socket_mount()],
        )
    };
    let provisioner = Container {
        env: Some(vec![
            common::env_from_field("NODE_NAME", "spec.nodeName"),
            common::env_from_field("NAMESPACE", "metadata.namespace"),
            common::env_from_field("POD_NAME", "metadata.name"),
        ]),
        security_context: sidecar_security_context(),
        ..container(
            "csi-provisioner",
            &img.csi_provisioner,
            &pull,
            vec![
                format!("--v={v}"),
                format!("--csi-address={CSI_SOCKET}"),
                "--feature-gates=Topology=true".into(),
                "--enable-capacity=true".into(),
                "--capacity-for-immediate-binding=true".into(),
                "--extra-create-metadata=true".into(),
                "--immediate-topology=false".into(),
                "--strict-topology=true".into(),
                "--node-deployment=true".into(),
                "--default-fstype=xfs".into(),
                // Clones and restores copy data: far longer than the 10 s default.
                "--timeout=5m".into(),
            ],
            vec![socket_mount()],
        )
    };
    // The driver runs with --expansion=node, so it offers no controller expansion: the resizer
    // only records the new size on the PV, and kubelet calls NodeExpandVolume on the node that
    // holds the volume. One resizer in the cluster is enough (leader election).
    let resizer = Container {
        security_context: sidecar_security_context(),
        ..container(
            "csi-resizer",
            &img.csi_resizer,
            &pull,
            vec![
                format!("--v={v}"),
                format!("--csi-address={CSI_SOCKET}"),
                "--leader-election".into(),
                // Raising a limit is one ioctl or xattr; a minute covers a loaded node.
                "--timeout=1m".into(),
                // Expansion is online: a published volume is never an error.
                "--handle-volume-inuse-error=false".into(),
            ],
            vec![socket_mount()],
        )
    };
    let mut containers = vec![driver, registrar, liveness, provisioner, resizer];
    if runs_snapshotter_with(hpp, &mounts) {
        containers.push(Container {
            resources: None,
            security_context: sidecar_security_context(),
            ..container(
                "csi-snapshotter",
                &img.csi_snapshotter,
                &pull,
                vec![
                    format!("--v={v}"),
                    format!("--csi-address={CSI_SOCKET}"),
                    "--leader-election".into(),
                    "--timeout=5m".into(),
                ],
                vec![socket_mount()],
            )
        });
    }
    let mut volumes = vec![
        common::host_path_volume(
            "socket-dir",
            "/var/lib/kubelet/plugins/csi-hostpath",
            "DirectoryOrCreate",
        ),
        common::host_path_volume("mountpoint-dir", "/var/lib/kubelet/pods", "DirectoryOrCreate"),
        common::host_path_volume("registration-dir", "/var/lib/kubelet/plugins_registry", "Directory"),
        common::host_path_volume("plugins-dir", "/var/lib/kubelet/plugins", "Directory"),
    ];
    volumes.extend(
        mounts
            .iter()
            .map(|m| common::host_path_volume(&m.mount_name, &m.host_path, "DirectoryOrCreate")),
    );
    if audit {
        volumes.push(Volume {
            name: names::VOLUME_REPORT_VOLUME.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(names::VOLUME_REPORT_SECRET.into()),
                default_mode: Some(0o400),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let pod_spec = PodSpec {
        service_account_name: Some(names::CSI_SERVICE_ACCOUNT.into()),
        containers,
        volumes: Some(volumes),
        ..Default::default()
    };
    let extra = [(c::LABEL_PROMETHEUS, "true")];
    common::typed_ssa(&DaemonSet {
        metadata: common::object_meta(names::CSI_DAEMONSET, Some(&cfg.namespace), cfg, &extra, Some(hpp)),
        spec: Some(DaemonSetSpec {
            selector: common::app_selector(),
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDaemonSet {
                    max_unavailable: Some(IntOrString::String("10%".into())),
                    max_surge: Some(IntOrString::Int(0)),
                }),
            }),
            revision_history_limit: Some(10),
            template: PodTemplateSpec {
                metadata: Some(common::template_meta(cfg, &extra)),
                spec: Some(common::placed(hpp, pod_spec)),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// Sub-reconciler for the CSI DaemonSet.
pub struct CsiDaemonSet;

#[async_trait]
impl SubReconciler for CsiDaemonSet {
    fn name(&self) -> &str {
        crate::names::STEP_CSI_DAEMONSET
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        vec![daemonset_kind()]
    }

    fn permissions(&self, _facts: &ClusterFacts) -> Vec<Permission> {
        vec![
            Permission::on(&daemonset_kind(), &WRITE)
                .named([names::CSI_DAEMONSET])
                .because("csi-daemonset: the CSI driver's DaemonSet."),
        ]
    }

    fn desired(&self, hpp: &HostPathProvisioner, cfg: &OperatorConfig, _: &ClusterFacts) -> Result<Vec<DesiredObject>> {
        Ok(vec![desired_csi_daemonset(hpp, cfg)?])
    }

    /// The rollout, and a warning on the CR when the `Snapshotting` gate is on but no pool
    /// has a snapshot provider.
    fn readiness(&self, hpp: &HostPathProvisioner, _facts: &ClusterFacts, live: &[DynamicObject]) -> Readiness {
        let mut r = super::rollout::daemonsets_readiness(live);
        r.warnings
            .extend(snapshots_off_reason(hpp).map(|message| ObjectWarning {
                regarding: hpp.object_ref(&()),
                reason: REASON_SNAPSHOTS_DISABLED.into(),
                message,
            }));
        r
    }
}
