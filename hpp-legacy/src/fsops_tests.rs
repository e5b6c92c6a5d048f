use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::process::Command;

use super::*;

fn spec(mode: u32) -> DirSpec {
    DirSpec {
        mode,
        uid: None,
        gid: None,
        ceph_quota_bytes: None,
    }
}

fn labeler(dir: &Path) -> Labeler {
    Labeler::new(dir.join("no-selinux"))
}

#[test]
fn creates_with_mode_owner_and_is_idempotent() {
    let base = tempfile::tempdir().unwrap();
    let l = labeler(base.path());
    let rel = Path::new("ns/vol-1");
    let made = create_volume_dir(
        base.path(),
        rel,
        DirSpec {
            mode: 0o2770,
            uid: Some(107),
            gid: Some(108),
            ceph_quota_bytes: None,
        },
        &l,
    )
    .unwrap();
    assert!(made.newly_created);
    assert_eq!(made.selinux_context, None);
    let md = std::fs::metadata(base.path().join(rel)).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0o2770);
    assert_eq!((md.uid(), md.gid()), (107, 108));
    let again = create_volume_dir(base.path(), rel, spec(0o2770), &l).unwrap();
    assert!(!again.newly_created);
    // 0777 really is 0777 whatever the umask.
    create_volume_dir(base.path(), Path::new("open"), spec(0o777), &l).unwrap();
    let md = std::fs::metadata(base.path().join("open")).unwrap();
    assert_eq!(md.permissions().mode() & 0o777, 0o777);
}

#[test]
fn create_never_follows_symlinks() {
    let base = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    symlink(outside.path(), base.path().join("ns")).unwrap();
    let l = labeler(base.path());
    let err = create_volume_dir(base.path(), Path::new("ns/vol"), spec(0o770), &l).unwrap_err();
    assert!(matches!(err, Error::UnsafeDelete { .. }), "{err}");
    symlink(outside.path(), base.path().join("leaf")).unwrap();
    assert!(create_volume_dir(base.path(), Path::new("leaf"), spec(0o777), &l).is_err());
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    let outside_mode = std::fs::metadata(outside.path()).unwrap().permissions().mode() & 0o777;
    assert_ne!(outside_mode, 0o777);
    assert!(create_volume_dir(base.path(), Path::new("../x"), spec(0o770), &l).is_err());
}

#[test]
fn remove_deletes_tree_but_not_symlink_targets() {
    let base = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), "keep").unwrap();
    let vol = base.path().join("vol");
    std::fs::create_dir_all(vol.join("a/b")).unwrap();
    std::fs::write(vol.join("a/b/file"), "x").unwrap();
    symlink(outside.path(), vol.join("link-dir")).unwrap();
    symlink(outside.path().join("precious"), vol.join("a/link-file")).unwrap();
    assert_eq!(remove_volume_dir(base.path(), &vol, false).unwrap(), Removed::Deleted);
    assert!(!vol.exists());
    assert_eq!(
        std::fs::read_to_string(outside.path().join("precious")).unwrap(),
        "keep"
    );
    assert_eq!(remove_volume_dir(base.path(), &vol, false).unwrap(), Removed::Missing);
}

#[test]
fn remove_refuses_symlinked_volume_and_outside_paths() {
    let base = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), "keep").unwrap();
    symlink(outside.path(), base.path().join("vol")).unwrap();
    assert!(remove_volume_dir(base.path(), &base.path().join("vol"), false).is_err());
    assert!(remove_volume_dir(base.path(), outside.path(), false).is_err());
    assert!(remove_volume_dir(base.path(), &base.path().join("../x"), false).is_err());
    assert!(outside.path().join("precious").exists());
}

#[test]
fn archive_renames_and_never_overwrites() {
    let base = tempfile::tempdir().unwrap();
    let vol = base.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    std::fs::write(vol.join("data"), "1").unwrap();
    assert_eq!(
        remove_volume_dir(base.path(), &vol, true).unwrap(),
        Removed::Archived("archived-vol".into())
    );
    std::fs::create_dir(&vol).unwrap();
    assert_eq!(
        remove_volume_dir(base.path(), &vol, true).unwrap(),
        Removed::Archived("archived-vol-1".into())
    );
    assert_eq!(
        std::fs::read_to_string(base.path().join("archived-vol/data")).unwrap(),
        "1"
    );
}

struct Unmount(PathBuf);
impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn remove_stops_at_mount_points() {
    let base = tempfile::tempdir().unwrap();
    let vol = base.path().join("vol");
    let inner = vol.join("mnt");
    std::fs::create_dir_all(&inner).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&inner)
        .status()
        .unwrap();
    assert!(ok.success(), "tests run as root and can mount tmpfs");
    let _guard = Unmount(inner.clone());
    std::fs::write(inner.join("on-other-fs"), "keep").unwrap();
    let err = remove_volume_dir(base.path(), &vol, false).unwrap_err();
    assert!(matches!(err, Error::UnsafeDelete { .. }), "{err}");
    assert!(inner.join("on-other-fs").exists());
    // The volume directory itself being a mount point is refused too.
    let err = remove_volume_dir(&vol, &inner, false).unwrap_err();
    assert!(matches!(err, Error::UnsafeDelete { .. }), "{err}");
}

#[test]
fn failed_set_up_removes_the_new_directory() {
    let base = tempfile::tempdir().unwrap();
    let l = labeler(base.path());
    // Not a CephFS: the quota xattr cannot be set, and the half-made directory goes away.
    let quota = DirSpec {
        ceph_quota_bytes: Some(1 << 20),
        ..spec(0o770)
    };
    assert!(create_volume_dir(base.path(), Path::new("q"), quota, &l).is_err());
    assert!(!base.path().join("q").exists());
}

#[test]
fn filesystem_size_is_positive() {
    let base = tempfile::tempdir().unwrap();
    assert!(filesystem_size(base.path()).unwrap() > 0);
}

/// Loop-mounted scratch filesystems, the same helper the hpp-fs and hpp-csi quota tests use.
use hpp_testkit::loopfs;

#[test]
fn a_btrfs_backend_makes_limited_subvolumes_that_delete_cleanly() {
    let Some(fs) = loopfs::LoopFs::new("btrfs", 256, "") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mnt = fs.path().to_path_buf();
    let pool = std::fs::File::open(&mnt).unwrap();
    let backend = hpp_fs::quota::Btrfs::open(pool.as_fd()).unwrap();
    let l = labeler(tmp.path());
    let made = create_volume_dir_in(&mnt, Path::new("pvc-1"), spec(0o770), &l, &backend, 1 << 20).unwrap();
    assert!(made.newly_created);
    let again = create_volume_dir_in(&mnt, Path::new("pvc-1"), spec(0o770), &l, &backend, 1 << 20).unwrap();
    assert!(!again.newly_created);
    let vol = std::fs::File::open(mnt.join("pvc-1")).unwrap();
    assert!(hpp_fs::quota::btrfs::is_subvolume(vol.as_fd()));
    let usage = backend.usage(pool.as_fd(), "pvc-1").unwrap().unwrap();
    assert_eq!(usage.limit_bytes, 1 << 20);
    drop(vol);
    // A subvolume has a device of its own but is no mount point: deletion goes ahead.
    assert_eq!(
        remove_volume_dir_in(&mnt, &mnt.join("pvc-1"), false, &backend).unwrap(),
        Removed::Deleted
    );
    assert!(!mnt.join("pvc-1").exists());
}
