//! The image backend with real loop devices: the size is enforced by the filesystem in the
//! image, `df` shows the volume, growth works online, clones copy the image, and a mounted
//! image is reported in use.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use hpp_fs::quota::{Image, ImageFs, QuotaBackend, QuotaError};
use rustix::mount::MountFlags;

const MIB: u64 = 1 << 20;

/// Unmounts what the test mounted, even when it fails.
struct Unmount(Vec<PathBuf>);

impl Drop for Unmount {
    fn drop(&mut self) {
        for t in &self.0 {
            let _ = rustix::mount::unmount(t, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

fn fill(path: &Path, mib: u64) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    for _ in 0..mib {
        f.write_all(&vec![1u8; MIB as usize])?;
    }
    f.sync_all()
}

fn df_bytes(path: &Path) -> u64 {
    let st = rustix::fs::statvfs(path).unwrap();
    st.f_blocks * st.f_frsize
}

fn usable() -> bool {
    if !rustix::process::geteuid().is_root() || !Path::new("/dev/loop-control").exists() {
        eprintln!("skipped: needs root and loop devices");
        return false;
    }
    for tool in ["mkfs.ext4", "resize2fs", "e2fsck"] {
        if std::process::Command::new(tool).arg("-V").output().is_err() {
            eprintln!("skipped: {tool} is not installed");
            return false;
        }
    }
    true
}

#[test]
fn an_image_volume_is_limited_grows_online_and_clones() {
    if !usable() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pool_path = tmp.path().join("pool");
    let target = tmp.path().join("target");
    let target2 = tmp.path().join("target2");
    for d in [&pool_path, &target, &target2] {
        std::fs::create_dir(d).unwrap();
    }
    let _guard = Unmount(vec![target.clone(), target2.clone()]);
    let pool_dir = std::fs::File::open(&pool_path).unwrap();
    let pool = pool_dir.as_fd();
    let backend = Image::new(ImageFs::Ext4);
    assert!(backend.needs_node_expansion());

    assert!(backend.create(pool, "none", 0).is_err(), "an image needs a size");
    let vol = backend.create(pool, "v", 16 * MIB).unwrap();
    let usage = backend.usage(pool, "v").unwrap().unwrap();
    assert_eq!(usage.limit_bytes, 16 * MIB);
    assert!(usage.used_bytes < 16 * MIB, "the image is sparse: {usage:?}");

    assert!(backend.mount_at(vol.as_fd(), &target, MountFlags::empty()).unwrap());
    // Idempotent retry.
    assert!(backend.mount_at(vol.as_fd(), &target, MountFlags::empty()).unwrap());
    assert!(df_bytes(&target) <= 16 * MIB, "df shows the volume, not the pool");
    let err = fill(&target.join("big"), 32).unwrap_err();
    assert_eq!(
        rustix::io::Errno::from_io_error(&err),
        Some(rustix::io::Errno::NOSPC),
        "{err}"
    );
    std::fs::remove_file(target.join("big")).unwrap();
    std::fs::write(target.join("hello"), b"world").unwrap();
    assert!(backend.in_use(pool, "v").unwrap().is_some());
    // Another target never gets a second mount of the image: shared_mount hands out the
    // existing mount's root for a bind, and mount_at itself refuses to attach it again.
    let root = backend.shared_mount(vol.as_fd(), &target2, false).unwrap().unwrap();
    assert_eq!(
        rustix::fs::fstat(&root).unwrap().st_dev,
        rustix::fs::stat(&target).unwrap().st_dev
    );
    drop(root);
    assert!(
        backend.shared_mount(vol.as_fd(), &target, false).unwrap().is_none(),
        "a retry"
    );
    let twice = backend.mount_at(vol.as_fd(), &target2, MountFlags::empty());
    assert!(matches!(twice, Err(QuotaError::Unsupported(_))), "{twice:?}");

    // Online growth: controller grows the file, node grows the filesystem.
    backend.set_limit(pool, "v", 64 * MIB).unwrap();
    assert!(backend.set_limit(pool, "v", 8 * MIB).is_err(), "no shrinking");
    match backend.expand_mounted(&target) {
        Err(e) if e.to_string().contains("CAP_SYS_RESOURCE") => {
            eprintln!("skipped the online ext4 growth: {e}");
        }
        r => {
            r.unwrap();
            assert!(df_bytes(&target) > 48 * MIB, "{}", df_bytes(&target));
            fill(&target.join("big"), 32).unwrap();
            std::fs::remove_file(target.join("big")).unwrap();
        }
    }

    rustix::mount::unmount(&target, rustix::mount::UnmountFlags::empty()).unwrap();

    // A clone copies the image and grows it to its own size.
    let clone = backend.clone_volume(pool, "c", vol.as_fd(), 96 * MIB).unwrap().unwrap();
    assert!(
        backend
            .mount_at(clone.as_fd(), &target2, MountFlags::RDONLY | MountFlags::NOEXEC)
            .unwrap()
    );
    assert_eq!(std::fs::read(target2.join("hello")).unwrap(), b"world");
    assert!(df_bytes(&target2) > 80 * MIB);
    assert!(std::fs::write(target2.join("x"), b"x").is_err(), "published read-only");
    let st = rustix::fs::statvfs(&target2).unwrap();
    assert!(
        st.f_flag
            .contains(rustix::fs::StatVfsMountFlags::NOEXEC | rustix::fs::StatVfsMountFlags::NOSUID)
    );
    rustix::mount::unmount(&target2, rustix::mount::UnmountFlags::empty()).unwrap();

    drop((vol, clone));
    backend.remove(pool, "v").unwrap();
    backend.remove(pool, "c").unwrap();
    assert!(!pool_path.join("v").exists() && !pool_path.join("c").exists());
}

#[test]
fn an_xfs_image_grows_online() {
    if !usable() {
        return;
    }
    for tool in ["mkfs.xfs", "xfs_growfs"] {
        if std::process::Command::new(tool).arg("-V").output().is_err() {
            eprintln!("skipped: {tool} is not installed");
            return;
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let pool_path = tmp.path().join("pool");
    let target = tmp.path().join("target");
    std::fs::create_dir(&pool_path).unwrap();
    std::fs::create_dir(&target).unwrap();
    let _guard = Unmount(vec![target.clone()]);
    let pool_dir = std::fs::File::open(&pool_path).unwrap();
    let pool = pool_dir.as_fd();
    let backend = Image::new(ImageFs::Xfs);
    // Below XFS's minimum: the image gets the minimum.
    let vol = backend.create(pool, "x", 16 * MIB).unwrap();
    assert_eq!(backend.usage(pool, "x").unwrap().unwrap().limit_bytes, 300 * MIB);
    assert!(backend.mount_at(vol.as_fd(), &target, MountFlags::empty()).unwrap());
    let before = df_bytes(&target);
    backend.set_limit(pool, "x", 600 * MIB).unwrap();
    backend.expand_mounted(&target).unwrap();
    assert!(
        df_bytes(&target) > before + 200 * MIB,
        "{before} -> {}",
        df_bytes(&target)
    );
    rustix::mount::unmount(&target, rustix::mount::UnmountFlags::empty()).unwrap();
    drop(vol);
    backend.remove(pool, "x").unwrap();
}
