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
    /// Which classic provisioner this instance replaces.
    #[arg(long, env = "HPP_MODE", value_enum, default_value = "kubevirt")]
    pub mode: ModeArg,
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
    /// Value of the `hostPathProvisionerIdentity` annotation; defaults as the original did.
    #[arg(long, env = "PROVISIONER_IDENTITY")]
    pub identity: Option<String>,
    /// Further identities whose PVs this instance may delete (PVs of the original provisioner).
    #[arg(long, env = "ACCEPTED_IDENTITIES", value_delimiter = ',')]
    pub accept_identity: Vec<String>,
    /// Kubeconfig file for running outside the cluster; in-cluster config otherwise.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
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
    /// The library configuration these flags describe.
    pub fn config(&self) -> anyhow::Result<ProvisionerConfig> {
        let mode = Mode::from(self.mode);
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
        cfg.reclaim_override = self.reclaim_policy.map(|r| match r {
            ReclaimArg::Retain => ReclaimOverride::Retain,
            ReclaimArg::Delete => ReclaimOverride::Delete,
        });
        cfg.accepted_identities = self.accept_identity.iter().filter(|s| !s.is_empty()).cloned().collect();
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

async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<Client> {
    let Some(path) = kubeconfig else {
        return Client::try_default()
            .await
            .context("in-cluster Kubernetes configuration");
    };
    let kc = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// Parses flags and runs until SIGTERM/SIGINT.
pub async fn main_with(args: Args) -> anyhow::Result<()> {
    let _telemetry = telemetry::init("hpp-provisioner", args.log_format)?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cfg = args.config()?;
    if cfg.mode.is_node_local()
        && let Some(dir) = &cfg.pv_dir
    {
        // Node-local base directories may be created; a shared one never is (it is the mount).
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let client = client(args.kubeconfig.as_ref()).await?;
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
    let listener = tokio::net::TcpListener::bind(args.metrics_address)
        .await
        .with_context(|| format!("binding {}", args.metrics_address))?;
    let router = admin::metrics_router(Arc::new(registry)).route("/healthz", axum::routing::get(|| async { "ok" }));
    let server = tokio::spawn(admin::serve(listener, router, stop(stop_rx.clone())));
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
    server.await??;
    Ok(())
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
        let built = client(Some(&path)).await.unwrap();
        assert_eq!(built.default_namespace(), "storage");
        assert!(client(Some(&dir.path().join("missing"))).await.is_err());
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
