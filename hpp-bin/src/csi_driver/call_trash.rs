//! `hpp-csi-driver call trash …`: the client of the driver's admin service
//! (`hpp.admin.v1.Trash`, on the CSI socket): list the trash of deleted volumes, restore an
//! entry under a new volume id, purge one now, or move a volume (an orphan) into it.

use serde_json::{Value, json};

use hpp_csi::admin::{TrashClient, proto};

use super::call::{CallError, Reply, human_bytes};

/// What `call trash` does.
#[derive(Debug, clap::Subcommand)]
pub enum TrashOp {
    /// The entries of every pool's trash (or one pool's), oldest first.
    List {
        /// Only this pool.
        #[arg(long)]
        pool: Option<String>,
    },
    /// Makes a trash entry a volume again, under a new id (for a static PV).
    Restore {
        /// The entry, as `list` shows it (`<volume id>@<seconds>`).
        entry: String,
        /// The new volume id [default: <old id>-restored].
        #[arg(long = "as")]
        volume_id: Option<String>,
        /// The pool holding the entry [default: the one whose trash has it].
        #[arg(long)]
        pool: Option<String>,
    },
    /// Removes a trash entry now, for good.
    Purge {
        /// The entry.
        entry: String,
        /// The pool holding the entry [default: the one whose trash has it].
        #[arg(long)]
        pool: Option<String>,
    },
    /// Moves a volume into its pool's trash (an orphan: a directory no PersistentVolume refers
    /// to). Without a trash retention in that pool it stays until purged by hand.
    Move {
        /// Volume id.
        id: String,
        /// The pool holding it [default: whichever has it].
        #[arg(long)]
        pool: Option<String>,
    },
}

fn time(unix: i64) -> Option<String> {
    let secs = u64::try_from(unix).ok().filter(|s| *s > 0)?;
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    Some(humantime::format_rfc3339_seconds(at).to_string())
}

fn entry_json(e: &proto::TrashEntry) -> Value {
    let claim = (!e.claim_name.is_empty()).then(|| json!({ "namespace": e.claim_namespace, "name": e.claim_name }));
    json!({
        "pool": e.pool,
        "entry": e.entry,
        "volumeId": e.volume_id,
        "claim": claim,
        "deletedAt": time(e.deleted_at),
        "purgeAt": time(e.purge_at),
        "bytes": (e.bytes >= 0).then_some(e.bytes),
    })
}

fn entry_row(e: &proto::TrashEntry) -> Vec<String> {
    let claim = match e.claim_name.as_str() {
        "" => "-".to_owned(),
        name => format!("{}/{name}", e.claim_namespace),
    };
    vec![
        e.pool.clone(),
        e.entry.clone(),
        claim,
        if e.bytes >= 0 {
            human_bytes(e.bytes)
        } else {
            "?".to_owned()
        },
        time(e.deleted_at).unwrap_or_else(|| "-".to_owned()),
        time(e.purge_at).unwrap_or_else(|| "never".to_owned()),
    ]
}

/// The reply to ListTrash.
pub fn list_reply(entries: &[proto::TrashEntry]) -> Reply {
    Reply::table(
        Value::Array(entries.iter().map(entry_json).collect()),
        vec!["POOL", "ENTRY", "CLAIM", "SIZE", "DELETED", "PURGE"],
        entries.iter().map(entry_row).collect(),
    )
}

/// Runs `op` over `ch`.
pub async fn call(ch: tonic::transport::Channel, op: TrashOp) -> Result<Reply, CallError> {
    let mut trash = TrashClient::new(ch);
    Ok(match op {
        TrashOp::List { pool } => {
            let req = proto::ListTrashRequest {
                pool: pool.unwrap_or_default(),
            };
            list_reply(&trash.list_trash(req).await?.into_inner().entries)
        }
        TrashOp::Restore { entry, volume_id, pool } => {
            let req = proto::RestoreTrashRequest {
                pool: pool.unwrap_or_default(),
                entry: entry.clone(),
                volume_id: volume_id.unwrap_or_default(),
            };
            let r = trash.restore_trash(req).await?.into_inner();
            let capacity = (r.capacity_bytes > 0).then_some(r.capacity_bytes);
            Reply::line(
                json!({ "pool": r.pool, "entry": entry, "volumeId": r.volume_id, "capacityBytes": capacity }),
                format!("restored {entry} as volume {} in pool {}", r.volume_id, r.pool),
            )
        }
        TrashOp::Purge { entry, pool } => {
            let req = proto::PurgeTrashRequest {
                pool: pool.unwrap_or_default(),
                entry: entry.clone(),
            };
            trash.purge_trash(req).await?;
            Reply::line(json!({ "entry": entry }), format!("purged {entry}"))
        }
        TrashOp::Move { id, pool } => {
            let req = proto::TrashVolumeRequest {
                volume_id: id.clone(),
                pool: pool.unwrap_or_default(),
            };
            let r = trash.trash_volume(req).await?.into_inner();
            Reply::line(
                json!({ "pool": r.pool, "volumeId": id, "entry": r.entry }),
                format!("moved volume {id} of pool {} into the trash as {}", r.pool, r.entry),
            )
        }
    })
}
