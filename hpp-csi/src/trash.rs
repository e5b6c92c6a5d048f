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
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::io::Errno;

use hpp_fs::MountTableCache;

use crate::error::{Error, Result};
use crate::fsops::{self, Entry};
use crate::pool::Pool;
use crate::volume_journal::{self, DirIdentity, Record};
use crate::volumes::{self, DELETING_PREFIX};

/// The trash directory inside a pool directory.
pub const TRASH_DIR: &str = ".hpp-trash";

/// Extended attribute naming the claim (`namespace/name`) a volume was created for, recorded
/// at creation in pools with a trash so a listing of the trash can say whose data an entry is.
/// `trusted.*`: tenants can neither read nor forge it.
pub const CLAIM_XATTR: &str = "trusted.hpp.claim";

/// CreateVolume parameters the csi-provisioner adds with `--extra-create-metadata`.
pub const PARAM_CLAIM_NAME: &str = "csi.storage.k8s.io/pvc/name";
/// See [`PARAM_CLAIM_NAME`].
pub const PARAM_CLAIM_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";

/// Most entries one [`purge`] removes; the next one goes on. Bounds how long a purge holds its
/// thread when thousands of entries fall due at once.
pub const MAX_PURGES_PER_PASS: usize = 64;

/// Most sizes one [`refresh_sizes`] measures (each may walk a tree).
const MAX_MEASURES_PER_PASS: usize = 16;

/// A pool's trash settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrashSettings {
    /// How long an entry is kept.
    pub retention: Duration,
    /// Free space (percent) under which entries are purged early, oldest first.
    pub min_free_percent: u32,
}

/// Why an entry was purged (the label of the purge counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PurgeReason {
    /// Older than the retention.
    Age,
    /// The filesystem's free space was under the floor.
    Space,
    /// An admin asked for it.
    Admin,
}

impl PurgeReason {
    /// The label value: `age`, `space`, `admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            PurgeReason::Age => "age",
            PurgeReason::Space => "space",
            PurgeReason::Admin => "admin",
        }
    }
}

/// The name of an entry in the trash: `<volume id>@<deleted at, unix seconds>`, ordered oldest
/// first. Volume ids may hold `@` themselves, so the id is everything before the last one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct EntryName {
    /// When the volume was trashed, in seconds since the epoch.
    pub deleted_at: u64,
    /// The volume id it had.
    pub volume_id: String,
}

impl EntryName {
    /// Parses an entry name; `None` for anything else (such names are never touched).
    pub fn parse(name: &str) -> Option<EntryName> {
        if name.starts_with('.') || name.contains('/') {
            return None;
        }
        let (id, secs) = name.rsplit_once('@')?;
        if id.is_empty() || secs.is_empty() || !secs.bytes().all(|b| b.is_ascii_digit()) || secs.len() > 12 {
            return None;
        }
        Some(EntryName {
            deleted_at: secs.parse().ok()?,
            volume_id: id.to_owned(),
        })
    }

    /// When the volume was trashed.
    pub fn deleted_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.deleted_at)
    }
}

impl std::fmt::Display for EntryName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.volume_id, self.deleted_at)
    }
}

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

/// What [`purge`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Entries removed, with why.
    pub purged: Vec<(String, PurgeReason)>,
    /// Entries whose removal failed (logged; tried again next time).
    pub failed: usize,
    /// Whether entries due were left for the next pass ([`MAX_PURGES_PER_PASS`]).
    pub more: bool,
}

/// Per-pool memory of the trash: the measured size of each entry (a walk each), so listings
/// and the gauges do not walk the trash again.
#[derive(Debug, Default)]
pub struct TrashBook {
    sizes: Mutex<HashMap<String, u64>>,
}

impl TrashBook {
    fn size(&self, entry: &str) -> Option<u64> {
        self.sizes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(entry)
            .copied()
    }

    fn keep_only(&self, present: &[String]) {
        let mut sizes = self.sizes.lock().unwrap_or_else(PoisonError::into_inner);
        sizes.retain(|k, _| present.iter().any(|p| p == k));
    }

    fn note(&self, entry: &str, bytes: u64) {
        self.sizes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(entry.to_owned(), bytes);
    }
}

/// Totals of a pool's trash, for the gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrashTotals {
    /// Entries.
    pub entries: u64,
    /// Bytes of the entries measured so far.
    pub bytes: u64,
}

/// Opens the trash directory of the pool directory `dir`; with `create`, makes it first
/// (mode 0700: only the driver looks in). `None` when it does not exist and `create` is off.
/// Something else under its name (a symlink, a file, another filesystem mounted there) is
/// refused: the trash is never followed out of the pool.
pub fn open_dir(pool: &Pool, dir: BorrowedFd<'_>, create: bool) -> Result<Option<OwnedFd>> {
    match fsops::entry(dir, TRASH_DIR).map_err(|e| Error::io("looking at the trash directory", e))? {
        Entry::Missing if !create => return Ok(None),
        Entry::Missing => match fsops::mkdir_exact(dir, TRASH_DIR, 0o700) {
            Ok(fd) => return Ok(Some(fd)),
            Err(Errno::EXIST) => {}
            Err(e) => return Err(Error::io("making the trash directory", e)),
        },
        Entry::Dir { .. } => {}
        Entry::Symlink | Entry::Other => return Err(not_a_trash(pool)),
    }
    let fd = fsops::open_child_dir(dir, TRASH_DIR).map_err(|e| match e {
        Errno::LOOP | Errno::NOTDIR => not_a_trash(pool),
        e => Error::io("opening the trash directory", e),
    })?;
    let (inside, outside) = (
        hpp_fs::Meta::of(fd.as_fd()).map_err(|e| Error::io("stat the trash directory", e))?,
        hpp_fs::Meta::of(dir).map_err(|e| Error::io("stat the pool directory", e))?,
    );
    if !inside.same_mount(&outside) {
        return Err(Error::FailedPrecondition(format!(
            "{} is another filesystem mounted into storage pool {}; the trash must be on the pool's own filesystem",
            pool.path.join(TRASH_DIR).display(),
            pool.name
        )));
    }
    Ok(Some(fd))
}

fn not_a_trash(pool: &Pool) -> Error {
    Error::FailedPrecondition(format!(
        "{} is not a directory; the trash of storage pool {} cannot be used until it is removed",
        pool.path.join(TRASH_DIR).display(),
        pool.name
    ))
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
    let mut name = EntryName {
        deleted_at: now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        volume_id: id.to_owned(),
    };
    // The same id trashed twice within a second (deleted, restored under it, deleted again):
    // the later entry takes the next free second.
    for _ in 0..16 {
        match rename_between(dir, id, trash, &name.to_string()) {
            Ok(()) => return Ok(Some(name)),
            Err(Errno::EXIST | Errno::NOTEMPTY) => name.deleted_at += 1,
            Err(Errno::XDEV) => {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} cannot be moved into the trash of storage pool {} (EXDEV: a project quota \
                     boundary or another filesystem); turn the trash off for this pool",
                    pool.name
                )));
            }
            Err(e) => return Err(Error::io(format!("moving volume {id} into the trash"), e)),
        }
    }
    Err(Error::Aborted(format!(
        "volume {id} was trashed too often within a few seconds; try again"
    )))
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
    match rename_between(dir, id, trash.as_fd(), entry) {
        Ok(()) => {
            tracing::info!(pool = %pool.name, volume_id = %id, entry, "moved again into the trash a volume whose move a crash had lost");
            Ok(())
        }
        Err(e) => Err(Error::io(format!("moving volume {id} into the trash"), e)),
    }
}

/// Redoes a restore a crash lost: the entry is still in the trash and `id` is free.
pub(crate) fn redo_restore(pool: &Pool, dir: BorrowedFd<'_>, id: &str, entry: &str) -> Result<()> {
    if DirIdentity::of(dir, id)?.is_some() || EntryName::parse(entry).is_none() {
        return Ok(());
    }
    let Some(trash) = open_dir(pool, dir, false)? else {
        return Ok(());
    };
    if !matches!(fsops::entry(trash.as_fd(), entry), Ok(Entry::Dir { .. })) {
        return Ok(());
    }
    rename_between(trash.as_fd(), entry, dir, id)
        .map_err(|e| Error::io(format!("restoring {entry} as volume {id}"), e))?;
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
    for name in entry_names(trash.as_fd())? {
        let claim = fsops::open_child_dir(trash.as_fd(), name.to_string())
            .ok()
            .and_then(|fd| read_claim(fd.as_fd()));
        let purge_at = pool.trash.map(|t| name.deleted_at() + t.retention);
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

/// Entry names in the trash directory, oldest first: real directories whose names have the
/// trash's form. Anything else is not an entry and is never touched.
fn entry_names(trash: BorrowedFd<'_>) -> Result<Vec<EntryName>> {
    let names = fsops::list_names(trash).map_err(|e| Error::io("listing the trash", e))?;
    let mut entries: Vec<EntryName> = names
        .iter()
        .filter_map(|n| EntryName::parse(n))
        .filter(|n| matches!(fsops::entry(trash, &n.to_string()), Ok(Entry::Dir { .. })))
        .collect();
    entries.sort();
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
    match fsops::entry(trash.as_fd(), entry).map_err(|e| Error::io(format!("stat trash entry {entry}"), e))? {
        Entry::Dir { .. } => {}
        _ => return Err(no_entry(pool, entry)),
    }
    match rename_between(trash.as_fd(), entry, dir.as_fd(), new_id) {
        Ok(()) => {}
        Err(Errno::EXIST | Errno::NOTEMPTY) => {
            return Err(Error::AlreadyExists(format!(
                "volume {new_id} already exists in storage pool {}; restore under another id",
                pool.name
            )));
        }
        Err(Errno::NOENT) => return Err(no_entry(pool, entry)),
        Err(e) => return Err(Error::io(format!("restoring {entry} as volume {new_id}"), e)),
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
    /// Those older than the retention, then the oldest while free space is under the floor.
    Due {
        /// The time to judge ages by.
        now: SystemTime,
    },
    /// This one, because an admin asked.
    Entry(&'a str),
}

/// Removes entries of `pool`'s trash (see [`Purge`]), at most [`MAX_PURGES_PER_PASS`]; first
/// finishes removals a crash cut short. Only names of the trash's own form inside the trash
/// directory are ever removed.
pub fn purge(pool: &Pool, which: Purge<'_>) -> Result<PurgeReport> {
    let dir = pool.open()?;
    let mut report = PurgeReport::default();
    let Some(trash) = open_dir(pool, dir.as_fd(), false)? else {
        return match which {
            Purge::Entry(entry) => Err(no_entry(pool, entry)),
            Purge::Due { .. } => Ok(report),
        };
    };
    let trash = trash.as_fd();
    finish_interrupted(pool, trash);
    match which {
        Purge::Entry(entry) => {
            if EntryName::parse(entry).is_none() || !matches!(fsops::entry(trash, entry), Ok(Entry::Dir { .. })) {
                return Err(no_entry(pool, entry));
            }
            remove_entry(pool, trash, entry)?;
            report.purged.push((entry.to_owned(), PurgeReason::Admin));
        }
        Purge::Due { now } => {
            let Some(settings) = pool.trash else {
                return Ok(report);
            };
            let mut entries = entry_names(trash)?.into_iter().peekable();
            while let Some(name) = entries.next_if(|n| n.deleted_at() + settings.retention <= now) {
                purge_one(pool, trash, &name.to_string(), PurgeReason::Age, &mut report);
                if report.more {
                    return Ok(report);
                }
            }
            while free_percent(trash)? < f64::from(settings.min_free_percent) {
                let Some(name) = entries.next() else { break };
                purge_one(pool, trash, &name.to_string(), PurgeReason::Space, &mut report);
                if report.more {
                    return Ok(report);
                }
            }
        }
    }
    Ok(report)
}

fn purge_one(pool: &Pool, trash: BorrowedFd<'_>, entry: &str, reason: PurgeReason, report: &mut PurgeReport) {
    if report.purged.len() + report.failed >= MAX_PURGES_PER_PASS {
        report.more = true;
        return;
    }
    match remove_entry(pool, trash, entry) {
        Ok(()) => {
            tracing::info!(pool = %pool.name, entry, reason = reason.as_str(), "trash entry purged");
            report.purged.push((entry.to_owned(), reason));
        }
        Err(e) => {
            tracing::warn!(pool = %pool.name, entry, error = %e, "cannot purge a trash entry; trying again later");
            report.failed += 1;
        }
    }
}

/// Renames `entry` to its removal name, then removes it with everything its backend attached.
fn remove_entry(pool: &Pool, trash: BorrowedFd<'_>, entry: &str) -> Result<()> {
    let gone = format!("{DELETING_PREFIX}{entry}");
    match fsops::rename_noreplace(trash, entry, &gone) {
        Ok(()) => {}
        // Restored or purged meanwhile.
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(Error::io(format!("renaming trash entry {entry} for removal"), e)),
    }
    pool.quota.remove(trash, &gone)?;
    Ok(())
}

/// Finishes removals a crash cut short (`.hpp-del-<entry>` inside the trash).
fn finish_interrupted(pool: &Pool, trash: BorrowedFd<'_>) {
    let Ok(names) = fsops::list_names(trash) else { return };
    for name in names.iter().filter(|n| n.starts_with(DELETING_PREFIX)) {
        if EntryName::parse(&name[DELETING_PREFIX.len()..]).is_none() {
            continue;
        }
        if let Err(e) = pool.quota.remove(trash, name) {
            tracing::warn!(pool = %pool.name, entry = %name, error = %e, "cannot finish an interrupted purge; trying again later");
        }
    }
}

/// Free space of the trash's filesystem, in percent of its size (as unprivileged writers see
/// it, like the pool's capacity).
fn free_percent(trash: BorrowedFd<'_>) -> Result<f64> {
    let st = rustix::fs::fstatvfs(trash).map_err(|e| Error::io("statvfs of the trash", e))?;
    if st.f_blocks == 0 {
        return Ok(100.0);
    }
    Ok(st.f_bavail as f64 * 100.0 / st.f_blocks as f64)
}

/// Measures entries not measured yet (at most a few per call: each may walk a tree) and
/// returns the trash's totals.
pub fn refresh_sizes(pool: &Pool) -> Result<TrashTotals> {
    let dir = pool.open()?;
    let Some(trash) = open_dir(pool, dir.as_fd(), false)? else {
        pool.trash_book().keep_only(&[]);
        return Ok(TrashTotals::default());
    };
    let names: Vec<String> = entry_names(trash.as_fd())?.iter().map(ToString::to_string).collect();
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
                let bytes = measure(pool, trash.as_fd(), name);
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

/// Bytes an entry holds: the backend's own accounting when it keeps one, else a bounded walk.
fn measure(pool: &Pool, trash: BorrowedFd<'_>, entry: &str) -> Option<u64> {
    if let Ok(Some(usage)) = pool.quota.usage(trash, entry) {
        return Some(usage.used_bytes);
    }
    let fd = fsops::open_child_dir(trash, entry).ok()?;
    fsops::usage(fd.as_fd()).ok().map(|(bytes, _)| bytes)
}

/// `renameat2(from_dir/from → to_dir/to, RENAME_NOREPLACE)`.
fn rename_between(from_dir: BorrowedFd<'_>, from: &str, to_dir: BorrowedFd<'_>, to: &str) -> rustix::io::Result<()> {
    rustix::fs::renameat_with(from_dir, from, to_dir, to, rustix::fs::RenameFlags::NOREPLACE)
}

/// How often the background purge looks at a pool with this retention: a quarter of it,
/// between one second and one minute (the free-space floor is checked as often).
pub fn purge_interval(retention: Duration) -> Duration {
    (retention / 4).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// Purges due entries of every pool with a trash, measures new entries and updates the
/// gauges, every [`purge_interval`] of the shortest retention, until the task is dropped.
pub async fn watch(state: Arc<crate::state::DriverState>) {
    let Some(interval) = state
        .pools
        .iter()
        .filter_map(|p| p.trash.map(|t| purge_interval(t.retention)))
        .min()
    else {
        return;
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let state = state.clone();
        let _ = tokio::task::spawn_blocking(move || purge_all(&state)).await;
    }
}

/// One pass of [`watch`] over every pool with a trash.
pub fn purge_all(state: &crate::state::DriverState) {
    for pool in state.pools.iter().filter(|p| p.trash.is_some()) {
        match purge(pool, Purge::Due { now: SystemTime::now() }) {
            Ok(report) => {
                if let Some(m) = &state.metrics {
                    for (_, reason) in &report.purged {
                        m.trash_purged(&pool.name, *reason);
                    }
                }
            }
            // An unmounted guarded pool, say: its health reports say why.
            Err(e) => tracing::debug!(pool = %pool.name, error = %e, "trash not purged this time"),
        }
        if let (Ok(totals), Some(m)) = (refresh_sizes(pool), &state.metrics) {
            m.set_trash(&pool.name, totals);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn entry_names_round_trip_and_nothing_else_parses() {
        let n = EntryName::parse("pvc-1@1790000000").unwrap();
        assert_eq!(n.volume_id, "pvc-1");
        assert_eq!(n.deleted_at, 1_790_000_000);
        assert_eq!(n.to_string(), "pvc-1@1790000000");
        // The id is everything before the last `@`.
        assert_eq!(EntryName::parse("a@b@12").unwrap().volume_id, "a@b");
        for bad in [
            "pvc-1",
            "@12",
            "pvc-1@",
            "pvc-1@12x",
            ".hpp-del-pvc-1@12",
            "../x@12",
            "a/b@12",
            "pvc@1234567890123",
        ] {
            assert_eq!(EntryName::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn entries_order_oldest_first() {
        let mut names = [
            EntryName::parse("b@20").unwrap(),
            EntryName::parse("a@30").unwrap(),
            EntryName::parse("c@10").unwrap(),
        ];
        names.sort();
        let ids: Vec<_> = names.iter().map(|n| n.volume_id.as_str()).collect();
        assert_eq!(ids, ["c", "b", "a"]);
    }

    #[test]
    fn purge_interval_is_a_quarter_within_bounds() {
        assert_eq!(purge_interval(Duration::from_secs(10)), Duration::from_millis(2500));
        assert_eq!(purge_interval(Duration::from_secs(2)), Duration::from_secs(1));
        assert_eq!(purge_interval(Duration::from_secs(72 * 3600)), Duration::from_secs(60));
    }

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
