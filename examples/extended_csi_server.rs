//! The driver's own server, extended with a service of yours on the same unix socket: here the
//! standard gRPC health service (`grpc.health.v1.Health`), next to Identity, Controller, Node
//! and hpp's admin service. Everything `serve` does stays done (the socket's checks and mode,
//! the `:authority` fix non-Go clients need, the background work, the journals' checkpoint
//! and the socket's removal on stop); the driver's RPC layer observes its own services only.
//!
//! Run with `cargo run -p hpp-examples --example extended_csi_server [DIR]`;
//! `examples/tests/extended_csi_server.rs` calls it the way a gRPC C-core client does.

use std::path::{Path, PathBuf};

use hpp_csi::{Driver, Endpoint, PoolConfig};

/// A running extended server.
#[derive(Debug)]
pub struct Running {
    /// Its unix socket.
    pub socket: PathBuf,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), hpp_csi::ServeError>>,
}

impl Running {
    /// Stops the server and waits for it (the socket is removed, the journals checkpointed).
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        Ok(self.task.await??)
    }
}

/// Serves the driver on `<dir>/csi.sock` with the gRPC health service added; the health
/// service reports `hostpath` as serving.
pub async fn start(dir: &Path) -> anyhow::Result<Running> {
    // ANCHOR: extended_server
    let socket = dir.join("csi.sock");
    let driver = Driver::builder()
        .node_id("example-node")
        .pool(PoolConfig::new("local", dir.join("pool")))
        .endpoint(Endpoint::Unix(socket.clone()))
        .build()?;
    // Your service; wrap it in a tower layer of yours with `tonic::service::LayerExt::named_layer`.
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status("hostpath", tonic_health::ServingStatus::Serving)
        .await;
    let bound = driver.bind().await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(bound.serve_with(
        async {
            let _ = stopped.await;
        },
        |router| router.add_service(health_service),
    ));
    // ANCHOR_END: extended_server
    Ok(Running { socket, stop, task })
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
    println!(
        "serving CSI and grpc.health.v1 on {}; Ctrl-C stops",
        running.socket.display()
    );
    let _ = tokio::signal::ctrl_c().await;
    running.stop().await
}
