//! The btrfs ioctls the quota backend needs: subvolumes (create, snapshot, destroy, id) and
//! qgroups (enable quotas, set a limit, remove). No maintained crate wraps them without
//! linking libbtrfsutil (a C library), so the few structures are written out here from
//! `linux/btrfs.h`; their sizes are checked at compile time against the ioctl numbers' sizes.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;

/// `BTRFS_IOCTL_MAGIC`.
const MAGIC: u64 = 0x94;
/// Largest name in `btrfs_ioctl_vol_args` (`BTRFS_PATH_NAME_MAX`).
const PATH_NAME_MAX: usize = 4087;
/// Largest name in `btrfs_ioctl_vol_args_v2` (`BTRFS_SUBVOL_NAME_MAX`).
const SUBVOL_NAME_MAX: usize = 4039;
/// `BTRFS_SUBVOL_RDONLY`: the snapshot is read-only.
const SUBVOL_RDONLY: u64 = 1 << 1;
/// `BTRFS_QUOTA_CTL_ENABLE`.
const QUOTA_CTL_ENABLE: u64 = 1;
/// `BTRFS_QGROUP_LIMIT_MAX_RFER`: limit the referenced bytes.
const QGROUP_LIMIT_MAX_RFER: u64 = 1;
/// `BTRFS_FIRST_FREE_OBJECTID`: inode number of every subvolume's root directory.
pub const SUBVOL_ROOT_INO: u64 = 256;
/// `BTRFS_SUPER_MAGIC`: `f_type` of a btrfs filesystem.
pub const SUPER_MAGIC: i64 = 0x9123_683E;

/// `_IOC(dir, MAGIC, nr, size)` for x86, arm and most other architectures.
const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (MAGIC << 8) | nr
}
const WRITE: u64 = 1;
const READ: u64 = 2;

#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; PATH_NAME_MAX + 1],
}

#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; SUBVOL_NAME_MAX + 1],
}

#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; 4080],
}

#[repr(C)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

#[repr(C)]
struct QgroupCreateArgs {
    create: u64,
    qgroupid: u64,
}

#[repr(C)]
struct FsInfoArgs {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; 16],
    rest: [u8; 1024 - 32],
}

const _: () = assert!(std::mem::size_of::<VolArgs>() == 4096);
const _: () = assert!(std::mem::size_of::<VolArgsV2>() == 4096);
const _: () = assert!(std::mem::size_of::<InoLookupArgs>() == 4096);
const _: () = assert!(std::mem::size_of::<QgroupLimitArgs>() == 48);
const _: () = assert!(std::mem::size_of::<FsInfoArgs>() == 1024);

const IOC_SUBVOL_CREATE: u64 = ioc(WRITE, 14, std::mem::size_of::<VolArgs>());
const IOC_SNAP_DESTROY: u64 = ioc(WRITE, 15, std::mem::size_of::<VolArgs>());
const IOC_INO_LOOKUP: u64 = ioc(READ | WRITE, 18, std::mem::size_of::<InoLookupArgs>());
const IOC_SNAP_CREATE_V2: u64 = ioc(WRITE, 23, std::mem::size_of::<VolArgsV2>());
const IOC_SUBVOL_GETFLAGS: u64 = ioc(READ, 25, std::mem::size_of::<u64>());
const IOC_SUBVOL_SETFLAGS: u64 = ioc(WRITE, 26, std::mem::size_of::<u64>());
const IOC_FS_INFO: u64 = ioc(READ, 31, std::mem::size_of::<FsInfoArgs>());
const IOC_QUOTA_CTL: u64 = ioc(READ | WRITE, 40, std::mem::size_of::<QuotaCtlArgs>());
const IOC_QGROUP_CREATE: u64 = ioc(WRITE, 42, std::mem::size_of::<QgroupCreateArgs>());
const IOC_QGROUP_LIMIT: u64 = ioc(READ, 43, std::mem::size_of::<QgroupLimitArgs>());

/// Copies a single path component into a NUL-padded kernel name buffer.
fn put_name<const N: usize>(buf: &mut [u8; N], name: &str) -> io::Result<()> {
    put_name_bytes(buf, name.as_bytes())
}

/// [`put_name`] for any name the filesystem may hold (not necessarily UTF-8).
fn put_name_bytes<const N: usize>(buf: &mut [u8; N], b: &[u8]) -> io::Result<()> {
    if b.is_empty() || b.len() >= N || b.contains(&0) || b.contains(&b'/') || b == b"." || b == b".." {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    buf[..b.len()].copy_from_slice(b);
    Ok(())
}

/// Runs one btrfs ioctl whose argument is `arg`.
#[allow(unsafe_code)]
fn ioctl<T>(fd: BorrowedFd<'_>, request: u64, arg: &mut T) -> io::Result<()> {
    // SAFETY: `fd` is a live descriptor for the call; `arg` is an exclusively borrowed,
    // initialised `#[repr(C)]` structure (or a `u64`) whose size is the size encoded in `request` (checked
    // by the const assertions above), so the kernel reads and writes only inside it. The
    // kernel keeps no pointer to it after the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request as libc::Ioctl, arg as *mut T) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Creates an empty subvolume `name` directly inside directory `parent`.
pub fn subvolume_create(parent: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    let mut args = VolArgs {
        fd: 0,
        name: [0; PATH_NAME_MAX + 1],
    };
    put_name(&mut args.name, name)?;
    ioctl(parent, IOC_SUBVOL_CREATE, &mut args)
}

/// Makes `name` inside `parent` a snapshot of the subvolume open as `source`: writable (a
/// copy-on-write clone) or read-only. Instant whatever the size.
pub fn snapshot_create(parent: BorrowedFd<'_>, name: &str, source: BorrowedFd<'_>, read_only: bool) -> io::Result<()> {
    let mut args = VolArgsV2 {
        fd: i64::from(source.as_raw_fd()),
        transid: 0,
        flags: if read_only { SUBVOL_RDONLY } else { 0 },
        unused: [0; 4],
        name: [0; SUBVOL_NAME_MAX + 1],
    };
    put_name(&mut args.name, name)?;
    ioctl(parent, IOC_SNAP_CREATE_V2, &mut args)
}

/// Deletes subvolume `name` inside `parent`, contents included, without walking it (the
/// kernel frees its extents in the background). Fails with `ENOTEMPTY` while it holds other
/// subvolumes, and with `EROFS` when `parent` is in a read-only subvolume.
pub fn subvolume_destroy<N: AsRef<OsStr> + ?Sized>(parent: BorrowedFd<'_>, name: &N) -> io::Result<()> {
    let mut args = VolArgs {
        fd: 0,
        name: [0; PATH_NAME_MAX + 1],
    };
    put_name_bytes(&mut args.name, name.as_ref().as_bytes())?;
    ioctl(parent, IOC_SNAP_DESTROY, &mut args)
}

/// Whether the subvolume `fd` (its root directory) is read-only.
pub fn subvolume_read_only(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut flags: u64 = 0;
    ioctl(fd, IOC_SUBVOL_GETFLAGS, &mut flags)?;
    Ok(flags & SUBVOL_RDONLY != 0)
}

/// Makes the subvolume `fd` (its root directory) read-only or writable again; its owner may.
pub fn subvolume_set_read_only(fd: BorrowedFd<'_>, read_only: bool) -> io::Result<()> {
    let mut flags: u64 = 0;
    ioctl(fd, IOC_SUBVOL_GETFLAGS, &mut flags)?;
    flags = if read_only {
        flags | SUBVOL_RDONLY
    } else {
        flags & !SUBVOL_RDONLY
    };
    ioctl(fd, IOC_SUBVOL_SETFLAGS, &mut flags)
}

/// The id of the subvolume `fd` lives in (5 for the top level).
pub fn subvolume_id(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut args = InoLookupArgs {
        treeid: 0,
        objectid: SUBVOL_ROOT_INO,
        name: [0; 4080],
    };
    ioctl(fd, IOC_INO_LOOKUP, &mut args)?;
    Ok(args.treeid)
}

/// The filesystem's UUID (the name of its `/sys/fs/btrfs/<uuid>` directory).
pub fn fs_uuid(fd: BorrowedFd<'_>) -> io::Result<[u8; 16]> {
    let mut args = FsInfoArgs {
        max_id: 0,
        num_devices: 0,
        fsid: [0; 16],
        rest: [0; 1024 - 32],
    };
    ioctl(fd, IOC_FS_INFO, &mut args)?;
    Ok(args.fsid)
}

/// Turns quota accounting on for the whole filesystem (a no-op when already on; the kernel
/// starts a rescan of existing data).
pub fn quota_enable(fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut args = QuotaCtlArgs {
        cmd: QUOTA_CTL_ENABLE,
        status: 0,
    };
    ioctl(fd, IOC_QUOTA_CTL, &mut args)
}

/// Limits the bytes referenced by qgroup `0/<subvolume>` to `max_bytes` (0 = no limit). `fd`
/// is any descriptor on the filesystem.
pub fn qgroup_limit(fd: BorrowedFd<'_>, subvolume: u64, max_bytes: u64) -> io::Result<()> {
    let mut args = QgroupLimitArgs {
        qgroupid: subvolume,
        flags: QGROUP_LIMIT_MAX_RFER,
        // The kernel reads `(u64)-1` as "no limit"; 0 would forbid every write.
        max_rfer: if max_bytes == 0 { u64::MAX } else { max_bytes },
        max_excl: 0,
        rsv_rfer: 0,
        rsv_excl: 0,
    };
    ioctl(fd, IOC_QGROUP_LIMIT, &mut args)
}

/// Removes qgroup `0/<subvolume>` (after its subvolume was destroyed). `fd` is any descriptor
/// on the filesystem.
pub fn qgroup_remove(fd: BorrowedFd<'_>, subvolume: u64) -> io::Result<()> {
    let mut args = QgroupCreateArgs {
        create: 0,
        qgroupid: subvolume,
    };
    ioctl(fd, IOC_QGROUP_CREATE, &mut args)
}

/// Whether `fd` is on btrfs.
pub fn is_btrfs(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let st = rustix::fs::fstatfs(fd)?;
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_type as i64 == SUPER_MAGIC)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn ioctl_numbers_match_the_kernel_headers() {
        // The values linux/btrfs.h expands to on x86_64 and arm64.
        assert_eq!(IOC_SUBVOL_CREATE, 0x5000_940e);
        assert_eq!(IOC_SNAP_DESTROY, 0x5000_940f);
        assert_eq!(IOC_INO_LOOKUP, 0xd000_9412);
        assert_eq!(IOC_SNAP_CREATE_V2, 0x5000_9417);
        assert_eq!(IOC_FS_INFO, 0x8400_941f);
        assert_eq!(IOC_QUOTA_CTL, 0xc010_9428);
        assert_eq!(IOC_QGROUP_CREATE, 0x4010_942a);
        assert_eq!(IOC_QGROUP_LIMIT, 0x8030_942b);
    }

    #[test]
    fn names_that_are_not_one_component_are_refused() {
        let mut buf = [0u8; 16];
        for bad in ["", ".", "..", "a/b", "a\0b", "0123456789abcdef"] {
            assert_eq!(
                put_name(&mut buf, bad).unwrap_err().raw_os_error(),
                Some(libc::EINVAL),
                "{bad:?}"
            );
        }
        put_name(&mut buf, "vol").unwrap();
        assert_eq!(&buf[..4], b"vol\0");
    }

    #[test]
    fn a_directory_that_is_not_btrfs_is_recognised_and_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = std::fs::File::open(tmp.path()).unwrap();
        if is_btrfs(dir.as_fd()).unwrap() {
            eprintln!("skipped: the temporary directory is on btrfs");
            return;
        }
        assert!(subvolume_create(dir.as_fd(), "v").is_err());
        assert!(subvolume_id(dir.as_fd()).is_err());
    }
}
