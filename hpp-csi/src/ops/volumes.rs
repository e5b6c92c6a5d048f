//! Creating and deleting volume directories with crash safety. A volume with contents (a
//! clone, a restore) or with a quota backend's attachments is built under a temporary name
//! unique to the attempt, `.hpp-tmp-<id>-<attempt>`, and renamed into place in one atomic step,
//! so a crash leaves either no volume or a complete one. No attempt ever touches another
//! attempt's temporary (an abandoned attempt may still be copying); temporaries left by a crash
//! are swept when the driver starts ([`sweep`]). An empty plain directory in a node-local pool
//! is made in place instead (one atomic `mkdir`; what a crash may leave unfinished, its mode and
//! capacity record, is finished by the retry or the journal's redo). Deletion renames to
//! `.hpp-del-<id>` first, so a half-deleted volume is never served and a retry finishes the job.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::io::Errno;

use hpp_fs::MountTableCache;
use hpp_fs::quota::{QuotaBackend, Tuning, round_up};

use crate::error::{Error, Result};
use crate::mountinfo::MountTable;
use crate::ops::copy::{self, CopyStats};
use crate::ops::volume_journal::{self, Deferred, DirIdentity, Record};
use crate::pool::Pool;
use crate::pool::fsops::{self, Entry};

/// Mode of a new volume directory (one value for the driver and every quota backend).
pub use hpp_fs::quota::VOLUME_MODE;

/// Prefix of every temporary the driver builds a volume or snapshot under.
pub const TEMP_PREFIX: &str = ".hpp-tmp-";
/// Prefix of every volume or snapshot being deleted.
pub const DELETING_PREFIX: &str = ".hpp-del-";

/// A temporary name for building `id`, unique to this attempt: `.hpp-tmp-<id>-<8 hex digits>`
/// (at most 248 bytes for the longest valid id, under NAME_MAX).
pub fn temp_name(id: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static ATTEMPT: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(ATTEMPT.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    format!("{TEMP_PREFIX}{id}-{:08x}", h.finish() as u32)
}

/// Removes every temporary (and finishes every interrupted deletion) directly in `dir`, through
/// the pool's quota backend (a temporary may be a subvolume with a qgroup). Run at start-up,
/// before any request can start an attempt of its own. One entry that cannot be removed is
/// logged and passed over, so it never keeps the others for ever; the error is only for a
/// directory that cannot be listed.
pub fn sweep(dir: std::os::fd::BorrowedFd<'_>, backend: &dyn QuotaBackend) -> Result<usize> {
    let mut swept = 0;
    let leftovers = fsops::list_names_where(dir, |name, _| {
        name.starts_with(TEMP_PREFIX) || name.starts_with(DELETING_PREFIX)
    })
    .map_err(|e| Error::io("listing for temporaries", e))?;
    for name in leftovers {
        match backend.remove(dir, &name) {
            Ok(()) => swept += 1,
            Err(e) => {
                tracing::warn!(entry = %name, error = %e, "cannot remove a leftover of an interrupted operation; passing over it")
            }
        }
    }
    Ok(swept)
}

/// Name a volume is renamed to while being deleted.
pub fn deleting_name(id: &str) -> String {
    format!("{DELETING_PREFIX}{id}")
}

/// Extended attribute recording the capacity a volume was requested with, set on the temporary
/// before the rename so a volume never exists without it. `trusted.*`: only the driver (root)
/// can read or change it, the tenant cannot. A directory without it (made by KubeVirt, or on a
/// filesystem without xattrs) is still served; only the capacity check is skipped.
pub const CAPACITY_XATTR: &str = "trusted.hpp.capacity";

/// The capacity range of a CreateVolume, in bytes (0 = not set).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Requested {
    /// `required_bytes`.
    pub required: u64,
    /// `limit_bytes`.
    pub limit: u64,
}

impl Requested {
    /// Whether a volume recorded with `capacity` bytes satisfies this request (what CSI calls
    /// a compatible existing volume; otherwise AlreadyExists).
    pub fn satisfied_by(&self, capacity: u64) -> bool {
        capacity >= self.required && (self.limit == 0 || capacity <= self.limit)
    }
}

/// Whether the warning that a pool's filesystem keeps no capacity records was logged.
static NO_RECORDS_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Records `bytes` on the volume directory `dir` of `pool`.
fn record_capacity(pool: &Pool, dir: std::os::fd::BorrowedFd<'_>, bytes: u64) -> Result<()> {
    match rustix::fs::fsetxattr(
        dir,
        CAPACITY_XATTR,
        bytes.to_string().as_bytes(),
        rustix::fs::XattrFlags::empty(),
    ) {
        Ok(()) => Ok(()),
        Err(e @ (Errno::OPNOTSUPP | Errno::PERM)) => {
            // Once per process: every create on such a pool would say the same.
            if !NO_RECORDS_WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(
                    pool = %pool.name,
                    error = %e,
                    "cannot record volume capacities (trusted xattrs need CAP_SYS_ADMIN and a filesystem that keeps them): \
                     a CreateVolume retried with a different size is answered OK instead of AlreadyExists"
                );
            }
            Ok(())
        }
        Err(e) => Err(Error::io("recording the volume's capacity", e)),
    }
}

/// The capacity volume `id` was created with, when recorded.
pub fn recorded_capacity(pool_dir: std::os::fd::BorrowedFd<'_>, id: &str) -> Result<Option<u64>> {
    match open_if_there(pool_dir, id)? {
        Some(volume) => read_capacity(volume.as_fd(), id),
        None => Ok(None),
    }
}

/// Volume `id` of the pool directory `dir`, opened; `None` when there is none.
fn open_if_there(dir: BorrowedFd<'_>, id: &str) -> Result<Option<OwnedFd>> {
    match fsops::open_child_dir(dir, id) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(Error::io(format!("opening volume {id}"), e)),
    }
}

/// Whether `pool` makes an empty volume in place (one `mkdir`) rather than under a temporary:
/// a node-local pool whose backend attaches nothing to a volume. What a crash cut short there
/// is finished, never elsewhere.
pub(crate) fn makes_volumes_in_place(pool: &Pool) -> bool {
    !pool.shared && !pool.quota.enforces()
}

/// The capacity recorded on the open volume directory `volume`.
fn read_capacity(volume: BorrowedFd<'_>, id: &str) -> Result<Option<u64>> {
    let mut buf = [0u8; 32];
    match rustix::fs::fgetxattr(volume, CAPACITY_XATTR, &mut buf[..]) {
        Ok(n) => Ok(std::str::from_utf8(&buf[..n]).ok().and_then(|s| s.parse().ok())),
        Err(Errno::NODATA | Errno::OPNOTSUPP | Errno::RANGE) => Ok(None),
        Err(e) => Err(Error::io(format!("reading the capacity of volume {id}"), e)),
    }
}

/// What is already at `id`: nothing (`None`), a volume that satisfies `want` (finished if an
/// in-place create was cut short), or an error (AlreadyExists when it does not satisfy it or is
/// not a directory).
fn existing(pool: &Pool, dir: BorrowedFd<'_>, id: &str, want: Requested) -> Result<Option<Created>> {
    match fsops::entry(dir, id).map_err(|e| Error::io(format!("stat volume {id}"), e))? {
        Entry::Missing => Ok(None),
        Entry::Dir { .. } => check_existing(pool, dir, id, want).map(Some),
        Entry::Symlink | Entry::Other => Err(Error::AlreadyExists(format!(
            "{} exists and is not a directory; it is not an hpp volume",
            pool.volume_path(id).display()
        ))),
    }
}

fn check_existing(pool: &Pool, dir: BorrowedFd<'_>, id: &str, want: Requested) -> Result<Created> {
    let Some(volume) = open_if_there(dir, id)? else {
        return Ok(Created::Existing);
    };
    match read_capacity(volume.as_fd(), id)? {
        Some(have) if !want.satisfied_by(have) => Err(Error::AlreadyExists(format!(
            "volume {id} already exists in storage pool {} with capacity {have} bytes, which does not \
             satisfy the requested range (required {}, limit {})",
            pool.name, want.required, want.limit
        ))),
        Some(_) => Ok(Created::Existing),
        None => {
            // The caller applies the class's settings again. The volume is visible: a failure
            // here is for a retry to finish, not a final answer.
            finish_unrecorded(pool, dir, volume.as_fd(), id, want.required).map_err(Error::after_visible)?;
            Ok(Created::Existing)
        }
    }
}

/// An empty volume in a node-local pool whose backend enforces nothing: one `mkdir` under its
/// own name, then its mode and capacity record. No temporary and rename: on a large ext4
/// directory the rename costs about as much again as the `mkdir`, and an empty directory has
/// nothing to hide while half-made. A crash may keep the directory but not its mode or record
/// (nothing was acknowledged then); the retry finishes it ([`finish_if_cut_short`]), and so
/// does the journal's redo of an acknowledged create.
fn build_in_place(pool: &Pool, dir: BorrowedFd<'_>, id: &str, requested: Requested) -> Result<Created> {
    match rustix::fs::mkdirat(dir, id, rustix::fs::Mode::from_raw_mode(VOLUME_MODE)) {
        Ok(()) => {}
        Err(Errno::EXIST) => {
            return existing(pool, dir, id, requested)?
                .ok_or_else(|| Error::Aborted(format!("volume {id} appeared and went while being created; retry")));
        }
        Err(e) => return Err(Error::io(format!("creating {}", pool.volume_path(id).display()), e)),
    }
    let finished = fsops::open_child_dir(dir, id)
        .map_err(|e| Error::io(format!("opening volume {id}"), e))
        .and_then(|fd| finish(pool, fd.as_fd(), id, requested.required));
    if let Err(e) = finished {
        // Made by this call and never acknowledged: nothing else can be in it yet.
        if let Err(cleanup) = rustix::fs::unlinkat(dir, id, rustix::fs::AtFlags::REMOVEDIR) {
            tracing::warn!(volume_id = %id, error = %cleanup, "cannot remove a volume whose creation failed; a retry finishes it");
            // It stays visible under its name: the CO must retry, not give up on it.
            return Err(e.after_visible());
        }
        return Err(e);
    }
    Ok(Created::New(CopyStats::default()))
}

/// Sets a new volume's mode (the process umask never decides it) and records its capacity.
fn finish(pool: &Pool, volume: BorrowedFd<'_>, id: &str, required: u64) -> Result<()> {
    rustix::fs::fchmod(volume, rustix::fs::Mode::from_raw_mode(VOLUME_MODE))
        .map_err(|e| Error::io(format!("chmod volume {id}"), e))?;
    record_capacity(pool, volume, required)
}

/// Finishes volume `id` when it is what an in-place create cut short by a crash leaves: an
/// empty directory without a capacity record, in a pool where creates are made in place. A
/// volume with contents (a KubeVirt volume adopted as it is, say) is left alone. Returns
/// whether it was finished.
pub(crate) fn finish_if_cut_short(pool: &Pool, dir: BorrowedFd<'_>, id: &str, required: u64) -> Result<bool> {
    let Some(volume) = open_if_there(dir, id)? else {
        return Ok(false);
    };
    match read_capacity(volume.as_fd(), id)? {
        Some(_) => Ok(false),
        None => finish_unrecorded(pool, dir, volume.as_fd(), id, required),
    }
}

/// [`finish_if_cut_short`] for the open `volume` in the pool directory `dir`, already known to
/// have no capacity record.
fn finish_unrecorded(
    pool: &Pool,
    dir: BorrowedFd<'_>,
    volume: BorrowedFd<'_>,
    id: &str,
    required: u64,
) -> Result<bool> {
    if !makes_volumes_in_place(pool) {
        return Ok(false);
    }
    let stat = |fd: BorrowedFd<'_>| rustix::fs::fstat(fd).map_err(|e| Error::io(format!("stat volume {id}"), e));
    let volume_stat = stat(volume)?;
    // A mkdir here leaves a directory of the pool's filesystem: another filesystem mounted
    // there (or a subvolume an admin made) is not one to touch.
    if volume_stat.st_dev != stat(dir)?.st_dev {
        return Ok(false);
    }
    if !fsops::is_empty_dir(volume).map_err(|e| Error::io(format!("listing volume {id}"), e))? {
        return Ok(false);
    }
    // Only bits a umask took are given back: a mode someone widened (KubeVirt's legacy 0777, a
    // kubelet's fsGroup setgid) stays.
    let mode = volume_stat.st_mode & 0o7777;
    if mode & VOLUME_MODE != VOLUME_MODE {
        rustix::fs::fchmod(volume, rustix::fs::Mode::from_raw_mode(mode | VOLUME_MODE))
            .map_err(|e| Error::io(format!("chmod volume {id}"), e))?;
    }
    record_capacity(pool, volume, required)?;
    // Made durable here: the caller's sync may not cover it (a pool without its journal syncs
    // only the pool directory, which this did not change). A rare path: crash recovery.
    rustix::fs::fsync(volume).map_err(|e| Error::io(format!("syncing volume {id}"), e))?;
    Ok(true)
}

/// Outcome of [`create`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// The directory already existed; nothing was done (idempotent retry or adopted KubeVirt
    /// volume).
    Existing,
    /// A new directory was made, with what was copied into it.
    New(CopyStats),
}

/// Creates volume `id` in `pool` with the `requested` capacity, filled with a copy of `source`
/// when given. An existing volume is fine when its recorded capacity satisfies the request.
/// Returns once the volume is durable: through the pool's journal for an empty volume, else a
/// directory sync.
pub fn create(pool: &Pool, id: &str, source: Option<&OwnedFd>, requested: Requested) -> Result<Created> {
    create_tuned(pool, pool.open()?.as_fd(), id, source, requested, &Tuning::default())
}

/// [`create`] for a volume the caller then applies `tuning` to: the journal record carries it,
/// so a volume a crash lost comes back with its class's settings. `dir` is the pool directory,
/// opened by [`Pool::open`] (or measured usable by [`Pool::measure_open`]).
pub fn create_tuned(
    pool: &Pool,
    dir: BorrowedFd<'_>,
    id: &str,
    source: Option<&OwnedFd>,
    requested: Requested,
    tuning: &Tuning,
) -> Result<Created> {
    let (created, _) = create_in(pool, dir, id, source, requested, tuning, false)?;
    Ok(created)
}

/// [`create_tuned`], or with `defer`, for an async caller: when the volume is made durable
/// through the journal, returns without waiting for the flush, with the [`Deferred`] to await
/// before acknowledging.
pub(crate) fn create_in(
    pool: &Pool,
    dir: BorrowedFd<'_>,
    id: &str,
    source: Option<&OwnedFd>,
    requested: Requested,
    tuning: &Tuning,
    defer: bool,
) -> Result<(Created, Option<Deferred>)> {
    // Before anything is looked at: the first use redoes what a crash lost.
    let journal = pool.journal_in(dir)?;
    let (created, temp) = build(pool, dir, id, source, requested, journal.is_some())?;
    // Nothing is acknowledged before the sync that covers it, an existing volume included (a
    // retry after a crash between the rename and its sync); concurrent creates and deletes
    // share that sync (group commit).
    let deferred = match (&journal, source) {
        (Some(journal), None) => {
            let record = Record::create(id, requested, tuning, temp);
            match defer {
                true => volume_journal::append_deferred(pool, journal, dir, &record).map(Some),
                false => volume_journal::append(pool, journal, dir, &record).map(|()| None),
            }
        }
        _ => pool.volume_commits().entries(dir).map(|()| None),
    }
    .map_err(Error::after_visible)?;
    Ok((created, deferred))
}

/// Builds volume `id` in the pool directory `dir` under a temporary and renames it into place
/// (returning the temporary's name), or checks the existing one; makes nothing durable (the
/// caller does). With `journaled` (the pool's journal is open) an empty plain volume is made in
/// place: the journal's record covers its mode and capacity record. Without, the rename comes
/// last, so the sync of the pool directory covers everything done before it.
pub(crate) fn build(
    pool: &Pool,
    dir: BorrowedFd<'_>,
    id: &str,
    source: Option<&OwnedFd>,
    requested: Requested,
    journaled: bool,
) -> Result<(Created, Option<String>)> {
    if journaled && source.is_none() && makes_volumes_in_place(pool) {
        return Ok((build_in_place(pool, dir, id, requested)?, None));
    }
    if let Some(existing) = existing(pool, dir, id, requested)? {
        return Ok((existing, None));
    }
    let tmp = temp_name(id);
    let backend = &*pool.quota;
    let limit = round_up(requested.required, backend.granularity());
    // Removes the half-built temporary (subvolume, project id and all) on the way out.
    let abandon = |fd: OwnedFd, e: Error| {
        drop(fd);
        if let Err(cleanup) = backend.remove(dir, &tmp) {
            tracing::warn!(temporary = %tmp, error = %cleanup, "cannot remove an abandoned temporary; the start-up sweep will");
        }
        Err(e)
    };
    let native = match source {
        Some(src) => backend.clone_volume(dir, &tmp, src.as_fd(), limit)?,
        None => None,
    };
    let (tmp_fd, stats) = match native {
        Some(fd) => (fd, CopyStats::default()),
        None => {
            let tmp_fd = backend
                .create(dir, &tmp, limit)
                .map_err(|e| with_context(e, &pool.path.join(&tmp)))?;
            if let Err(e) = rustix::fs::fchmod(&tmp_fd, rustix::fs::Mode::from_raw_mode(VOLUME_MODE)) {
                return abandon(tmp_fd, Error::io(format!("chmod {tmp}"), e));
            }
            match source {
                // The source's mode is copied; a volume is always traversable by its owner.
                Some(src) => match copy::copy_tree(src.as_fd(), tmp_fd.as_fd()) {
                    Ok(stats) => (tmp_fd, stats),
                    Err(e) => return abandon(tmp_fd, e),
                },
                None => (tmp_fd, CopyStats::default()),
            }
        }
    };
    // After the copy: the source's own record came along with its xattrs. A copy at its
    // source's size keeps that record as it is: writing it again inside a full volume would be
    // refused (the xattr is metadata charged to the volume's limit).
    let recorded = source.is_some() && read_capacity(tmp_fd.as_fd(), &tmp).ok().flatten() == Some(requested.required);
    if !recorded && let Err(e) = record_capacity(pool, tmp_fd.as_fd(), requested.required) {
        return abandon(tmp_fd, e);
    }
    if source.is_some() {
        // Copied data must be on disk before the volume becomes visible; one syncfs (shared by
        // concurrent clones) is far cheaper than an fsync per file. An empty directory needs
        // only the parent's sync.
        if let Err(e) = pool.volume_commits().data(tmp_fd.as_fd()) {
            return abandon(tmp_fd, e);
        }
    }
    drop(tmp_fd);
    match fsops::rename_noreplace(dir, &tmp, id) {
        Ok(()) => Ok((Created::New(stats), Some(tmp))),
        Err(Errno::EXIST) | Err(Errno::NOTEMPTY) => {
            let _ = backend.remove(dir, &tmp);
            Ok((Created::Existing, None))
        }
        Err(e) => {
            let _ = backend.remove(dir, &tmp);
            Err(Error::io(format!("renaming {tmp} to {id}"), e))
        }
    }
}

/// Deletes volume `id` from `pool` if it is an hpp volume: a real directory directly in the
/// pool, on the pool's filesystem, with nothing mounted from or into it. Missing is success.
/// Returns whether anything was deleted. The deletion is durable (journaled, or the directory
/// synced) before its data is removed.
pub fn delete(pool: &Pool, id: &str, mounts: &MountTableCache) -> Result<bool> {
    let dir = pool.open()?;
    if pool.trash.is_some() {
        return Ok(crate::ops::trash::delete_into(pool, dir.as_fd(), id, mounts)?.is_some());
    }
    let journal = match pool.journal_in(dir.as_fd()) {
        Ok(journal) => journal,
        // DeleteVolume asks every pool: one whose journal cannot be opened (a filesystem
        // remounted read-only, say) must not fail the deletion of a volume it does not hold.
        Err(e) => match fsops::entry(dir.as_fd(), id) {
            Ok(Entry::Missing) => {
                pool.volume_commits().entries(dir.as_fd())?;
                return Ok(false);
            }
            _ => return Err(e),
        },
    };
    // Which directory is deleted: only a journal record needs it.
    let was = match &journal {
        Some(_) => DirIdentity::of(dir.as_fd(), id)?,
        None => None,
    };
    // Even when it was already gone: maybe by a rename a crash kept from being synced.
    let retired = retire(pool, dir.as_fd(), id, mounts)?;
    match &journal {
        Some(journal) => {
            let was = if retired { was } else { None };
            let record = Record::Delete { id: id.to_owned(), was };
            volume_journal::append(pool, journal, dir.as_fd(), &record)?
        }
        None => pool.volume_commits().entries(dir.as_fd())?,
    }
    if retired {
        pool.quota.remove(dir.as_fd(), &deleting_name(id))?;
    }
    Ok(retired)
}

/// Checks that `id` in the pool directory `dir` may be deleted and renames it to its deleting
/// name; false when it is missing. Makes nothing durable and removes nothing (the caller does).
pub(crate) fn retire(pool: &Pool, dir: BorrowedFd<'_>, id: &str, mounts: &MountTableCache) -> Result<bool> {
    let gone = deleting_name(id);
    // Finish an interrupted deletion first.
    pool.quota.remove(dir, &gone)?;
    if !check_retirable(pool, dir, id, mounts)? {
        return Ok(false);
    }
    fsops::rename_noreplace(dir, id, &gone).map_err(|e| Error::io(format!("renaming {id} for deletion"), e))?;
    Ok(true)
}

/// Checks that `id` in the pool directory `dir` is an hpp volume that may leave the pool (a
/// real directory on the pool's filesystem, mounted nowhere, not in use); false when it is
/// missing.
pub(crate) fn check_retirable(pool: &Pool, dir: BorrowedFd<'_>, id: &str, mounts: &MountTableCache) -> Result<bool> {
    match fsops::entry(dir, id).map_err(|e| Error::io(format!("stat volume {id}"), e))? {
        Entry::Missing => return Ok(false),
        Entry::Symlink | Entry::Other => {
            return Err(Error::FailedPrecondition(format!(
                "{} is not a directory; it is not an hpp volume and is left alone",
                pool.volume_path(id).display()
            )));
        }
        // Compared by mount, not device: a btrfs subvolume has a device of its own.
        Entry::Dir { .. } if !same_mount(dir, id)? => {
            return Err(Error::FailedPrecondition(format!(
                "{} is a mount point of another filesystem; unmount it first",
                pool.volume_path(id).display()
            )));
        }
        Entry::Dir { .. } => {}
    }
    // Read (or reused from the cache) only once a volume is found.
    let table = crate::pool::fsops::mount_table(mounts)?;
    check_not_mounted(pool, id, &table)?;
    if let Some(why) = pool.quota.in_use(dir, id)? {
        return Err(Error::FailedPrecondition(format!(
            "volume {id} is in use: {why}; unpublish it first"
        )));
    }
    Ok(true)
}

/// Whether `name` in `dir` is on the same mount as `dir` itself.
fn same_mount(dir: std::os::fd::BorrowedFd<'_>, name: &str) -> Result<bool> {
    let cname =
        std::ffi::CString::new(name).map_err(|_| Error::InvalidArgument(format!("{name:?} holds a NUL byte")))?;
    let child = hpp_fs::Meta::at(dir, &cname).map_err(|e| Error::io(format!("stat volume {name}"), e))?;
    let parent = hpp_fs::Meta::of(dir).map_err(|e| Error::io("stat pool", e))?;
    Ok(child.same_mount(&parent))
}

/// Names the temporary in an I/O error from the backend.
fn with_context(e: hpp_fs::quota::QuotaError, path: &std::path::Path) -> Error {
    match e {
        hpp_fs::quota::QuotaError::Io { source, .. } => Error::io(format!("creating {}", path.display()), source),
        other => other.into(),
    }
}

/// Fails with FailedPrecondition while volume `id` is bind-mounted somewhere or has something
/// mounted inside it: deleting it would destroy data a pod is using.
pub fn check_not_mounted(pool: &Pool, id: &str, mounts: &MountTable) -> Result<()> {
    let path = pool.volume_path(id);
    let mut users = mounts.bind_mounts_of(&path);
    users.extend(mounts.mounts_below(&path));
    if let Some(first) = users.first() {
        return Err(Error::FailedPrecondition(format!(
            "volume {id} is still mounted at {} ({} mount(s)); unpublish it first",
            first.display(),
            users.len()
        )));
    }
    Ok(())
}

/// Opens volume `id` in `pool` for reading (clone source, publish source, stats).
/// Missing → NotFound; a symlink or file planted in the pool → InvalidArgument.
pub fn open(pool: &Pool, id: &str) -> Result<OwnedFd> {
    let dir = pool.open()?;
    match fsops::open_child_dir(dir.as_fd(), id) {
        Ok(fd) => Ok(fd),
        Err(Errno::NOENT) => Err(Error::NotFound(format!(
            "volume {id} does not exist in storage pool {}",
            pool.name
        ))),
        Err(Errno::LOOP) | Err(Errno::NOTDIR) => Err(Error::InvalidArgument(format!(
            "{} is a symlink or not a directory; refusing to follow it out of the pool",
            pool.volume_path(id).display()
        ))),
        Err(e) => Err(Error::io(format!("opening volume {id}"), e)),
    }
}

/// Whether volume `id` exists in `pool` as a real directory. Only looks (the mount guard is
/// not applied, so an unmounted guarded pool's volume is reported with an abnormal condition
/// rather than as missing); serving it goes through the guard.
pub fn exists(pool: &Pool, id: &str) -> Result<bool> {
    exists_in(pool.open_unguarded()?.as_fd(), id)
}

/// [`exists`] in the pool directory `dir`, already open.
pub fn exists_in(dir: BorrowedFd<'_>, id: &str) -> Result<bool> {
    Ok(matches!(
        fsops::entry(dir, id).map_err(|e| Error::io(format!("stat volume {id}"), e))?,
        Entry::Dir { .. }
    ))
}

/// Bytes a volume (or trash entry) `id` of `dir` uses: the backend's own accounting when it
/// keeps one, else a bounded walk.
pub(crate) fn used_bytes(pool: &Pool, dir: std::os::fd::BorrowedFd<'_>, id: &str) -> Option<u64> {
    if let Ok(Some(usage)) = pool.quota.usage(dir, id) {
        return Some(usage.used_bytes);
    }
    let fd = fsops::open_child_dir(dir, id).ok()?;
    fsops::usage(fd.as_fd()).ok().map(|(bytes, _)| bytes)
}
