//! The error of every walk, with the path (relative to the walk's root) where it happened.

use std::io;
use std::path::PathBuf;

/// What went wrong during a walk. Paths are relative to the directory the walk started at.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalkError {
    /// A system call failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// The operation (`open`, `unlink`, ...).
        op: &'static str,
        /// Where.
        path: PathBuf,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// The walk met another mount and refuses to cross into it.
    #[error("{} is a mount point; refusing to cross it", path.display())]
    CrossesMount {
        /// The mount point.
        path: PathBuf,
    },
    /// A copy met a directory deeper than its documented limit.
    #[error("{} is more than {limit} directory levels deep; refusing to copy it", path.display())]
    TooDeep {
        /// The first directory beyond the limit.
        path: PathBuf,
        /// The limit that was exceeded.
        limit: usize,
    },
    /// A directory was moved while the walk was in it (it no longer sits where it was found).
    #[error("{} was moved while being walked", path.display())]
    Moved {
        /// The directory that moved.
        path: PathBuf,
    },
    /// A copy does not fit in the free space of its destination.
    #[error("copy needs {needed} bytes but only {available} are free")]
    NoSpace {
        /// Bytes the source occupies.
        needed: u64,
        /// Bytes free on the destination.
        available: u64,
    },
}

impl WalkError {
    /// Wraps an errno with the operation and path.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: impl Into<io::Error>) -> Self {
        WalkError::Io {
            op,
            path: path.into(),
            source: source.into(),
        }
    }

    /// The underlying errno, for `Io` errors.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            WalkError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}
