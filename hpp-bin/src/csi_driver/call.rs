//! `hpp-csi-driver call`: a minimal CSI client, so a user can poke a running driver without
//! installing csc or grpcurl.

use std::collections::HashMap;

use hpp_csi::csi::{
    self, controller_client::ControllerClient, identity_client::IdentityClient, node_client::NodeClient,
    volume_content_source,
};
use hpp_csi::{Endpoint, client};

/// Flags of `call`.
#[derive(Debug, clap::Args)]
pub struct CallArgs {
    /// Driver endpoint (unix:///path, path, or tcp://host:port).
    #[arg(long)]
    pub endpoint: String,
    /// The RPC.
    #[command(subcommand)]
    pub op: Op,
}

/// RPCs `call` can make.
#[derive(Debug, clap::Subcommand)]
pub enum Op {
    /// GetPluginInfo.
    Info,
    /// Probe.
    Probe,
    /// GetCapacity of a pool.
    Capacity {
        /// Pool name [default: legacy].
        #[arg(long)]
        pool: Option<String>,
    },
    /// CreateVolume (mount access, single-node writer).
    CreateVolume {
        /// Volume name (= id).
        name: String,
        /// Pool name [default: legacy].
        #[arg(long)]
        pool: Option<String>,
        /// Restore from this snapshot.
        #[arg(long, conflicts_with = "from_volume")]
        from_snapshot: Option<String>,
        /// Clone this volume.
        #[arg(long)]
        from_volume: Option<String>,
    },
    /// DeleteVolume.
    DeleteVolume {
        /// Volume id.
        id: String,
    },
    /// ListVolumes (all pages).
    ListVolumes,
    /// CreateSnapshot.
    Snapshot {
        /// Source volume id.
        source: String,
        /// Snapshot name (= id).
        name: String,
    },
    /// DeleteSnapshot.
    DeleteSnapshot {
        /// Snapshot id.
        id: String,
    },
    /// ListSnapshots (all pages).
    ListSnapshots,
    /// NodePublishVolume (bind mount onto TARGET).
    Publish {
        /// Volume id.
        id: String,
        /// Target directory.
        target: String,
        /// Mount read-only.
        #[arg(long)]
        readonly: bool,
    },
    /// NodeUnpublishVolume.
    Unpublish {
        /// Volume id.
        id: String,
        /// Target directory.
        target: String,
    },
    /// NodeGetVolumeStats.
    Stats {
        /// Volume id.
        id: String,
        /// Published path.
        path: String,
    },
}

fn mount_cap() -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

fn pool_params(pool: Option<String>) -> HashMap<String, String> {
    pool.map(|p| HashMap::from([(hpp_api::constants::PARAM_STORAGE_POOL.to_owned(), p)]))
        .unwrap_or_default()
}

/// Runs one RPC and prints the response.
pub async fn run(args: CallArgs) -> anyhow::Result<()> {
    let endpoint: Endpoint = args.endpoint.parse()?;
    let ch = client::connect(&endpoint).await?;
    let mut identity = IdentityClient::new(ch.clone());
    let mut controller = ControllerClient::new(ch.clone());
    let mut node = NodeClient::new(ch);
    match args.op {
        Op::Info => println!(
            "{:#?}",
            identity
                .get_plugin_info(csi::GetPluginInfoRequest {})
                .await?
                .into_inner()
        ),
        Op::Probe => println!("{:#?}", identity.probe(csi::ProbeRequest {}).await?.into_inner()),
        Op::Capacity { pool } => {
            let req = csi::GetCapacityRequest {
                parameters: pool_params(pool),
                ..Default::default()
            };
            println!("{:#?}", controller.get_capacity(req).await?.into_inner());
        }
        Op::CreateVolume {
            name,
            pool,
            from_snapshot,
            from_volume,
        } => {
            let source = match (from_snapshot, from_volume) {
                (Some(s), _) => Some(volume_content_source::Type::Snapshot(
                    volume_content_source::SnapshotSource { snapshot_id: s },
                )),
                (None, Some(v)) => Some(volume_content_source::Type::Volume(
                    volume_content_source::VolumeSource { volume_id: v },
                )),
                (None, None) => None,
            };
            let req = csi::CreateVolumeRequest {
                name,
                volume_capabilities: vec![mount_cap()],
                parameters: pool_params(pool),
                volume_content_source: source.map(|t| csi::VolumeContentSource { r#type: Some(t) }),
                ..Default::default()
            };
            println!("{:#?}", controller.create_volume(req).await?.into_inner());
        }
        Op::DeleteVolume { id } => {
            controller
                .delete_volume(csi::DeleteVolumeRequest {
                    volume_id: id.clone(),
                    ..Default::default()
                })
                .await?;
            println!("deleted {id}");
        }
        Op::ListVolumes => {
            let mut token = String::new();
            loop {
                let r = controller
                    .list_volumes(csi::ListVolumesRequest {
                        max_entries: 100,
                        starting_token: token,
                    })
                    .await?
                    .into_inner();
                for e in r.entries {
                    println!("{:#?}", e);
                }
                if r.next_token.is_empty() {
                    break;
                }
                token = r.next_token;
            }
        }
        Op::Snapshot { source, name } => {
            let req = csi::CreateSnapshotRequest {
                source_volume_id: source,
                name,
                ..Default::default()
            };
            println!("{:#?}", controller.create_snapshot(req).await?.into_inner());
        }
        Op::DeleteSnapshot { id } => {
            controller
                .delete_snapshot(csi::DeleteSnapshotRequest {
                    snapshot_id: id.clone(),
                    ..Default::default()
                })
                .await?;
            println!("deleted snapshot {id}");
        }
        Op::ListSnapshots => {
            let mut token = String::new();
            loop {
                let r = controller
                    .list_snapshots(csi::ListSnapshotsRequest {
                        max_entries: 100,
                        starting_token: token,
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                for e in r.entries {
                    println!("{:#?}", e);
                }
                if r.next_token.is_empty() {
                    break;
                }
                token = r.next_token;
            }
        }
        Op::Publish { id, target, readonly } => {
            let req = csi::NodePublishVolumeRequest {
                volume_id: id.clone(),
                target_path: target.clone(),
                volume_capability: Some(mount_cap()),
                readonly,
                ..Default::default()
            };
            node.node_publish_volume(req).await?;
            println!("published {id} at {target}");
        }
        Op::Unpublish { id, target } => {
            node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: id.clone(),
                target_path: target.clone(),
            })
            .await?;
            println!("unpublished {id} from {target}");
        }
        Op::Stats { id, path } => {
            let req = csi::NodeGetVolumeStatsRequest {
                volume_id: id,
                volume_path: path,
                staging_target_path: String::new(),
            };
            println!("{:#?}", node.node_get_volume_stats(req).await?.into_inner());
        }
    }
    Ok(())
}
