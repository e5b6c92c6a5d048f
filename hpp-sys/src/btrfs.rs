//! The btrfs ioctls the quota backend needs: subvolumes (create, snapshot, destroy, id, the
//! subvolumes below one) and qgroups (enable full or simple quotas, create, assign to a parent,
//! set a limit, remove). No maintained crate wraps them without
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
/// `BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA` (Linux 6.7+).
const QUOTA_CTL_ENABLE_SIMPLE: u64 = 4;
/// Entries one `BTRFS_IOC_GET_SUBVOL_ROOTREF` call returns at most.
const ROOTREF_MAX: usize = 255;
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
struct QgroupAssignArgs {
    assign: u64,
    src: u64,
    dst: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct RootRef {
    treeid: u64,
    dirid: u64,
}

#[repr(C)]
struct GetSubvolRootrefArgs {
    min_treeid: u64,
    rootref: [RootRef; ROOTREF_MAX],
    num_items: u8,
    align: [u8; 7],
}

#[repr(C)]
struct SearchKey {
    tree_id: u64,
    min_objectid: u64,
    max_objectid: u64,
    min_offset: u64,
    max_offset: u64,
    min_transid: u64,
    max_transid: u64,
    min_type: u32,
    max_type: u32,
    nr_items: u32,
    unused: u32,
    unused1: u64,
    unused2: u64,
    unused3: u64,
    unused4: u64,
}

/// Bytes of results one `BTRFS_IOC_TREE_SEARCH` returns at most.
const SEARCH_BUF: usize = 4096 - std::mem::size_of::<SearchKey>();

#[repr(C)]
struct SearchArgs {
    key: SearchKey,
    buf: [u8; SEARCH_BUF],
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
const _: () = assert!(std::mem::size_of::<QgroupAssignArgs>() == 24);
const _: () = assert!(std::mem::size_of::<GetSubvolRootrefArgs>() == 4096);
const _: () = assert!(std::mem::size_of::<SearchKey>() == 104);
const _: () = assert!(std::mem::size_of::<SearchArgs>() == 4096);

const IOC_SUBVOL_CREATE: u64 = ioc(WRITE, 14, std::mem::size_of::<VolArgs>());
const IOC_SNAP_DESTROY: u64 = ioc(WRITE, 15, std::mem::size_of::<VolArgs>());
const IOC_TREE_SEARCH: u64 = ioc(READ | WRITE, 17, std::mem::size_of::<SearchArgs>());
const IOC_INO_LOOKUP: u64 = ioc(READ | WRITE, 18, std::mem::size_of::<InoLookupArgs>());
const IOC_SNAP_CREATE_V2: u64 = ioc(WRITE, 23, std::mem::size_of::<VolArgsV2>());
const IOC_SUBVOL_GETFLAGS: u64 = ioc(READ, 25, std::mem::size_of::<u64>());
const IOC_SUBVOL_SETFLAGS: u64 = ioc(WRITE, 26, std::mem::size_of::<u64>());
const IOC_FS_INFO: u64 = ioc(READ, 31, std::mem::size_of::<FsInfoArgs>());
const IOC_QUOTA_CTL: u64 = ioc(READ | WRITE, 40, std::mem::size_of::<QuotaCtlArgs>());
const IOC_QGROUP_ASSIGN: u64 = ioc(WRITE, 41, std::mem::size_of::<QgroupAssignArgs>());
const IOC_QGROUP_CREATE: u64 = ioc(WRITE, 42, std::mem::size_of::<QgroupCreateArgs>());
const IOC_GET_SUBVOL_ROOTREF: u64 = ioc(READ | WRITE, 61, std::mem::size_of::<GetSubvolRootrefArgs>());
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
fn ioctl<T>(fd: BorrowedFd<'_>, request: u64, arg: &mut T) -> io::Result<()> {
    ioctl_rc(fd, request, arg).map(|_| ())
}

/// [`ioctl`], returning the call's non-negative result (some calls say more than "done").
#[allow(unsafe_code)]
fn ioctl_rc<T>(fd: BorrowedFd<'_>, request: u64, arg: &mut T) -> io::Result<i32> {
    // SAFETY: `fd` is a live descriptor for the call; `arg` is an exclusively borrowed,
    // initialised `#[repr(C)]` structure (or a `u64`) whose size is the size encoded in `request` (checked
    // by the const assertions above), so the kernel reads and writes only inside it. The
    // kernel keeps no pointer to it after the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request as libc::Ioctl, arg as *mut T) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
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

/// Turns simple quota accounting on (Linux 6.7+): every extent is charged to the subvolume that
/// wrote it, and a new subvolume joins the level-1 qgroup of the subvolume it is made in, so a
/// limit on that qgroup also covers subvolumes a tenant creates inside a volume. Older kernels
/// answer `EINVAL`.
pub fn quota_enable_simple(fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut args = QuotaCtlArgs {
        cmd: QUOTA_CTL_ENABLE_SIMPLE,
        status: 0,
    };
    ioctl(fd, IOC_QUOTA_CTL, &mut args)
}

/// The qgroup id `1/<n>`: a level-1 qgroup, which holds level-0 qgroups (subvolumes).
pub const fn level1(n: u64) -> u64 {
    (1 << 48) | n
}

/// Creates qgroup `qgroupid` (e.g. [`level1`]). `fd` is any descriptor on the filesystem.
pub fn qgroup_create(fd: BorrowedFd<'_>, qgroupid: u64) -> io::Result<()> {
    let mut args = QgroupCreateArgs { create: 1, qgroupid };
    ioctl(fd, IOC_QGROUP_CREATE, &mut args)
}

/// Makes qgroup `child` a member of `parent` (`assign`), or no longer one. Returns whether the
/// kernel marked the accounting inconsistent (the child shared extents it could not move over
/// at once; a rescan fixes the numbers). `fd` is any descriptor on the filesystem.
pub fn qgroup_assign(fd: BorrowedFd<'_>, child: u64, parent: u64, assign: bool) -> io::Result<bool> {
    let mut args = QgroupAssignArgs {
        assign: u64::from(assign),
        src: child,
        dst: parent,
    };
    Ok(ioctl_rc(fd, IOC_QGROUP_ASSIGN, &mut args)? > 0)
}

/// The ids of the subvolumes made directly below the subvolume `fd` is in (at any depth of its
/// directories, not inside those subvolumes). Needs no privilege beyond access to `fd`.
pub fn subvolume_children(fd: BorrowedFd<'_>) -> io::Result<Vec<u64>> {
    let mut out = Vec::new();
    let mut min_treeid = 0;
    loop {
        let mut args = GetSubvolRootrefArgs {
            min_treeid,
            rootref: [RootRef { treeid: 0, dirid: 0 }; ROOTREF_MAX],
            num_items: 0,
            align: [0; 7],
        };
        let more = match ioctl(fd, IOC_GET_SUBVOL_ROOTREF, &mut args) {
            Ok(()) => false,
            // More than one call's worth: go on after the last one returned.
            Err(e) if e.raw_os_error() == Some(libc::EOVERFLOW) => true,
            Err(e) => return Err(e),
        };
        let got = &args.rootref[..usize::from(args.num_items).min(ROOTREF_MAX)];
        out.extend(got.iter().map(|r| r.treeid));
        match (more, got.last()) {
            (true, Some(last)) => min_treeid = last.treeid + 1,
            _ => return Ok(out),
        }
    }
}

/// `BTRFS_ROOT_TREE_OBJECTID`: the tree that lists every subvolume.
const ROOT_TREE: u64 = 1;
/// `BTRFS_ROOT_BACKREF_KEY`: item `(child id, 144, parent id)` of the root tree.
const ROOT_BACKREF_KEY: u32 = 144;

/// Every subvolume with an id of at least `min_id`, with the id of the subvolume it was made in
/// (`(child, parent)`, ascending by child). Subvolume ids only grow, so a caller that keeps the
/// last id it saw asks only for what is new. Reads the root tree: needs `CAP_SYS_ADMIN`.
pub fn subvolumes_since(fd: BorrowedFd<'_>, min_id: u64) -> io::Result<Vec<(u64, u64)>> {
    search_backrefs(fd, min_id, u64::MAX)
}

/// The subvolume subvolume `id` was made in (`None` for the top level or an unknown id).
/// Reads the root tree: needs `CAP_SYS_ADMIN`.
pub fn subvolume_parent(fd: BorrowedFd<'_>, id: u64) -> io::Result<Option<u64>> {
    Ok(search_backrefs(fd, id, id)?.first().map(|&(_, parent)| parent))
}

/// A btrfs key: objectid, type, offset.
type Key = (u64, u32, u64);

/// The `ROOT_BACKREF` items of subvolumes `min_id..=max_id`. The kernel returns every item
/// between the first and last key in the root tree's order (`(objectid, type, offset)`), other
/// types included, as many as fit in one buffer; the search goes on after the last key it saw.
fn search_backrefs(fd: BorrowedFd<'_>, min_id: u64, max_id: u64) -> io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let (mut objectid, mut kind, mut offset) = (min_id, ROOT_BACKREF_KEY, 0);
    loop {
        let mut args = SearchArgs {
            key: SearchKey {
                tree_id: ROOT_TREE,
                min_objectid: objectid,
                max_objectid: max_id,
                min_offset: offset,
                max_offset: u64::MAX,
                min_transid: 0,
                max_transid: u64::MAX,
                min_type: kind,
                max_type: ROOT_BACKREF_KEY,
                nr_items: 4096,
                unused: 0,
                unused1: 0,
                unused2: 0,
                unused3: 0,
                unused4: 0,
            },
            buf: [0; SEARCH_BUF],
        };
        ioctl(fd, IOC_TREE_SEARCH, &mut args)?;
        let (found, last) = parse_backrefs(&args.buf, args.key.nr_items);
        out.extend(found.into_iter().filter(|(child, _)| (min_id..=max_id).contains(child)));
        let Some(last) = last else {
            return Ok(out);
        };
        // The next key after `last`.
        (objectid, kind, offset) = match last {
            (o, t, off) if off < u64::MAX => (o, t, off + 1),
            (o, t, _) if t < ROOT_BACKREF_KEY => (o, t + 1, 0),
            (o, _, _) if o < max_id => (o + 1, ROOT_BACKREF_KEY, 0),
            _ => return Ok(out),
        };
    }
}

/// The `(objectid, offset)` of each `ROOT_BACKREF` item among the `count` search results in
/// `buf` (each a 32-byte header: transid, objectid, offset, type, len; then `len` bytes), and
/// the key of the last result of any type.
fn parse_backrefs(buf: &[u8], count: u32) -> (Vec<(u64, u64)>, Option<Key>) {
    let u64_at = |at: usize| {
        buf.get(at..at + 8)
            .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])))
    };
    let u32_at = |at: usize| {
        buf.get(at..at + 4)
            .map(|b| u32::from_ne_bytes(b.try_into().unwrap_or([0; 4])))
    };
    let mut out = Vec::new();
    let mut last = None;
    let mut at = 0;
    for _ in 0..count {
        let (Some(objectid), Some(offset), Some(kind), Some(len)) =
            (u64_at(at + 8), u64_at(at + 16), u32_at(at + 24), u32_at(at + 28))
        else {
            break;
        };
        if kind == ROOT_BACKREF_KEY {
            out.push((objectid, offset));
        }
        last = Some((objectid, kind, offset));
        at += 32 + len as usize;
    }
    (out, last)
}

/// Limits the bytes referenced by qgroup `qgroupid` (`0/<subvolume>` is the subvolume's id
/// itself; see [`level1`]) to `max_bytes` (0 = no limit). `fd` is any descriptor on the
/// filesystem.
pub fn qgroup_limit(fd: BorrowedFd<'_>, qgroupid: u64, max_bytes: u64) -> io::Result<()> {
    let mut args = QgroupLimitArgs {
        qgroupid,
        flags: QGROUP_LIMIT_MAX_RFER,
        // The kernel reads `(u64)-1` as "no limit"; 0 would forbid every write.
        max_rfer: if max_bytes == 0 { u64::MAX } else { max_bytes },
        max_excl: 0,
        rsv_rfer: 0,
        rsv_excl: 0,
    };
    ioctl(fd, IOC_QGROUP_LIMIT, &mut args)
}

/// Removes qgroup `qgroupid` (`0/<subvolume>` after its subvolume was destroyed, or a
/// [`level1`] qgroup without members). `fd` is any descriptor on the filesystem.
pub fn qgroup_remove(fd: BorrowedFd<'_>, qgroupid: u64) -> io::Result<()> {
    let mut args = QgroupCreateArgs { create: 0, qgroupid };
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
        assert_eq!(IOC_QGROUP_ASSIGN, 0x4018_9429);
        assert_eq!(IOC_GET_SUBVOL_ROOTREF, 0xd000_943d);
        assert_eq!(IOC_TREE_SEARCH, 0xd000_9411);
        assert_eq!(IOC_QGROUP_LIMIT, 0x8030_942b);
    }

    #[test]
    fn search_results_are_read_item_by_item() {
        let mut buf = vec![0u8; 200];
        let mut put = |at: usize, objectid: u64, offset: u64, kind: u32, len: u32| {
            buf[at + 8..at + 16].copy_from_slice(&objectid.to_ne_bytes());
            buf[at + 16..at + 24].copy_from_slice(&offset.to_ne_bytes());
            buf[at + 24..at + 28].copy_from_slice(&kind.to_ne_bytes());
            buf[at + 28..at + 32].copy_from_slice(&len.to_ne_bytes());
        };
        put(0, 257, 256, ROOT_BACKREF_KEY, 20);
        put(52, 300, 5, 132, 0);
        put(84, 301, 257, ROOT_BACKREF_KEY, 10);
        assert_eq!(
            parse_backrefs(&buf, 3),
            (vec![(257, 256), (301, 257)], Some((301, ROOT_BACKREF_KEY, 257)))
        );
        // A count larger than what the buffer holds stops at its end.
        assert_eq!(
            parse_backrefs(&buf[..60], 3),
            (vec![(257, 256)], Some((257, ROOT_BACKREF_KEY, 256)))
        );
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
