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
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex, PoisonError};

use hpp_fs::journal::{DEFAULT_CAPACITY, Journal, JournalError, JournalStats};
use hpp_fs::quota::Tuning;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ops::volumes::{self, Requested};
use crate::pool::Pool;
use crate::pool::fsops;

/// The journal file in a pool directory (the `.hpp-` prefix keeps it out of every listing).
pub const JOURNAL_NAME: &str = ".hpp-journal";

/// Which directory a volume was: its inode number and birth time. A volume id made again (a
/// clone or restore under the same name, not journaled) is another directory, so a deletion
/// redone after a crash never touches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirIdentity {
    /// Inode number.
    pub ino: u64,
    /// Birth time, seconds and nanoseconds, when the filesystem records it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub born: Option<(i64, u32)>,
}

impl DirIdentity {
    /// The identity of `name` in `dir` (not following a symlink); `None` when it is missing.
    pub fn of(dir: BorrowedFd<'_>, name: &str) -> Result<Option<DirIdentity>> {
        use rustix::fs::{AtFlags, StatxFlags};
        match rustix::fs::statx(
            dir,
            name,
            AtFlags::SYMLINK_NOFOLLOW,
            StatxFlags::INO | StatxFlags::BTIME,
        ) {
            Ok(st) => Ok(Some(DirIdentity {
                ino: st.stx_ino,
                born: StatxFlags::from_bits_retain(st.stx_mask)
                    .contains(StatxFlags::BTIME)
                    .then_some((st.stx_btime.tv_sec, st.stx_btime.tv_nsec)),
            })),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(Error::io(format!("stat {name}"), e)),
        }
    }
}

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
        /// The temporary it was built under: when the rename was lost but the temporary was
        /// not (it may hold what a tenant wrote and synced since), it is renamed into place.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        temp: Option<String>,
    },
    /// A volume was renamed away for deletion (or found gone).
    Delete {
        /// Volume id.
        id: String,
        /// The directory that was renamed away (`None`: it was already gone).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        was: Option<DirIdentity>,
    },
    /// A volume was moved into the pool's trash ([`crate::ops::trash`]) as this entry.
    Trash {
        /// Volume id.
        id: String,
        /// The directory that was moved.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        was: Option<DirIdentity>,
        /// Its name in the trash.
        entry: String,
    },
    /// A trash entry was made volume `id` again.
    Restore {
        /// The new volume id.
        id: String,
        /// The entry it was.
        entry: String,
    },
}

impl Record {
    /// The volume the record is about.
    pub fn id(&self) -> &str {
        match self {
            Record::Create { id, .. }
            | Record::Delete { id, .. }
            | Record::Trash { id, .. }
            | Record::Restore { id, .. } => id,
        }
    }

    /// A create record.
    pub fn create(id: &str, requested: Requested, tuning: &Tuning, temp: Option<String>) -> Record {
        Record::Create {
            id: id.to_owned(),
            required: requested.required,
            limit: requested.limit,
            tuning: tuning.pairs().into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            temp,
        }
    }
}

/// The journal of one pool, opened (and replayed) on first use.
#[derive(Debug, Default)]
pub struct VolumeJournal {
    slot: Mutex<Slot>,
    /// Flushes and records of the journals this process dropped after a failure (so the
    /// counters exported as metrics never go back).
    retired: Mutex<JournalStats>,
}

#[derive(Debug, Default)]
enum Slot {
    /// Not opened yet (or the pool could not be looked into last time).
    #[default]
    Unopened,
    Open(Arc<Journal>),
    /// Dropped after a failure; the file it had (device, inode), whose records this process
    /// has already redone.
    Forgotten((u64, u64)),
    /// This process syncs the pool directory instead, until it restarts.
    Without,
}

impl VolumeJournal {
    /// The journal of the pool directory `dir` (the caller's descriptor of `pool`), or `None`
    /// when this pool syncs its directory instead: a shared pool, or a filesystem where the
    /// journal cannot be made (full, read-only) or a foreign file holds its name. The first
    /// call redoes what the journal holds; every create and delete calls this before looking
    /// at the pool, so none runs before that is done. A journal open on another filesystem
    /// than `dir`'s (one mounted over the pool since) is replaced by `dir`'s own.
    pub fn get(&self, pool: &Pool, dir: BorrowedFd<'_>) -> Result<Option<Arc<Journal>>> {
        if pool.shared {
            return Ok(None);
        }
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        let replayed = match &*slot {
            Slot::Open(journal) if journal.is_in(dir) => return Ok(Some(journal.clone())),
            Slot::Open(journal) => Some(journal.identity()),
            Slot::Without => return Ok(None),
            Slot::Forgotten(identity) => Some(*identity),
            Slot::Unopened => None,
        };
        let (journal, records) = match Journal::open(dir, JOURNAL_NAME, DEFAULT_CAPACITY) {
            Ok(opened) => opened,
            Err(e @ (JournalError::CannotCreate(_) | JournalError::NotAJournal)) => {
                tracing::warn!(pool = %pool.name, error = %e, "no volume journal: creates and deletes sync the pool directory instead");
                *slot = Slot::Without;
                return Ok(None);
            }
            Err(e) => return Err(journal_error(e)),
        };
        // The same file again in this process (after a failed flush): nothing was lost without
        // a crash, and requests may be in flight; its records were redone when it was opened.
        let carried = match replayed == Some(journal.identity()) {
            true => Vec::new(),
            false => replay(pool, dir, &records),
        };
        journal.checkpoint(dir).map_err(journal_error)?;
        // What could not be redone stays recorded, for the next start to try again.
        for bytes in &carried {
            journal.append(dir, bytes).map_err(journal_error)?;
        }
        let journal = Arc::new(journal);
        *slot = Slot::Open(journal.clone());
        Ok(Some(journal))
    }

    /// Checkpoints the journal if it is open and still the one in `dir`.
    pub fn checkpoint_open(&self, dir: BorrowedFd<'_>) -> Result<()> {
        let slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        match &*slot {
            Slot::Open(journal) if journal.is_in(dir) => journal.checkpoint(dir).map_err(journal_error),
            _ => Ok(()),
        }
    }

    /// Whether the journal is open (and so in use).
    pub fn is_open(&self) -> bool {
        matches!(*self.slot.lock().unwrap_or_else(PoisonError::into_inner), Slot::Open(_))
    }

    /// Drops the open journal after a flush failed or its file was replaced: the next create or
    /// delete opens the journal again instead of trusting this one.
    fn forget(&self) {
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Slot::Open(journal) = &*slot {
            let last = journal.stats();
            let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
            retired.flushes += last.flushes;
            retired.records += last.records;
            *slot = Slot::Forgotten(journal.identity());
        }
    }

    /// Flushes and the records they made durable, over every journal this process opened for
    /// the pool.
    pub fn stats(&self) -> JournalStats {
        let slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        let retired = *self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        match &*slot {
            Slot::Open(journal) => {
                let now = journal.stats();
                JournalStats {
                    flushes: retired.flushes + now.flushes,
                    records: retired.records + now.records,
                    ..JournalStats::default()
                }
            }
            _ => retired,
        }
    }
}

/// Appends `record` to `pool`'s `journal`, found in the pool directory `dir`; returns once it is
/// durable.
pub fn append(pool: &Pool, journal: &Journal, dir: BorrowedFd<'_>, record: &Record) -> Result<()> {
    let state = pool.journal_state();
    journal
        .append(dir, &encode(record)?)
        .map_err(|e| append_error(state, e))
}

/// [`append`] without holding the thread: the record is queued, and the returned [`Deferred`]
/// resolves once it is durable. For async callers, so a request waiting for its flush holds no
/// blocking thread and is woken straight from the flush.
pub fn append_deferred(pool: &Pool, journal: &Journal, dir: BorrowedFd<'_>, record: &Record) -> Result<Deferred> {
    let bytes = encode(record)?;
    let deferred = Deferred(Arc::new(Mutex::new(Rendezvous::Flushing)));
    let flush = Flush(deferred.0.clone());
    let state = pool.journal_state().clone();
    let done = Box::new(move |outcome: std::result::Result<(), JournalError>| {
        flush.finish(outcome.map_err(|e| append_error(&state, e)));
    });
    journal
        .append_then(dir, &bytes, done)
        .map_err(|e| append_error(pool.journal_state(), e))?;
    Ok(deferred)
}

fn encode(record: &Record) -> Result<Vec<u8>> {
    serde_json::to_vec(record).map_err(|e| Error::Internal(format!("encoding a journal record: {e}")))
}

/// The error of a failed append; a journal that failed or was replaced is dropped, so the next
/// request opens it again instead of trusting it.
fn append_error(state: &VolumeJournal, e: JournalError) -> Error {
    if matches!(e, JournalError::Failed(_) | JournalError::Replaced) {
        state.forget();
    }
    journal_error(e)
}

/// A journal record on its way to disk ([`append_deferred`]). Its continuation runs once, on
/// whichever side comes second: the flush's thread, or the caller's when the flush was first.
#[derive(Debug)]
pub struct Deferred(Arc<Mutex<Rendezvous>>);

type Continuation = Box<dyn FnOnce(Result<()>) + Send>;

enum Rendezvous {
    Flushing,
    Flushed(Result<()>),
    Then(Continuation),
    Done,
}

impl std::fmt::Debug for Rendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Rendezvous::Flushing => "Flushing",
            Rendezvous::Flushed(_) => "Flushed",
            Rendezvous::Then(_) => "Then",
            Rendezvous::Done => "Done",
        })
    }
}

impl Deferred {
    /// Runs `f` with the flush's outcome once the record is durable (or its flush failed): at
    /// once when it already is, else on the thread that flushed it. `f` must be quick.
    pub fn then(self, f: impl FnOnce(Result<()>) + Send + 'static) {
        let mut st = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match std::mem::replace(&mut *st, Rendezvous::Done) {
            Rendezvous::Flushed(outcome) => {
                drop(st);
                f(outcome);
            }
            _ => *st = Rendezvous::Then(Box::new(f)),
        }
    }
}

/// The flush's side of a [`Deferred`]; dropped without [`finish`](Flush::finish) (the journal
/// went away with the record queued), it reports that.
struct Flush(Arc<Mutex<Rendezvous>>);

impl Flush {
    fn finish(&self, outcome: Result<()>) {
        let mut st = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match std::mem::replace(&mut *st, Rendezvous::Done) {
            Rendezvous::Flushing => *st = Rendezvous::Flushed(outcome),
            Rendezvous::Then(f) => {
                drop(st);
                f(outcome);
            }
            // Already finished: keep what was there.
            other => *st = other,
        }
    }
}

impl Drop for Flush {
    fn drop(&mut self) {
        self.finish(Err(stopped()));
    }
}

fn stopped() -> Error {
    Error::Unavailable("the pool's volume journal stopped before flushing the record".to_owned())
}

fn journal_error(e: JournalError) -> Error {
    match e {
        JournalError::Io { source, .. } => Error::io("the pool's volume journal", source),
        // Retried at once, against the journal opened again.
        JournalError::Replaced => Error::Aborted(format!("the pool's volume journal: {e}")),
        other => Error::Unavailable(format!("the pool's volume journal: {other}")),
    }
}

/// Redoes the last record of every volume where the pool disagrees with it. Returns the records
/// that could not be redone (logged): they are recorded again after the checkpoint, so a
/// volume a crash lost is never given up for a passing error (a full filesystem, say).
fn replay(pool: &Pool, dir: BorrowedFd<'_>, records: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut last: BTreeMap<String, (Record, &Vec<u8>)> = BTreeMap::new();
    for bytes in records {
        match serde_json::from_slice::<Record>(bytes) {
            Ok(record) => {
                last.insert(record.id().to_owned(), (record, bytes));
            }
            Err(e) => tracing::warn!(pool = %pool.name, error = %e, "skipping an unreadable journal record"),
        }
    }
    let mut carried = Vec::new();
    for (id, (record, bytes)) in last {
        if let Err(e) = pool.check_volume_name(&id) {
            tracing::warn!(pool = %pool.name, volume_id = %id, error = %e, "skipping a journal record with an invalid volume id");
            continue;
        }
        if let Err(e) = redo(pool, dir, record) {
            tracing::warn!(pool = %pool.name, volume_id = %id, error = %e, "cannot redo a journaled change; kept for the next start");
            carried.push(bytes.clone());
        }
    }
    carried
}

fn redo(pool: &Pool, dir: BorrowedFd<'_>, record: Record) -> Result<()> {
    match record {
        Record::Create {
            id,
            required,
            limit,
            tuning,
            temp,
        } => {
            // The class's settings, applied again to a volume made again or finished.
            let apply_tuning = |tuning: BTreeMap<String, String>| -> Result<()> {
                let tuning = crate::ops::modify::parse(pool, &tuning.into_iter().collect())?;
                crate::ops::modify::apply(pool, &id, &tuning)
            };
            if DirIdentity::of(dir, &id)?.is_some() {
                // An in-place create keeps its directory through a crash, but maybe not its
                // mode, capacity record or settings.
                if volumes::finish_if_cut_short(pool, dir, &id, required)? {
                    apply_tuning(tuning)?;
                    tracing::info!(pool = %pool.name, volume_id = %id, "finished a volume whose creation a crash had cut short");
                }
                return Ok(());
            }
            let kept = match &temp {
                Some(temp) if temp.starts_with(volumes::TEMP_PREFIX) && !temp.contains('/') => {
                    matches!(fsops::entry(dir, temp), Ok(fsops::Entry::Dir { .. }))
                        && fsops::rename_noreplace(dir, temp, &id).is_ok()
                }
                _ => false,
            };
            if !kept {
                volumes::build(pool, dir, &id, None, Requested { required, limit }, true)?;
                apply_tuning(tuning)?;
            }
            tracing::info!(pool = %pool.name, volume_id = %id, from_temporary = kept, "recreated a volume whose creation a crash had lost");
            Ok(())
        }
        Record::Delete { id, was } => {
            let Some(now) = DirIdentity::of(dir, &id)? else {
                return Ok(());
            };
            if was != Some(now) {
                // Made again since (a clone or restore under the same name): not the volume
                // whose deletion was recorded.
                return Ok(());
            }
            let mounts = hpp_fs::MountTableCache::default();
            volumes::retire(pool, dir, &id, &mounts)?;
            pool.quota.remove(dir, &volumes::deleting_name(&id))?;
            tracing::info!(pool = %pool.name, volume_id = %id, "deleted again a volume whose deletion a crash had lost");
            Ok(())
        }
        Record::Trash { id, was, entry } => crate::ops::trash::redo_move(pool, dir, &id, was, &entry),
        Record::Restore { id, entry } => crate::ops::trash::redo_restore(pool, dir, &id, &entry),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pending() -> (Deferred, Flush) {
        let deferred = Deferred(Arc::new(Mutex::new(Rendezvous::Flushing)));
        let flush = Flush(deferred.0.clone());
        (deferred, flush)
    }

    fn heard(deferred: Deferred) -> std::sync::mpsc::Receiver<Result<()>> {
        let (tx, rx) = std::sync::mpsc::channel();
        deferred.then(move |outcome| tx.send(outcome).unwrap());
        rx
    }

    #[test]
    fn a_deferred_continuation_runs_once_whichever_side_comes_second() {
        // The flush first: the continuation runs when it is attached.
        let (deferred, flush) = pending();
        flush.finish(Ok(()));
        drop(flush);
        let rx = heard(deferred);
        assert!(rx.try_recv().unwrap().is_ok());
        assert!(rx.try_recv().is_err(), "ran twice");

        // The continuation first: the flush runs it, with its error.
        let (deferred, flush) = pending();
        let rx = heard(deferred);
        assert!(rx.try_recv().is_err(), "ran before the flush");
        flush.finish(Err(Error::Unavailable("flush failed".to_owned())));
        assert!(matches!(rx.try_recv().unwrap(), Err(Error::Unavailable(m)) if m == "flush failed"));
        drop(flush);
        assert!(rx.try_recv().is_err(), "ran twice");

        // A journal dropping the queued record: the waiter hears that it stopped.
        let (deferred, flush) = pending();
        let rx = heard(deferred);
        drop(flush);
        assert!(matches!(rx.try_recv().unwrap(), Err(Error::Unavailable(m)) if m.contains("stopped")));
    }

    #[test]
    fn records_are_small_json_lines_that_round_trip() {
        let tuning = Tuning {
            inode_limit: Some(1000),
            compression: None,
        };
        let create = Record::create("pvc-1", Requested { required: 5, limit: 0 }, &tuning, None);
        let bytes = serde_json::to_vec(&create).unwrap();
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"op":"create","id":"pvc-1","required":5,"limit":0,"tuning":{"inodeLimit":"1000"}}"#
        );
        assert_eq!(serde_json::from_slice::<Record>(&bytes).unwrap(), create);
        let delete = Record::Delete {
            id: "pvc-1".into(),
            was: None,
        };
        let bytes = serde_json::to_vec(&delete).unwrap();
        assert_eq!(std::str::from_utf8(&bytes).unwrap(), r#"{"op":"delete","id":"pvc-1"}"#);
    }
}
