//! Symlink-safe filesystem primitives. Every operation below a pool works relative to an open
//! directory descriptor on a single path component with `O_NOFOLLOW`, so neither a hostile id nor
//! a symlink planted inside a pool can make the driver touch anything outside it.

use std::ffi::OsStr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, Stat};
use rustix::io::Errno;

use crate::error::{Error, Result};

/// Opens a directory by absolute path (trusted configuration: pool roots).
pub fn open_dir_path(path: &Path) -> Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io(format!("opening directory {}", path.display()), e))
}

/// Opens the directory `name` directly inside `dir`, refusing symlinks (the one shared helper).
pub use hpp_fs::open_child_dir;

/// The current mount table from `cache`, its read error as the driver reports it.
pub(crate) fn mount_table(cache: &hpp_fs::MountTableCache) -> Result<std::sync::Arc<crate::mountinfo::MountTable>> {
    cache.current().map_err(|e| Error::io("reading mount table", e))
}

/// What a single directory entry is, looked at without following symlinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// Nothing with that name.
    Missing,
    /// A real directory on the given device.
    Dir {
        /// `st_dev` of the directory, to detect mount points.
        dev: u64,
    },
    /// A symlink: never followed.
    Symlink,
    /// A regular file, socket, device or fifo.
    Other,
}

/// Looks at `name` inside `dir` without following symlinks.
pub fn entry(dir: BorrowedFd<'_>, name: &str) -> rustix::io::Result<Entry> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(classify(&st)),
        Err(Errno::NOENT) => Ok(Entry::Missing),
        Err(e) => Err(e),
    }
}

fn classify(st: &Stat) -> Entry {
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => Entry::Dir { dev: st.st_dev },
        FileType::Symlink => Entry::Symlink,
        _ => Entry::Other,
    }
}

/// Names in a directory, skipping `.` and `..`. Names that are not UTF-8 are skipped too: they
/// can never be valid volume ids.
pub fn list_names(dir: BorrowedFd<'_>) -> rustix::io::Result<Vec<String>> {
    list_names_where(dir, |_, _| true)
}

/// The names of [`list_names`] that `keep` accepts, given each entry's type as the directory
/// reports it (`FileType::Unknown` where the filesystem does not say). Only kept names are
/// copied, so a start-up looking for a few leftovers among 100,000 volumes holds a few names,
/// not 100,000.
pub fn list_names_where(
    dir: BorrowedFd<'_>,
    mut keep: impl FnMut(&str, FileType) -> bool,
) -> rustix::io::Result<Vec<String>> {
    let mut d = rustix::fs::Dir::read_from(dir)?;
    let mut names = Vec::new();
    while let Some(entry) = d.read() {
        let entry = entry?;
        let bytes = entry.file_name().to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        if let Ok(s) = std::str::from_utf8(bytes)
            && keep(s, entry.file_type())
        {
            names.push(s.to_owned());
        }
    }
    Ok(names)
}

/// Creates directory `name` in `dir` with `mode` (exactly: the umask does not apply).
pub fn mkdir_exact(dir: BorrowedFd<'_>, name: &str, mode: u32) -> rustix::io::Result<OwnedFd> {
    rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(mode))?;
    let fd = open_child_dir(dir, name)?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
    Ok(fd)
}

/// Atomically renames `from` to `to` inside `dir`, failing with `EEXIST` instead of replacing.
pub fn rename_noreplace(dir: BorrowedFd<'_>, from: &str, to: &str) -> rustix::io::Result<()> {
    rustix::fs::renameat_with(dir, from, dir, to, RenameFlags::NOREPLACE)
}

/// Removes `name` inside `dir` and everything below it, never following symlinks and never
/// crossing into another mount (a mount inside the tree stops the removal with
/// FailedPrecondition). Any depth works: the walk is [`hpp_fs::remove_tree`]. Missing is
/// success, so interrupted removals can simply be retried.
pub fn remove_tree(dir: BorrowedFd<'_>, name: &str) -> Result<()> {
    Ok(hpp_fs::remove_tree(dir, OsStr::new(name))?)
}

/// Whether the open directory `fd` is the root of a mount, from `statx` on the descriptor
/// itself (so the answer is about exactly what was opened); `None` when the kernel cannot say.
pub fn fd_is_mount_root(fd: BorrowedFd<'_>) -> Option<bool> {
    use rustix::fs::{StatxAttributes, StatxFlags};
    let st = rustix::fs::statx(fd, c"", AtFlags::EMPTY_PATH, StatxFlags::BASIC_STATS).ok()?;
    st.stx_attributes_mask
        .contains(StatxAttributes::MOUNT_ROOT)
        .then(|| st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT))
}

/// Whether a filesystem is mounted at `path`: [`is_mount_root`], else the mount table.
pub fn is_mount_point(path: &Path) -> bool {
    is_mount_root(path).unwrap_or_else(|| listed_as_mount_point(path))
}

/// Whether a fresh read of the mount table lists `path` as a mount point (false when it cannot
/// be read): the answer where `statx` cannot tell.
pub fn listed_as_mount_point(path: &Path) -> bool {
    crate::mountinfo::MountTable::read()
        .map(|t| t.is_mount_point(path))
        .unwrap_or(false)
}

/// Whether `path` is the root of a mount, from `statx` (Linux 5.8+) without reading the mount
/// table (a missing path is no mount point); `None` when the kernel or filesystem cannot say.
pub fn is_mount_root(path: &std::path::Path) -> Option<bool> {
    use rustix::fs::{CWD, StatxAttributes, StatxFlags};
    let st = match rustix::fs::statx(CWD, path, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::BASIC_STATS) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Some(false),
        Err(_) => return None,
    };
    st.stx_attributes_mask
        .contains(StatxAttributes::MOUNT_ROOT)
        .then(|| st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT))
}

/// Bytes (allocated blocks) and inodes used by the tree below `dir`, not crossing mounts;
/// any depth (the walk is [`hpp_fs::usage()`]).
pub fn usage(dir: BorrowedFd<'_>) -> Result<(u64, u64)> {
    let u = hpp_fs::usage(dir)?;
    Ok((u.bytes, u.inodes))
}

/// Whether directory `dir` holds nothing but `.` and `..` (reads up to its first entry).
pub fn is_empty_dir(dir: BorrowedFd<'_>) -> rustix::io::Result<bool> {
    let mut d = rustix::fs::Dir::read_from(dir)?;
    while let Some(entry) = d.read() {
        let entry = entry?;
        if !matches!(entry.file_name().to_bytes(), b"." | b"..") {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn remove_tree_deletes_contents_but_not_symlink_targets() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("precious"), b"keep").unwrap();
        let root = tempfile::tempdir().unwrap();
        let vol = root.path().join("vol");
        std::fs::create_dir_all(vol.join("a/b")).unwrap();
        std::fs::write(vol.join("a/b/f"), b"x").unwrap();
        std::os::unix::fs::symlink(outside.path(), vol.join("link")).unwrap();
        let fd = open_dir_path(root.path()).unwrap();
        remove_tree(fd.as_fd(), "vol").unwrap();
        assert!(!vol.exists());
        assert!(outside.path().join("precious").exists());
        remove_tree(fd.as_fd(), "vol").unwrap();
    }

    #[test]
    fn entry_does_not_follow_symlinks() {
        let root = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", root.path().join("evil")).unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        let fd = open_dir_path(root.path()).unwrap();
        assert_eq!(entry(fd.as_fd(), "evil").unwrap(), Entry::Symlink);
        assert!(matches!(entry(fd.as_fd(), "d").unwrap(), Entry::Dir { .. }));
        assert_eq!(entry(fd.as_fd(), "nope").unwrap(), Entry::Missing);
        assert!(open_child_dir(fd.as_fd(), "evil").is_err());
    }

    #[test]
    fn mount_root_is_detected_without_the_mount_table() {
        assert_eq!(is_mount_root(std::path::Path::new("/proc")), Some(true));
        let dir = tempfile::tempdir().unwrap();
        assert_ne!(is_mount_root(dir.path()), Some(true));
        assert_eq!(is_mount_root(&dir.path().join("missing")), Some(false));
    }

    #[test]
    fn usage_counts_bytes_and_inodes() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("sub")).unwrap();
        std::fs::write(root.path().join("sub/f"), vec![1u8; 64 * 1024]).unwrap();
        let fd = open_dir_path(root.path()).unwrap();
        let (bytes, inodes) = usage(fd.as_fd()).unwrap();
        assert_eq!(inodes, 3);
        assert!(bytes >= 64 * 1024, "{bytes}");
    }
}
