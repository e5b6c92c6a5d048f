//! Kernel calls hpp needs that no maintained safe crate wraps yet (rustix 1.1 has `open_tree`
//! and `move_mount` but not `mount_setattr`). Everything else in the workspace forbids
//! `unsafe`; this crate denies it too and allows it only on the individual blocks below, each
//! with the argument why it is sound. Keep it that way: when rustix grows a wrapper, delete the
//! function here and call rustix.
//!
//! Every function takes borrowed file descriptors and Rust strings, checks its inputs, and
//! returns `std::io::Error` from the kernel's errno, so callers never see raw pointers.

pub mod btrfs;
pub mod loopdev;
pub mod malloc;
pub mod mount;
pub mod mount_watch;
pub mod quota;
