//! What the walker knows about one entry: one `statx` without following symlinks, including
//! the mount id so bind mounts of the same filesystem are recognised as mounts too.

use std::ffi::CStr;
use std::os::fd::BorrowedFd;

use rustix::fs::{AtFlags, FileType, Statx, StatxFlags};

/// Metadata of one directory entry (the entry itself, never a symlink's target).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// File type.
    pub kind: FileType,
    /// Permission bits including set-id and sticky bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Hard link count.
    pub nlink: u32,
    /// Size in bytes.
    pub size: u64,
    /// Allocated 512-byte blocks.
    pub blocks: u64,
    /// Device, as `(major, minor)`.
    pub dev: (u32, u32),
    /// Inode number.
    pub ino: u64,
    /// Mount id, where the kernel reports it (Linux 5.8+).
    pub mnt_id: Option<u64>,
    /// Access time (seconds, nanoseconds).
    pub atime: (i64, u32),
    /// Modification time (seconds, nanoseconds).
    pub mtime: (i64, u32),
}

impl Meta {
    fn from_statx(st: &Statx) -> Self {
        Meta {
            kind: FileType::from_raw_mode(u32::from(st.stx_mode)),
            mode: u32::from(st.stx_mode) & 0o7777,
            uid: st.stx_uid,
            gid: st.stx_gid,
            nlink: st.stx_nlink,
            size: st.stx_size,
            blocks: st.stx_blocks,
            dev: (st.stx_dev_major, st.stx_dev_minor),
            ino: st.stx_ino,
            mnt_id: (st.stx_mask & StatxFlags::MNT_ID.bits() != 0).then_some(st.stx_mnt_id),
            atime: (st.stx_atime.tv_sec, st.stx_atime.tv_nsec),
            mtime: (st.stx_mtime.tv_sec, st.stx_mtime.tv_nsec),
        }
    }

    /// Metadata of `name` in `dir`, not following a symlink.
    pub fn at(dir: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<Self> {
        let st = rustix::fs::statx(dir, name, AtFlags::SYMLINK_NOFOLLOW, mask())?;
        Ok(Self::from_statx(&st))
    }

    /// Metadata of an open descriptor.
    pub fn of(fd: BorrowedFd<'_>) -> rustix::io::Result<Self> {
        let st = rustix::fs::statx(fd, c"", AtFlags::EMPTY_PATH, mask())?;
        Ok(Self::from_statx(&st))
    }

    /// Whether `self` and `other` live on the same mount (mount id when both have one, else the
    /// device). A bind mount of the same filesystem has the same device but another mount id.
    pub fn same_mount(&self, other: &Meta) -> bool {
        match (self.mnt_id, other.mnt_id) {
            (Some(a), Some(b)) => a == b,
            _ => self.dev == other.dev,
        }
    }

    /// Identity of the inode: `(device, inode)`.
    pub fn id(&self) -> ((u32, u32), u64) {
        (self.dev, self.ino)
    }

    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.kind == FileType::Directory
    }
}

fn mask() -> StatxFlags {
    StatxFlags::BASIC_STATS | StatxFlags::MNT_ID
}
