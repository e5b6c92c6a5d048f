//! Filesystem building blocks shared by every hpp crate that touches volume trees or the mount
//! table, so there is exactly one of each:
//!
//! - [`walk`]: an iterative, symlink-safe directory walker with an explicit stack and a bounded
//!   number of open descriptors, and the three walks built on it: [`remove_tree`], [`usage()`]
//!   and [`copy_tree`]. A tenant-made tree 100,000 levels deep neither overflows a thread stack
//!   nor exhausts file descriptors.
//! - [`quota`]: per-volume size limits, one backend per pool.
//! - [`group_sync`]: group commit, so concurrent creates and deletes share one directory sync.
//! - [`journal`]: an intent journal, so a create or delete is durable with one shared
//!   `fdatasync` of preallocated blocks instead of a journal commit of the whole filesystem.
//! - [`trash`]: deleted volumes kept for a retention, purged by age or free space.
//! - [`mountinfo`]: the parser for `/proc/self/mountinfo` and the per-mount flags of an entry.

pub mod copy;
pub mod error;
pub mod group_sync;
pub mod journal;
pub mod meta;
pub mod mount_cache;
pub mod mountinfo;
pub mod quota;
pub mod remove;
pub mod stack;
pub mod trash;
pub mod usage;
pub mod walk;

pub use copy::{CopyOptions, CopyStats, MAX_COPY_DEPTH, copy_tree};
pub use error::WalkError;
pub use meta::Meta;
pub use mount_cache::MountTableCache;
pub use remove::remove_tree;
pub use stack::open_child_dir;
pub use usage::{Usage, usage};
pub use walk::{Step, Walker};
