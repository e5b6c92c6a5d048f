//! Command line and start-up of `hpp-provisioner`, the non-CSI hostPath provisioner that stands
//! in for the KubeVirt legacy, single-node and shared-filesystem provisioners.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use hpp_legacy::config::DEFAULT_LEASE_NAME;
use hpp_legacy::controller::{LeaseSettings, run, run_with_leader_election};
use hpp_legacy::metrics::Metrics;
use hpp_legacy::provisioner::Provisioner;
use hpp_legacy::{Mode, ProvisionerConfig, ReclaimOverride};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::admin;
use crate::telemetry::{self, LogFormat};

pub mod go_flags;

/// Provisioner name of the torchbox shared-filesystem provisioner.
pub const TORCHBOX_NAME: &str = "torchbox.com/hostpath";
/// Provisioner name of the single-node (incubator demo) provisioner.
pub const SINGLE_NODE_NAME: &str = "hostpath";

/// Which classic provisioner to replace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// `kubevirt.io/hostpath-provisioner`: DaemonSet, one instance per node.
    Kubevirt,
    /// Single-node / DIY clusters.
    SingleNode,
    /// Shared network filesystem, one leader-elected instance.
    Shared,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Kubevirt => Mode::Kubevirt,
            ModeArg::SingleNode => Mode::SingleNode,
            ModeArg::Shared => Mode::Shared,
        }
    }
}

/// Reclaim policy override.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReclaimArg {
    /// Keep directories.
    #[value(name = "Retain", alias = "retain")]
    Retain,
    /// Remove directories.
    #[value(name = "Delete", alias = "delete")]
    Delete,
}

/// KubeVirt's provisioner turned `USE_NAMING_PREFIX` on for `true` in any case, off otherwise.
fn loose_bool(s: &str) -> Result<bool, std::convert::Infallible> {
    Ok(s.eq_ignore_ascii_case("true"))
}

/// Flags; each is also read from the environment variable shown in `--help`.
#[derive(Debug, Parser)]
#[command(
    name = "hpp-provisioner",
    version,
    about = "The non-CSI hostPath provisioner: KubeVirt legacy, single-node and shared-filesystem modes"
)]
pub struct Args {
    /// Which classic provisioner this instance replaces [default: from the provisioner name:
    /// `torchbox.com/hostpath` shared, `hostpath` single-node, else kubevirt].
    #[arg(long, env = "HPP_MODE", value_enum)]
    pub mode: Option<ModeArg>,
    /// Provisioner name (StorageClass `provisioner`); defaults per mode.
    #[arg(long, env = "PROVISIONER_NAME")]
    pub provisioner_name: Option<String>,
    /// Node this instance runs on (downward API `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Base directory of node-local volumes.
    #[arg(long, env = "PV_DIR")]
    pub pv_dir: Option<PathBuf>,
    /// Name directories `<claim>-<pv>` (KubeVirt mode).
    #[arg(long, env = "USE_NAMING_PREFIX", default_value = "false", value_parser = loose_bool, action = clap::ArgAction::Set)]
    pub use_naming_prefix: bool,
    /// Force this reclaim policy on new PVs instead of the StorageClass's.
    #[arg(long, env = "PV_RECLAIM_POLICY", value_enum)]
    pub reclaim_policy: Option<ReclaimArg>,
    /// Quota backend for volumes under --pv-dir (node-local modes), limiting each to its
    /// claim's request. One of: `none`, `btrfs`, `xfs-project`, `ext4-project`, `auto`.
    #[arg(long, env = "PV_QUOTA", default_value = "none", value_parser = parse_quota)]
    pub quota: hpp_api::quota::QuotaMode,
    /// Keep released volumes in `<base>/.hpp-trash` this long before removing them (a duration:
    /// 72h, 7d, 1h30m; 0 or absent: remove at once, as the classic provisioners do). A class's
    /// archiveOnDelete still archives instead.
    #[arg(long = "trash-retention", env = "TRASH_RETENTION", value_parser = parse_retention)]
    pub trash_retention: Option<std::time::Duration>,
    /// Free space (percent) under which the trash is purged early, oldest first.
    #[arg(long = "trash-min-free-percent", env = "TRASH_MIN_FREE_PERCENT", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(0..=99))]
    pub trash_min_free_percent: u32,
    /// Value of the `hostPathProvisionerIdentity` annotation; defaults as the original did.
    #[arg(long, env = "PROVISIONER_IDENTITY")]
    pub identity: Option<String>,
    /// Further identities whose PVs this instance may delete (PVs of the original provisioner).
    #[arg(long, env = "ACCEPTED_IDENTITIES", value_delimiter = ',')]
    pub accept_identity: Vec<String>,
    /// Kubeconfig file for running outside the cluster; in-cluster config otherwise.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// API server URL, overriding the kubeconfig's (torchbox's `-master`).
    #[arg(long)]
    pub master: Option<String>,
    /// glog/klog flags of the replaced Go provisioners (`-v`, `-logtostderr`, …): accepted so
    /// their manifests keep working, and ignored (use `RUST_LOG`).
    #[arg(long = "v", hide = true)]
    pub glog_v: Option<String>,
    #[allow(missing_docs)]
    #[arg(long = "logtostderr", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub glog_logtostderr: Option<String>,
    #[allow(missing_docs)]
    #[arg(long = "alsologtostderr", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub glog_alsologtostderr: Option<String>,
    #[allow(missing_docs)]
    #[arg(long = "stderrthreshold", hide = true)]
    pub glog_stderrthreshold: Option<String>,
    #[allow(missing_docs)]
    #[arg(long = "log_dir", hide = true)]
    pub glog_log_dir: Option<String>,
    #[allow(missing_docs)]
    #[arg(long = "vmodule", hide = true)]
    pub glog_vmodule: Option<String>,
    /// Print the resolved configuration and exit, without contacting the cluster.
    #[arg(long, hide = true)]
    pub print_config: bool,
    /// Address of the `/metrics` and `/healthz` server.
    #[arg(long, env = "METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    pub metrics_address: SocketAddr,
    /// Log line format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Run only while holding a Lease; defaults to on in shared mode, off otherwise.
    #[arg(long, env = "LEADER_ELECT")]
    pub leader_elect: Option<bool>,
    /// Name of the leader Lease.
    #[arg(long, env = "LEASE_NAME", default_value = DEFAULT_LEASE_NAME)]
    pub lease_name: String,
    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// Name of this instance in Events and the Lease (pod name; host name if unset).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
}

impl Args {
    /// Parses `argv`, accepting the Go flag spellings of the replaced provisioners.
    pub fn parse_compat(argv: impl IntoIterator<Item = std::ffi::OsString>) -> Result<Self, clap::Error> {
        Self::try_parse_from(go_flags::normalize(argv))
    }

    /// The mode: `--mode`, else the one the provisioner name implies.
    pub fn effective_mode(&self) -> ModeArg {
        self.mode.unwrap_or(match self.provisioner_name.as_deref() {
            Some(TORCHBOX_NAME) => ModeArg::Shared,
            Some(SINGLE_NODE_NAME) => ModeArg::SingleNode,
            _ => ModeArg::Kubevirt,
        })
    }

    /// The library configuration these flags describe (with `--quota`, the backend is
    /// prepared on `--pv-dir`).
    pub fn config(&self) -> anyhow::Result<ProvisionerConfig> {
        let mode = Mode::from(self.effective_mode());
        let mut cfg = ProvisionerConfig::new(mode, self.node_name.clone(), self.pv_dir.clone());
        if let Some(name) = &self.provisioner_name {
            if cfg.identity == cfg.provisioner_name {
                cfg.identity = name.clone();
            }
            cfg.provisioner_name = name.clone();
        }
        if let Some(identity) = &self.identity {
            cfg.identity = identity.clone();
        }
        cfg.use_naming_prefix = self.use_naming_prefix;
        cfg.trash = self
            .trash_retention
            .filter(|r| !r.is_zero())
            .map(|retention| hpp_fs::trash::Settings {
                retention,
                min_free_percent: self.trash_min_free_percent,
            });
        cfg.reclaim_override = self.reclaim_policy.map(|r| match r {
            ReclaimArg::Retain => ReclaimOverride::Retain,
            ReclaimArg::Delete => ReclaimOverride::Delete,
        });
        cfg.accepted_identities = self.accept_identity.iter().filter(|s| !s.is_empty()).cloned().collect();
        if self.quota != hpp_api::quota::QuotaMode::None {
            let dir = match (&self.pv_dir, mode) {
                (_, Mode::Shared) => {
                    anyhow::bail!("--quota works only for node-local --pv-dir volumes, not in shared mode")
                }
                (None, _) => anyhow::bail!("--quota needs --pv-dir"),
                (Some(dir), _) => dir,
            };
            cfg.quota = Some(hpp_csi::build_quota_backend("pv-dir", self.quota, dir)?);
        }
        cfg.validate()?;
        Ok(cfg)
    }

    fn instance(&self) -> String {
        self.pod_name
            .clone()
            .or_else(|| self.node_name.clone())
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|s| s.trim().to_owned())
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| format!("hpp-provisioner-{}", std::process::id()))
    }
}

async fn client(kubeconfig: Option<&PathBuf>, master: Option<&str>) -> anyhow::Result<Client> {
    let mut config = match kubeconfig {
        None => kube::Config::infer()
            .await
            .context("in-cluster Kubernetes configuration")?,
        Some(path) => {
            let kc = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?
        }
    };
    if let Some(url) = master.filter(|m| !m.is_empty()) {
        config.cluster_url = url.parse().with_context(|| format!("invalid --master URL {url:?}"))?;
    }
    Ok(Client::try_from(config)?)
}

/// Parses flags and runs until SIGTERM/SIGINT.
pub async fn main_with(args: Args) -> anyhow::Result<()> {
    let _telemetry = telemetry::init("hpp-provisioner", args.log_format)?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cfg = args.config()?;
    if args.print_config {
        println!(
            "mode={} name={} identity={} node={} pv_dir={} naming_prefix={} kubeconfig={} master={}",
            cfg.mode.as_str(),
            cfg.provisioner_name,
            cfg.identity,
            cfg.node_name.as_deref().unwrap_or("-"),
            cfg.pv_dir
                .as_ref()
                .map_or_else(|| "-".into(), |p| p.display().to_string()),
            cfg.use_naming_prefix,
            args.kubeconfig
                .as_ref()
                .map_or_else(|| "-".into(), |p| p.display().to_string()),
            args.master.as_deref().unwrap_or("-"),
        );
        return Ok(());
    }
    if cfg.mode.is_node_local()
        && let Some(dir) = &cfg.pv_dir
    {
        // Node-local base directories may be created; a shared one never is (it is the mount).
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let client = client(args.kubeconfig.as_ref(), args.master.as_deref()).await?;
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    let instance = args.instance();
    tracing::info!(mode = cfg.mode.as_str(), name = %cfg.provisioner_name, %instance, "starting");
    let leader_elect = args.leader_elect.unwrap_or(cfg.mode == Mode::Shared);
    let prov = Arc::new(Provisioner::new(client, cfg, metrics, Some(instance.clone())));

    let (stop_tx, stop_rx) = watch::channel(false);
    let stop = move |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let router = admin::metrics_router(Arc::new(registry)).route("/healthz", axum::routing::get(|| async { "ok" }));
    // KubeVirt's default 0.0.0.0:8080 may be taken (hostNetwork, a second instance): logged and
    // retried, never fatal to provisioning.
    let server_stop = stop(stop_rx.clone());
    admin::bind_or_retry(args.metrics_address, "metrics", move |listener| async move {
        if let Err(e) = admin::serve(listener, router, server_stop).await {
            tracing::error!(error = %e, "metrics server failed");
        }
    })
    .await;
    tokio::spawn(async move {
        admin::shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    if leader_elect {
        let lease = LeaseSettings::new(args.lease_name.clone(), args.lease_namespace.clone(), instance);
        run_with_leader_election(prov, lease, stop(stop_rx)).await?;
    } else {
        run(prov, stop(stop_rx)).await;
    }
    Ok(())
}

/// Parses `--trash-retention` with the one duration syntax of every hpp setting.
fn parse_retention(v: &str) -> Result<std::time::Duration, String> {
    hpp_api::duration::parse(v).map_err(|e| e.to_string())
}

/// Parses `--quota`: the pool quota modes a hostPath PV can use (not `image`, which needs a
/// loop mount at publish that only the CSI driver does).
fn parse_quota(v: &str) -> Result<hpp_api::quota::QuotaMode, String> {
    use hpp_api::quota::QuotaMode;
    match QuotaMode::ALL.into_iter().find(|m| m.as_str() == v) {
        Some(QuotaMode::Image) => Err("image volumes need the CSI driver (a loop mount at publish)".into()),
        Some(m) => Ok(m),
        None => Err(format!(
            "expected one of none, btrfs, xfs-project, ext4-project, auto; got {v:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Args {
        let mut v = vec!["hpp-provisioner"];
        v.extend_from_slice(args);
        Args::try_parse_from(v).unwrap()
    }

    #[tokio::test]
    async fn out_of_cluster_client_from_kubeconfig() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:6443\n\
             contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n    namespace: storage\nusers:\n- name: u\n  user:\n    token: t\n",
        )
        .unwrap();
        let built = client(Some(&path), None).await.unwrap();
        assert_eq!(built.default_namespace(), "storage");
        assert!(client(Some(&dir.path().join("missing")), None).await.is_err());
        assert!(client(Some(&path), Some("https://10.0.0.1:6443")).await.is_ok());
        assert!(client(Some(&path), Some("not a url")).await.is_err());
    }

    #[test]
    fn kubevirt_flags() {
        let a = parse(&[
            "--node-name",
            "n1",
            "--pv-dir",
            "/var/hpvolumes",
            "--use-naming-prefix",
            "TRUE",
        ]);
        let cfg = a.config().unwrap();
        assert_eq!(cfg.mode, Mode::Kubevirt);
        assert!(cfg.use_naming_prefix);
        assert_eq!(cfg.provisioner_name, hpp_api::constants::LEGACY_PROVISIONER_NAME);
        let a = parse(&[
            "--node-name",
            "n1",
            "--pv-dir",
            "/var/hpvolumes",
            "--use-naming-prefix",
            "yes",
        ]);
        assert!(!a.config().unwrap().use_naming_prefix);
        assert!(parse(&["--pv-dir", "/var/hpvolumes"]).config().is_err());
    }

    #[test]
    fn quota_flag_is_checked_and_builds_the_backend() {
        assert!(Args::try_parse_from(["hpp-provisioner", "--quota", "image"]).is_err());
        assert!(Args::try_parse_from(["hpp-provisioner", "--quota", "zfs"]).is_err());
        let shared = parse(&["--mode", "shared", "--quota", "btrfs"]);
        assert!(shared.config().unwrap_err().to_string().contains("shared"));
        let no_dir = parse(&["--mode", "single-node", "--quota", "btrfs"]);
        assert!(no_dir.config().unwrap_err().to_string().contains("--pv-dir"));
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_str().unwrap();
        let not_btrfs = parse(&["--mode", "single-node", "--pv-dir", dir, "--quota", "btrfs"]);
        if !matches!(std::fs::File::open(tmp.path()).map(|f| hpp_sys_is_btrfs(&f)), Ok(true)) {
            assert!(not_btrfs.config().unwrap_err().to_string().contains("btrfs"));
        }
        let auto = parse(&["--mode", "single-node", "--pv-dir", dir, "--quota", "auto"]);
        assert!(auto.config().unwrap().quota.is_some());
        assert!(
            parse(&["--mode", "single-node", "--pv-dir", dir])
                .config()
                .unwrap()
                .quota
                .is_none()
        );
    }

    #[allow(clippy::unnecessary_cast)] // f_type is i64 here, another width elsewhere
    fn hpp_sys_is_btrfs(f: &std::fs::File) -> bool {
        rustix::fs::fstatfs(f).is_ok_and(|st| st.f_type as i64 == 0x9123_683E)
    }

    #[test]
    fn shared_and_single_node_flags() {
        let a = parse(&[
            "--mode",
            "shared",
            "--provisioner-name",
            "example.com/nfs",
            "--kubeconfig",
            "/k",
        ]);
        let cfg = a.config().unwrap();
        assert_eq!(cfg.provisioner_name, "example.com/nfs");
        assert_eq!(cfg.identity, "example.com/nfs");
        assert_eq!(a.kubeconfig, Some(PathBuf::from("/k")));
        let a = parse(&[
            "--mode",
            "single-node",
            "--pv-dir",
            "/srv/pv",
            "--node-name",
            "box",
            "--reclaim-policy",
            "Retain",
            "--accept-identity",
            "a,b",
        ]);
        let cfg = a.config().unwrap();
        assert_eq!(cfg.reclaim_override, Some(ReclaimOverride::Retain));
        assert_eq!(cfg.identity, "box");
        assert_eq!(cfg.accepted_identities, vec!["a", "b"]);
        assert!(
            parse(&["--metrics-address", "127.0.0.1:0", "--mode", "shared"])
                .config()
                .is_ok()
        );
    }
}
