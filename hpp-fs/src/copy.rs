//! Copies a directory tree for snapshots, restores and clones, on the shared walker.
//!
//! Each regular file is cloned copy-on-write with `FICLONE` (XFS with reflink, btrfs, ...);
//! where extents cannot be shared it is copied keeping its holes (`SEEK_DATA`/`SEEK_HOLE`).
//! Hard links stay hard links, symlinks are copied as links and never followed, and mode,
//! ownership, extended attributes and times are preserved like `cp -a`. Trees deeper than
//! [`CopyOptions::max_depth`] (default [`MAX_COPY_DEPTH`]) are refused with
//! [`WalkError::TooDeep`]; the caller removes its partial destination.

use std::collections::HashMap;
use std::ffi::CStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, SeekFrom, Timestamps};
use rustix::io::Errno;

use crate::error::WalkError;
use crate::meta::Meta;
use crate::stack::DirStack;
use crate::usage::usage;
use crate::walk::{Step, Walker};

/// Deepest directory level a copy accepts by default. Kubernetes workloads do not nest
/// anywhere near this deep; a tree that does is hostile or broken, and copying it would produce
/// paths no tool can open (PATH_MAX is 4096 bytes).
pub const MAX_COPY_DEPTH: usize = 1000;

/// How to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOptions {
    /// Deepest directory level accepted below the source root.
    pub max_depth: usize,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            max_depth: MAX_COPY_DEPTH,
        }
    }
}

/// What a copy did, for logs and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CopyStats {
    /// Regular files copied (hard links to an already copied file not included).
    pub files: u64,
    /// Of those, how many were cloned copy-on-write.
    pub reflinked: u64,
    /// Bytes of regular-file content.
    pub bytes: u64,
    /// Hard links recreated as links.
    pub hardlinks: u64,
}

/// Copies the contents of `src` into the existing, empty directory `dst`, then gives `dst` the
/// mode, owner, extended attributes and times of `src`. Error paths are relative to `src`.
pub fn copy_tree(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, opts: CopyOptions) -> Result<CopyStats, WalkError> {
    let mut walk = Walker::new_dup(src)?;
    let dst_root = rustix::io::fcntl_dupfd_cloexec(dst, 0).map_err(|e| WalkError::io("dup", "", e))?;
    let mut out = DirStack::new(dst_root)?;
    let root_meta = *walk.root_meta();
    // Metadata of the source directories on the way down, applied when each is finished.
    let mut dir_meta: Vec<Meta> = Vec::new();
    // First destination path of every multiply-linked source inode.
    let mut links: HashMap<((u32, u32), u64), PathBuf> = HashMap::new();
    let mut stats = CopyStats::default();
    while let Some(step) = walk.step()? {
        match step {
            Step::Entry(name, meta) => match meta.kind {
                FileType::Directory => {
                    if walk.depth() + 1 > opts.max_depth {
                        return Err(WalkError::TooDeep {
                            path: walk.path_of(&name),
                            limit: opts.max_depth,
                        });
                    }
                    rustix::fs::mkdirat(out.top()?, &name, Mode::from_raw_mode(0o700))
                        .map_err(|e| WalkError::io("mkdir", walk.path_of(&name), e))?;
                    out.enter(&name)?;
                    walk.descend(&name)?;
                    copy_xattrs(walk.dir()?, out.top()?);
                    dir_meta.push(meta);
                }
                FileType::RegularFile => {
                    let path = walk.path_of(&name);
                    if meta.nlink > 1
                        && let Some(first) = links.get(&meta.id())
                        && rustix::fs::linkat(out.root()?, first.as_path(), out.top()?, &name, AtFlags::empty()).is_ok()
                    {
                        stats.hardlinks += 1;
                        continue;
                    }
                    let reflinked = copy_file(walk.dir()?, out.top()?, &name, &meta, &path)?;
                    stats.files += 1;
                    stats.bytes += meta.size;
                    stats.reflinked += u64::from(reflinked);
                    if meta.nlink > 1 {
                        links.insert(meta.id(), path);
                    }
                }
                FileType::Symlink => {
                    let path = walk.path_of(&name);
                    let target = rustix::fs::readlinkat(walk.dir()?, &name, Vec::new())
                        .map_err(|e| WalkError::io("readlink", path.clone(), e))?;
                    rustix::fs::symlinkat(target.as_c_str(), out.top()?, &name)
                        .map_err(|e| WalkError::io("symlink", path, e))?;
                    // Ownership of the link itself; failure (unprivileged) is not fatal.
                    let _ = rustix::fs::chownat(
                        out.top()?,
                        &name,
                        Some(rustix::fs::Uid::from_raw(meta.uid)),
                        Some(rustix::fs::Gid::from_raw(meta.gid)),
                        AtFlags::SYMLINK_NOFOLLOW,
                    );
                }
                other => {
                    tracing::warn!(entry = %walk.path_of(&name).display(), kind = ?other, "skipping special file while copying");
                }
            },
            Step::Leave(name) => {
                let meta = dir_meta.pop().unwrap_or(root_meta);
                // Extended attributes were copied on the way down.
                copy_metadata(None, out.top()?, &meta, &walk.path_of(&name))?;
                out.pop()?;
            }
        }
    }
    copy_metadata(Some(walk.root()?), out.root()?, &root_meta, &PathBuf::new())?;
    Ok(stats)
}

/// Copies one regular file; returns whether it was cloned copy-on-write.
fn copy_file(
    src_dir: BorrowedFd<'_>,
    dst_dir: BorrowedFd<'_>,
    name: &CStr,
    meta: &Meta,
    path: &std::path::Path,
) -> Result<bool, WalkError> {
    let src = rustix::fs::openat(
        src_dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| WalkError::io("open", path, e))?;
    let dst = rustix::fs::openat(
        dst_dir,
        name,
        OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| WalkError::io("create", path, e))?;
    let reflinked = match rustix::fs::ioctl_ficlone(&dst, &src) {
        Ok(()) => true,
        Err(Errno::OPNOTSUPP | Errno::XDEV | Errno::INVAL | Errno::NOTTY | Errno::PERM | Errno::NOSYS) => {
            copy_sparse(&src, &dst, meta.size).map_err(|e| WalkError::io("copy", path, e))?;
            false
        }
        Err(e) => return Err(WalkError::io("clone", path, e)),
    };
    copy_metadata(Some(src.as_fd()), dst.as_fd(), meta, path)?;
    Ok(reflinked)
}

/// Copies the data regions of `src` (`size` bytes) into `dst` and leaves holes as holes, so a
/// sparse file (a volume's disk image) costs only what it holds.
pub fn copy_sparse(src: &OwnedFd, dst: &OwnedFd, size: u64) -> std::io::Result<()> {
    let mut offset = 0u64;
    while offset < size {
        let data = match rustix::fs::seek(src, SeekFrom::Data(offset)) {
            Ok(d) => d,
            Err(Errno::NXIO) => break,
            // No SEEK_DATA here: the whole file is data.
            Err(Errno::INVAL) => offset,
            Err(e) => return Err(e.into()),
        };
        let hole = match rustix::fs::seek(src, SeekFrom::Hole(data)) {
            Ok(h) => h,
            Err(Errno::INVAL) => size,
            Err(e) => return Err(e.into()),
        };
        copy_range(src, dst, data, hole.min(size).max(data))?;
        offset = hole.max(data + 1);
    }
    rustix::fs::ftruncate(dst, size)?;
    Ok(())
}

/// Copies bytes `[from, to)` at the same offsets.
fn copy_range(src: &OwnedFd, dst: &OwnedFd, from: u64, to: u64) -> std::io::Result<()> {
    let mut pos = from;
    while pos < to {
        let len = usize::try_from(to - pos).unwrap_or(usize::MAX).min(1 << 30);
        let (mut off_in, mut off_out) = (pos, pos);
        match rustix::fs::copy_file_range(src, Some(&mut off_in), dst, Some(&mut off_out), len) {
            Ok(0) => break,
            Ok(n) => pos += n as u64,
            Err(Errno::XDEV | Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                return copy_range_rw(src, dst, pos, to);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Plain read/write fallback of [`copy_range`].
fn copy_range_rw(src: &OwnedFd, dst: &OwnedFd, mut pos: u64, to: u64) -> std::io::Result<()> {
    let from = File::from(src.try_clone()?);
    let into = File::from(dst.try_clone()?);
    let mut buf = vec![0u8; 1 << 20];
    while pos < to {
        let want = usize::try_from(to - pos).unwrap_or(usize::MAX).min(buf.len());
        let n = from.read_at(&mut buf[..want], pos)?;
        if n == 0 {
            break;
        }
        into.write_all_at(&buf[..n], pos)?;
        pos += n as u64;
    }
    Ok(())
}

/// Gives `dst` the owner, mode, extended attributes (read from `src` when open) and times.
fn copy_metadata(
    src: Option<BorrowedFd<'_>>,
    dst: BorrowedFd<'_>,
    meta: &Meta,
    path: &std::path::Path,
) -> Result<(), WalkError> {
    // Owner first: chown clears set-id bits and file capabilities, so those go on afterwards.
    if let Err(e) = rustix::fs::fchown(
        dst,
        Some(rustix::fs::Uid::from_raw(meta.uid)),
        Some(rustix::fs::Gid::from_raw(meta.gid)),
    ) && e != Errno::PERM
    {
        return Err(WalkError::io("chown", path, e));
    }
    rustix::fs::fchmod(dst, Mode::from_raw_mode(meta.mode)).map_err(|e| WalkError::io("chmod", path, e))?;
    if let Some(src) = src {
        copy_xattrs(src, dst);
    }
    let ts = |(sec, nsec): (i64, u32)| rustix::fs::Timespec {
        tv_sec: sec,
        tv_nsec: nsec.into(),
    };
    let times = Timestamps {
        last_access: ts(meta.atime),
        last_modification: ts(meta.mtime),
    };
    rustix::fs::futimens(dst, &times).map_err(|e| WalkError::io("set times", path, e))
}

/// Copies every extended attribute the destination accepts; ones it refuses (another
/// filesystem's namespaces, SELinux labels without policy) are skipped.
fn copy_xattrs(src: BorrowedFd<'_>, dst: BorrowedFd<'_>) {
    let Ok(len) = rustix::fs::flistxattr_query(src) else {
        return;
    };
    if len == 0 {
        return;
    }
    let mut list = vec![0u8; len];
    let Ok(n) = rustix::fs::flistxattr(src, &mut list[..]) else {
        return;
    };
    list.truncate(n);
    for name in list.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let Ok(name) = std::ffi::CString::new(name) else {
            continue;
        };
        let Ok(len) = rustix::fs::fgetxattr_query(src, &name) else {
            continue;
        };
        let mut value = vec![0u8; len];
        let Ok(n) = rustix::fs::fgetxattr(src, &name, &mut value[..]) else {
            continue;
        };
        if let Err(e) = rustix::fs::fsetxattr(dst, &name, &value[..n], rustix::fs::XattrFlags::empty()) {
            tracing::debug!(xattr = ?name, error = %e, "extended attribute not copied");
        }
    }
}

/// Fails with [`WalkError::NoSpace`] when a full (non-reflink) copy of `src` cannot fit in the
/// free space of the filesystem holding `dst`. Trees that can be cloned copy-on-write (same
/// filesystem and `FICLONE` works there) always pass: they need no data space up front.
pub fn check_fits(src: BorrowedFd<'_>, dst: BorrowedFd<'_>) -> Result<(), WalkError> {
    // The reflink probe is two empty files; the usage walk reads the whole source tree, so it
    // only runs when a full copy is really ahead.
    if reflink_works(src, dst) {
        return Ok(());
    }
    let fs = rustix::fs::fstatvfs(dst).map_err(|e| WalkError::io("statvfs", "", e))?;
    let available = fs.f_bavail.saturating_mul(fs.f_frsize);
    let needed = usage(src)?.bytes;
    if needed <= available {
        return Ok(());
    }
    Err(WalkError::NoSpace { needed, available })
}

/// Whether `FICLONE` from `src`'s filesystem into `dst` works, tried on a throwaway file.
fn reflink_works(src: BorrowedFd<'_>, dst: BorrowedFd<'_>) -> bool {
    let (Ok(a), Ok(b)) = (Meta::of(src), Meta::of(dst)) else {
        return false;
    };
    if a.dev != b.dev {
        return false;
    }
    let probe = |dir: BorrowedFd<'_>| {
        rustix::fs::openat(
            dir,
            c".",
            OFlags::RDWR | OFlags::TMPFILE | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
    };
    match (probe(dst), probe(dst)) {
        (Ok(x), Ok(y)) => {
            let _ = rustix::fs::ftruncate(&x, 4096);
            rustix::fs::ioctl_ficlone(&y, &x).is_ok()
        }
        _ => false,
    }
}
