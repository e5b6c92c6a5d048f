//! Embedding the hpp CSI driver in your own program: build a driver over one pool, serve it on
//! a unix socket, then talk to it with the generated CSI client — create a volume, snapshot it
//! and restore the snapshot into a second volume — and shut it down cleanly.
//!
//! Run with `cargo run -p hpp-examples --example embed_csi_driver [DIR]` (a temporary directory
//! by default); `examples/tests/embed_csi_driver.rs` runs it in the test suite.

use std::path::Path;

use hpp_csi::csi::controller_client::ControllerClient;
use hpp_csi::csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use hpp_csi::csi::{self, volume_content_source};
use hpp_csi::{Driver, Endpoint, PoolConfig};

fn mount_capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// Serves a driver with one pool under `dir`, provisions `demo`, snapshots it as `demo-snap`,
/// restores that into `demo-restored`, and stops the server (which removes its socket).
pub async fn run(dir: &Path) -> anyhow::Result<()> {
    // ANCHOR: serve
    let endpoint = Endpoint::Unix(dir.join("csi.sock"));
    let driver = Driver::builder()
        .node_id("example-node")
        .pool(PoolConfig::new("legacy", dir.join("pool")).with_snapshots(dir.join("snapshots")))
        .endpoint(endpoint.clone())
        .build()?;

    // Bind first, so the socket exists before the first client connects.
    let bound = driver.bind().await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(bound.serve(async {
        let _ = stopped.await;
    }));
    // ANCHOR_END: serve

    // ANCHOR: create_volume
    let mut controller = ControllerClient::new(hpp_csi::client::connect(&endpoint).await?);
    let volume = controller
        .create_volume(csi::CreateVolumeRequest {
            name: "demo".into(),
            volume_capabilities: vec![mount_capability()],
            ..Default::default()
        })
        .await?
        .into_inner()
        .volume
        .ok_or_else(|| anyhow::anyhow!("CreateVolume returned no volume"))?;
    println!("created volume {} ({} bytes)", volume.volume_id, volume.capacity_bytes);
    // ANCHOR_END: create_volume

    // A workload writes into the volume directory.
    std::fs::write(dir.join("pool/demo/hello.txt"), b"hello from hpp\n")?;

    // ANCHOR: snapshot_restore
    let snapshot = controller
        .create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: "demo".into(),
            name: "demo-snap".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .snapshot
        .ok_or_else(|| anyhow::anyhow!("CreateSnapshot returned no snapshot"))?;
    println!(
        "snapshot {} of {} ready: {}",
        snapshot.snapshot_id, snapshot.source_volume_id, snapshot.ready_to_use
    );

    controller
        .create_volume(csi::CreateVolumeRequest {
            name: "demo-restored".into(),
            volume_capabilities: vec![mount_capability()],
            volume_content_source: Some(csi::VolumeContentSource {
                r#type: Some(volume_content_source::Type::Snapshot(
                    volume_content_source::SnapshotSource {
                        snapshot_id: "demo-snap".into(),
                    },
                )),
            }),
            ..Default::default()
        })
        .await?;
    // ANCHOR_END: snapshot_restore
    println!(
        "restored: {}",
        std::fs::read_to_string(dir.join("pool/demo-restored/hello.txt"))?.trim()
    );

    let _ = stop.send(());
    server.await??;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    run(&dir).await
}
