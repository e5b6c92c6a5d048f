//! `hpp-csi-driver call`: a minimal CSI client, so a user can poke a running driver without
//! installing csc or grpcurl.
//!
//! Output is a short table (or one line) per object by default and `-o json|yaml` for scripts,
//! as kubectl does. An RPC error is one line: the gRPC code name and the driver's message.

use std::collections::HashMap;

use serde_json::{Value, json};

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
    /// Output format: a table (default), or json / yaml for scripts.
    #[arg(short = 'o', long = "output", value_enum, global = true)]
    pub output: Option<OutputFormat>,
    /// The RPC.
    #[command(subcommand)]
    pub op: Op,
}

/// Machine-readable output formats of `call`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// One JSON document.
    Json,
    /// One YAML document.
    Yaml,
}

/// Why a call failed, printed on one line.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The endpoint flag does not parse.
    #[error("invalid --endpoint: {0}")]
    Endpoint(String),
    /// The driver cannot be reached.
    #[error("cannot connect to {endpoint}: {reason}")]
    Connect {
        /// The endpoint tried.
        endpoint: String,
        /// Why it failed.
        reason: String,
    },
    /// The driver answered with an error status.
    #[error("{code:?}: {message}")]
    Rpc {
        /// gRPC code, printed by name (`NotFound`).
        code: tonic::Code,
        /// The driver's message.
        message: String,
    },
    /// The call cannot be made as asked (a missing flag the driver's answer calls for).
    #[error("{0}")]
    Usage(String),
    /// The response could not be written as JSON or YAML.
    #[error("cannot format the response: {0}")]
    Format(String),
}

impl From<tonic::Status> for CallError {
    fn from(s: tonic::Status) -> Self {
        Self::Rpc {
            code: s.code(),
            message: s.message().to_owned(),
        }
    }
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
        /// Size, a Kubernetes quantity (64Mi, 1Gi, 500M, bytes): the capacity_range's
        /// required_bytes [default: none asked; the driver's rule applies (a pool with a quota
        /// backend gives 1 GiB, a clone or restore its source's size where the driver does)].
        #[arg(long, value_parser = super::call_resize::parse_size)]
        size: Option<i64>,
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
    /// ControllerExpandVolume where the driver offers it, then NodeExpandVolume when the answer
    /// asks for it or the driver expands on the node only.
    Expand {
        /// Volume id.
        id: String,
        /// New size, a Kubernetes quantity (128Mi, 2Gi, bytes).
        #[arg(value_parser = super::call_resize::parse_size)]
        size: i64,
        /// Where the volume is published (NodeExpandVolume's volume_path); needed when the node
        /// expands.
        #[arg(long)]
        target: Option<String>,
    },
    /// ControllerModifyVolume: sets mutable parameters (e.g. compression=zstd, inodeLimit=1000).
    Modify {
        /// Volume id.
        id: String,
        /// key=value pairs.
        #[arg(required = true, value_parser = super::call_resize::parse_parameter)]
        parameters: Vec<(String, String)>,
    },
    /// CreateSnapshot (the source may be in any pool; the snapshot is taken in its pool).
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
    /// The trash of deleted volumes (hpp's admin service on the same socket).
    Trash {
        /// What to do.
        #[command(subcommand)]
        op: super::call_trash::TrashOp,
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

/// What one call returned: the value scripts get and the table people read.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// The response as JSON (camelCase field names, as in the CSI spec's JSON mapping).
    pub value: Value,
    /// Column headers; empty for a one-line reply.
    pub headers: Vec<&'static str>,
    /// Table rows, or the single line.
    pub rows: Vec<Vec<String>>,
}

impl Reply {
    pub(crate) fn line(value: Value, line: String) -> Self {
        Self {
            value,
            headers: Vec::new(),
            rows: vec![vec![line]],
        }
    }

    pub(crate) fn table(value: Value, headers: Vec<&'static str>, rows: Vec<Vec<String>>) -> Self {
        Self { value, headers, rows }
    }

    /// The reply in `format`, or as a table / line for people.
    pub fn render(&self, format: Option<OutputFormat>) -> Result<String, CallError> {
        let mut out = match format {
            Some(OutputFormat::Json) => {
                serde_json::to_string_pretty(&self.value).map_err(|e| CallError::Format(e.to_string()))?
            }
            Some(OutputFormat::Yaml) => {
                serde_saphyr::to_string(&self.value).map_err(|e| CallError::Format(e.to_string()))?
            }
            None if self.headers.is_empty() => self.rows.iter().map(|r| r.join(" ")).collect::<Vec<_>>().join("\n"),
            None => crate::columns::columns(&self.headers, &self.rows),
        };
        if !out.ends_with('\n') {
            out.push('\n');
        }
        Ok(out)
    }
}

/// Bytes in binary units, as `kubectl` shows quantities: `10Gi`, `1.5Mi`, `512`.
pub fn human_bytes(bytes: i64) -> String {
    const UNITS: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let mut value = bytes as f64;
    let mut unit = "";
    for u in UNITS {
        if value.abs() < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = u;
    }
    if unit.is_empty() {
        bytes.to_string()
    } else if (value - value.round()).abs() < 0.05 {
        format!("{value:.0}{unit}")
    } else {
        format!("{value:.1}{unit}")
    }
}

fn or_dash(s: impl Into<String>) -> String {
    let s = s.into();
    if s.is_empty() { "-".to_owned() } else { s }
}

fn topology_json(t: &[csi::Topology]) -> Value {
    Value::Array(t.iter().map(|t| json!({ "segments": t.segments })).collect())
}

fn topology_text(t: &[csi::Topology]) -> String {
    let mut values: Vec<String> = t.iter().flat_map(|t| t.segments.values().cloned()).collect();
    values.sort();
    values.dedup();
    or_dash(values.join(","))
}

fn volume_json(v: &csi::Volume) -> Value {
    let source = v
        .content_source
        .as_ref()
        .and_then(|s| s.r#type.as_ref())
        .map(|t| match t {
            volume_content_source::Type::Snapshot(s) => json!({ "snapshot": { "snapshotId": s.snapshot_id } }),
            volume_content_source::Type::Volume(v) => json!({ "volume": { "volumeId": v.volume_id } }),
        });
    let mut out = json!({
        "volumeId": v.volume_id,
        "capacityBytes": v.capacity_bytes,
        "volumeContext": v.volume_context,
        "accessibleTopology": topology_json(&v.accessible_topology),
    });
    if let Some(source) = source {
        out["contentSource"] = source;
    }
    out
}

fn volume_row(v: &csi::Volume) -> Vec<String> {
    let pool = v
        .volume_context
        .get(hpp_api::constants::PARAM_STORAGE_POOL)
        .cloned()
        .unwrap_or_default();
    vec![
        v.volume_id.clone(),
        human_bytes(v.capacity_bytes),
        or_dash(pool),
        topology_text(&v.accessible_topology),
    ]
}

const VOLUME_HEADERS: [&str; 4] = ["VOLUME", "CAPACITY", "POOL", "NODE"];

fn snapshot_json(s: &csi::Snapshot) -> Value {
    json!({
        "snapshotId": s.snapshot_id,
        "sourceVolumeId": s.source_volume_id,
        "sizeBytes": s.size_bytes,
        "creationTime": s.creation_time.as_ref().map(|t| t.to_string()),
        "readyToUse": s.ready_to_use,
    })
}

fn snapshot_row(s: &csi::Snapshot) -> Vec<String> {
    vec![
        s.snapshot_id.clone(),
        s.source_volume_id.clone(),
        human_bytes(s.size_bytes),
        s.ready_to_use.to_string(),
        s.creation_time
            .as_ref()
            .map(|t| t.to_string())
            .unwrap_or_else(|| "-".into()),
    ]
}

const SNAPSHOT_HEADERS: [&str; 5] = ["SNAPSHOT", "SOURCE", "SIZE", "READY", "CREATED"];

/// The reply to GetPluginInfo.
pub fn info_reply(r: &csi::GetPluginInfoResponse) -> Reply {
    Reply::table(
        json!({ "name": r.name, "vendorVersion": r.vendor_version, "manifest": r.manifest }),
        vec!["NAME", "VERSION"],
        vec![vec![r.name.clone(), r.vendor_version.clone()]],
    )
}

/// The reply to Probe (`ready` is true when the driver leaves it unset, per the CSI spec).
pub fn probe_reply(r: &csi::ProbeResponse) -> Reply {
    let ready = r.ready.unwrap_or(true);
    Reply::line(
        json!({ "ready": ready }),
        if ready { "ready".into() } else { "not ready".into() },
    )
}

/// The reply to GetCapacity.
pub fn capacity_reply(pool: &str, r: &csi::GetCapacityResponse) -> Reply {
    Reply::table(
        json!({
            "availableCapacity": r.available_capacity,
            "maximumVolumeSize": r.maximum_volume_size,
            "minimumVolumeSize": r.minimum_volume_size,
        }),
        vec!["POOL", "AVAILABLE", "MAXIMUM VOLUME"],
        vec![vec![
            pool.to_owned(),
            human_bytes(r.available_capacity),
            r.maximum_volume_size.map(human_bytes).unwrap_or_else(|| "-".into()),
        ]],
    )
}

/// The reply to CreateVolume.
pub fn volume_reply(v: Option<&csi::Volume>) -> Reply {
    Reply::table(
        v.map(volume_json).unwrap_or(Value::Null),
        VOLUME_HEADERS.to_vec(),
        v.map(volume_row).into_iter().collect(),
    )
}

/// The reply to ListVolumes (every page).
pub fn volumes_reply(entries: &[csi::list_volumes_response::Entry]) -> Reply {
    let value = entries
        .iter()
        .map(|e| {
            let mut v = e.volume.as_ref().map(volume_json).unwrap_or(Value::Null);
            if let Some(status) = &e.status {
                v["publishedNodeIds"] = json!(status.published_node_ids);
                if let Some(c) = &status.volume_condition {
                    v["volumeCondition"] = json!({ "abnormal": c.abnormal, "message": c.message });
                }
            }
            v
        })
        .collect();
    let mut headers = VOLUME_HEADERS.to_vec();
    headers.push("CONDITION");
    let rows = entries
        .iter()
        .filter_map(|e| {
            let mut row = volume_row(e.volume.as_ref()?);
            let condition = e.status.as_ref().and_then(|s| s.volume_condition.as_ref());
            row.push(match condition {
                Some(c) if c.abnormal => format!("abnormal: {}", c.message),
                Some(_) => "ok".into(),
                None => "-".into(),
            });
            Some(row)
        })
        .collect();
    Reply::table(Value::Array(value), headers, rows)
}

/// The reply to CreateSnapshot.
pub fn snapshot_reply(s: Option<&csi::Snapshot>) -> Reply {
    Reply::table(
        s.map(snapshot_json).unwrap_or(Value::Null),
        SNAPSHOT_HEADERS.to_vec(),
        s.map(snapshot_row).into_iter().collect(),
    )
}

/// The reply to ListSnapshots (every page).
pub fn snapshots_reply(snapshots: &[csi::Snapshot]) -> Reply {
    Reply::table(
        Value::Array(snapshots.iter().map(snapshot_json).collect()),
        SNAPSHOT_HEADERS.to_vec(),
        snapshots.iter().map(snapshot_row).collect(),
    )
}

/// The reply to NodeGetVolumeStats.
pub fn stats_reply(r: &csi::NodeGetVolumeStatsResponse) -> Reply {
    use csi::volume_usage::Unit;
    let unit = |u: i32| match Unit::try_from(u) {
        Ok(Unit::Bytes) => "bytes",
        Ok(Unit::Inodes) => "inodes",
        _ => "unknown",
    };
    let amount = |u: i32, n: i64| {
        if unit(u) == "bytes" {
            human_bytes(n)
        } else {
            n.to_string()
        }
    };
    let mut value = json!({
        "usage": r.usage.iter().map(|u| json!({
            "unit": unit(u.unit), "total": u.total, "used": u.used, "available": u.available,
        })).collect::<Vec<_>>(),
    });
    if let Some(c) = &r.volume_condition {
        value["volumeCondition"] = json!({ "abnormal": c.abnormal, "message": c.message });
    }
    let rows = r
        .usage
        .iter()
        .map(|u| {
            vec![
                unit(u.unit).to_owned(),
                amount(u.unit, u.total),
                amount(u.unit, u.used),
                amount(u.unit, u.available),
            ]
        })
        .collect();
    Reply::table(value, vec!["UNIT", "TOTAL", "USED", "AVAILABLE"], rows)
}

/// The reply to an RPC whose response is empty: what was done, to what.
pub fn done_reply(action: &str, fields: &[(&str, &str)]) -> Reply {
    let mut value = json!({ "action": action });
    for (k, v) in fields {
        value[*k] = json!(v);
    }
    let what: Vec<&str> = fields.iter().map(|(_, v)| *v).collect();
    Reply::line(value, format!("{action} {}", what.join(" ")))
}

/// Runs one RPC and returns what to print.
pub async fn run(args: CallArgs) -> Result<String, CallError> {
    let endpoint: Endpoint = args
        .endpoint
        .parse()
        .map_err(|e: <Endpoint as std::str::FromStr>::Err| CallError::Endpoint(e.to_string()))?;
    let ch = client::connect(&endpoint).await.map_err(|e| CallError::Connect {
        endpoint: args.endpoint.clone(),
        reason: e.to_string(),
    })?;
    call(ch, args.op).await?.render(args.output)
}

/// Makes the RPC `op` over `ch`.
pub async fn call(ch: tonic::transport::Channel, op: Op) -> Result<Reply, CallError> {
    let mut identity = IdentityClient::new(ch.clone());
    let mut controller = ControllerClient::new(ch.clone());
    let mut node = NodeClient::new(ch.clone());
    let reply = match op {
        Op::Info => info_reply(
            &identity
                .get_plugin_info(csi::GetPluginInfoRequest {})
                .await?
                .into_inner(),
        ),
        Op::Probe => probe_reply(&identity.probe(csi::ProbeRequest {}).await?.into_inner()),
        Op::Capacity { pool } => {
            let shown = pool
                .clone()
                .unwrap_or_else(|| hpp_api::constants::DEFAULT_POOL_NAME.to_owned());
            let req = csi::GetCapacityRequest {
                parameters: pool_params(pool),
                ..Default::default()
            };
            capacity_reply(&shown, &controller.get_capacity(req).await?.into_inner())
        }
        Op::CreateVolume {
            name,
            size,
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
                capacity_range: size.map(|required_bytes| csi::CapacityRange {
                    required_bytes,
                    limit_bytes: 0,
                }),
                ..Default::default()
            };
            volume_reply(controller.create_volume(req).await?.into_inner().volume.as_ref())
        }
        Op::DeleteVolume { id } => {
            controller
                .delete_volume(csi::DeleteVolumeRequest {
                    volume_id: id.clone(),
                    ..Default::default()
                })
                .await?;
            done_reply("deleted", &[("volumeId", &id)])
        }
        Op::ListVolumes => {
            let mut token = String::new();
            let mut entries = Vec::new();
            loop {
                let r = controller
                    .list_volumes(csi::ListVolumesRequest {
                        max_entries: 100,
                        starting_token: token,
                    })
                    .await?
                    .into_inner();
                entries.extend(r.entries);
                if r.next_token.is_empty() {
                    break;
                }
                token = r.next_token;
            }
            volumes_reply(&entries)
        }
        Op::Snapshot { source, name } => {
            let req = csi::CreateSnapshotRequest {
                source_volume_id: source,
                name,
                ..Default::default()
            };
            snapshot_reply(controller.create_snapshot(req).await?.into_inner().snapshot.as_ref())
        }
        Op::DeleteSnapshot { id } => {
            controller
                .delete_snapshot(csi::DeleteSnapshotRequest {
                    snapshot_id: id.clone(),
                    ..Default::default()
                })
                .await?;
            done_reply("deleted snapshot", &[("snapshotId", &id)])
        }
        Op::ListSnapshots => {
            let mut token = String::new();
            let mut snapshots = Vec::new();
            loop {
                let r = controller
                    .list_snapshots(csi::ListSnapshotsRequest {
                        max_entries: 100,
                        starting_token: token,
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                snapshots.extend(r.entries.into_iter().filter_map(|e| e.snapshot));
                if r.next_token.is_empty() {
                    break;
                }
                token = r.next_token;
            }
            snapshots_reply(&snapshots)
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
            done_reply("published", &[("volumeId", &id), ("targetPath", &target)])
        }
        Op::Unpublish { id, target } => {
            node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: id.clone(),
                target_path: target.clone(),
            })
            .await?;
            done_reply("unpublished", &[("volumeId", &id), ("targetPath", &target)])
        }
        Op::Stats { id, path } => {
            let req = csi::NodeGetVolumeStatsRequest {
                volume_id: id,
                volume_path: path,
                staging_target_path: String::new(),
            };
            stats_reply(&node.node_get_volume_stats(req).await?.into_inner())
        }
        Op::Trash { op } => super::call_trash::call(ch, op).await?,
        Op::Expand { id, size, target } => super::call_resize::expand(ch, id, size, target).await?,
        Op::Modify { id, parameters } => super::call_resize::modify(ch, id, parameters).await?,
    };
    Ok(reply)
}
