//! Project quotas (XFS and ext4): the project id of a directory (`FS_IOC_FSGETXATTR` /
//! `FS_IOC_FSSETXATTR`, with `PROJINHERIT` so everything made below inherits it) and the limit
//! and usage of a project (`quotactl_fd(2)` with the generic `Q_SETQUOTA`/`Q_GETQUOTA`, which
//! both filesystems implement, on a descriptor: no block device path needed; Linux 5.14+).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `struct fsxattr` from `linux/fs.h`.
#[repr(C)]
#[derive(Default)]
struct FsXattr {
    xflags: u32,
    extsize: u32,
    nextents: u32,
    projid: u32,
    cowextsize: u32,
    pad: [u8; 8],
}

const _: () = assert!(std::mem::size_of::<FsXattr>() == 28);

/// `_IOR('X', 31, struct fsxattr)`.
const FS_IOC_FSGETXATTR: u64 = 0x801c_581f;
/// `_IOW('X', 32, struct fsxattr)`.
const FS_IOC_FSSETXATTR: u64 = 0x401c_5820;
/// `FS_XFLAG_PROJINHERIT`: new entries below inherit the directory's project id.
pub const XFLAG_PROJINHERIT: u32 = 0x0000_0200;

/// `PRJQUOTA`.
const PRJQUOTA: u32 = 2;
const Q_GETQUOTA: u32 = 0x80_0007;
const Q_SETQUOTA: u32 = 0x80_0008;
/// Quota block limits are counted in units of this many bytes (`QIF_DQBLKSIZE`).
pub const QUOTA_BLOCK: u64 = 1024;

const fn qcmd(cmd: u32, kind: u32) -> u32 {
    (cmd << 8) | (kind & 0xff)
}

#[allow(unsafe_code)]
fn xattr_ioctl(fd: BorrowedFd<'_>, request: u64, arg: &mut FsXattr) -> io::Result<()> {
    // SAFETY: `fd` is live for the call; `arg` is an exclusively borrowed, initialised
    // `struct fsxattr` whose size is the one encoded in `request`; the kernel keeps no pointer.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request as libc::Ioctl, arg as *mut FsXattr) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The project id of the file or directory open as `fd`, and whether it has `PROJINHERIT`.
pub fn project_id(fd: BorrowedFd<'_>) -> io::Result<(u32, bool)> {
    let mut x = FsXattr::default();
    xattr_ioctl(fd, FS_IOC_FSGETXATTR, &mut x)?;
    Ok((x.projid, x.xflags & XFLAG_PROJINHERIT != 0))
}

/// Sets the project id of the directory open as `fd` and marks it `PROJINHERIT`, keeping its
/// other attributes.
pub fn set_project_id(fd: BorrowedFd<'_>, id: u32) -> io::Result<()> {
    let mut x = FsXattr::default();
    xattr_ioctl(fd, FS_IOC_FSGETXATTR, &mut x)?;
    x.projid = id;
    x.xflags |= XFLAG_PROJINHERIT;
    xattr_ioctl(fd, FS_IOC_FSSETXATTR, &mut x)
}

/// Usage and hard limits of one project, in bytes and inodes (0 = no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProjectQuota {
    /// Bytes charged to the project.
    pub used_bytes: u64,
    /// Hard limit in bytes.
    pub limit_bytes: u64,
    /// Inodes charged to the project.
    pub used_inodes: u64,
    /// Hard inode limit.
    pub limit_inodes: u64,
}

#[allow(unsafe_code)]
fn quotactl_fd(fd: BorrowedFd<'_>, cmd: u32, id: u32, dq: &mut libc::dqblk) -> io::Result<()> {
    // SAFETY: `fd` is live for the call; `dq` is an exclusively borrowed, initialised
    // `struct if_dqblk` (libc's `dqblk` has its layout), the only memory Q_GETQUOTA and
    // Q_SETQUOTA read or write; the kernel keeps no pointer.
    let rc = unsafe { libc::syscall(libc::SYS_quotactl_fd, fd.as_raw_fd(), cmd, id, dq as *mut libc::dqblk) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn empty_dqblk() -> libc::dqblk {
    libc::dqblk {
        dqb_bhardlimit: 0,
        dqb_bsoftlimit: 0,
        dqb_curspace: 0,
        dqb_ihardlimit: 0,
        dqb_isoftlimit: 0,
        dqb_curinodes: 0,
        dqb_btime: 0,
        dqb_itime: 0,
        dqb_valid: 0,
    }
}

/// Sets the hard (and soft, equal) block and inode limits of project `id` on the filesystem
/// of `fd`. Bytes are rounded up to whole quota blocks; 0 removes a limit.
pub fn set_project_limits(fd: BorrowedFd<'_>, id: u32, bytes: u64, inodes: u64) -> io::Result<()> {
    let blocks = bytes.div_ceil(QUOTA_BLOCK);
    let mut dq = empty_dqblk();
    dq.dqb_bhardlimit = blocks;
    dq.dqb_bsoftlimit = blocks;
    dq.dqb_ihardlimit = inodes;
    dq.dqb_isoftlimit = inodes;
    dq.dqb_valid = libc::QIF_BLIMITS | libc::QIF_ILIMITS;
    quotactl_fd(fd, qcmd(Q_SETQUOTA, PRJQUOTA), id, &mut dq)
}

/// Usage and limits of project `id` on the filesystem of `fd`.
pub fn project_quota(fd: BorrowedFd<'_>, id: u32) -> io::Result<ProjectQuota> {
    let mut dq = empty_dqblk();
    quotactl_fd(fd, qcmd(Q_GETQUOTA, PRJQUOTA), id, &mut dq)?;
    Ok(ProjectQuota {
        used_bytes: dq.dqb_curspace,
        limit_bytes: dq.dqb_bhardlimit.saturating_mul(QUOTA_BLOCK),
        used_inodes: dq.dqb_curinodes,
        limit_inodes: dq.dqb_ihardlimit,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn commands_match_the_kernel_headers() {
        assert_eq!(qcmd(Q_SETQUOTA, PRJQUOTA), 0x8000_0802);
        assert_eq!(qcmd(Q_GETQUOTA, PRJQUOTA), 0x8000_0702);
    }

    /// Without project quota on the filesystem (tmpfs or a filesystem mounted without
    /// prjquota), quotactl fails with an errno instead of pretending.
    #[test]
    fn a_filesystem_without_project_quota_says_so() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = std::fs::File::open(tmp.path()).unwrap();
        assert!(project_quota(dir.as_fd(), 1_048_576).is_err());
        assert!(set_project_limits(dir.as_fd(), 1_048_576, 1 << 20, 0).is_err());
    }
}
