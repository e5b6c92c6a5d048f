//! Serving the hpp CSI services from a tonic server of your own, next to whatever else that
//! server carries: the driver's router (its services under its tracing-and-metrics layer),
//! served on a unix socket bound with the driver's checks ([`hpp_csi::CsiSocket`]: stale socket
//! replaced, live one refused, mode 0660, the `:authority` fix non-Go gRPC clients need, the
//! socket removed on stop), with the driver's background work beside it and one call to stop
//! it ([`hpp_csi::Background::stop`], which also checkpoints the volume journals). Metrics go
//! into your own `prometheus-client` registry.
//!
//! Run with `cargo run -p hpp-examples --example own_tonic_server [DIR]`;
//! `examples/tests/own_tonic_server.rs` runs it in the test suite, with a C-core-style client.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hpp_csi::csi::{self, controller_client::ControllerClient, identity_client::IdentityClient};
use hpp_csi::{CsiSocket, Driver, DriverMetrics, Endpoint, PoolConfig};
use prometheus_client::registry::Registry;

/// The running server.
pub struct Running {
    /// Its unix socket.
    pub socket: PathBuf,
    /// The registry the driver records into.
    pub registry: Registry,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    background: hpp_csi::Background,
}

/// What the example observed, for the test to check.
#[derive(Debug)]
pub struct Outcome {
    /// Driver name from GetPluginInfo.
    pub driver_name: String,
    /// Id of the volume CreateVolume returned.
    pub volume_id: String,
}

/// Serves the driver's services on `<dir>/csi.sock` from a server of our own.
pub async fn start(dir: &Path) -> anyhow::Result<Running> {
    // ANCHOR: own_server
    // Your registry: the driver registers its metrics into it.
    let mut registry = Registry::default();
    let metrics = Arc::new(DriverMetrics::register(&mut registry));

    // No endpoint: this driver is never served by `Driver::serve`.
    let driver = Driver::builder()
        .node_id("example-node")
        .pool(PoolConfig::new("local", dir.join("pool")))
        .metrics(metrics)
        .build()?;

    // The socket, bound with the driver's checks; its connections carry the :authority fix.
    let socket = CsiSocket::bind(dir.join("csi.sock"))?;
    let path = socket.path().to_path_buf();
    // Pool health, trash purges, nested-subvolume containment: what `serve` runs beside.
    let background = driver.start_background();

    // Your server: the driver's router; add your own services to it.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(driver.router().serve_with_incoming_shutdown(socket.incoming(), async {
        let _ = stopped.await;
    }));
    // ANCHOR_END: own_server
    Ok(Running {
        socket: path,
        registry,
        stop,
        server,
        background,
    })
}

impl Running {
    /// Talks to the server with hpp's client: GetPluginInfo, then one CreateVolume.
    pub async fn use_it(&self) -> anyhow::Result<Outcome> {
        let channel = hpp_csi::client::connect(&Endpoint::Unix(self.socket.clone())).await?;
        let info = IdentityClient::new(channel.clone())
            .get_plugin_info(csi::GetPluginInfoRequest {})
            .await?
            .into_inner();
        let volume = ControllerClient::new(channel)
            .create_volume(csi::CreateVolumeRequest {
                name: "demo".into(),
                volume_capabilities: vec![csi::VolumeCapability {
                    access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
                    access_mode: Some(csi::volume_capability::AccessMode {
                        mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
                    }),
                }],
                parameters: [("storagePool".to_owned(), "local".to_owned())].into(),
                ..Default::default()
            })
            .await?
            .into_inner()
            .volume
            .ok_or_else(|| anyhow::anyhow!("CreateVolume returned no volume"))?;
        Ok(Outcome {
            driver_name: info.name,
            volume_id: volume.volume_id,
        })
    }

    /// The registry encoded (OpenMetrics text).
    pub fn metrics(&self) -> anyhow::Result<String> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }

    /// Stops the server, then the background work (one call: journals checkpointed); the
    /// socket goes with the server's connection stream.
    pub async fn stop(self) -> anyhow::Result<()> {
        // ANCHOR: own_server_stop
        let _ = self.stop.send(());
        self.server.await??;
        self.background.stop().await;
        // ANCHOR_END: own_server_stop
        Ok(())
    }
}

#[allow(dead_code)] // the test includes this file as a module and never calls main
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let running = start(&dir).await?;
    let outcome = running.use_it().await?;
    println!("{} served volume {}", outcome.driver_name, outcome.volume_id);
    print!("{}", running.metrics()?);
    running.stop().await
}
