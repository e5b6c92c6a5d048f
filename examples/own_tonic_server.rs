//! Serving the hpp CSI services from a tonic server of your own, next to whatever else that
//! server carries: take the Identity, Controller and Node services from a built driver, wrap
//! them in the driver's tracing-and-metrics layer, and serve them on your own listener. Metrics
//! go into your own `prometheus-client` registry.
//!
//! Run with `cargo run -p hpp-examples --example own_tonic_server [DIR]`;
//! `examples/tests/own_tonic_server.rs` runs it in the test suite.

use std::path::Path;
use std::sync::Arc;

use hpp_csi::csi::{self, controller_client::ControllerClient, identity_client::IdentityClient};
use hpp_csi::{Driver, DriverMetrics, Endpoint, PoolConfig};
use prometheus_client::registry::Registry;
use tokio_stream::wrappers::TcpListenerStream;

/// What the example observed, for the test to check.
#[derive(Debug)]
pub struct Outcome {
    /// Driver name from GetPluginInfo.
    pub driver_name: String,
    /// Id of the volume CreateVolume returned.
    pub volume_id: String,
    /// The registry encoded after the calls (OpenMetrics text).
    pub metrics: String,
}

/// Serves the three CSI services on a TCP port of our own, creates one volume through them and
/// returns what it saw.
pub async fn run(dir: &Path) -> anyhow::Result<Outcome> {
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

    // Your listener and your server; add your own services next to the CSI ones.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .layer(driver.rpc_layer())
            .add_service(driver.identity_service())
            .add_service(driver.controller_service())
            .add_service(driver.node_service())
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    // Pool health (gauges, transition logs) kept current in the background, as `serve` does.
    let health = tokio::spawn(hpp_csi::watch_health(
        driver.state().clone(),
        hpp_csi::DEFAULT_HEALTH_INTERVAL,
    ));
    // ANCHOR_END: own_server

    let channel = hpp_csi::client::connect(&Endpoint::Tcp(addr.to_string())).await?;
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

    let _ = stop.send(());
    server.await??;
    health.abort();

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    println!("{} served volume {}", info.name, volume.volume_id);
    Ok(Outcome {
        driver_name: info.name,
        volume_id: volume.volume_id,
        metrics: text,
    })
}

#[allow(dead_code)] // the test includes this file as a module and never calls main
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let outcome = run(&dir).await?;
    print!("{}", outcome.metrics);
    Ok(())
}
