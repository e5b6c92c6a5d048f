//! The `image` backend: a volume is a directory holding one sparse file, `disk.img`, formatted
//! ext4 (default) or XFS and loop-mounted at publish. Works on any pool filesystem, quota
//! support or not: the size is the image's, enforced by the filesystem inside it, and `df` in
//! the pod shows exactly the volume.
//!
//! Raising the limit grows the file (controller side); the mounted filesystem then grows in
//! NodeExpandVolume ([`QuotaBackend::expand_mounted`]: refresh the loop device's size, then
//! `resize2fs` or `xfs_growfs`, both online). Formatting and growing fork the filesystem's own
//! tools: they run once per volume or expansion, never on a hot path.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::mount::MountFlags;

use super::{Layout, QuotaBackend, QuotaError, QuotaUsage, errno, io_err};

/// Name of the image file inside a volume directory.
pub const IMAGE_FILE: &str = "disk.img";

const MIB: u64 = 1 << 20;
/// How many times (10 ms apart) publish looks again at an image attached to a loop device but
/// mounted nowhere before refusing: the autoclear of an unmount detaches just after it.
const RELEASE_POLLS: usize = 100;
/// `EXT4_SUPER_MAGIC`.
const EXT4_MAGIC: i64 = 0xEF53;
/// `XFS_SUPER_MAGIC`.
const XFS_MAGIC: i64 = 0x5846_5342;

/// The filesystem inside the images.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImageFs {
    /// ext4 (default): small minimum size, online growth with `resize2fs`.
    #[default]
    Ext4,
    /// XFS: needs at least 300 MiB (mkfs.xfs refuses smaller), online growth with `xfs_growfs`.
    Xfs,
}

impl ImageFs {
    fn name(self) -> &'static str {
        match self {
            ImageFs::Ext4 => "ext4",
            ImageFs::Xfs => "xfs",
        }
    }

    /// Smallest image mkfs accepts; smaller requests get this much.
    pub fn minimum_bytes(self) -> u64 {
        match self {
            ImageFs::Ext4 => 8 * MIB,
            ImageFs::Xfs => 300 * MIB,
        }
    }
}

/// The image backend for one pool.
#[derive(Debug, Clone, Copy, Default)]
pub struct Image {
    fs: ImageFs,
}

/// Runs a tool, turning a missing tool or a failure into a clear error.
fn run(cmd: &mut Command) -> Result<(), QuotaError> {
    let prog = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            QuotaError::Unsupported(format!("{prog} is not installed on this node"))
        } else {
            io_err(format!("running {prog}"))(e)
        }
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(QuotaError::Io {
            op: format!("{prog}: {}", String::from_utf8_lossy(&out.stderr).trim()),
            source: std::io::Error::other(format!("{prog} exited with {}", out.status)),
        })
    }
}

/// A path naming the open descriptor `fd` for a child process (which inherits nothing but
/// can reach our descriptors through /proc).
fn fd_path(fd: BorrowedFd<'_>) -> PathBuf {
    PathBuf::from(format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd()))
}

fn open_image(volume: BorrowedFd<'_>, write: bool) -> rustix::io::Result<OwnedFd> {
    let access = if write { OFlags::RDWR } else { OFlags::RDONLY };
    rustix::fs::openat(
        volume,
        IMAGE_FILE,
        access | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn open_volume(pool: BorrowedFd<'_>, name: &str) -> Result<OwnedFd, QuotaError> {
    crate::open_child_dir(pool, name).map_err(errno(format!("opening volume {name}")))
}

/// The loop device (`loopN`) a mount's device number belongs to, from sysfs.
fn loop_name(dev_major: u32, dev_minor: u32) -> Option<String> {
    let uevent = std::fs::read_to_string(format!("/sys/dev/block/{dev_major}:{dev_minor}/uevent")).ok()?;
    uevent
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .filter(|n| n.starts_with("loop"))
        .map(str::to_owned)
}

fn statx(path: &Path) -> Result<rustix::fs::Statx, QuotaError> {
    rustix::fs::statx(
        rustix::fs::CWD,
        path,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        rustix::fs::StatxFlags::BASIC_STATS,
    )
    .map_err(errno(format!("stat {}", path.display())))
}

/// Whether `target` (stat as `st`) is the root of a mount. A plain directory on a filesystem
/// that itself sits on a loop device (a loop-mounted /var/lib/kubelet, a test's pool) has
/// that device's number too: without this check it would pass for a mounted image.
fn is_mount_root(target: &Path, st: &rustix::fs::Statx) -> Result<bool, QuotaError> {
    use rustix::fs::StatxAttributes;
    if st.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT) {
        return Ok(st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT));
    }
    // Kernels before 5.8: a mount of another device than its parent directory's.
    let Some(parent) = target.parent() else {
        return Ok(true);
    };
    let up = statx(parent)?;
    Ok((up.stx_dev_major, up.stx_dev_minor) != (st.stx_dev_major, st.stx_dev_minor))
}

/// The loop device mounted at `target`, when `target` is the root of such a mount.
fn mounted_loop(target: &Path) -> Result<Option<String>, QuotaError> {
    let st = statx(target)?;
    if !is_mount_root(target, &st)? {
        return Ok(None);
    }
    Ok(loop_name(st.stx_dev_major, st.stx_dev_minor))
}

/// Path of the open file `fd`, as the kernel prints it (the same way sysfs prints a loop
/// device's backing file).
fn image_path(fd: BorrowedFd<'_>) -> Option<String> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

/// The backing file of loop device `dev` (`loopN`), when attached.
fn backing_file(dev: &str) -> Option<String> {
    std::fs::read_to_string(format!("/sys/block/{dev}/loop/backing_file"))
        .ok()
        .map(|s| s.trim_end_matches('\n').to_owned())
}

/// The loop devices (`loopN`) whose backing file is `path`: normally none or one.
fn loops_backed_by(path: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|dev| dev.starts_with("loop") && backing_file(dev).as_deref() == Some(path))
        .collect()
}

/// The device number of loop device `dev` (`loopN`), from sysfs.
fn loop_dev_number(dev: &str) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(format!("/sys/block/{dev}/dev")).ok()?;
    let (major, minor) = text.trim().split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Whether loop device `dev` was attached read-only.
fn loop_read_only(dev: &str) -> bool {
    std::fs::read_to_string(format!("/sys/block/{dev}/ro")).is_ok_and(|s| s.trim() == "1")
}

/// Opens (`O_PATH`) the root of a mount of device `number` listed in `table`, checking that
/// what the path leads to now is still that mount's root (a mount stacked over it since, or a
/// symlink, is skipped).
fn open_mount_root(table: &crate::mountinfo::MountTable, number: (u32, u32)) -> Option<OwnedFd> {
    table
        .mounts()
        .iter()
        .filter(|m| m.dev == number && m.root == Path::new("/"))
        .find_map(|m| {
            let fd = rustix::fs::open(
                &m.mount_point,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .ok()?;
            let st = statx(&m.mount_point).ok()?;
            let fst = rustix::fs::fstat(&fd).ok()?;
            let same = (st.stx_dev_major, st.stx_dev_minor) == number
                && (rustix::fs::major(fst.st_dev), rustix::fs::minor(fst.st_dev)) == number
                && st.stx_ino == fst.st_ino
                && is_mount_root(&m.mount_point, &st).unwrap_or(false);
            same.then_some(fd)
        })
}

/// Whether the mount source `source` (a mountinfo source field, `/dev/loopN`) is a loop device
/// whose backing file is `image`: how unpublish recognises an image volume's mount as its own.
pub fn loop_backs(source: &str, image: &Path) -> bool {
    source
        .strip_prefix("/dev/")
        .filter(|dev| dev.starts_with("loop"))
        .and_then(backing_file)
        .is_some_and(|backing| Path::new(&backing) == image)
}

impl Image {
    /// Checks the tools this backend forks are installed (at start-up, so a node without them
    /// says so before the first volume).
    pub fn check_tools(&self) -> Result<(), QuotaError> {
        let tools: &[&str] = match self.fs {
            ImageFs::Ext4 => &["mkfs.ext4", "resize2fs", "e2fsck"],
            ImageFs::Xfs => &["mkfs.xfs", "xfs_growfs"],
        };
        for tool in tools {
            if Command::new(tool).arg("-V").output().is_err() {
                return Err(QuotaError::Unsupported(format!(
                    "quota mode image needs {tool}, which is not installed"
                )));
            }
        }
        Ok(())
    }

    /// An image backend whose volumes are formatted with `fs`.
    pub fn new(fs: ImageFs) -> Self {
        Image { fs }
    }

    /// Grows the filesystem in an unmounted image to the file's size (a clone bigger than its
    /// source). XFS grows only mounted: its clones grow at the next NodeExpandVolume.
    fn grow_offline(&self, volume: BorrowedFd<'_>) -> Result<(), QuotaError> {
        if self.fs != ImageFs::Ext4 {
            return Ok(());
        }
        let image = open_image(volume, true).map_err(errno(format!("opening {IMAGE_FILE}")))?;
        let path = fd_path(image.as_fd());
        run(Command::new("e2fsck").args(["-f", "-p"]).arg(&path))?;
        run(Command::new("resize2fs").arg(&path))
    }

    fn mkfs(&self, image: BorrowedFd<'_>) -> Result<(), QuotaError> {
        let path = fd_path(image);
        match self.fs {
            ImageFs::Ext4 => run(Command::new("mkfs.ext4")
                .args([
                    "-q",
                    "-F",
                    "-m",
                    "0",
                    "-E",
                    "nodiscard,lazy_itable_init=1,lazy_journal_init=1",
                ])
                .arg(&path)),
            ImageFs::Xfs => run(Command::new("mkfs.xfs").args(["-q", "-f", "-K"]).arg(&path)),
        }
    }
}

impl QuotaBackend for Image {
    fn name(&self) -> &'static str {
        "image"
    }

    fn granularity(&self) -> u64 {
        MIB
    }

    fn layout(&self) -> Layout {
        Layout::Image(IMAGE_FILE)
    }

    fn needs_node_expansion(&self) -> bool {
        true
    }

    fn create(&self, pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<OwnedFd, QuotaError> {
        if limit_bytes == 0 {
            return Err(QuotaError::OutOfRange(
                "an image volume needs a size (capacity_range.required_bytes, or size for an inline ephemeral volume)"
                    .into(),
            ));
        }
        let size = super::round_up(limit_bytes.max(self.fs.minimum_bytes()), MIB);
        super::mkdir_volume(pool, name)?;
        let result = (|| {
            let dir = open_volume(pool, name)?;
            let image = rustix::fs::openat(
                &dir,
                IMAGE_FILE,
                OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(errno(format!("creating {name}/{IMAGE_FILE}")))?;
            rustix::fs::ftruncate(&image, size).map_err(errno(format!("sizing {name}/{IMAGE_FILE}")))?;
            self.mkfs(image.as_fd())?;
            rustix::fs::fsync(&image).map_err(errno(format!("fsync {name}/{IMAGE_FILE}")))?;
            Ok(dir)
        })();
        if result.is_err() {
            let _ = super::remove_tree(pool, name);
        }
        result
    }

    fn clone_volume(
        &self,
        pool: BorrowedFd<'_>,
        name: &str,
        source: BorrowedFd<'_>,
        limit_bytes: u64,
    ) -> Result<Option<OwnedFd>, QuotaError> {
        let src = match open_image(source, false) {
            Ok(f) => f,
            Err(Errno::NOENT) => {
                return Err(QuotaError::Unsupported(
                    "the source is a plain directory (made before the pool used images); cloning it \
                     into an image volume is not supported"
                        .into(),
                ));
            }
            Err(e) => return Err(errno(format!("opening the source {IMAGE_FILE}"))(e)),
        };
        super::mkdir_volume(pool, name)?;
        let result = (|| {
            let dir = open_volume(pool, name)?;
            let dst = rustix::fs::openat(
                &dir,
                IMAGE_FILE,
                OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(errno(format!("creating {name}/{IMAGE_FILE}")))?;
            // Copy-on-write where the pool can (btrfs, XFS with reflink), else a copy of the
            // image's data regions only: its holes stay holes, so a clone costs what the source
            // holds, not its size.
            if rustix::fs::ioctl_ficlone(&dst, &src).is_err() {
                let size = rustix::fs::fstat(&src).map_err(errno("stat the source image"))?.st_size;
                crate::copy::copy_sparse(&src, &dst, u64::try_from(size).unwrap_or(0))
                    .map_err(io_err(format!("copying the image into {name}")))?;
            }
            rustix::fs::fsync(&dst).map_err(errno(format!("fsync {name}/{IMAGE_FILE}")))?;
            drop(dst);
            let have = self.usage(pool, name)?.map(|u| u.limit_bytes).unwrap_or(0);
            if super::round_up(limit_bytes, MIB) > have {
                self.set_limit(pool, name, limit_bytes)?;
                self.grow_offline(dir.as_fd())?;
            }
            Ok(Some(dir))
        })();
        if result.is_err() {
            let _ = super::remove_tree(pool, name);
        }
        result
    }

    fn set_limit(&self, pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<(), QuotaError> {
        let dir = open_volume(pool, name)?;
        let image = open_image(dir.as_fd(), true).map_err(errno(format!("opening {name}/{IMAGE_FILE}")))?;
        let have = rustix::fs::fstat(&image).map_err(errno("stat image"))?.st_size;
        let have = u64::try_from(have).unwrap_or(0);
        let want = super::round_up(limit_bytes, MIB);
        if want < have {
            return Err(QuotaError::OutOfRange(format!(
                "image volume {name} is {have} bytes; it cannot shrink to {want}"
            )));
        }
        if want > have {
            rustix::fs::ftruncate(&image, want).map_err(errno(format!("growing {name}/{IMAGE_FILE}")))?;
            rustix::fs::fsync(&image).map_err(errno(format!("fsync {name}/{IMAGE_FILE}")))?;
        }
        Ok(())
    }

    fn usage(&self, pool: BorrowedFd<'_>, name: &str) -> Result<Option<QuotaUsage>, QuotaError> {
        let dir = open_volume(pool, name)?;
        let image = match open_image(dir.as_fd(), false) {
            Ok(f) => f,
            // A plain directory from before the pool used images: the caller walks it.
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(errno(format!("opening {name}/{IMAGE_FILE}"))(e)),
        };
        let st = rustix::fs::fstat(&image).map_err(errno("stat image"))?;
        Ok(Some(QuotaUsage {
            // Blocks the image occupies: what the volume costs the pool (an upper bound of
            // what the filesystem inside holds).
            used_bytes: u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512),
            limit_bytes: u64::try_from(st.st_size).unwrap_or(0),
            used_inodes: None,
            limit_inodes: None,
        }))
    }

    fn release(&self, _pool: BorrowedFd<'_>, _name: &str) -> Result<(), QuotaError> {
        Ok(())
    }

    fn in_use(&self, pool: BorrowedFd<'_>, name: &str) -> Result<Option<String>, QuotaError> {
        let dir = match open_volume(pool, name) {
            Ok(d) => d,
            Err(_) => return Ok(None),
        };
        let image = match open_image(dir.as_fd(), false) {
            Ok(f) => f,
            Err(_) => return Ok(None),
        };
        let Some(path) = image_path(image.as_fd()) else {
            return Ok(None);
        };
        // Every attached loop device names its backing file in sysfs.
        Ok(loops_backed_by(&path)
            .first()
            .map(|dev| format!("its image is attached to /dev/{dev} (still mounted)")))
    }

    fn shared_mount(
        &self,
        volume: BorrowedFd<'_>,
        target: &Path,
        read_only: bool,
    ) -> Result<Option<OwnedFd>, QuotaError> {
        let image = match open_image(volume, false) {
            Ok(f) => f,
            // mount_at says what is wrong.
            Err(_) => return Ok(None),
        };
        let Some(path) = image_path(image.as_fd()) else {
            return Ok(None);
        };
        // A retry at a target that already is the mount (or someone else's): mount_at's call.
        if mounted_loop(target)?.is_some() {
            return Ok(None);
        }
        let mut devices = Vec::new();
        for _ in 0..RELEASE_POLLS {
            devices = loops_backed_by(&path);
            if devices.is_empty() {
                return Ok(None);
            }
            let table = crate::mountinfo::MountTable::read().map_err(io_err("reading the mount table"))?;
            for dev in &devices {
                let Some(number) = loop_dev_number(dev) else {
                    continue;
                };
                let Some(root) = open_mount_root(&table, number) else {
                    continue;
                };
                if !read_only && loop_read_only(dev) {
                    return Err(QuotaError::Unsupported(format!(
                        "the image of this volume is mounted read-only (/dev/{dev}, published \
                         read-only elsewhere); a writable publish needs those publishes gone first"
                    )));
                }
                return Ok(Some(root));
            }
            // Attached but mounted nowhere: most likely just unmounted, the kernel's autoclear
            // detaching the device right after. Give it a moment.
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // Still attached and mounted nowhere we can see (another mount namespace, or someone
        // else's attach): a second attach could mount the image twice.
        Err(QuotaError::Unsupported(format!(
            "the image of this volume is attached to /dev/{} but not mounted in this mount \
             namespace; not attaching it a second time (retry once it is released)",
            devices.join(", /dev/")
        )))
    }

    fn mount_at(&self, volume: BorrowedFd<'_>, target: &Path, flags: MountFlags) -> Result<bool, QuotaError> {
        let read_only = flags.contains(MountFlags::RDONLY);
        let image = open_image(volume, !read_only).map_err(errno(format!("opening {IMAGE_FILE}")))?;
        // A retry after a publish that got as far as mounting: the same image is already there.
        if let Some(dev) = mounted_loop(target)? {
            if backing_file(&dev).is_some() && backing_file(&dev) == image_path(image.as_fd()) {
                return Ok(true);
            }
            return Err(QuotaError::Unsupported(format!(
                "{} is already a mount of another device",
                target.display()
            )));
        }
        // Never a second loop device (and a second mount) for one image: a publish at another
        // target binds the existing mount ([`QuotaBackend::shared_mount`]).
        if let Some(path) = image_path(image.as_fd())
            && let Some(dev) = loops_backed_by(&path).first()
        {
            return Err(QuotaError::Unsupported(format!(
                "the image of this volume is already attached to /dev/{dev}; not mounting it a second time"
            )));
        }
        let dev = hpp_sys::loopdev::attach(image.as_fd(), read_only).map_err(io_err("attaching a loop device"))?;
        // Device files and set-id programs inside a tenant's image are never honoured.
        let flags = flags | MountFlags::NOSUID | MountFlags::NODEV;
        let mut result = rustix::mount::mount(dev.path(), target, self.fs.name(), flags, c"");
        if result == Err(Errno::INVAL) {
            // Formatted with the other filesystem (the pool's setting changed since).
            let other = if self.fs == ImageFs::Ext4 { "xfs" } else { "ext4" };
            result = rustix::mount::mount(dev.path(), target, other, flags, c"");
        }
        result.map_err(errno(format!(
            "mounting {} at {}",
            dev.path().display(),
            target.display()
        )))?;
        // The mount now holds the device; with autoclear, unmounting frees it.
        drop(dev);
        Ok(true)
    }

    fn expand_mounted(&self, target: &Path) -> Result<(), QuotaError> {
        let Some(dev) = mounted_loop(target)? else {
            return Err(QuotaError::Unsupported(format!(
                "{} is not a loop-mounted image volume",
                target.display()
            )));
        };
        let path = PathBuf::from("/dev").join(&dev);
        let fd = rustix::fs::open(&path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
            .map_err(errno(format!("opening {}", path.display())))?;
        hpp_sys::loopdev::refresh_capacity(fd.as_fd())
            .map_err(io_err(format!("refreshing the size of {}", path.display())))?;
        #[allow(clippy::unnecessary_cast)]
        let magic = rustix::fs::statfs(target).map_err(errno("statfs"))?.f_type as i64;
        match magic {
            EXT4_MAGIC => run(Command::new("resize2fs").arg(&path)).map_err(|e| match e {
                QuotaError::Io { op, .. } if op.contains("Permission denied") => QuotaError::Unsupported(format!(
                    "growing ext4 online needs CAP_SYS_RESOURCE, which the driver lacks: {op}"
                )),
                other => other,
            }),
            XFS_MAGIC => run(Command::new("xfs_growfs").arg(target)),
            other => Err(QuotaError::Unsupported(format!(
                "cannot grow filesystem type {other:#x} at {}",
                target.display()
            ))),
        }
    }
}
