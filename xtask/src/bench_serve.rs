//! The servers `cargo xtask bench` measures, each in a child process of its own (this binary
//! again, with a hidden flag) so its memory and threads are its own:
//!
//! - `--serve-driver DIR`: the shipped driver, started as `hpp-csi-driver` starts it
//!   ([`hpp_bin::csi_driver::serve`]: metrics registry, RPC layer, metrics listener), pool
//!   `DIR/pool` with snapshots in `DIR/snapshots`, socket `DIR/csi.sock`;
//! - `--serve-bare DIR`: the empty-call floor, a constant Identity service served by plain
//!   tonic on `DIR/csi.sock`;
//! - `--serve-bare-layered DIR`: the same service wrapped in the driver's
//!   [`hpp_csi::RpcLayer`] with a registered [`DriverMetrics`], so the difference to
//!   the bare server is what the span, the log decision and the metrics cost per call;
//! - `--serve-durable-floor DIR`: the durable floor behind plain tonic, the least any durable
//!   server can do per call: the same Identity service, and a Controller whose CreateVolume is
//!   only `mkdir + fsync(parent)` and DeleteVolume only `rename + fsync(parent)` in `DIR/pool`,
//!   each on a blocking thread (`spawn_blocking`, as tokio servers run file-system calls), one
//!   `fsync` per call. The driver's CreateVolume and DeleteVolume against it are what the
//!   driver's own work costs over the same two thread hops and wake-ups; at c=16 they show
//!   what group commit saves over an `fsync` per call.
//!
//! Every child installs the shipped tracing subscriber ([`hpp_bin::telemetry::init`], text
//! lines on stderr at the default `info`), with `RUST_LOG` and the OTLP variables removed so
//! the level is the default one; its stderr goes to /dev/null.

use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser as _;
use hpp_csi::csi::{self, controller_server::Controller, controller_server::ControllerServer};
use hpp_csi::csi::{identity_server::Identity, identity_server::IdentityServer};
use hpp_csi::{DriverMetrics, Endpoint, PoolConfig};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// Which server a child runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The shipped driver.
    Driver,
    /// Plain tonic, constant Identity service.
    Bare,
    /// The same behind the driver's RPC layer.
    BareLayered,
    /// Plain tonic, the constant Identity service and the durable floor as a Controller.
    DurableFloor,
}

impl Kind {
    fn flag(self) -> &'static str {
        match self {
            Kind::Driver => "--serve-driver",
            Kind::Bare => "--serve-bare",
            Kind::BareLayered => "--serve-bare-layered",
            Kind::DurableFloor => "--serve-durable-floor",
        }
    }
}

/// The socket a child serves in `dir`.
pub fn socket(dir: &Path) -> PathBuf {
    dir.join("csi.sock")
}

/// A child process, killed (and reaped) when dropped, also on the error paths.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running child and a channel to it; the child is killed when this is dropped.
pub struct Server {
    child: ChildGuard,
    /// gRPC channel over the child's unix socket.
    pub channel: tonic::transport::Channel,
}

impl Server {
    /// Starts this binary as the `kind` server on `dir` and waits (30 s at most) until it
    /// answers on its socket.
    pub async fn spawn(kind: Kind, dir: &Path) -> anyhow::Result<Server> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg("bench").arg(kind.flag()).arg(dir);
        Self::start(cmd, kind.flag(), dir).await
    }

    /// Starts the `hpp-csi-driver` executable `bin` with exactly the flags the served driver
    /// gets ([`driver_args`]) on `dir`.
    pub async fn spawn_driver_bin(bin: &Path, dir: &Path) -> anyhow::Result<Server> {
        let mut cmd = Command::new(bin);
        cmd.args(driver_args(dir)?.iter().skip(1));
        Self::start(cmd, &bin.display().to_string(), dir).await
    }

    /// Starts `cmd` (its output discarded) and waits (30 s at most) until it answers on
    /// [`socket`]`(dir)`; `what` names it in errors.
    pub(crate) async fn start(mut cmd: Command, what: &str, dir: &Path) -> anyhow::Result<Server> {
        std::fs::create_dir_all(dir)?;
        let child = cmd
            .env_remove("RUST_LOG")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("HPP_LOG_FORMAT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting a server child")?;
        let mut child = ChildGuard(child);
        let sock = socket(dir);
        let endpoint = Endpoint::Unix(sock.clone());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if sock.exists()
                && let Ok(ch) = hpp_csi::client::connect(&endpoint).await
            {
                return Ok(Server { child, channel: ch });
            }
            if let Some(status) = child.0.try_wait()? {
                anyhow::bail!(
                    "{what} {dir} exited with {status} before serving; run `xtask bench {what} {dir}` to see its log",
                    dir = dir.display()
                );
            }
            anyhow::ensure!(Instant::now() < deadline, "{what} did not start within 30 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }
}

/// Runs the `kind` server on `dir` until SIGTERM or Ctrl-C (the child side of [`Server`]).
pub async fn serve(kind: Kind, dir: &Path) -> anyhow::Result<()> {
    let _telemetry = hpp_bin::telemetry::init("hpp-csi-driver", hpp_bin::telemetry::LogFormat::Text)?;
    match kind {
        Kind::Driver => serve_driver(dir).await,
        Kind::Bare => serve_bare(dir, None).await,
        Kind::BareLayered => {
            let mut registry = prometheus_client::registry::Registry::default();
            let metrics = Arc::new(DriverMetrics::register(&mut registry));
            serve_bare(dir, Some(hpp_csi::RpcLayer::new(Some(metrics)))).await
        }
        Kind::DurableFloor => serve_durable_floor(dir).await,
    }
}

/// The pools of the measured driver: one, with snapshots, inside `dir`.
pub fn driver_pools(dir: &Path) -> Vec<PoolConfig> {
    vec![PoolConfig::new("legacy", dir.join("pool")).with_snapshots(dir.join("snapshots"))]
}

async fn serve_driver(dir: &Path) -> anyhow::Result<()> {
    let args = hpp_bin::csi_driver::Args::try_parse_from(driver_args(dir)?)?;
    hpp_bin::csi_driver::serve(args.serve, hpp_bin::admin::shutdown_signal()).await
}

/// The measured driver's command line (program name first): the pools of [`driver_pools`],
/// its socket in `dir`, metrics on a free loopback port.
pub fn driver_args(dir: &Path) -> anyhow::Result<Vec<String>> {
    let pools = serde_json::to_string(&driver_pools(dir))?;
    Ok([
        "hpp-csi-driver",
        "--endpoint",
        &socket(dir).to_string_lossy(),
        "--nodeid",
        "bench",
        "--datadir",
        &pools,
        "--os-reference-path",
        "/",
        "--metrics-address",
        "127.0.0.1:0",
        "--metrics-insecure-http",
    ]
    .map(str::to_owned)
    .to_vec())
}

/// An Identity service that answers from constants: no state, no I/O.
#[derive(Debug, Clone, Copy)]
struct ConstantIdentity;

#[tonic::async_trait]
impl Identity for ConstantIdentity {
    async fn get_plugin_info(
        &self,
        _req: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: hpp_api::constants::DRIVER_NAME.to_owned(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _req: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::GetPluginCapabilitiesResponse::default()))
    }

    async fn probe(&self, _req: Request<csi::ProbeRequest>) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

async fn serve_bare(dir: &Path, layer: Option<hpp_csi::RpcLayer>) -> anyhow::Result<()> {
    let sock = socket(dir);
    let _ = std::fs::remove_file(&sock);
    let incoming =
        UnixListenerStream::new(UnixListener::bind(&sock).with_context(|| format!("binding {}", sock.display()))?);
    let shutdown = hpp_bin::admin::shutdown_signal();
    let service = IdentityServer::new(ConstantIdentity);
    match layer {
        None => {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await?
        }
        Some(layer) => {
            tonic::transport::Server::builder()
                .layer(layer)
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await?
        }
    }
    let _ = std::fs::remove_file(&sock);
    Ok(())
}

/// The pool directory of the durable-floor server on `dir`.
pub fn durable_floor_pool(dir: &Path) -> PathBuf {
    dir.join("pool")
}

async fn serve_durable_floor(dir: &Path) -> anyhow::Result<()> {
    let pool = durable_floor_pool(dir);
    std::fs::create_dir_all(&pool).with_context(|| format!("creating {}", pool.display()))?;
    let pool_fd = rustix::fs::open(
        &pool,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .with_context(|| format!("opening {}", pool.display()))?;
    let sock = socket(dir);
    let _ = std::fs::remove_file(&sock);
    let incoming =
        UnixListenerStream::new(UnixListener::bind(&sock).with_context(|| format!("binding {}", sock.display()))?);
    tonic::transport::Server::builder()
        .add_service(IdentityServer::new(ConstantIdentity))
        .add_service(ControllerServer::new(DurableFloor {
            pool: Arc::new(pool_fd),
        }))
        .serve_with_incoming_shutdown(incoming, hpp_bin::admin::shutdown_signal())
        .await?;
    let _ = std::fs::remove_file(&sock);
    Ok(())
}

/// CreateVolume and DeleteVolume as the durable floor and nothing else (see the module docs;
/// the other RPCs answer Unimplemented, the generated default).
#[derive(Debug, Clone)]
struct DurableFloor {
    pool: Arc<OwnedFd>,
}

impl DurableFloor {
    /// Runs `op` on the pool directory on a blocking thread; `name` must be a plain child name.
    async fn blocking(
        &self,
        name: &str,
        op: impl FnOnce(BorrowedFd<'_>, &str) -> rustix::io::Result<()> + Send + 'static,
    ) -> Result<(), Status> {
        if name.is_empty() || name.starts_with('.') || name.contains('/') {
            return Err(Status::invalid_argument(format!("{name:?} is not a plain child name")));
        }
        let (pool, owned) = (self.pool.clone(), name.to_owned());
        tokio::task::spawn_blocking(move || op(pool.as_fd(), &owned))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| Status::internal(format!("{name}: {e}")))
    }
}

/// The name a deleted floor volume is renamed to.
fn deleting(name: &str) -> String {
    format!(".deleting-{name}")
}

#[tonic::async_trait]
impl Controller for DurableFloor {
    async fn create_volume(
        &self,
        req: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let name = req.into_inner().name;
        self.blocking(&name, |pool, name| {
            rustix::fs::mkdirat(pool, name, rustix::fs::Mode::from_raw_mode(0o750))?;
            rustix::fs::fsync(pool)
        })
        .await?;
        Ok(Response::new(csi::CreateVolumeResponse {
            volume: Some(csi::Volume {
                volume_id: name,
                ..Default::default()
            }),
        }))
    }

    async fn delete_volume(
        &self,
        req: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        self.blocking(&req.into_inner().volume_id, |pool, name| {
            rustix::fs::renameat(pool, name, pool, deleting(name))?;
            rustix::fs::fsync(pool)
        })
        .await?;
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }
}
