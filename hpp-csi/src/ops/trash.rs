//! A pool's trash: deleted volumes kept for a while instead of removed at once, so a claim
//! deleted by mistake can be brought back.
//!
//! With a retention set (`trashRetention` in `--datadir`), DeleteVolume renames the volume
//! directory into `<pool>/.hpp-trash/<volume id>@<deleted at, unix seconds>`: one rename on the
//! same filesystem, journaled like a deletion, so it is as durable and as cheap. Nothing is
//! copied and nothing the backend attached is released: a btrfs subvolume keeps its qgroup
//! limit, a project id its quota, an image its size, so a trashed volume cannot grow. The
//! `.hpp-` prefix keeps the directory out of every listing, so ListVolumes, the capacity
//! ledger and GetCapacity treat the volume as gone; only the bytes it holds are still used on
//! the filesystem until it is purged.
//!
//! [`purge`] removes entries older than the retention and, while the filesystem's free space
//! is under the floor (`trashMinFreePercent`, default 10), the oldest ones first. An entry is
//! renamed to `.hpp-del-<entry>` inside the trash before its tree is removed, so a removal a
//! crash cut short is never listed or restored, and is finished by the next purge. Only names
//! of the trash's own form, inside the trash directory, are ever removed.
//!
//! [`restore`] renames an entry back into the pool under a new volume id (for a static PV, so
//! a re-created claim can bind to it), journaled like a creation.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::SystemTime;

use hpp_fs::MountTableCache;
use hpp_fs::trash::TrashError;

use crate::error::{Error, Result};
use crate::ops::volume_journal::{self, DirIdentity, Record};
use crate::ops::volumes;
use crate::pool::Pool;
use crate::pool::fsops::{self, Entry};

pub use hpp_fs::trash::{EntryName, PurgeReason, PurgeReport, TRASH_DIR, purge_interval};

/// Extended attribute naming the claim (`namespace/name`) a volume was created for, recorded
/// at creation in pools with a trash so a listing of the trash can say whose data an entry is.
/// `trusted.*`: tenants can neither read nor forge it.
pub const CLAIM_XATTR: &str = "trusted.hpp.claim";

/// CreateVolume parameters the csi-provisioner adds with `--extra-create-metadata`.
pub const PARAM_CLAIM_NAME: &str = "csi.storage.k8s.io/pvc/name";
/// See [`PARAM_CLAIM_NAME`].
pub const PARAM_CLAIM_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";

/// Most sizes one [`refresh_sizes`] measures (each may walk a tree).
const MAX_MEASURES_PER_PASS: usize = 16;

/// One entry of a pool's trash, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrashEntry {
    /// The pool.
    pub pool: String,
    /// The entry's name in the trash (what [`restore`] and an admin purge take).
    pub name: EntryName,
    /// The claim the volume was created for (`namespace`, `name`), when recorded.
    pub claim: Option<(String, String)>,
    /// Bytes it holds, once measured.
    pub bytes: Option<u64>,
    /// When the retention ends (`None`: the pool has no retention; kept until purged by hand).
    pub purge_at: Option<SystemTime>,
}

/// Totals of a pool's trash, for the gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrashTotals {
    /// Entries.
    pub entries: u64,
    /// Bytes of the entries measured so far.
    pub bytes: u64,
}

/// Opens the trash directory of the pool directory `dir` ([`hpp_fs::trash::open`]), its
/// errors as the driver reports them.
pub fn open_dir(pool: &Pool, dir: BorrowedFd<'_>, create: bool) -> Result<Option<OwnedFd>> {
    hpp_fs::trash::open(dir, create).map_err(|e| trash_error(pool, e))
}

/// A trash error as a gRPC-coded driver error.
fn trash_error(pool: &Pool, e: TrashError) -> Error {
    let pool_dir = pool.path.display();
    match e {
        e @ (TrashError::NotADirectory | TrashError::OtherFilesystem) => Error::FailedPrecondition(format!(
            "{pool_dir}/{TRASH_DIR}: {e}; the trash of storage pool {} cannot be used until it is fixed",
            pool.name
        )),
        e @ TrashError::CrossDevice { .. } => Error::FailedPrecondition(format!(
            "storage pool {}: {e}; turn the trash off for this pool",
            pool.name
        )),
        TrashError::Exists(name) => {
            Error::AlreadyExists(format!("{name} already exists in storage pool {}", pool.name))
        }
        TrashError::Missing(name) => Error::NotFound(format!(
            "storage pool {} has no {name} (it may have been purged or restored already)",
            pool.name
        )),
        e @ TrashError::NameTooLong(_) => Error::InvalidArgument(e.to_string()),
        TrashError::Io { op, source } => Error::io(op, source),
        other => Error::Internal(other.to_string()),
    }
}

/// Moves volume `id` of the pool directory `dir` into the trash, after the same checks as a
/// deletion (a real directory on the pool's filesystem, mounted nowhere, not in use). Returns
/// the entry's name; `None` when the volume does not exist. Makes nothing durable (the caller
/// journals or syncs).
pub(crate) fn move_in(
    pool: &Pool,
    dir: BorrowedFd<'_>,
    trash: BorrowedFd<'_>,
    id: &str,
    mounts: &MountTableCache,
    now: SystemTime,
) -> Result<Option<EntryName>> {
    if !volumes::check_retirable(pool, dir, id, mounts)? {
        return Ok(None);
    }
    match hpp_fs::trash::move_in(dir, id, trash, now) {
        Ok(entry) => Ok(Some(entry)),
        Err(TrashError::Missing(_)) => Ok(None),
        Err(e) => Err(trash_error(pool, e)),
    }
}

/// DeleteVolume in a pool with a trash (and an admin's move of an orphan in any pool): the
/// volume moves into the trash instead of being removed, durably before this returns. Returns
/// its entry; `None` when there was no such volume.
pub(crate) fn delete_into(
    pool: &Pool,
    dir: BorrowedFd<'_>,
    id: &str,
    mounts: &MountTableCache,
) -> Result<Option<EntryName>> {
    let journal = pool.journal_in(dir)?;
    let was = match &journal {
        Some(_) => DirIdentity::of(dir, id)?,
        None => None,
    };
    let trash = match fsops::entry(dir, id).map_err(|e| Error::io(format!("stat volume {id}"), e))? {
        Entry::Missing => None,
        _ => open_dir(pool, dir, true)?,
    };
    let moved = match &trash {
        Some(trash) => move_in(pool, dir, trash.as_fd(), id, mounts, SystemTime::now())?,
        None => None,
    };
    match (&journal, &moved) {
        (Some(journal), Some(entry)) => {
            let record = Record::Trash {
                id: id.to_owned(),
                was,
                entry: entry.to_string(),
            };
            volume_journal::append(pool, journal, dir, &record)?;
        }
        // Already gone: as a deletion does, so the record of a lost create is superseded.
        (Some(journal), None) => {
            let record = Record::Delete {
                id: id.to_owned(),
                was: None,
            };
            volume_journal::append(pool, journal, dir, &record)?;
        }
        (None, _) => {
            pool.volume_commits().entries(dir)?;
            if let Some(trash) = &trash {
                rustix::fs::fsync(trash).map_err(|e| Error::io("syncing the trash directory", e))?;
            }
        }
    }
    if let Some(entry) = &moved {
        tracing::info!(pool = %pool.name, volume_id = %id, entry = %entry, "volume moved into the trash");
    }
    Ok(moved)
}

/// Redoes a trash move a crash lost: `id` is still the directory that was moved.
pub(crate) fn redo_move(
    pool: &Pool,
    dir: BorrowedFd<'_>,
    id: &str,
    was: Option<DirIdentity>,
    entry: &str,
) -> Result<()> {
    let Some(now) = DirIdentity::of(dir, id)? else {
        return Ok(());
    };
    if was != Some(now) || EntryName::parse(entry).is_none() {
        return Ok(());
    }
    let Some(trash) = open_dir(pool, dir, true)? else {
        return Ok(());
    };
    let mounts = MountTableCache::default();
    if !volumes::check_retirable(pool, dir, id, &mounts)? {
        return Ok(());
    }
    rustix::fs::renameat_with(dir, id, trash.as_fd(), entry, rustix::fs::RenameFlags::NOREPLACE)
        .map_err(|e| Error::io(format!("moving volume {id} into the trash"), e))?;
    tracing::info!(pool = %pool.name, volume_id = %id, entry, "moved again into the trash a volume whose move a crash had lost");
    Ok(())
}

/// Redoes a restore a crash lost: the entry is still in the trash and `id` is free.
pub(crate) fn redo_restore(pool: &Pool, dir: BorrowedFd<'_>, id: &str, entry: &str) -> Result<()> {
    if DirIdentity::of(dir, id)?.is_some() || EntryName::parse(entry).is_none() {
        return Ok(());
    }
    let Some(trash) = open_dir(pool, dir, false)? else {
        return Ok(());
    };
    match hpp_fs::trash::take_out(trash.as_fd(), entry, dir, id) {
        Ok(()) => {}
        Err(TrashError::Missing(_) | TrashError::Exists(_)) => return Ok(()),
        Err(e) => return Err(trash_error(pool, e)),
    }
    tracing::info!(pool = %pool.name, volume_id = %id, entry, "restored again a trash entry whose restore a crash had lost");
    Ok(())
}

/// Records the claim a volume is created for (best effort: only the trash listing reads it).
pub(crate) fn remember_claim(pool: &Pool, dir: BorrowedFd<'_>, id: &str, claim: &(String, String)) {
    let value = format!("{}/{}", claim.0, claim.1);
    let outcome = fsops::open_child_dir(dir, id)
        .and_then(|fd| rustix::fs::fsetxattr(&fd, CLAIM_XATTR, value.as_bytes(), rustix::fs::XattrFlags::empty()));
    if let Err(e) = outcome {
        tracing::debug!(pool = %pool.name, volume_id = %id, error = %e, "cannot record the volume's claim for the trash listing");
    }
}

/// The claim named by CreateVolume parameters, when the csi-provisioner sent it.
pub fn claim_of(params: &HashMap<String, String>) -> Option<(String, String)> {
    let ns = params.get(PARAM_CLAIM_NAMESPACE)?;
    let name = params.get(PARAM_CLAIM_NAME)?;
    (!ns.is_empty() && !name.is_empty() && !ns.contains('/')).then(|| (ns.clone(), name.clone()))
}

fn read_claim(entry: BorrowedFd<'_>) -> Option<(String, String)> {
    let mut buf = [0u8; 512];
    let n = rustix::fs::fgetxattr(entry, CLAIM_XATTR, &mut buf).ok()?;
    let text = std::str::from_utf8(buf.get(..n)?).ok()?;
    let (ns, name) = text.split_once('/')?;
    Some((ns.to_owned(), name.to_owned()))
}

/// The entries of `pool`'s trash, oldest first (empty when the pool has none). The sizes are
/// those measured so far ([`refresh_sizes`]); a listing never walks a tree.
pub fn list(pool: &Pool) -> Result<Vec<TrashEntry>> {
    let dir = pool.open()?;
    let Some(trash) = open_dir(pool, dir.as_fd(), false)? else {
        return Ok(Vec::new());
    };
    let mut entries = Vec::new();
    for name in hpp_fs::trash::entries(trash.as_fd()).map_err(|e| trash_error(pool, e))? {
        let claim = fsops::open_child_dir(trash.as_fd(), name.to_string())
            .ok()
            .and_then(|fd| read_claim(fd.as_fd()));
        let purge_at = pool.trash.map(|t| name.purge_at(t.retention));
        entries.push(TrashEntry {
            pool: pool.name.clone(),
            bytes: pool.trash_book().size(&name.to_string()),
            name,
            claim,
            purge_at,
        });
    }
    Ok(entries)
}

/// A trash entry made a volume again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The new volume id.
    pub volume_id: String,
    /// Its recorded capacity, when it has one.
    pub capacity: Option<u64>,
}

/// Makes trash entry `entry` of `pool` the volume `new_id` (one rename, durable before this
/// returns). The caller holds `new_id`'s in-flight lock and, in an enforcing pool, a ledger
/// reservation for its capacity ([`entry_capacity`]).
pub fn restore(pool: &Pool, entry: &str, new_id: &str) -> Result<Restored> {
    let name = EntryName::parse(entry).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{entry:?} is not the name of a trash entry (<volume id>@<seconds>)"
        ))
    })?;
    pool.check_volume_name(new_id)?;
    let dir = pool.open()?;
    let journal = pool.journal_in(dir.as_fd())?;
    let trash = open_dir(pool, dir.as_fd(), false)?.ok_or_else(|| no_entry(pool, entry))?;
    match hpp_fs::trash::take_out(trash.as_fd(), entry, dir.as_fd(), new_id) {
        Ok(()) => {}
        Err(TrashError::Exists(_)) => {
            return Err(Error::AlreadyExists(format!(
                "volume {new_id} already exists in storage pool {}; restore under another id",
                pool.name
            )));
        }
        Err(e) => return Err(trash_error(pool, e)),
    }
    match &journal {
        Some(journal) => {
            let record = Record::Restore {
                id: new_id.to_owned(),
                entry: entry.to_owned(),
            };
            volume_journal::append(pool, journal, dir.as_fd(), &record)?;
        }
        None => {
            pool.volume_commits().entries(dir.as_fd())?;
            rustix::fs::fsync(&trash).map_err(|e| Error::io("syncing the trash directory", e))?;
        }
    }
    // The new claim is someone else's: the old name would only mislead a later listing.
    if let Ok(fd) = fsops::open_child_dir(dir.as_fd(), new_id) {
        let _ = rustix::fs::fremovexattr(&fd, CLAIM_XATTR);
    }
    let capacity = volumes::recorded_capacity(dir.as_fd(), new_id)?;
    tracing::info!(pool = %pool.name, entry, volume_id = %new_id, was = %name.volume_id, "trash entry restored as a volume");
    Ok(Restored {
        volume_id: new_id.to_owned(),
        capacity,
    })
}

/// The capacity recorded on trash entry `entry` (to reserve before restoring it).
pub fn entry_capacity(pool: &Pool, entry: &str) -> Result<Option<u64>> {
    let dir = pool.open()?;
    let trash = open_dir(pool, dir.as_fd(), false)?.ok_or_else(|| no_entry(pool, entry))?;
    if EntryName::parse(entry).is_none() {
        return Err(no_entry(pool, entry));
    }
    volumes::recorded_capacity(trash.as_fd(), entry)
}

fn no_entry(pool: &Pool, entry: &str) -> Error {
    Error::NotFound(format!(
        "storage pool {} has no trash entry {entry:?} (it may have been purged or restored already)",
        pool.name
    ))
}

/// Which entries [`purge`] removes.
#[derive(Debug, Clone, Copy)]
pub enum Purge<'a> {
    /// Those older than the pool's retention, then the oldest while free space is under its
    /// floor (nothing in a pool without a retention).
    Due {
        /// The time to judge ages by.
        now: SystemTime,
    },
    /// This one, because an admin asked.
    Entry(&'a str),
}

/// Removes entries of `pool`'s trash (see [`Purge`]) through the pool's quota backend (a
/// subvolume with its qgroup, a project id's limit), at most [`hpp_fs::trash::MAX_PURGES_PER_PASS`] per call.
pub fn purge(pool: &Pool, which: Purge<'_>) -> Result<PurgeReport> {
    let dir = pool.open()?;
    let Some(trash) = open_dir(pool, dir.as_fd(), false)? else {
        return match which {
            Purge::Entry(entry) => Err(no_entry(pool, entry)),
            Purge::Due { .. } => Ok(PurgeReport::default()),
        };
    };
    let which = match which {
        Purge::Entry(entry) => hpp_fs::trash::Purge::Entry(entry),
        Purge::Due { now } => match pool.trash {
            Some(settings) => hpp_fs::trash::Purge::Due { settings, now },
            None => return Ok(PurgeReport::default()),
        },
    };
    hpp_fs::trash::purge(trash.as_fd(), which, |fd, name| pool.quota.remove(fd, name)).map_err(|e| match e {
        TrashError::Missing(entry) => no_entry(pool, &entry),
        e => trash_error(pool, e),
    })
}

/// Measures entries not measured yet (at most a few per call: each may walk a tree) and
/// returns the trash's totals.
pub fn refresh_sizes(pool: &Pool) -> Result<TrashTotals> {
    let dir = pool.open()?;
    let Some(trash) = open_dir(pool, dir.as_fd(), false)? else {
        pool.trash_book().keep_only(&[]);
        return Ok(TrashTotals::default());
    };
    let names: Vec<String> = hpp_fs::trash::entries(trash.as_fd())
        .map_err(|e| trash_error(pool, e))?
        .iter()
        .map(ToString::to_string)
        .collect();
    let book = pool.trash_book();
    book.keep_only(&names);
    let mut measured = 0;
    let mut totals = TrashTotals {
        entries: names.len() as u64,
        bytes: 0,
    };
    for name in &names {
        let bytes = match book.size(name) {
            Some(b) => Some(b),
            None if measured < MAX_MEASURES_PER_PASS => {
                measured += 1;
                let bytes = crate::ops::volumes::used_bytes(pool, trash.as_fd(), name);
                if let Some(b) = bytes {
                    book.note(name, b);
                }
                bytes
            }
            None => None,
        };
        totals.bytes += bytes.unwrap_or(0);
    }
    Ok(totals)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn claims_come_from_the_provisioners_metadata() {
        let mut params = HashMap::new();
        assert_eq!(claim_of(&params), None);
        params.insert(PARAM_CLAIM_NAME.to_owned(), "data".to_owned());
        params.insert(PARAM_CLAIM_NAMESPACE.to_owned(), "shop".to_owned());
        assert_eq!(claim_of(&params), Some(("shop".into(), "data".into())));
        params.insert(PARAM_CLAIM_NAMESPACE.to_owned(), "a/b".to_owned());
        assert_eq!(claim_of(&params), None);
    }
}
