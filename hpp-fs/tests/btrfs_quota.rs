//! The btrfs backend on a real, loop-mounted btrfs: limits are enforced per volume, raised
//! while files are open, read back without a walk, and deletion takes the subvolume and its
//! qgroup.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use hpp_fs::quota::{Btrfs, QuotaBackend};

const MIB: u64 = 1 << 20;

/// Writes `mib` MiB of data to `path` and syncs; returns the first error.
fn fill(file: &mut std::fs::File, mib: u64) -> std::io::Result<()> {
    let chunk = vec![0x5au8; MIB as usize];
    for _ in 0..mib {
        file.write_all(&chunk)?;
    }
    file.sync_all()
}

fn is_quota_error(e: &std::io::Error) -> bool {
    matches!(
        rustix::io::Errno::from_io_error(e),
        Some(rustix::io::Errno::DQUOT | rustix::io::Errno::NOSPC)
    )
}

#[test]
fn limits_are_enforced_per_volume_raised_online_and_removed_with_the_volume() {
    let Some(fs) = hpp_testkit::loopfs::LoopFs::new("btrfs", 512, "") else {
        return;
    };
    let pool_dir = std::fs::File::open(fs.path()).unwrap();
    let pool = pool_dir.as_fd();
    let backend = Btrfs::open(pool).unwrap();
    assert_eq!(backend.granularity(), 4096);

    backend.create(pool, "small", 8 * MIB).unwrap();
    backend.create(pool, "big", 64 * MIB).unwrap();
    assert_eq!(
        std::fs::metadata(fs.path().join("small")).unwrap().permissions().mode() & 0o7777,
        0o755
    );

    // Past the limit: EDQUOT inside the small volume.
    let mut f = std::fs::File::create(fs.path().join("small/f")).unwrap();
    let err = fill(&mut f, 16).unwrap_err();
    assert!(is_quota_error(&err), "{err}");

    // The other volume is unaffected.
    let mut g = std::fs::File::create(fs.path().join("big/g")).unwrap();
    fill(&mut g, 16).unwrap();

    // Raise the limit while the file is open: writing through the same handle works again.
    backend.set_limit(pool, "small", 64 * MIB).unwrap();
    fill(&mut f, 16).unwrap();
    drop(f);

    rustix::fs::syncfs(&pool_dir).unwrap();
    let usage = backend.usage(pool, "small").unwrap().unwrap();
    assert_eq!(usage.limit_bytes, 64 * MIB);
    assert!(usage.used_bytes >= 16 * MIB, "{usage:?}");

    // Deletion takes the subvolume; its qgroup goes once the kernel has dropped it.
    let id = hpp_sys::btrfs::subvolume_id(std::fs::File::open(fs.path().join("small")).unwrap().as_fd()).unwrap();
    backend.remove(pool, "small").unwrap();
    assert!(!fs.path().join("small").exists());
    backend.remove(pool, "small").unwrap();
    let _ = Command::new("btrfs")
        .arg("subvolume")
        .arg("sync")
        .arg(fs.path())
        .status();
    let uuid = hpp_sys::btrfs::fs_uuid(pool).unwrap();
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    let qgroup = format!(
        "/sys/fs/btrfs/{}-{}-{}-{}-{}/qgroups/0_{id}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    // Either our remove or the kernel's cleanup after the drop took it.
    let _ = hpp_sys::btrfs::qgroup_remove(pool, id);
    assert!(!std::path::Path::new(&qgroup).exists(), "{qgroup} still exists");
    assert!(backend.usage(pool, "big").unwrap().is_some());
}

#[test]
fn clones_and_snapshots_are_subvolume_snapshots_with_their_own_limit() {
    let Some(fs) = hpp_testkit::loopfs::LoopFs::new("btrfs", 512, "") else {
        return;
    };
    let pool_dir = std::fs::File::open(fs.path()).unwrap();
    let pool = pool_dir.as_fd();
    let backend = Btrfs::open(pool).unwrap();
    backend.create(pool, "src", 32 * MIB).unwrap();
    std::fs::write(fs.path().join("src/data"), b"hello").unwrap();

    std::fs::create_dir(fs.path().join("snaps")).unwrap();
    let snaps = std::fs::File::open(fs.path().join("snaps")).unwrap();
    let src = std::fs::File::open(fs.path().join("src")).unwrap();
    assert!(backend.snapshot(snaps.as_fd(), "s1", src.as_fd()).unwrap());
    assert_eq!(std::fs::read(fs.path().join("snaps/s1/data")).unwrap(), b"hello");
    // Read-only.
    assert!(std::fs::write(fs.path().join("snaps/s1/new"), b"x").is_err());

    let s1 = std::fs::File::open(fs.path().join("snaps/s1")).unwrap();
    let clone = backend.clone_volume(pool, "clone", s1.as_fd(), 4 * MIB).unwrap();
    assert!(clone.is_some());
    assert_eq!(std::fs::read(fs.path().join("clone/data")).unwrap(), b"hello");
    std::fs::write(fs.path().join("clone/new"), b"writable").unwrap();
    let mut f = std::fs::File::create(fs.path().join("clone/big")).unwrap();
    assert!(fill(&mut f, 8).is_err(), "the clone has its own 4 MiB limit");

    // A plain directory is no subvolume: the caller copies instead.
    std::fs::create_dir(fs.path().join("plain")).unwrap();
    let plain = std::fs::File::open(fs.path().join("plain")).unwrap();
    assert!(backend.clone_volume(pool, "c2", plain.as_fd(), MIB).unwrap().is_none());
    assert!(backend.usage(pool, "plain").unwrap().is_none());

    // Read-only snapshots are removed too.
    drop(s1);
    backend.remove(snaps.as_fd(), "s1").unwrap();
    assert!(!fs.path().join("snaps/s1").exists());
    drop(f);
    backend.remove(pool, "clone").unwrap();
    backend.remove(pool, "plain").unwrap();
    assert!(!fs.path().join("plain").exists());
}

#[test]
fn a_pool_that_is_not_btrfs_is_refused_with_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::File::open(tmp.path()).unwrap();
    if hpp_sys::btrfs::is_btrfs(dir.as_fd()).unwrap() {
        eprintln!("skipped: the temporary directory is on btrfs");
        return;
    }
    let err = Btrfs::open(dir.as_fd()).unwrap_err();
    assert!(err.to_string().contains("btrfs"), "{err}");
}

#[test]
fn compression_is_a_per_volume_parameter_applied_while_in_use() {
    let Some(fs) = hpp_testkit::loopfs::LoopFs::new("btrfs", 512, "") else {
        return;
    };
    let pool_dir = std::fs::File::open(fs.path()).unwrap();
    let pool = pool_dir.as_fd();
    let backend = Btrfs::open(pool).unwrap();
    backend.create(pool, "v", 64 * MIB).unwrap();
    let open_file = std::fs::File::create(fs.path().join("v/busy")).unwrap();
    assert!(backend.parameters().iter().any(|(k, _)| *k == "compression"));
    backend.set_parameter(pool, "v", "compression", "zstd").unwrap();
    let dir = std::fs::File::open(fs.path().join("v")).unwrap();
    let mut buf = [0u8; 16];
    let n = rustix::fs::fgetxattr(&dir, "btrfs.compression", &mut buf[..]).unwrap();
    assert_eq!(&buf[..n], b"zstd");
    for (key, value) in [("compression", "gzip"), ("colour", "blue")] {
        let err = backend.set_parameter(pool, "v", key, value).unwrap_err();
        assert!(matches!(err, hpp_fs::quota::QuotaError::Invalid(_)), "{err}");
    }
    drop((open_file, dir));
    backend.remove(pool, "v").unwrap();
}

/// `btrfs subvolume create DIR` as the tenant would run it (the `btrfs` tool when it is
/// installed, else the same ioctl), as `uid` when given.
fn tenant_makes_subvolume(path: &std::path::Path, uid: Option<u32>) -> bool {
    let mut cmd = Command::new("btrfs");
    cmd.args(["subvolume", "create"]).arg(path);
    if let Some(uid) = uid {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(uid);
    }
    match cmd.output() {
        Ok(out) => out.status.success(),
        Err(_) if uid.is_none() => {
            let parent = std::fs::File::open(path.parent().unwrap()).unwrap();
            let name = path.file_name().unwrap().to_str().unwrap();
            hpp_sys::btrfs::subvolume_create(parent.as_fd(), name).is_ok()
        }
        Err(_) => false,
    }
}

/// `dd` of `mib` MiB into `path` as `uid`; whether every byte was written.
fn tenant_writes(path: &std::path::Path, mib: u64, uid: u32) -> bool {
    use std::os::unix::process::CommandExt;
    Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", path.display()))
        .arg("bs=1M")
        .arg(format!("count={mib}"))
        .arg("conv=fsync")
        .uid(uid)
        .gid(uid)
        .output()
        .unwrap()
        .status
        .success()
}

/// The qgroup directory `<level>_<id>` of the filesystem holding `pool` in sysfs.
fn qgroup_path(pool: std::os::fd::BorrowedFd<'_>, level: u8, id: u64) -> std::path::PathBuf {
    let hex: String = hpp_sys::btrfs::fs_uuid(pool)
        .unwrap()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    std::path::PathBuf::from(format!(
        "/sys/fs/btrfs/{}-{}-{}-{}-{}/qgroups/{level}_{id}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    ))
}

/// The escape issue 29 measured (48 MiB written into a 16 MiB volume through a subvolume made
/// inside it) is closed: with simple quotas, which a pool turns on where quotas were off, the
/// kernel counts a subvolume made anywhere inside a volume against the volume's limit from the
/// moment it exists, whoever makes it.
#[test]
fn a_subvolume_a_tenant_makes_inside_its_volume_counts_against_the_volume_limit() {
    let Some(fs) = hpp_testkit::loopfs::LoopFs::new("btrfs", 512, "") else {
        return;
    };
    let pool_dir = std::fs::File::open(fs.path()).unwrap();
    let pool = pool_dir.as_fd();
    let backend = Btrfs::open(pool).unwrap();
    if !backend.simple_quotas() {
        eprintln!("skipping: this kernel has no simple btrfs quotas (the full-quota test covers it)");
        return;
    }
    assert_eq!(backend.nested_containment(), None, "the kernel does it");

    // As root in the volume, and deeper: a directory, then a subvolume inside the subvolume.
    backend.create(pool, "vol", 16 * MIB).unwrap();
    assert!(tenant_makes_subvolume(&fs.path().join("vol/nested"), None));
    std::fs::create_dir(fs.path().join("vol/nested/dir")).unwrap();
    assert!(tenant_makes_subvolume(&fs.path().join("vol/nested/dir/deeper"), None));
    let mut f = std::fs::File::create(fs.path().join("vol/nested/dir/deeper/f")).unwrap();
    let err = fill(&mut f, 48).unwrap_err();
    assert!(is_quota_error(&err), "{err}");
    drop(f);
    rustix::fs::syncfs(&pool_dir).unwrap();
    let usage = backend.usage(pool, "vol").unwrap().unwrap();
    assert!(
        usage.used_bytes > 12 * MIB && usage.used_bytes <= 16 * MIB + MIB,
        "the nested data counts and stops at the limit: {usage:?}"
    );

    // As an unprivileged uid that owns the volume's directory (what a pod's user is).
    backend.create(pool, "owned", 16 * MIB).unwrap();
    std::os::unix::fs::chown(fs.path().join("owned"), Some(65534), Some(65534)).unwrap();
    if !tenant_makes_subvolume(&fs.path().join("owned/mine"), Some(65534)) {
        eprintln!("skipping the unprivileged half: the btrfs tool is not installed");
        return;
    }
    assert!(
        !tenant_writes(&fs.path().join("owned/mine/f"), 48, 65534),
        "48 MiB went into a 16 MiB volume"
    );
    rustix::fs::syncfs(&pool_dir).unwrap();
    let usage = backend.usage(pool, "owned").unwrap().unwrap();
    assert!(usage.used_bytes <= 17 * MIB, "{usage:?}");
}

/// Where quotas were already on in full mode (earlier hpp versions turned them on so, or the
/// kernel has no simple quotas), the driver limits every subvolume made inside a volume, at any
/// depth, to what it holds, every `nested_containment()` interval: what was written before
/// stays, nothing more goes in.
#[test]
fn with_full_quotas_nested_subvolumes_are_frozen_at_what_they_hold() {
    let Some(fs) = hpp_testkit::loopfs::LoopFs::new("btrfs", 512, "") else {
        return;
    };
    let pool_dir = std::fs::File::open(fs.path()).unwrap();
    let pool = pool_dir.as_fd();
    hpp_sys::btrfs::quota_enable(pool).unwrap();
    let backend = Btrfs::open(pool).unwrap();
    assert!(!backend.simple_quotas());
    assert_eq!(
        backend.nested_containment(),
        Some(hpp_fs::quota::btrfs::CONTAIN_INTERVAL)
    );
    backend.create(pool, "vol", 16 * MIB).unwrap();
    // Direct children of the pool (volumes, temporaries, snapshot data) are never touched.
    hpp_sys::btrfs::subvolume_create(pool, "not-a-volume").unwrap();
    assert_eq!(backend.contain_nested(pool).unwrap(), 0);

    assert!(tenant_makes_subvolume(&fs.path().join("vol/a"), None));
    assert!(tenant_makes_subvolume(&fs.path().join("vol/a/b"), None));
    let mut f = std::fs::File::create(fs.path().join("vol/a/b/early")).unwrap();
    fill(&mut f, 8).unwrap();
    drop(f);
    rustix::fs::syncfs(&pool_dir).unwrap();
    assert_eq!(backend.contain_nested(pool).unwrap(), 2, "both levels");
    assert_eq!(backend.contain_nested(pool).unwrap(), 0, "only new ones are looked at");
    for dir in ["vol/a", "vol/a/b"] {
        // Even the new file's metadata may not fit any more.
        let err = std::fs::File::create(fs.path().join(dir).join("late"))
            .and_then(|mut g| fill(&mut g, 4))
            .unwrap_err();
        assert!(is_quota_error(&err), "{dir}: {err}");
    }
    assert_eq!(
        std::fs::metadata(fs.path().join("vol/a/b/early")).unwrap().len(),
        8 * MIB
    );
    // The volume itself keeps its own 16 MiB.
    let mut h = std::fs::File::create(fs.path().join("vol/own")).unwrap();
    fill(&mut h, 8).unwrap();
    drop(h);
    // Deleting the volume still takes everything.
    backend.remove(pool, "vol").unwrap();
    assert!(!fs.path().join("vol").exists());
}

/// A btrfs snapshot leaves a nested subvolume's data out: snapshots and clones of such a volume
/// are refused with the reason, never taken without it; the volume is still deleted whole,
/// with its qgroups.
#[test]
fn snapshots_and_clones_of_a_volume_holding_subvolumes_are_refused() {
    let Some(fs) = hpp_testkit::loopfs::LoopFs::new("btrfs", 512, "") else {
        return;
    };
    let pool_dir = std::fs::File::open(fs.path()).unwrap();
    let pool = pool_dir.as_fd();
    let backend = Btrfs::open(pool).unwrap();
    backend.create(pool, "vol", 32 * MIB).unwrap();
    assert!(tenant_makes_subvolume(&fs.path().join("vol/inner"), None));
    std::fs::write(fs.path().join("vol/inner/data"), b"would be lost").unwrap();
    let vol = std::fs::File::open(fs.path().join("vol")).unwrap();
    let id = hpp_sys::btrfs::subvolume_id(vol.as_fd()).unwrap();

    let err = backend.clone_volume(pool, "clone", vol.as_fd(), 32 * MIB).unwrap_err();
    assert!(matches!(err, hpp_fs::quota::QuotaError::Refused(_)), "{err}");
    assert!(err.to_string().contains("would not include"), "{err}");
    assert!(!fs.path().join("clone").exists());
    std::fs::create_dir(fs.path().join("snaps")).unwrap();
    let snaps = std::fs::File::open(fs.path().join("snaps")).unwrap();
    let err = backend.snapshot(snaps.as_fd(), "s", vol.as_fd()).unwrap_err();
    assert!(matches!(err, hpp_fs::quota::QuotaError::Refused(_)), "{err}");
    assert!(!fs.path().join("snaps/s").exists());

    drop(vol);
    backend.remove(pool, "vol").unwrap();
    assert!(!fs.path().join("vol").exists());
    assert!(
        !qgroup_path(pool, 1, id).exists(),
        "the volume's level-1 qgroup went with it"
    );
}
