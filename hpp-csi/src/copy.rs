//! Copies a directory tree for snapshots, restores and clones: each regular file is cloned
//! copy-on-write with the `FICLONE` ioctl (XFS with reflink, btrfs, bcachefs, ...) and copied
//! byte by byte where the filesystem cannot share extents. Symlinks are copied as links and never
//! followed; mode, ownership and modification times are preserved like `cp -rp`.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timestamps};
use rustix::io::Errno;

use crate::error::{Error, Result};
use crate::fsops;

/// What a copy did, for logs and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CopyStats {
    /// Regular files copied.
    pub files: u64,
    /// Of those, how many were cloned copy-on-write.
    pub reflinked: u64,
    /// Bytes of regular-file content.
    pub bytes: u64,
}

/// Copies the contents of `src` into the existing, empty directory `dst`, then gives `dst` the
/// mode, owner and times of `src`.
pub fn copy_tree(src: BorrowedFd<'_>, dst: BorrowedFd<'_>) -> Result<CopyStats> {
    let mut stats = CopyStats::default();
    copy_dir_contents(src, dst, &mut stats)?;
    let st = rustix::fs::fstat(src).map_err(|e| Error::io("stat of copy source", e))?;
    copy_metadata(dst, &st)?;
    Ok(stats)
}

fn copy_dir_contents(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, stats: &mut CopyStats) -> Result<()> {
    let names = fsops::list_names_bytes(src).map_err(|e| Error::io("reading copy source", e))?;
    for name in names {
        let name = OsStr::from_bytes(&name);
        let shown = name.to_string_lossy().into_owned();
        let st = match rustix::fs::statat(src, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(Error::io(format!("stat {shown}"), e)),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                let s = rustix::fs::openat(src, name, dir_flags(), Mode::empty())
                    .map_err(|e| Error::io(format!("open {shown}"), e))?;
                rustix::fs::mkdirat(dst, name, Mode::from_raw_mode(0o700))
                    .map_err(|e| Error::io(format!("mkdir {shown}"), e))?;
                let d = rustix::fs::openat(dst, name, dir_flags(), Mode::empty())
                    .map_err(|e| Error::io(format!("open {shown}"), e))?;
                copy_dir_contents(s.as_fd(), d.as_fd(), stats)?;
                copy_metadata(d.as_fd(), &st)?;
            }
            FileType::RegularFile => {
                let s = rustix::fs::openat(
                    src,
                    name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| Error::io(format!("open {shown}"), e))?;
                let d = rustix::fs::openat(
                    dst,
                    name,
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| Error::io(format!("create {shown}"), e))?;
                let reflinked = clone_or_copy(s, &d).map_err(|e| Error::io(format!("copy {shown}"), e))?;
                stats.files += 1;
                stats.bytes += st.st_size as u64;
                if reflinked {
                    stats.reflinked += 1;
                }
                copy_metadata(d.as_fd(), &st)?;
            }
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(src, name, Vec::new())
                    .map_err(|e| Error::io(format!("readlink {shown}"), e))?;
                rustix::fs::symlinkat(target.as_c_str(), dst, name)
                    .map_err(|e| Error::io(format!("symlink {shown}"), e))?;
                let owner = (
                    Some(rustix::fs::Uid::from_raw(st.st_uid)),
                    Some(rustix::fs::Gid::from_raw(st.st_gid)),
                );
                // Ownership of the link itself; failure (e.g. unprivileged) is not fatal.
                let _ = rustix::fs::chownat(dst, name, owner.0, owner.1, AtFlags::SYMLINK_NOFOLLOW);
            }
            other => {
                tracing::warn!(entry = %shown, kind = ?other, "skipping special file while copying");
            }
        }
    }
    Ok(())
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// Clones `src` into `dst` with FICLONE; falls back to a plain copy when the filesystem (or the
/// pair of filesystems) cannot share extents. Returns whether the clone worked.
fn clone_or_copy(src: OwnedFd, dst: &OwnedFd) -> std::io::Result<bool> {
    match rustix::fs::ioctl_ficlone(dst, &src) {
        Ok(()) => return Ok(true),
        Err(Errno::OPNOTSUPP | Errno::XDEV | Errno::INVAL | Errno::NOTTY | Errno::PERM | Errno::NOSYS) => {}
        Err(e) => return Err(e.into()),
    }
    let mut from = File::from(src);
    let mut to = File::from(dst.try_clone()?);
    std::io::copy(&mut from, &mut to)?;
    Ok(false)
}

fn copy_metadata(fd: BorrowedFd<'_>, st: &rustix::fs::Stat) -> Result<()> {
    // Owner first: chown clears set-id bits, so the mode goes on afterwards.
    if let Err(e) = rustix::fs::fchown(
        fd,
        Some(rustix::fs::Uid::from_raw(st.st_uid)),
        Some(rustix::fs::Gid::from_raw(st.st_gid)),
    ) && e != Errno::PERM
    {
        return Err(Error::io("chown during copy", e));
    }
    rustix::fs::fchmod(fd, Mode::from_raw_mode(st.st_mode & 0o7777)).map_err(|e| Error::io("chmod during copy", e))?;
    let times = Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: st.st_atime as _,
            tv_nsec: st.st_atime_nsec as _,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: st.st_mtime as _,
            tv_nsec: st.st_mtime_nsec as _,
        },
    };
    rustix::fs::futimens(fd, &times).map_err(|e| Error::io("setting times during copy", e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn copies_files_dirs_links_and_modes() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir(src.path().join("d")).unwrap();
        std::fs::write(src.path().join("d/file"), b"hello").unwrap();
        std::fs::set_permissions(src.path().join("d/file"), std::fs::Permissions::from_mode(0o640)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", src.path().join("link")).unwrap();
        let dst = tempfile::tempdir().unwrap();
        let s = fsops::open_dir_path(src.path()).unwrap();
        let d = fsops::open_dir_path(dst.path()).unwrap();
        let stats = copy_tree(s.as_fd(), d.as_fd()).unwrap();
        assert_eq!(stats.files, 1);
        assert_eq!(stats.bytes, 5);
        assert_eq!(std::fs::read(dst.path().join("d/file")).unwrap(), b"hello");
        let mode = std::fs::metadata(dst.path().join("d/file"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
        assert_eq!(
            std::fs::read_link(dst.path().join("link")).unwrap(),
            std::path::Path::new("/etc/passwd")
        );
        let mtime_src = std::fs::metadata(src.path().join("d/file"))
            .unwrap()
            .modified()
            .unwrap();
        let mtime_dst = std::fs::metadata(dst.path().join("d/file"))
            .unwrap()
            .modified()
            .unwrap();
        assert_eq!(mtime_src, mtime_dst);
    }
}
