//! Space and inodes used by a tree, on the shared walker (any depth, bounded descriptors).

use std::os::fd::BorrowedFd;

use crate::error::WalkError;
use crate::walk::{Step, Walker};

/// What a tree uses.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Allocated bytes (blocks × 512), hard links counted once per link.
    pub bytes: u64,
    /// Inodes, the root included.
    pub inodes: u64,
}

/// Bytes and inodes used below (and including) `dir`, not descending into other mounts (a
/// mount point inside counts as one inode).
pub fn usage(dir: BorrowedFd<'_>) -> Result<Usage, WalkError> {
    let mut walk = Walker::new_dup(dir)?;
    let root = *walk.root_meta();
    let mut u = Usage {
        bytes: root.blocks.saturating_mul(512),
        inodes: 1,
    };
    while let Some(step) = walk.step()? {
        if let Step::Entry(name, meta) = step {
            u.bytes = u.bytes.saturating_add(meta.blocks.saturating_mul(512));
            u.inodes = u.inodes.saturating_add(1);
            if meta.is_dir() && meta.same_mount(&root) {
                walk.descend(&name)?;
            }
        }
    }
    Ok(u)
}
