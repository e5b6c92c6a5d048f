//! Recursive removal on the shared walker: never follows symlinks (they are unlinked as links),
//! never crosses into another mount (bind mounts of the same filesystem included), works on
//! trees of any depth with bounded descriptors. Missing is success, so an interrupted removal
//! is simply retried.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use rustix::fs::AtFlags;
use rustix::io::Errno;

use crate::error::WalkError;
use crate::meta::Meta;
use crate::stack::dir_flags;
use crate::walk::{Step, Walker};

/// Turns a name into a C string; a NUL byte can never name a file.
pub(crate) fn c_name(name: &OsStr) -> Result<CString, WalkError> {
    CString::new(name.as_bytes()).map_err(|_| WalkError::io("name", PathBuf::from(name), Errno::INVAL))
}

/// Removes `name` inside `parent` and everything below it. Errors name paths relative to
/// `parent`. A mount anywhere inside stops the removal with [`WalkError::CrossesMount`].
pub fn remove_tree(parent: BorrowedFd<'_>, name: &OsStr) -> Result<(), WalkError> {
    let cname = c_name(name)?;
    // An empty directory (most deletions, and every retry's leftover) is one `rmdir`. It fails
    // on anything the walk has to look at: contents (ENOTEMPTY), a symlink or file (ENOTDIR),
    // a mount point (EBUSY); the walk below then handles, or refuses, that case.
    match rustix::fs::unlinkat(parent, &cname, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => return Ok(()),
        Err(_) => {}
    }
    let top = match Meta::at(parent, &cname) {
        Ok(m) => m,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(WalkError::io("stat", name, e)),
    };
    if !top.is_dir() {
        return unlink(parent, &cname, AtFlags::empty(), || PathBuf::from(name));
    }
    let parent_meta = Meta::of(parent).map_err(|e| WalkError::io("stat", "", e))?;
    if !top.same_mount(&parent_meta) {
        return Err(WalkError::CrossesMount { path: name.into() });
    }
    let fd = rustix::fs::openat(parent, &cname, dir_flags(), rustix::fs::Mode::empty())
        .map_err(|e| WalkError::io("open", name, e))?;
    let mut walk = Walker::new(fd)?;
    let root = *walk.root_meta();
    let prefix = PathBuf::from(name);
    while let Some(step) = walk.step()? {
        match step {
            Step::Entry(child, meta) if meta.is_dir() => {
                if !meta.same_mount(&root) {
                    return Err(WalkError::CrossesMount {
                        path: prefix.join(walk.path_of(&child)),
                    });
                }
                walk.descend(&child).map_err(|e| prefixed(e, &prefix))?;
            }
            Step::Entry(child, _) => {
                unlink(walk.dir()?, &child, AtFlags::empty(), || {
                    prefix.join(walk.path_of(&child))
                })?;
            }
            Step::Leave(child) => {
                unlink(walk.dir()?, &child, AtFlags::REMOVEDIR, || {
                    prefix.join(walk.path_of(&child))
                })?;
            }
        }
    }
    drop(walk);
    unlink(parent.as_fd(), &cname, AtFlags::REMOVEDIR, || PathBuf::from(name))
}

/// `unlinkat`; missing is fine. The path is only built for an error (building it costs the
/// depth, which must not be paid per entry on deep trees).
fn unlink(
    dir: BorrowedFd<'_>,
    name: &std::ffi::CStr,
    flags: AtFlags,
    path: impl FnOnce() -> PathBuf,
) -> Result<(), WalkError> {
    match rustix::fs::unlinkat(dir, name, flags) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(WalkError::io(
            if flags.is_empty() { "unlink" } else { "rmdir" },
            path(),
            e,
        )),
    }
}

/// Puts `prefix` in front of the path of a walk error.
pub(crate) fn prefixed(e: WalkError, prefix: &std::path::Path) -> WalkError {
    match e {
        WalkError::Io { op, path, source } => WalkError::Io {
            op,
            path: prefix.join(path),
            source,
        },
        WalkError::CrossesMount { path } => WalkError::CrossesMount {
            path: prefix.join(path),
        },
        WalkError::TooDeep { path, limit } => WalkError::TooDeep {
            path: prefix.join(path),
            limit,
        },
        WalkError::Moved { path } => WalkError::Moved {
            path: prefix.join(path),
        },
        other => other,
    }
}
