//! `hpp-csi-driver`: flags, start-up and shutdown around the `hpp-csi` library.
//!
//! Flags are KubeVirt's (`--endpoint`, `--drivername`, `--nodeid`, `--version`, `--datadir`,
//! `--metrics-*`), so the DaemonSet args carry over. `--datadir-root DIR` is the zero-config
//! mode: one pool and the socket under `DIR`, node id from the host name.
//!
//! KubeVirt's `--version=V` sets the vendor version GetPluginInfo reports; a bare `--version`,
//! `-V` and the `version` subcommand print the build instead.

mod call;
mod call_resize;
mod call_trash;
mod http;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use hpp_api::constants::DRIVER_NAME;
use hpp_csi::{Driver, DriverMetrics, Endpoint, ExpansionMode, PoolConfig, parse_pools};
use prometheus_client::registry::Registry;
use tracing::info;

use crate::telemetry::LogFormat;

pub use call::CallArgs;

/// KubeVirt's default `--datadir`.
const KUBEVIRT_DEFAULT_DATADIR: &str =
    r#"[{"name":"legacy","path":"/csi-data-dir","snapshotPath":"/snap-dir","snapshotProvider":"reflink"}]"#;
/// KubeVirt's default `--endpoint`.
const KUBEVIRT_DEFAULT_ENDPOINT: &str = "unix://tmp/csi.sock";

/// Command line of `hpp-csi-driver`.
#[derive(Debug, clap::Parser)]
#[command(
    name = "hpp-csi-driver",
    about = "hpp CSI driver: serves hostpath storage pools over the Container Storage Interface",
    disable_version_flag = true,
    args_conflicts_with_subcommands = true
)]
pub struct Args {
    /// Talk to a running driver instead of serving.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Print the build (version and git revision) and exit.
    #[arg(short = 'V', action = clap::ArgAction::SetTrue)]
    pub print_version: bool,
    /// Serving flags.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Call a running driver: `call --endpoint unix:///tmp/hpp-demo/csi.sock info`.
    Call(CallArgs),
    /// Print the build (version and git revision).
    Version,
}

/// Flags of the serving mode.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Zero-config mode: pool `legacy` at DIR/pools/legacy (snapshots in DIR/snapshots/legacy),
    /// socket DIR/csi.sock, node id from the host name, metrics on 127.0.0.1 (random port).
    #[arg(long = "datadir-root", value_name = "DIR")]
    pub datadir_root: Option<PathBuf>,
    /// CSI endpoint: unix:///path, a plain path, or tcp://host:port
    /// [default: unix://tmp/csi.sock, or DIR/csi.sock with --datadir-root].
    #[arg(long, env = "CSI_ENDPOINT")]
    pub endpoint: Option<String>,
    /// CSI driver name.
    #[arg(long, default_value = DRIVER_NAME)]
    pub drivername: String,
    /// Node id (the Kubernetes node name) [default with --datadir-root: the host name].
    #[arg(long, env = "NODE_NAME")]
    pub nodeid: Option<String>,
    /// Vendor version reported by GetPluginInfo [default: the hpp version]. Without a value,
    /// print the build and exit (as -V).
    #[arg(long = "version", value_name = "VERSION", num_args = 0..=1, default_missing_value = "")]
    pub vendor_version: Option<String>,
    /// Storage pools as a JSON list of objects with the keys name, path, snapshotPath,
    /// snapshotProvider, shared, requireMountPoint, ephemeral, ephemeralMaxBytes, quota,
    /// overcommitPercent, trashRetention, trashMinFreePercent (an unknown key is an error)
    /// [default: KubeVirt's, or one pool under --datadir-root].
    #[arg(long)]
    pub datadir: Option<String>,
    /// Make a pool directory whose parent does not exist, parents and all. Without it such a
    /// pool is refused at start (a typo, or a disk not mounted yet); a pool directory whose
    /// parent exists is always made, a guarded pool's (requireMountPoint) never [default: on
    /// with --datadir-root and no --datadir].
    #[arg(long = "create-pool-parents")]
    pub create_pool_parents: bool,
    /// Address of the /metrics and /healthz listener [default: [::]:8443, or 127.0.0.1:0 with
    /// --datadir-root].
    #[allow(rustdoc::broken_intra_doc_links)] // `[::]` is an address in --help, not a link
    #[arg(long = "metrics-address", env = "HPP_METRICS_ADDRESS")]
    pub metrics_address: Option<SocketAddr>,
    /// PEM certificate of the HTTPS metrics listener, re-read when it changes [default: a
    /// self-signed certificate for POD_IP, POD_NAMESPACE and SERVICE_NAME; also when only one of
    /// the two files is given].
    #[arg(long = "metrics-cert-file")]
    pub metrics_cert_file: Option<PathBuf>,
    /// PEM private key of the HTTPS metrics listener.
    #[arg(long = "metrics-key-file")]
    pub metrics_key_file: Option<PathBuf>,
    /// Serve /metrics and /healthz over plain HTTP instead of HTTPS (the default without
    /// certificate files in --datadir-root mode).
    #[arg(
        long = "metrics-insecure-http",
        env = "HPP_METRICS_INSECURE_HTTP",
        conflicts_with_all = ["metrics_cert_file", "metrics_key_file"]
    )]
    pub metrics_insecure_http: bool,
    /// Minimum TLS version of the metrics listener (VersionTLS12 or VersionTLS13; 1.0 and 1.1
    /// are raised to 1.2, anything else means 1.3, as in KubeVirt).
    #[arg(long = "metrics-tls-version", default_value = "VersionTLS13")]
    pub metrics_tls_version: String,
    /// File holding the bearer token of `GET /volumes` on the metrics listener (the node's volume
    /// report the operator's orphan audit reads); re-read at every request. Without it the
    /// endpoint does not exist.
    #[arg(long = "volume-report-token-file", env = "HPP_VOLUME_REPORT_TOKEN_FILE")]
    pub volume_report_token_file: Option<PathBuf>,
    /// A path on the OS disk, to detect pools sharing its device [default: the socket directory].
    #[arg(long = "os-reference-path")]
    pub os_reference_path: Option<PathBuf>,
    /// Which CSI service raises volume limits: `controller` offers ControllerExpandVolume and
    /// ControllerModifyVolume, for one driver that sees every volume; `node` offers only
    /// NodeExpandVolume, which kubelet calls on the node holding the volume, for a DaemonSet of
    /// node-local drivers where the resizer could reach the wrong node.
    #[arg(long, value_enum, default_value = "controller")]
    pub expansion: Expansion,
    /// Log line format.
    #[arg(long = "log-format", value_enum, default_value = "text", env = "HPP_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// klog verbosity, accepted for compatibility with KubeVirt manifests (use RUST_LOG).
    #[arg(long = "v", hide = true)]
    pub klog_verbosity: Option<String>,
}

/// `--expansion`: which CSI service raises volume limits (see [`ExpansionMode`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Expansion {
    /// ControllerExpandVolume and ControllerModifyVolume.
    #[default]
    Controller,
    /// NodeExpandVolume only, on the node holding the volume.
    Node,
}

impl From<Expansion> for ExpansionMode {
    fn from(e: Expansion) -> Self {
        match e {
            Expansion::Controller => ExpansionMode::Controller,
            Expansion::Node => ExpansionMode::Node,
        }
    }
}

/// Resolved configuration of a serving driver.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// Where CSI is served.
    pub endpoint: Endpoint,
    /// Node id.
    pub node_id: String,
    /// Pools.
    pub pools: Vec<PoolConfig>,
    /// Metrics listener.
    pub metrics_address: SocketAddr,
    /// Whether pool directories are made with their missing parents.
    pub create_pool_parents: bool,
}

impl ServeArgs {
    /// Applies the defaults (KubeVirt's, or the `--datadir-root` ones). Pure, for tests.
    pub fn resolve(&self, hostname: impl FnOnce() -> Option<String>) -> anyhow::Result<Resolved> {
        let root = self.datadir_root.as_ref();
        let endpoint: Endpoint = match (&self.endpoint, root) {
            (Some(e), _) => e.parse()?,
            (None, Some(r)) => Endpoint::Unix(r.join("csi.sock")),
            (None, None) => KUBEVIRT_DEFAULT_ENDPOINT.parse()?,
        };
        let pools = match (&self.datadir, root) {
            (Some(json), _) => parse_pools(json)?,
            (None, Some(r)) => vec![
                PoolConfig::new(hpp_api::constants::DEFAULT_POOL_NAME, r.join("pools/legacy"))
                    .with_snapshots(r.join("snapshots/legacy")),
            ],
            (None, None) => parse_pools(KUBEVIRT_DEFAULT_DATADIR)?,
        };
        let node_id = match (self.nodeid.as_ref().filter(|n| !n.is_empty()), root) {
            (Some(n), _) => n.clone(),
            (None, Some(_)) => hostname().context("cannot read the host name; pass --nodeid")?,
            (None, None) => anyhow::bail!("--nodeid (or NODE_NAME) is required"),
        };
        let metrics_address = match (self.metrics_address, root) {
            (Some(a), _) => a,
            (None, Some(_)) => SocketAddr::from(([127, 0, 0, 1], 0)),
            (None, None) => SocketAddr::from(([0u16; 8], 8443)),
        };
        // The zero-config mode makes its own tree under DIR.
        let create_pool_parents = self.create_pool_parents || (root.is_some() && self.datadir.is_none());
        Ok(Resolved {
            endpoint,
            node_id,
            pools,
            metrics_address,
            create_pool_parents,
        })
    }
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

impl Args {
    /// Whether the command line asks for the build (`-V`, `version`, or `--version` without a
    /// value) rather than to serve.
    pub fn wants_version(&self) -> bool {
        self.print_version
            || matches!(self.command, Some(Command::Version))
            || self.serve.vendor_version.as_deref() == Some("")
    }
}

/// What `--version`, `-V` and `version` print: `hpp-csi-driver 0.1.0 (revision abc123)`.
pub fn version_line() -> String {
    format!("hpp-csi-driver {}", crate::build_version())
}

/// How to run this binary again, for the start-up hint: its own path, as the user or pod has it.
fn own_command() -> String {
    std::env::current_exe()
        .ok()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "hpp-csi-driver".to_owned())
}

/// The start-up hint: how to talk to this driver, with this binary.
pub fn startup_hint(exe: &str, endpoint: &Endpoint, metrics_url: &str) -> String {
    format!(
        "hpp-csi-driver serving CSI on {endpoint}; talk to it with: \
         {exe} call --endpoint {endpoint} info \
         (or probe, capacity, create-volume NAME --size 1Gi, list-volumes, expand ID SIZE, snapshot SRC NAME, publish ID DIR); \
         metrics at {metrics_url}/metrics, health at {metrics_url}/healthz"
    )
}

/// The executable of the legacy provisioner, next to this one in the image.
pub const LEGACY_PROVISIONER_EXE: &str = "hpp-provisioner";

/// Whether this start is KubeVirt's legacy DaemonSet running the image `PROVISIONER_IMAGE`
/// names: KubeVirt's operator renders that container with no `command` and no `args`, only the
/// environment `USE_NAMING_PREFIX`, `NODE_NAME` and `PV_DIR` (daemonset.go of
/// kubevirt/hostpath-provisioner-operator), so the image's entrypoint, this driver, runs bare.
/// Every CSI DaemonSet (KubeVirt's and hpp's) passes `--endpoint` and friends and sets
/// `CSI_ENDPOINT`: no arguments, `PV_DIR` set and `CSI_ENDPOINT` unset is only ever the legacy
/// DaemonSet, which the driver would otherwise serve as a CSI driver on a socket nobody reads.
pub fn is_kubevirt_legacy_start(argv: &[std::ffi::OsString], env: impl Fn(&str) -> Option<std::ffi::OsString>) -> bool {
    let set = |k: &str| env(k).is_some_and(|v| !v.is_empty());
    argv.len() <= 1 && set("PV_DIR") && !set("CSI_ENDPOINT")
}

/// Replaces this process with the legacy provisioner next to it (same environment), for
/// [`is_kubevirt_legacy_start`]. Returns only when that cannot be done, with the reason.
pub fn exec_legacy_provisioner() -> anyhow::Error {
    use std::os::unix::process::CommandExt as _;
    let exe = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name(LEGACY_PROVISIONER_EXE),
        Err(e) => return anyhow::Error::new(e).context("finding this executable's directory"),
    };
    eprintln!(
        "hpp-csi-driver: started with no arguments, PV_DIR set and no CSI_ENDPOINT, as KubeVirt's legacy \
         DaemonSet runs its provisioner image: running {}",
        exe.display()
    );
    let e = std::process::Command::new(&exe).exec();
    anyhow::Error::new(e).context(format!(
        "running the legacy provisioner {} (KubeVirt's legacy DaemonSet runs this image without a command)",
        exe.display()
    ))
}

/// Entry point of the executable.
pub async fn main(args: Args) -> anyhow::Result<()> {
    if args.wants_version() {
        println!("{}", version_line());
        return Ok(());
    }
    match args.command {
        Some(Command::Call(call)) => {
            let out = call::run(call).await?;
            crate::operator::print_stdout(&out)
        }
        Some(Command::Version) => Ok(()),
        None => {
            let _telemetry = crate::telemetry::init("hpp-csi-driver", args.serve.log_format)?;
            serve(args.serve, crate::admin::shutdown_signal()).await
        }
    }
}

/// Serves the driver and its metrics/health listener until `shutdown` resolves.
pub async fn serve(
    args: ServeArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    start(args).await?.run_until(shutdown).await
}

/// A driver whose CSI endpoint and metrics listener are bound and serving.
pub struct Running {
    endpoint: Endpoint,
    metrics_url: String,
    stop: tokio::sync::watch::Sender<bool>,
    serving: tokio::task::JoinHandle<Result<(), hpp_csi::ServeError>>,
}

impl Running {
    /// The CSI endpoint actually listened on.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Base URL of the metrics/health listener (`http://` or `https://`).
    pub fn metrics_url(&self) -> &str {
        &self.metrics_url
    }

    /// Serves until `shutdown` resolves, then stops both listeners and removes the socket.
    pub async fn run_until(self, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
        shutdown.await;
        let _ = self.stop.send(true);
        self.serving.await??;
        info!("hpp-csi-driver stopped");
        Ok(())
    }
}

/// Prepares the pools, binds the CSI endpoint and the metrics listener, and starts serving.
pub async fn start(args: ServeArgs) -> anyhow::Result<Running> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cfg = args.resolve(hostname)?;
    let mut registry = Registry::default();
    let metrics = Arc::new(DriverMetrics::register(&mut registry));
    let mut builder = Driver::builder()
        .driver_name(&args.drivername)
        .vendor_version(
            args.vendor_version
                .clone()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned()),
        )
        .node_id(&cfg.node_id)
        .pools(cfg.pools.clone())
        .endpoint(cfg.endpoint.clone())
        .expansion(args.expansion.into())
        .create_pool_parents(cfg.create_pool_parents)
        .metrics(metrics);
    if let Some(p) = &args.os_reference_path {
        builder = builder.os_reference_path(p);
    }
    let driver = builder.build()?;
    let report = {
        let d = driver.clone();
        tokio::task::spawn_blocking(move || d.pools_report()).await?
    };
    for (name, h, shared) in &report.pools {
        match &h.reason {
            None => {
                info!(pool = %name, path = %driver.state().pools.iter().find(|p| &p.name == name).map(|p| p.path.display().to_string()).unwrap_or_default(),
                total_bytes = h.total_bytes, available_bytes = h.available_bytes, shared_with_os = shared, "storage pool ready")
            }
            Some(reason) => tracing::warn!(pool = %name, %reason, "storage pool not usable"),
        }
    }
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let wait_stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    // Metrics first: a bad TLS flag must fail before the CSI socket exists.
    let csi_endpoint = http::CsiEndpoint::default();
    let metrics_url = http::start(
        &args,
        cfg.metrics_address,
        Arc::new(registry),
        driver.clone(),
        Arc::clone(&csi_endpoint),
        wait_stop(stop_rx.clone()),
    )
    .await?;
    let bound = driver.bind().await?;
    let endpoint = bound.endpoint().clone();
    // Set once, right after binding; a second set cannot happen.
    let _ = csi_endpoint.set(endpoint.clone());
    info!(
        endpoint = %endpoint,
        node_id = %cfg.node_id,
        driver = %args.drivername,
        metrics = %metrics_url,
        "{}",
        startup_hint(&own_command(), &endpoint, &metrics_url)
    );
    let serving = tokio::spawn(bound.serve(wait_stop(stop_rx)));
    Ok(Running {
        endpoint,
        metrics_url,
        stop,
        serving,
    })
}

#[cfg(test)]
mod tests;
