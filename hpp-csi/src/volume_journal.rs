//! A node-local pool's volume journal (`<pool>/.hpp-journal`): how a CreateVolume or
//! DeleteVolume of an empty volume is made durable before it is acknowledged.
//!
//! The change is made first (the volume renamed into place, or renamed away), then a record
//! that is enough to redo it is appended to the journal ([`hpp_fs::journal`]). Concurrent
//! requests share one `fdatasync` of the journal's preallocated blocks: no journal commit of the
//! pool's filesystem, so a create costs a third of a directory `fsync` here and does not pay for
//! what other tenants changed. The first use of the journal after a start (before any create or
//! delete is served) redoes what the records say and a crash may have lost, then checkpoints.
//!
//! Not journaled, and synced with the pool directory as before: clones and restores (a record
//! cannot bring back copied data), and shared pools (several nodes would write one journal).

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex, PoisonError};

use hpp_fs::journal::{DEFAULT_CAPACITY, Journal, JournalError};
use hpp_fs::quota::Tuning;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::pool::Pool;
use crate::volumes::{self, Requested};

/// The journal file in a pool directory (the `.hpp-` prefix keeps it out of every listing).
pub const JOURNAL_NAME: &str = ".hpp-journal";

/// One journaled change of a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Record {
    /// An empty volume was created with this capacity range and these mutable parameters.
    Create {
        /// Volume id.
        id: String,
        /// `required_bytes` as created.
        required: u64,
        /// `limit_bytes`.
        limit: u64,
        /// Mutable parameters applied at creation.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        tuning: BTreeMap<String, String>,
    },
    /// A volume was renamed away for deletion (or found gone).
    Delete {
        /// Volume id.
        id: String,
    },
}

impl Record {
    fn id(&self) -> &str {
        match self {
            Record::Create { id, .. } | Record::Delete { id } => id,
        }
    }

    /// A create record.
    pub fn create(id: &str, requested: Requested, tuning: &Tuning) -> Record {
        Record::Create {
            id: id.to_owned(),
            required: requested.required,
            limit: requested.limit,
            tuning: tuning.pairs().into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        }
    }
}

/// The journal of one pool, opened (and replayed) on first use.
#[derive(Debug, Default)]
pub struct VolumeJournal {
    slot: Mutex<Slot>,
}

#[derive(Debug, Default)]
enum Slot {
    /// Not opened yet (or the pool could not be looked into last time).
    #[default]
    Unopened,
    Open(Arc<Journal>),
    /// This process syncs the pool directory instead, until it restarts.
    Without,
}

impl VolumeJournal {
    /// The pool's journal, or `None` when this pool syncs its directory instead: a shared pool,
    /// or a filesystem where the journal cannot be made (full, read-only) or a foreign file
    /// holds its name. The first call redoes what the journal holds; every create and delete
    /// calls this before looking at the pool, so none runs before that is done.
    pub fn get(&self, pool: &Pool) -> Result<Option<Arc<Journal>>> {
        if pool.shared {
            return Ok(None);
        }
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        match &*slot {
            Slot::Open(journal) => return Ok(Some(journal.clone())),
            Slot::Without => return Ok(None),
            Slot::Unopened => {}
        }
        let dir = pool.open()?;
        let (journal, records) = match Journal::open(dir.as_fd(), JOURNAL_NAME, DEFAULT_CAPACITY) {
            Ok(opened) => opened,
            Err(e @ (JournalError::CannotCreate(_) | JournalError::NotAJournal)) => {
                tracing::warn!(pool = %pool.name, error = %e, "no volume journal: creates and deletes sync the pool directory instead");
                *slot = Slot::Without;
                return Ok(None);
            }
            Err(e) => return Err(journal_error(e)),
        };
        let redone = replay(pool, dir.as_fd(), &records);
        journal.checkpoint(dir.as_fd()).map_err(journal_error)?;
        if redone > 0 {
            tracing::info!(pool = %pool.name, records = records.len(), redone, "redid journaled volume changes a crash had lost");
        }
        let journal = Arc::new(journal);
        *slot = Slot::Open(journal.clone());
        Ok(Some(journal))
    }

    /// Whether the journal is open (and so in use).
    pub fn is_open(&self) -> bool {
        matches!(*self.slot.lock().unwrap_or_else(PoisonError::into_inner), Slot::Open(_))
    }

    /// Drops the open journal after it failed (a flush error, or its file replaced by a mount
    /// over the pool): the next create or delete opens the journal again, redoing what it
    /// holds, instead of trusting this one.
    fn forget(&self) {
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(*slot, Slot::Open(_)) {
            *slot = Slot::Unopened;
        }
    }
}

/// Appends `record` to `pool`'s `journal`, found in the pool directory `dir`; returns once it is
/// durable.
pub fn append(pool: &Pool, journal: &Journal, dir: BorrowedFd<'_>, record: &Record) -> Result<()> {
    let bytes = serde_json::to_vec(record).map_err(|e| Error::Internal(format!("encoding a journal record: {e}")))?;
    journal.append(dir, &bytes).map_err(|e| {
        pool.journal_state().forget();
        journal_error(e)
    })
}

fn journal_error(e: JournalError) -> Error {
    match e {
        JournalError::Io { source, .. } => Error::io("the pool's volume journal", source),
        // Retried at once, against the journal opened again.
        JournalError::Replaced => Error::Aborted(format!("the pool's volume journal: {e}")),
        other => Error::Unavailable(format!("the pool's volume journal: {other}")),
    }
}

/// Redoes the last record of every volume where the pool disagrees with it; returns how many
/// changes were redone. A record that cannot be redone is logged and left: the volume stays as
/// the crash left it, for the CO's retry (or an admin) to settle.
fn replay(pool: &Pool, dir: BorrowedFd<'_>, records: &[Vec<u8>]) -> usize {
    let mut last: BTreeMap<String, Record> = BTreeMap::new();
    for bytes in records {
        match serde_json::from_slice::<Record>(bytes) {
            Ok(record) => {
                last.insert(record.id().to_owned(), record);
            }
            Err(e) => tracing::warn!(pool = %pool.name, error = %e, "skipping an unreadable journal record"),
        }
    }
    let mut redone = 0;
    for (id, record) in last {
        if let Err(e) = pool.check_volume_name(&id) {
            tracing::warn!(pool = %pool.name, volume_id = %id, error = %e, "skipping a journal record with an invalid volume id");
            continue;
        }
        match redo(pool, dir, record) {
            Ok(true) => redone += 1,
            Ok(false) => {}
            Err(e) => tracing::warn!(pool = %pool.name, volume_id = %id, error = %e, "cannot redo a journaled change"),
        }
    }
    redone
}

fn redo(pool: &Pool, dir: BorrowedFd<'_>, record: Record) -> Result<bool> {
    match record {
        Record::Create {
            id,
            required,
            limit,
            tuning,
        } => {
            if volumes::exists(pool, &id)? {
                return Ok(false);
            }
            let requested = Requested { required, limit };
            volumes::build(pool, dir, &id, None, requested)?;
            let params = tuning.into_iter().collect();
            let tuning = Tuning::parse(&params).map_err(|e| Error::InvalidArgument(e.to_string()))?;
            crate::modify::apply(pool, &id, &tuning)?;
            tracing::info!(pool = %pool.name, volume_id = %id, "recreated a volume whose creation a crash had lost");
            Ok(true)
        }
        Record::Delete { id } => {
            if !volumes::exists(pool, &id)? {
                return Ok(false);
            }
            let mounts = hpp_fs::MountTableCache::default();
            volumes::retire(pool, dir, &id, &mounts)?;
            pool.quota.remove(dir.as_fd(), &volumes::deleting_name(&id))?;
            tracing::info!(pool = %pool.name, volume_id = %id, "deleted again a volume whose deletion a crash had lost");
            Ok(true)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn records_are_small_json_lines_that_round_trip() {
        let tuning = Tuning {
            inode_limit: Some(1000),
            compression: None,
        };
        let create = Record::create("pvc-1", Requested { required: 5, limit: 0 }, &tuning);
        let bytes = serde_json::to_vec(&create).unwrap();
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"op":"create","id":"pvc-1","required":5,"limit":0,"tuning":{"inodeLimit":"1000"}}"#
        );
        assert_eq!(serde_json::from_slice::<Record>(&bytes).unwrap(), create);
        let delete = Record::Delete { id: "pvc-1".into() };
        let bytes = serde_json::to_vec(&delete).unwrap();
        assert_eq!(std::str::from_utf8(&bytes).unwrap(), r#"{"op":"delete","id":"pvc-1"}"#);
    }
}
