//! The one directory walker: depth first, iterative (an explicit stack, no recursion), never
//! following symlinks, with a bounded number of open descriptors (see [`crate::stack`]).
//!
//! The caller drives it: [`Walker::step`] yields each entry of the current directory, the caller
//! decides whether to [`Walker::descend`] into a directory entry, and once a directory is done
//! the walker climbs back and yields [`Step::Leave`] with the walker in the parent again (so the
//! caller can `rmdir` it or finish its copy).

use std::ffi::{CStr, CString};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::PathBuf;

use rustix::io::Errno;

use crate::error::WalkError;
use crate::meta::Meta;
use crate::stack::DirStack;

/// One step of a walk.
#[derive(Debug)]
pub enum Step {
    /// An entry of the current directory and its metadata.
    Entry(CString, Meta),
    /// The walk finished the directory of this name and is back in its parent.
    Leave(CString),
}

/// An iterative walk below one directory.
#[derive(Debug)]
pub struct Walker {
    stack: DirStack,
    /// Names still to visit, one list per level; the last name is visited first.
    pending: Vec<Vec<CString>>,
    /// Metadata of the root, for mount comparisons.
    root: Meta,
}

impl Walker {
    /// Starts a walk of the directory `root` (which the walker owns from now on).
    pub fn new(root: OwnedFd) -> Result<Self, WalkError> {
        let meta = Meta::of(std::os::fd::AsFd::as_fd(&root)).map_err(|e| WalkError::io("stat", "", e))?;
        let names = read_names(&root).map_err(|e| WalkError::io("read directory", "", e))?;
        Ok(Walker {
            stack: DirStack::with_meta(root, &meta),
            pending: vec![names],
            root: meta,
        })
    }

    /// Starts a walk at a duplicate of `root`; the caller keeps its descriptor.
    pub fn new_dup(root: BorrowedFd<'_>) -> Result<Self, WalkError> {
        let fd = rustix::io::fcntl_dupfd_cloexec(root, 0).map_err(|e| WalkError::io("dup", "", e))?;
        Self::new(fd)
    }

    /// Metadata of the walk's root directory.
    pub fn root_meta(&self) -> &Meta {
        &self.root
    }

    /// The next step, or `None` when the whole tree has been visited. Entries that vanish
    /// between listing and stat are skipped.
    pub fn step(&mut self) -> Result<Option<Step>, WalkError> {
        loop {
            let Some(names) = self.pending.last_mut() else {
                return Ok(None);
            };
            match names.pop() {
                Some(name) => match Meta::at(self.stack.top()?, &name) {
                    Ok(meta) => return Ok(Some(Step::Entry(name, meta))),
                    Err(Errno::NOENT) => continue,
                    Err(e) => return Err(WalkError::io("stat", self.stack.path_of(&name), e)),
                },
                None => {
                    if self.stack.depth() == 0 {
                        self.pending.clear();
                        return Ok(None);
                    }
                    self.pending.pop();
                    let name = self.stack.pop()?;
                    return Ok(Some(Step::Leave(name)));
                }
            }
        }
    }

    /// Enters the directory `name` of the current directory (just yielded by [`Self::step`]).
    /// Its entries come next, then a [`Step::Leave`] for it.
    pub fn descend(&mut self, name: &CStr) -> Result<(), WalkError> {
        self.stack.enter(name)?;
        let names = read_names(self.stack.top()?).map_err(|e| WalkError::io("read directory", self.stack.path(), e))?;
        self.pending.push(names);
        Ok(())
    }

    /// The current directory.
    pub fn dir(&self) -> Result<BorrowedFd<'_>, WalkError> {
        self.stack.top()
    }

    /// The root directory of the walk.
    pub fn root(&self) -> Result<BorrowedFd<'_>, WalkError> {
        self.stack.root()
    }

    /// Levels below the root of the current directory.
    pub fn depth(&self) -> usize {
        self.stack.depth()
    }

    /// Path of `name` in the current directory, relative to the root (for messages).
    pub fn path_of(&self, name: &CStr) -> PathBuf {
        self.stack.path_of(name)
    }

    /// Path of the current directory relative to the root.
    pub fn path(&self) -> PathBuf {
        self.stack.path()
    }

    /// Descriptors the walk holds open right now (bounded; for tests).
    pub fn open_count(&self) -> usize {
        self.stack.open_count()
    }
}

/// Names in a directory, without `.` and `..`, in reverse order so `pop` visits them in
/// directory order.
fn read_names(dir: impl std::os::fd::AsFd) -> rustix::io::Result<Vec<CString>> {
    let mut d = rustix::fs::Dir::read_from(dir)?;
    let mut names = Vec::new();
    while let Some(entry) = d.read() {
        let entry = entry?;
        let b = entry.file_name().to_bytes();
        if b != b"." && b != b".." {
            names.push(entry.file_name().to_owned());
        }
    }
    names.reverse();
    Ok(names)
}
