//! Copies a directory tree for snapshots, restores and clones: reflink where the filesystem
//! can share extents, otherwise a sparse copy keeping hard links and extended attributes. The
//! walk is [`hpp_fs::copy_tree`] (iterative, bounded descriptors); trees deeper than
//! [`hpp_fs::MAX_COPY_DEPTH`] levels are refused with FailedPrecondition naming the path, and
//! the caller removes its temporary.

use std::os::fd::BorrowedFd;

pub use hpp_fs::CopyStats;

use crate::error::Result;

/// Copies the contents of `src` into the existing, empty directory `dst`, then gives `dst` the
/// mode, owner and times of `src`. Fails with ResourceExhausted before copying anything when a
/// full copy is needed and cannot fit.
pub fn copy_tree(src: BorrowedFd<'_>, dst: BorrowedFd<'_>) -> Result<CopyStats> {
    hpp_fs::copy::check_fits(src, dst)?;
    Ok(hpp_fs::copy_tree(src, dst, hpp_fs::CopyOptions::default())?)
}
