//! A directory's trash: volumes deleted with a retention are renamed into `<dir>/.hpp-trash`
//! as `<name>@<deleted at, unix seconds>` instead of being removed, and purged later by age or,
//! oldest first, while the filesystem's free space is under a floor. Shared by the CSI driver
//! (per pool, with its journal and checks around it) and the legacy provisioner (per base
//! directory).
//!
//! Crash safety: moving in and taking out are single renames (`RENAME_NOREPLACE`). A purge
//! renames an entry to `.hpp-del-<entry>` inside the trash before removing its tree, so a
//! removal a crash cut short is never listed or restored, and the next purge finishes it. Only
//! names of the trash's own form inside the trash directory are ever removed: a file an admin
//! drops there, or a directory with another name, is never touched.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, FileType, Mode, RenameFlags};
use rustix::io::Errno;

/// The trash directory inside a pool or base directory.
pub const TRASH_DIR: &str = ".hpp-trash";

/// Prefix of an entry being purged.
pub const PURGING_PREFIX: &str = ".hpp-del-";

/// Most entries one [`purge`] removes; the next one goes on. Bounds how long a purge holds its
/// thread when thousands of entries fall due at once.
pub const MAX_PURGES_PER_PASS: usize = 64;

/// Longest name this module makes: a volume name up to this long fits with its timestamp and
/// the purge prefix in NAME_MAX (255).
pub const MAX_NAME_LEN: usize = 230;

/// Why a trash operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrashError {
    /// Something other than a directory holds the trash's name.
    #[error("{TRASH_DIR} is not a directory")]
    NotADirectory,
    /// Another filesystem is mounted on the trash directory.
    #[error("{TRASH_DIR} is another filesystem mounted into the directory; the trash must be on its own filesystem")]
    OtherFilesystem,
    /// The rename would cross a filesystem or project-quota boundary.
    #[error("{name} cannot be moved into {TRASH_DIR} (EXDEV: a project quota boundary or another filesystem)")]
    CrossDevice {
        /// The name that was to move.
        name: String,
    },
    /// The destination name is taken.
    #[error("{0} already exists")]
    Exists(String),
    /// The entry (or the name to move) does not exist.
    #[error("{0} does not exist")]
    Missing(String),
    /// A name too long to carry a timestamp.
    #[error("{0:?} is too long for the trash (at most {MAX_NAME_LEN} bytes)")]
    NameTooLong(String),
    /// A system call failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

fn io(op: impl Into<String>) -> impl FnOnce(Errno) -> TrashError {
    let op = op.into();
    move |e| TrashError::Io { op, source: e.into() }
}

/// A trash's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// How long an entry is kept.
    pub retention: Duration,
    /// Free space (percent of the filesystem) under which entries are purged early, oldest
    /// first.
    pub min_free_percent: u32,
}

/// Why an entry was purged (the label of the purge counters).
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

/// The name of an entry in the trash: `<name>@<deleted at, unix seconds>`, ordered oldest
/// first. Names may hold `@` themselves, so the name is everything before the last one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct EntryName {
    /// When it was trashed, in seconds since the epoch.
    pub deleted_at: u64,
    /// The name it had (a volume id, a PV name).
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

    /// When it was trashed.
    pub fn deleted_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.deleted_at)
    }

    /// When its retention ends.
    pub fn purge_at(&self, retention: Duration) -> SystemTime {
        self.deleted_at() + retention
    }
}

impl std::fmt::Display for EntryName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.volume_id, self.deleted_at)
    }
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

/// Opens the trash directory in `dir`; with `create`, makes it first (mode 0700: only the
/// driver looks in). `None` when it does not exist and `create` is off. Something else under its
/// name (a symlink, a file, another filesystem mounted there) is refused: the trash is never
/// followed out of `dir`.
pub fn open(dir: BorrowedFd<'_>, create: bool) -> Result<Option<OwnedFd>, TrashError> {
    match rustix::fs::statat(dir, TRASH_DIR, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {}
        Ok(_) => return Err(TrashError::NotADirectory),
        Err(Errno::NOENT) if !create => return Ok(None),
        Err(Errno::NOENT) => match rustix::fs::mkdirat(dir, TRASH_DIR, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(io("making the trash directory")(e)),
        },
        Err(e) => return Err(io("looking at the trash directory")(e)),
    }
    let fd = crate::open_child_dir(dir, TRASH_DIR).map_err(|e| match e {
        Errno::LOOP | Errno::NOTDIR => TrashError::NotADirectory,
        e => io("opening the trash directory")(e),
    })?;
    let inside = crate::Meta::of(fd.as_fd()).map_err(io("stat the trash directory"))?;
    let outside = crate::Meta::of(dir).map_err(io("stat the directory holding the trash"))?;
    if !inside.same_mount(&outside) {
        return Err(TrashError::OtherFilesystem);
    }
    Ok(Some(fd))
}

/// Renames `name` of `dir` into `trash` as an entry stamped `now`; returns the entry's name.
/// The same name trashed twice within a second (deleted, restored under it, deleted again)
/// takes the next free second. Makes nothing durable (the caller syncs or journals).
pub fn move_in(
    dir: BorrowedFd<'_>,
    name: &str,
    trash: BorrowedFd<'_>,
    now: SystemTime,
) -> Result<EntryName, TrashError> {
    if name.len() > MAX_NAME_LEN {
        return Err(TrashError::NameTooLong(name.to_owned()));
    }
    let mut entry = EntryName {
        deleted_at: now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        volume_id: name.to_owned(),
    };
    for _ in 0..16 {
        match rename(dir, name, trash, &entry.to_string()) {
            Ok(()) => return Ok(entry),
            Err(Errno::EXIST | Errno::NOTEMPTY) => entry.deleted_at += 1,
            Err(Errno::NOENT) => return Err(TrashError::Missing(name.to_owned())),
            Err(Errno::XDEV) => return Err(TrashError::CrossDevice { name: name.to_owned() }),
            Err(e) => return Err(io(format!("moving {name} into the trash"))(e)),
        }
    }
    Err(TrashError::Exists(entry.to_string()))
}

/// Renames trash entry `entry` back into `dir` as `new_name`.
pub fn take_out(trash: BorrowedFd<'_>, entry: &str, dir: BorrowedFd<'_>, new_name: &str) -> Result<(), TrashError> {
    if EntryName::parse(entry).is_none() || !is_dir(trash, entry) {
        return Err(TrashError::Missing(entry.to_owned()));
    }
    match rename(trash, entry, dir, new_name) {
        Ok(()) => Ok(()),
        Err(Errno::EXIST | Errno::NOTEMPTY) => Err(TrashError::Exists(new_name.to_owned())),
        Err(Errno::NOENT) => Err(TrashError::Missing(entry.to_owned())),
        Err(e) => Err(io(format!("restoring {entry} as {new_name}"))(e)),
    }
}

/// The entries of `trash`, oldest first: real directories whose names have the trash's form.
pub fn entries(trash: BorrowedFd<'_>) -> Result<Vec<EntryName>, TrashError> {
    let mut d = rustix::fs::Dir::read_from(trash).map_err(io("listing the trash"))?;
    let mut out = Vec::new();
    while let Some(e) = d.read() {
        let e = e.map_err(io("listing the trash"))?;
        let Ok(name) = std::str::from_utf8(e.file_name().to_bytes()) else {
            continue;
        };
        if let Some(entry) = EntryName::parse(name)
            && is_dir(trash, name)
        {
            out.push(entry);
        }
    }
    out.sort();
    Ok(out)
}

fn is_dir(dir: BorrowedFd<'_>, name: &str) -> bool {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
}

/// Which entries [`purge`] removes.
#[derive(Debug, Clone, Copy)]
pub enum Purge<'a> {
    /// Those older than the retention, then the oldest while free space is under the floor.
    Due {
        /// The settings to judge by.
        settings: Settings,
        /// The time to judge ages by.
        now: SystemTime,
    },
    /// This one, because an admin asked.
    Entry(&'a str),
}

/// Removes entries of `trash` (see [`Purge`]), at most [`MAX_PURGES_PER_PASS`], each renamed
/// to its purging name first and then removed by `remove` (which also releases what a quota
/// backend attached); first finishes removals a crash cut short. `remove` gets the trash
/// directory and the purging name.
pub fn purge<E: std::fmt::Display>(
    trash: BorrowedFd<'_>,
    which: Purge<'_>,
    mut remove: impl FnMut(BorrowedFd<'_>, &str) -> Result<(), E>,
) -> Result<PurgeReport, TrashError> {
    finish_interrupted(trash, &mut remove);
    let mut report = PurgeReport::default();
    match which {
        Purge::Entry(entry) => {
            if EntryName::parse(entry).is_none() || !is_dir(trash, entry) {
                return Err(TrashError::Missing(entry.to_owned()));
            }
            remove_entry(trash, entry, &mut remove).map_err(|e| TrashError::Io {
                op: format!("purging {entry}"),
                source: std::io::Error::other(e),
            })?;
            report.purged.push((entry.to_owned(), PurgeReason::Admin));
        }
        Purge::Due { settings, now } => {
            let mut all = entries(trash)?.into_iter().peekable();
            while let Some(entry) = all.next_if(|e| e.purge_at(settings.retention) <= now) {
                if !purge_one(trash, &entry.to_string(), PurgeReason::Age, &mut report, &mut remove) {
                    return Ok(report);
                }
            }
            while free_percent(trash)? < f64::from(settings.min_free_percent) {
                let Some(entry) = all.next() else { break };
                if !purge_one(trash, &entry.to_string(), PurgeReason::Space, &mut report, &mut remove) {
                    return Ok(report);
                }
            }
        }
    }
    Ok(report)
}

/// Purges one entry unless the pass is full; false when it was (and the pass must stop).
fn purge_one<E: std::fmt::Display>(
    trash: BorrowedFd<'_>,
    entry: &str,
    reason: PurgeReason,
    report: &mut PurgeReport,
    remove: &mut impl FnMut(BorrowedFd<'_>, &str) -> Result<(), E>,
) -> bool {
    if report.purged.len() + report.failed >= MAX_PURGES_PER_PASS {
        report.more = true;
        return false;
    }
    match remove_entry(trash, entry, remove) {
        Ok(()) => {
            tracing::info!(entry, reason = reason.as_str(), "trash entry purged");
            report.purged.push((entry.to_owned(), reason));
        }
        Err(e) => {
            tracing::warn!(entry, error = %e, "cannot purge a trash entry; trying again later");
            report.failed += 1;
        }
    }
    true
}

/// Renames `entry` to its purging name, then removes it.
fn remove_entry<E: std::fmt::Display>(
    trash: BorrowedFd<'_>,
    entry: &str,
    remove: &mut impl FnMut(BorrowedFd<'_>, &str) -> Result<(), E>,
) -> Result<(), String> {
    let gone = format!("{PURGING_PREFIX}{entry}");
    match rustix::fs::renameat_with(trash, entry, trash, &gone, RenameFlags::NOREPLACE) {
        Ok(()) => {}
        // Restored or purged meanwhile.
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(format!("renaming trash entry {entry} for removal: {e}")),
    }
    remove(trash, &gone).map_err(|e| e.to_string())
}

/// Finishes removals a crash cut short (`.hpp-del-<entry>` inside the trash).
fn finish_interrupted<E: std::fmt::Display>(
    trash: BorrowedFd<'_>,
    remove: &mut impl FnMut(BorrowedFd<'_>, &str) -> Result<(), E>,
) {
    let Ok(mut d) = rustix::fs::Dir::read_from(trash) else {
        return;
    };
    let mut leftovers = Vec::new();
    while let Some(Ok(e)) = d.read() {
        if let Ok(name) = std::str::from_utf8(e.file_name().to_bytes())
            && let Some(entry) = name.strip_prefix(PURGING_PREFIX)
            && EntryName::parse(entry).is_some()
        {
            leftovers.push(name.to_owned());
        }
    }
    for name in leftovers {
        if let Err(e) = remove(trash, &name) {
            tracing::warn!(entry = %name, error = %e, "cannot finish an interrupted purge; trying again later");
        }
    }
}

/// Free space of `fd`'s filesystem, in percent of its size (as unprivileged writers see it).
pub fn free_percent(fd: BorrowedFd<'_>) -> Result<f64, TrashError> {
    let st = rustix::fs::fstatvfs(fd).map_err(io("statvfs of the trash"))?;
    if st.f_blocks == 0 {
        return Ok(100.0);
    }
    Ok(st.f_bavail as f64 * 100.0 / st.f_blocks as f64)
}

/// How often a background purge looks at a trash with this retention: a quarter of it,
/// between one second and one minute (the free-space floor is checked as often).
pub fn purge_interval(retention: Duration) -> Duration {
    (retention / 4).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// `renameat2(from_dir/from → to_dir/to, RENAME_NOREPLACE)`.
fn rename(from_dir: BorrowedFd<'_>, from: &str, to_dir: BorrowedFd<'_>, to: &str) -> rustix::io::Result<()> {
    rustix::fs::renameat_with(from_dir, from, to_dir, to, RenameFlags::NOREPLACE)
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
    fn moving_in_taking_out_and_purging_touch_only_entries() {
        let t = tempfile::tempdir().unwrap();
        let dir = rustix::fs::open(t.path(), rustix::fs::OFlags::DIRECTORY, Mode::empty()).unwrap();
        std::fs::create_dir(t.path().join("vol")).unwrap();
        std::fs::write(t.path().join("vol/f"), b"x").unwrap();
        assert!(open(dir.as_fd(), false).unwrap().is_none());
        let trash = open(dir.as_fd(), true).unwrap().unwrap();
        let now = UNIX_EPOCH + Duration::from_secs(1000);
        let entry = move_in(dir.as_fd(), "vol", trash.as_fd(), now).unwrap();
        assert_eq!(entry.to_string(), "vol@1000");
        // The same name again within the second takes the next one.
        std::fs::create_dir(t.path().join("vol")).unwrap();
        assert_eq!(
            move_in(dir.as_fd(), "vol", trash.as_fd(), now).unwrap().to_string(),
            "vol@1001"
        );
        assert!(matches!(
            move_in(dir.as_fd(), "gone", trash.as_fd(), now),
            Err(TrashError::Missing(_))
        ));
        std::fs::write(t.path().join(TRASH_DIR).join("notes@12"), b"a file, not an entry").unwrap();
        let names: Vec<String> = entries(trash.as_fd())
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(names, ["vol@1000", "vol@1001"]);

        take_out(trash.as_fd(), "vol@1000", dir.as_fd(), "back").unwrap();
        assert_eq!(std::fs::read(t.path().join("back/f")).unwrap(), b"x");
        assert!(matches!(
            take_out(trash.as_fd(), "vol@1000", dir.as_fd(), "again"),
            Err(TrashError::Missing(_))
        ));

        let settings = Settings {
            retention: Duration::from_secs(10),
            min_free_percent: 0,
        };
        let mut removed = Vec::new();
        let report = purge(
            trash.as_fd(),
            Purge::Due {
                settings,
                now: SystemTime::now(),
            },
            |fd, name| {
                removed.push(name.to_owned());
                crate::remove_tree(fd, std::ffi::OsStr::new(name))
            },
        )
        .unwrap();
        assert_eq!(report.purged, vec![("vol@1001".to_owned(), PurgeReason::Age)]);
        assert_eq!(removed, [format!("{PURGING_PREFIX}vol@1001")]);
        assert!(t.path().join(TRASH_DIR).join("notes@12").exists());
    }
}
