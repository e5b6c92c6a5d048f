//! The descent path of a walk with a bounded number of open descriptors.
//!
//! Only the root and the deepest [`MAX_OPEN`] levels keep their directory open. Climbing back
//! to a level whose descriptor was closed reopens it as `..` of the level below and checks that
//! it is still the same inode (device and inode number recorded on the way down), so a tenant
//! who moves a directory mid-walk makes the walk stop with [`WalkError::Moved`] instead of
//! steering it somewhere else. Memory is a few dozen bytes per level plus the names.

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use rustix::fs::{Mode, OFlags};

use crate::error::WalkError;
use crate::meta::Meta;

/// Directory levels (below the root) that keep an open descriptor.
pub const MAX_OPEN: usize = 16;

#[derive(Debug)]
struct Level {
    /// Name of this directory in its parent (empty for the root).
    name: CString,
    /// `(device, inode)` recorded when the level was entered.
    id: ((u32, u32), u64),
    /// Open while the level is the root or among the deepest [`MAX_OPEN`] levels.
    fd: Option<OwnedFd>,
}

/// Open flags for every directory a walk enters: never through a symlink.
pub fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// Opens the directory `name` directly inside `dir` with [`dir_flags`]: a symlink is refused,
/// never followed. Every volume, pool and temporary hpp opens by name goes through this.
pub fn open_child_dir<P: rustix::path::Arg>(dir: BorrowedFd<'_>, name: P) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(dir, name, dir_flags(), Mode::empty())
}

/// The chain of directories from a walk's root down to where it is now.
#[derive(Debug)]
pub struct DirStack {
    levels: Vec<Level>,
    /// Levels whose descriptor is open.
    open: usize,
}

impl DirStack {
    /// Starts at `root`, which stays open for the whole walk.
    pub fn new(root: OwnedFd) -> Result<Self, WalkError> {
        let meta = Meta::of(root.as_fd()).map_err(|e| WalkError::io("stat", "", e))?;
        Ok(Self::with_meta(root, &meta))
    }

    /// Starts at `root`, whose metadata the caller already has.
    pub fn with_meta(root: OwnedFd, meta: &Meta) -> Self {
        DirStack {
            levels: vec![Level {
                name: CString::default(),
                id: meta.id(),
                fd: Some(root),
            }],
            open: 1,
        }
    }

    /// Levels below the root (0 at the root).
    pub fn depth(&self) -> usize {
        self.levels.len() - 1
    }

    /// The current (deepest) directory; always open.
    pub fn top(&self) -> Result<BorrowedFd<'_>, WalkError> {
        self.levels
            .last()
            .and_then(|l| l.fd.as_ref())
            .map(AsFd::as_fd)
            .ok_or_else(|| WalkError::io("walk", self.path(), rustix::io::Errno::BADF))
    }

    /// The root directory.
    pub fn root(&self) -> Result<BorrowedFd<'_>, WalkError> {
        self.levels
            .first()
            .and_then(|l| l.fd.as_ref())
            .map(AsFd::as_fd)
            .ok_or_else(|| WalkError::io("walk", "", rustix::io::Errno::BADF))
    }

    /// Opens `name` in the current directory (no symlinks) and makes it the current directory.
    pub fn enter(&mut self, name: &CStr) -> Result<(), WalkError> {
        let fd = rustix::fs::openat(self.top()?, name, dir_flags(), Mode::empty())
            .map_err(|e| WalkError::io("open", self.path_of(name), e))?;
        self.push(name.to_owned(), fd)
    }

    /// Makes the already-open directory `fd`, called `name` in the current one, current.
    pub fn push(&mut self, name: CString, fd: OwnedFd) -> Result<(), WalkError> {
        let meta = Meta::of(fd.as_fd()).map_err(|e| WalkError::io("stat", self.path_of(&name), e))?;
        self.levels.push(Level {
            name,
            id: meta.id(),
            fd: Some(fd),
        });
        self.open += 1;
        // Close the level that just left the window (never the root).
        if let Some(idx) = self.levels.len().checked_sub(MAX_OPEN + 1)
            && idx > 0
            && let Some(level) = self.levels.get_mut(idx)
            && level.fd.take().is_some()
        {
            self.open -= 1;
        }
        Ok(())
    }

    /// Climbs back to the parent of the current directory and returns the name the current one
    /// has in it. The parent is reopened through `..` and checked when its descriptor was closed.
    pub fn pop(&mut self) -> Result<CString, WalkError> {
        let n = self.levels.len();
        if n < 2 {
            return Err(WalkError::io("walk", "", rustix::io::Errno::INVAL));
        }
        if self.levels[n - 2].fd.is_none() {
            // Paths are built only for errors: building one costs the depth.
            let fd = rustix::fs::openat(self.top()?, c"..", dir_flags(), Mode::empty())
                .map_err(|e| WalkError::io("open", self.path_to(n - 1), e))?;
            let meta = Meta::of(fd.as_fd()).map_err(|e| WalkError::io("stat", self.path_to(n - 1), e))?;
            if meta.id() != self.levels[n - 2].id {
                return Err(WalkError::Moved { path: self.path() });
            }
            self.levels[n - 2].fd = Some(fd);
            self.open += 1;
        }
        let level = self
            .levels
            .pop()
            .ok_or_else(|| WalkError::io("walk", "", rustix::io::Errno::INVAL))?;
        if level.fd.is_some() {
            self.open -= 1;
        }
        Ok(level.name)
    }

    /// Path of the current directory relative to the root.
    pub fn path(&self) -> PathBuf {
        self.path_to(self.levels.len())
    }

    /// Path of `name` in the current directory, relative to the root.
    pub fn path_of(&self, name: &CStr) -> PathBuf {
        let mut p = self.path();
        p.push(OsStr::from_bytes(name.to_bytes()));
        p
    }

    fn path_to(&self, levels: usize) -> PathBuf {
        let mut p = PathBuf::new();
        for l in self.levels.iter().take(levels).skip(1) {
            p.push(OsStr::from_bytes(l.name.to_bytes()));
        }
        p
    }

    /// Number of descriptors this stack holds open (for tests).
    pub fn open_count(&self) -> usize {
        self.open
    }
}
