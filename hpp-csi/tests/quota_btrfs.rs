//! Volumes and snapshots of a `quota: btrfs` pool on a real, loop-mounted btrfs: every volume
//! is a size-limited subvolume, clones and snapshots are subvolume snapshots, deletion and the
//! start-up sweep take subvolumes (read-only ones included) away. kill -9 at any moment of
//! create, snapshot, clone, expand, modify and delete converges.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod crash_child;
use hpp_testkit::loopfs;

use std::io::Write;
use std::os::fd::AsFd;

use hpp_api::quota::QuotaMode;
use hpp_csi::PoolConfig;
use hpp_csi::mountinfo::MountTable;
use hpp_csi::ops::snapshots;
use hpp_csi::ops::volumes::{self, Created, Requested};
use hpp_csi::pool::Pool;
use hpp_fs::MountTableCache;
use hpp_fs::quota::btrfs::is_subvolume;

const MIB: u64 = 1 << 20;

fn is_subvol(path: &std::path::Path) -> bool {
    is_subvolume(std::fs::File::open(path).unwrap().as_fd())
}

fn write_mib(path: &std::path::Path, mib: u64) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    for _ in 0..mib {
        f.write_all(&vec![7u8; MIB as usize])?;
    }
    f.sync_all()
}

#[test]
fn a_btrfs_pool_builds_limited_subvolumes_snapshots_and_clones_and_removes_them() {
    let Some(fs) = loopfs::LoopFs::new("btrfs", 512, "") else {
        return;
    };
    let root = fs.path();
    let cfg = PoolConfig::new("b", root.join("pool"))
        .with_snapshots(root.join("snaps"))
        .quota(QuotaMode::Btrfs, 100);
    let pool = Pool::prepare(&cfg).unwrap();
    assert_eq!(pool.quota.name(), "btrfs");
    let want = |bytes| Requested {
        required: bytes,
        limit: 0,
    };

    assert!(matches!(
        volumes::create(&pool, "pvc-1", None, want(8 * MIB)).unwrap(),
        Created::New(_)
    ));
    let vol = root.join("pool/pvc-1");
    assert!(is_subvol(&vol));
    assert!(write_mib(&vol.join("big"), 16).is_err(), "the 8 MiB limit holds");
    std::fs::remove_file(vol.join("big")).unwrap();
    // btrfs gives freed extents back to the qgroup once the transaction that frees them commits
    // and its delayed references run, which one syncfs does not always cover: commit until the
    // space is back (the volume must be writable again), with a hang guard only.
    let mut written = Err(std::io::Error::other("not tried"));
    for _ in 0..100 {
        rustix::fs::syncfs(std::fs::File::open(&vol).unwrap()).unwrap();
        written = std::fs::write(vol.join("hello"), b"world");
        if written.is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    written.expect("the freed space comes back to the qgroup");
    // Idempotent retry.
    assert_eq!(
        volumes::create(&pool, "pvc-1", None, want(8 * MIB)).unwrap(),
        Created::Existing
    );

    let src = volumes::open(&pool, "pvc-1").unwrap();
    snapshots::create(&pool, "snap-1", "pvc-1", &src).unwrap();
    assert!(is_subvol(&root.join("snaps/snap-1/data")));

    let data = snapshots::open_data(&pool, "snap-1").unwrap();
    volumes::create(&pool, "pvc-2", Some(&data), want(32 * MIB)).unwrap();
    let clone = root.join("pool/pvc-2");
    assert!(is_subvol(&clone));
    assert_eq!(std::fs::read(clone.join("hello")).unwrap(), b"world");
    let dir = pool.open().unwrap();
    let usage = pool.quota.usage(dir.as_fd(), "pvc-2").unwrap().unwrap();
    assert_eq!(usage.limit_bytes, 32 * MIB);

    // Leftovers of crashed attempts: a temporary subvolume and a half-made snapshot.
    pool.quota.create(dir.as_fd(), ".hpp-tmp-pvc-3-0badf00d", MIB).unwrap();
    let snaps = std::fs::File::open(root.join("snaps")).unwrap();
    std::fs::create_dir(root.join("snaps/.hpp-tmp-snap-2-0badf00d")).unwrap();
    let half = std::fs::File::open(root.join("snaps/.hpp-tmp-snap-2-0badf00d")).unwrap();
    assert!(pool.quota.snapshot(half.as_fd(), "data", src.as_fd()).unwrap());
    drop(half);
    assert_eq!(volumes::sweep(dir.as_fd(), &*pool.quota).unwrap(), 1);
    assert_eq!(snapshots::sweep(&pool).unwrap(), 1);
    assert!(!root.join("pool/.hpp-tmp-pvc-3-0badf00d").exists());
    assert!(!root.join("snaps/.hpp-tmp-snap-2-0badf00d").exists());
    drop(snaps);

    // A plain directory from before the pool used btrfs is still served and deleted.
    std::fs::create_dir(root.join("pool/legacy")).unwrap();
    assert!(pool.quota.usage(dir.as_fd(), "legacy").unwrap().is_none());

    drop((src, data));
    // A published (bind-mounted) subvolume is never deleted.
    let target = root.join("target");
    std::fs::create_dir(&target).unwrap();
    rustix::mount::mount_bind(&vol, &target).unwrap();
    let refused = volumes::delete(&pool, "pvc-1", &MountTableCache::new());
    rustix::mount::unmount(&target, rustix::mount::UnmountFlags::empty()).unwrap();
    assert!(
        matches!(refused, Err(hpp_csi::Error::FailedPrecondition(_))),
        "{refused:?}"
    );
    assert!(vol.exists());
    let mounts = MountTableCache::new();
    for id in ["pvc-1", "pvc-2", "legacy"] {
        assert!(volumes::delete(&pool, id, &mounts).unwrap(), "{id}");
        assert!(!root.join("pool").join(id).exists());
    }
    assert!(snapshots::delete(&pool, "snap-1").unwrap());
    assert!(!root.join("snaps/snap-1").exists());
}

/// Environment variable that turns [`crash_child`] into the workload the crash test kills.
const CRASH_CHILD: &str = "HPP_TEST_CRASH_CHILD_ROOT";

fn crash_pool(root: &std::path::Path) -> Pool {
    let cfg = PoolConfig::new("b", root.join("pool"))
        .with_snapshots(root.join("snaps"))
        .quota(QuotaMode::Btrfs, 100);
    Pool::prepare(&cfg).unwrap()
}

/// Not a test on its own: when the crash test runs this binary with [`CRASH_CHILD`] set, it
/// creates, snapshots, clones and deletes volumes forever, until it is killed.
#[test]
fn crash_child() {
    let Ok(root) = std::env::var(CRASH_CHILD) else {
        return;
    };
    let root = std::path::PathBuf::from(root);
    let pool = crash_pool(&root);
    let want = Requested {
        required: 4 * MIB,
        limit: 0,
    };
    crash_child::mark_started(&root);
    for i in 0u64.. {
        let (vol, snap, clone) = (format!("vol-{i}"), format!("snap-{i}"), format!("clone-{i}"));
        volumes::create(&pool, &vol, None, want).unwrap();
        std::fs::write(root.join("pool").join(&vol).join("data"), i.to_string()).unwrap();
        let src = volumes::open(&pool, &vol).unwrap();
        snapshots::create(&pool, &snap, &vol, &src).unwrap();
        drop(src);
        let data = snapshots::open_data(&pool, &snap).unwrap();
        volumes::create(&pool, &clone, Some(&data), want).unwrap();
        drop(data);
        let mounts = MountTableCache::new();
        volumes::delete(&pool, &vol, &mounts).unwrap();
        snapshots::delete(&pool, &snap).unwrap();
        volumes::delete(&pool, &clone, &mounts).unwrap();
    }
}

/// kill -9 of a process creating, snapshotting, cloning and deleting btrfs volumes, at many
/// different moments: after the start-up sweep, no temporary is left, every volume is a
/// complete, limited subvolume, and deleting them all leaves no subvolume and no qgroup.
#[test]
fn killing_the_driver_at_any_moment_converges() {
    let Some(fs) = loopfs::LoopFs::new("btrfs", 512, "") else {
        return;
    };
    let root = fs.path().to_path_buf();
    crash_pool(&root);
    crash_child::kill_at_moments(
        "crash_child",
        CRASH_CHILD,
        &root,
        12,
        std::time::Duration::from_millis(17),
    );
    // What the driver does at start-up.
    let pool = crash_pool(&root);
    let dir = pool.open().unwrap();
    volumes::sweep(dir.as_fd(), &*pool.quota).unwrap();
    snapshots::sweep(&pool).unwrap();
    let leftovers = |p: &std::path::Path| {
        std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".hpp-tmp-") || n.starts_with(".hpp-del-"))
            .collect::<Vec<_>>()
    };
    assert_eq!(leftovers(&root.join("pool")), Vec::<String>::new());
    assert_eq!(leftovers(&root.join("snaps")), Vec::<String>::new());
    let volumes = pool.list_volumes().unwrap();
    for id in &volumes {
        assert!(is_subvol(&root.join("pool").join(id)), "{id} is a complete subvolume");
        assert_eq!(
            volumes::recorded_capacity(dir.as_fd(), id).unwrap(),
            Some(4 * MIB),
            "{id}"
        );
        let usage = pool.quota.usage(dir.as_fd(), id).unwrap().unwrap();
        assert_eq!(usage.limit_bytes, 4 * MIB, "{id}");
    }
    let mounts = MountTableCache::new();
    for id in &volumes {
        volumes::delete(&pool, id, &mounts).unwrap();
    }
    for snap in snapshots::list(&pool).unwrap() {
        snapshots::delete(&pool, &snap.id).unwrap();
    }
    let _ = std::process::Command::new("btrfs")
        .args(["subvolume", "sync"])
        .arg(&root)
        .output();
    // The children did work: every subvolume they made used up an id (a fresh one is past them).
    let probe = pool.quota.create(dir.as_fd(), "probe", MIB).unwrap();
    let last_id = hpp_sys::btrfs::subvolume_id(probe.as_fd()).unwrap();
    drop(probe);
    pool.quota.remove(dir.as_fd(), "probe").unwrap();
    eprintln!("the killed children made {} subvolumes", last_id - 256);
    assert!(last_id > 257, "the children made no subvolume at all ({last_id})");
    let _ = std::process::Command::new("btrfs")
        .args(["subvolume", "sync"])
        .arg(&root)
        .output();
    let uuid = hpp_sys::btrfs::fs_uuid(dir.as_fd()).unwrap();
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    let qgroups = format!(
        "/sys/fs/btrfs/{}-{}-{}-{}-{}/qgroups",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    let left: Vec<String> = std::fs::read_dir(&qgroups)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("0_") && n != "0_5")
        .collect();
    assert_eq!(left, Vec::<String>::new(), "no qgroup outlives its subvolume");
}

/// Environment variables that turn [`resize_crash_child`] into the workload
/// [`killing_the_driver_while_expanding_or_modifying_converges`] kills.
const RESIZE_CHILD: &str = "HPP_TEST_RESIZE_CRASH_ROOT";
const RESIZE_ROUND: &str = "HPP_TEST_RESIZE_CRASH_ROUND";

/// The workload's steps after create, with their argument: sizes in MiB, compression names.
const RESIZE_STEPS: [(&str, &str); 4] = [("expand", "8"), ("modify", "zstd"), ("expand", "12"), ("modify", "lzo")];

fn expand_btrfs(pool: &Pool, id: &str, bytes: u64) -> u64 {
    let health = pool.health(&MountTable::read().unwrap());
    let range = hpp_csi::ops::sizing::Range {
        required: bytes,
        limit: 0,
    };
    hpp_csi::ops::expand::controller_expand(&hpp_csi::ops::ledger::Ledger::default(), pool, &health, id, range)
        .unwrap()
        .capacity
}

fn modify_btrfs(pool: &Pool, id: &str, compression: &str) {
    let params = std::collections::HashMap::from([("compression".to_owned(), compression.to_owned())]);
    let tuning = hpp_csi::ops::modify::parse(pool, &params).unwrap();
    hpp_csi::ops::modify::apply(pool, id, &tuning).unwrap();
}

fn compression_of(pool: &Pool, id: &str) -> String {
    let fd = std::fs::File::open(pool.path.join(id)).unwrap();
    let mut buf = [0u8; 16];
    let n = rustix::fs::fgetxattr(&fd, "btrfs.compression", &mut buf[..]).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Limit and recorded size of volume `id` agree and are `bytes`.
fn assert_limit(pool: &Pool, id: &str, bytes: u64) {
    let dir = pool.open().unwrap();
    assert_eq!(
        volumes::recorded_capacity(dir.as_fd(), id).unwrap(),
        Some(bytes),
        "{id}: recorded size"
    );
    let usage = pool.quota.usage(dir.as_fd(), id).unwrap().unwrap();
    assert_eq!(usage.limit_bytes, bytes, "{id}: qgroup limit");
}

/// Not a test on its own: with [`RESIZE_CHILD`] set, creates volumes and expands and modifies
/// each twice, journalling each step before taking it, until it is killed.
#[test]
fn resize_crash_child() {
    let Ok(root) = std::env::var(RESIZE_CHILD) else {
        return;
    };
    let round = std::env::var(RESIZE_ROUND).unwrap();
    let root = std::path::PathBuf::from(root);
    let pool = crash_pool(&root);
    let mut journal = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join(format!("journal-{round}")))
        .unwrap();
    let mut step = |line: String| writeln!(journal, "{line}").unwrap();
    crash_child::mark_started(&root);
    for i in 0u64.. {
        let vol = format!("r{round}-vol-{i}");
        step(format!("create {vol}"));
        volumes::create(
            &pool,
            &vol,
            None,
            Requested {
                required: 4 * MIB,
                limit: 0,
            },
        )
        .unwrap();
        for (op, arg) in RESIZE_STEPS {
            step(format!("{op} {vol} {arg}"));
            match op {
                "expand" => {
                    expand_btrfs(&pool, &vol, arg.parse::<u64>().unwrap() * MIB);
                }
                _ => modify_btrfs(&pool, &vol, arg),
            }
        }
        step(format!("delete {vol}"));
        volumes::delete(&pool, &vol, &MountTableCache::new()).unwrap();
    }
}

/// kill -9 of a driver expanding (raising qgroup limits) and modifying (compression) btrfs
/// volumes, aimed at each kind of step in turn: after the start-up sweep, the CO's retry of the
/// interrupted call succeeds, leaving limit and recorded size equal to the size asked for and
/// the compression asked for in place; every other volume's limit equals its recorded size.
#[test]
fn killing_the_driver_while_expanding_or_modifying_converges() {
    let Some(fs) = loopfs::LoopFs::new("btrfs", 512, "") else {
        return;
    };
    let root = fs.path().to_path_buf();
    let pool = crash_pool(&root);
    let exe = std::env::current_exe().unwrap();
    let mut interrupted = std::collections::BTreeMap::<String, usize>::new();
    for round in 0..12u64 {
        let mut child = std::process::Command::new(&exe)
            .args(["--exact", "resize_crash_child", "--nocapture", "--test-threads=1"])
            .env(RESIZE_CHILD, &root)
            .env(RESIZE_ROUND, round.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(root.join(format!("child-{round}.log"))).unwrap())
            .spawn()
            .unwrap();
        // Rounds aim at expand and modify in turn, a little later into the step each time.
        let aim = if round % 2 == 0 { "expand" } else { "modify" };
        let journal = root.join(format!("journal-{round}"));
        loop {
            let log = std::fs::read_to_string(&journal).unwrap_or_default();
            if log.lines().last().is_some_and(|l| l.starts_with(aim)) {
                break;
            }
            assert!(child.try_wait().unwrap().is_none(), "round {round}: the child died");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::thread::sleep(std::time::Duration::from_millis(round / 2));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "round {round}: the child ended with {status}: {}",
            std::fs::read_to_string(root.join(format!("child-{round}.log"))).unwrap()
        );
        let _ = std::fs::remove_file(crash_child::started_marker(&root, &child));

        let dir = pool.open().unwrap();
        volumes::sweep(dir.as_fd(), &*pool.quota).unwrap();
        let log = std::fs::read_to_string(&journal).unwrap();
        let last = log.lines().last().unwrap().to_owned();
        let words: Vec<&str> = last.split(' ').collect();
        *interrupted.entry(words[0].to_owned()).or_default() += 1;
        match words[..] {
            ["create", vol] => {
                let want = Requested {
                    required: 4 * MIB,
                    limit: 0,
                };
                volumes::create(&pool, vol, None, want).unwrap();
                assert_limit(&pool, vol, 4 * MIB);
            }
            ["expand", vol, mib] => {
                let bytes = mib.parse::<u64>().unwrap() * MIB;
                assert_eq!(expand_btrfs(&pool, vol, bytes), bytes);
                assert_limit(&pool, vol, bytes);
            }
            ["modify", vol, compression] => {
                modify_btrfs(&pool, vol, compression);
                assert_eq!(compression_of(&pool, vol), compression);
            }
            ["delete", vol] => {
                volumes::delete(&pool, vol, &MountTableCache::new()).unwrap();
                assert!(!pool.path.join(vol).exists());
            }
            _ => panic!("unexpected journal line {last:?}"),
        }
    }
    eprintln!("kills interrupted: {interrupted:?}");
    let dir = pool.open().unwrap();
    for id in pool.list_volumes().unwrap() {
        let recorded = volumes::recorded_capacity(dir.as_fd(), &id).unwrap().unwrap();
        assert_limit(&pool, &id, recorded);
    }
}

/// A guarded btrfs pool whose filesystem is mounted after the driver started: the backend is
/// set up once the mount is there, instead of failing the whole driver at start-up (btrfs
/// quota on the root filesystem's directory) or being chosen from the wrong filesystem.
#[test]
fn a_guarded_pool_mounted_after_start_gets_its_backend_then() {
    let Some(fs) = loopfs::LoopFs::new("btrfs", 512, "") else {
        return;
    };
    let later = tempfile::tempdir().unwrap();
    let path = later.path().join("pool");
    std::fs::create_dir(&path).unwrap();
    let cfg = PoolConfig::new("late", &path)
        .require_mount_point(true)
        .quota(QuotaMode::Btrfs, 100);
    let pool = Pool::prepare(&cfg).expect("an unmounted guarded pool is no configuration error");
    assert!(!pool.measure().usable, "unusable until mounted");
    let dir = std::fs::File::open(&path).unwrap();
    assert!(pool.quota.create(dir.as_fd(), "early", MIB).is_err());
    drop(dir);
    rustix::mount::mount_bind(fs.path(), &path).unwrap();
    let created = volumes::create(
        &pool,
        "pvc-late",
        None,
        Requested {
            required: 8 * MIB,
            limit: 0,
        },
    );
    let subvolume = created.is_ok() && is_subvol(&path.join("pvc-late"));
    let name = pool.quota.name();
    rustix::mount::unmount(&path, rustix::mount::UnmountFlags::DETACH).unwrap();
    assert!(subvolume, "{created:?}");
    assert_eq!(name, "btrfs");
}

/// A tenant may make subvolumes inside its volume, snapshot them read-only, nest them and mark
/// them read-only (their owner may, unprivileged): deleting the volume takes them all away,
/// deepest first, instead of failing on every retry (EROFS inside a read-only snapshot).
#[test]
fn deleting_a_volume_destroys_the_subvolumes_a_tenant_made_inside_it() {
    let Some(fs) = loopfs::LoopFs::new("btrfs", 512, "") else {
        return;
    };
    let root = fs.path();
    let cfg = PoolConfig::new("b", root.join("pool")).quota(QuotaMode::Btrfs, 100);
    let pool = Pool::prepare(&cfg).unwrap();
    let want = Requested {
        required: 64 * MIB,
        limit: 0,
    };
    volumes::create(&pool, "pvc-t", None, want).unwrap();
    let vol = root.join("pool/pvc-t");
    let open = |p: &std::path::Path| std::fs::File::open(p).unwrap();
    use hpp_sys::btrfs::{snapshot_create, subvolume_create, subvolume_set_read_only};
    // s (with a file), r: a read-only snapshot of s.
    subvolume_create(open(&vol).as_fd(), "s").unwrap();
    std::fs::write(vol.join("s/file"), b"tenant data").unwrap();
    snapshot_create(open(&vol).as_fd(), "r", open(&vol.join("s")).as_fd(), true).unwrap();
    assert!(std::fs::remove_file(vol.join("r/file")).is_err(), "r is read-only");
    // A subvolume two levels down, holding another subvolume, in plain directories.
    std::fs::create_dir_all(vol.join("a/b")).unwrap();
    subvolume_create(open(&vol.join("a/b")).as_fd(), "n").unwrap();
    std::fs::create_dir_all(vol.join("a/b/n/deep")).unwrap();
    subvolume_create(open(&vol.join("a/b/n/deep")).as_fd(), "m").unwrap();
    std::fs::write(vol.join("a/b/n/deep/m/f"), b"m").unwrap();
    // p holds q, then p is made read-only (q can only go once p is writable again).
    subvolume_create(open(&vol).as_fd(), "p").unwrap();
    subvolume_create(open(&vol.join("p")).as_fd(), "q").unwrap();
    std::fs::write(vol.join("p/q/f"), b"q").unwrap();
    subvolume_set_read_only(open(&vol.join("p")).as_fd(), true).unwrap();
    assert!(std::fs::write(vol.join("p/g"), b"x").is_err(), "p is read-only");
    // A symlink out of the volume is never followed.
    std::fs::create_dir(root.join("outside")).unwrap();
    subvolume_create(open(&root.join("outside")).as_fd(), "keep").unwrap();
    std::os::unix::fs::symlink(root.join("outside"), vol.join("link")).unwrap();

    let mounts = MountTableCache::new();
    let first = volumes::delete(&pool, "pvc-t", &mounts);
    assert!(matches!(first, Ok(true)), "{first:?}");
    assert!(!vol.exists());
    assert!(
        std::fs::read_dir(root.join("pool")).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".hpp-del")),
        "nothing left behind"
    );
    assert!(
        is_subvol(&root.join("outside/keep")),
        "the symlink's target is untouched"
    );
    assert!(volumes::delete(&pool, "pvc-t", &mounts).is_ok(), "a retry is fine");
}

/// The same in a plain directory volume from before the pool used btrfs: a read-only snapshot
/// below a subdirectory is destroyed, not walked into.
#[test]
fn deleting_a_plain_directory_volume_destroys_the_subvolumes_inside_it() {
    let Some(fs) = loopfs::LoopFs::new("btrfs", 512, "") else {
        return;
    };
    let root = fs.path();
    let cfg = PoolConfig::new("b", root.join("pool")).quota(QuotaMode::Btrfs, 100);
    let pool = Pool::prepare(&cfg).unwrap();
    let open = |p: &std::path::Path| std::fs::File::open(p).unwrap();
    use hpp_sys::btrfs::{snapshot_create, subvolume_create};
    let mounts = MountTableCache::new();
    let legacy = root.join("pool/legacy");
    std::fs::create_dir_all(legacy.join("d")).unwrap();
    subvolume_create(open(&legacy.join("d")).as_fd(), "s").unwrap();
    std::fs::write(legacy.join("d/s/file"), b"tenant data").unwrap();
    snapshot_create(
        open(&legacy.join("d")).as_fd(),
        "r",
        open(&legacy.join("d/s")).as_fd(),
        true,
    )
    .unwrap();
    let plain = volumes::delete(&pool, "legacy", &mounts);
    assert!(matches!(plain, Ok(true)), "{plain:?}");
    assert!(!legacy.exists());
}

/// Writes up to `mib` MiB into `path`; whether all of it went in.
fn try_write_mib(path: &std::path::Path, mib: u64) -> bool {
    write_mib(path, mib).is_ok()
}

/// `btrfs subvolume create PATH`, the tenant's action (the tool when installed, else its ioctl).
fn make_subvolume(path: &std::path::Path) {
    let made = std::process::Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(path)
        .output()
        .map(|o| o.status.success());
    if !matches!(made, Ok(true)) {
        let parent = std::fs::File::open(path.parent().unwrap()).unwrap();
        hpp_sys::btrfs::subvolume_create(parent.as_fd(), path.file_name().unwrap().to_str().unwrap()).unwrap();
    }
}

/// Issue 29's sized-volume findings through the driver's socket, on simple and on full btrfs
/// quotas: a clone of a full source at its size succeeds, no size means the source's, smaller
/// is OutOfRange; a tenant's subvolume inside a published volume counts against its limit
/// (at once with simple quotas, from the next containment pass with full ones); a snapshot of
/// a volume holding one is refused.
#[tokio::test]
async fn through_the_driver_copies_keep_their_source_size_and_nested_subvolumes_count() {
    use hpp_csi::csi;
    for full_quotas in [false, true] {
        let Some(fs) = loopfs::LoopFs::new("btrfs", 512, "") else {
            return;
        };
        let root = fs.path().to_path_buf();
        if full_quotas {
            hpp_sys::btrfs::quota_enable(std::fs::File::open(&root).unwrap().as_fd()).unwrap();
        }
        let pool_root = root.clone();
        let mut h = common::Harness::with(move |_, b| {
            b.pool(
                PoolConfig::new("b", pool_root.join("pool"))
                    .with_snapshots(pool_root.join("snaps"))
                    .quota(QuotaMode::Btrfs, 100),
            )
        })
        .await;
        let sized =
            |name: &str, bytes: i64, source: Option<csi::volume_content_source::Type>| csi::CreateVolumeRequest {
                parameters: common::params("b"),
                volume_content_source: source.map(|t| csi::VolumeContentSource { r#type: Some(t) }),
                ..common::sized_req(name, bytes, 0)
            };
        let from = |id: &str| {
            Some(csi::volume_content_source::Type::Volume(
                csi::volume_content_source::VolumeSource { volume_id: id.into() },
            ))
        };
        h.controller
            .create_volume(sized("src", 16 * MIB as i64, None))
            .await
            .unwrap();
        // Full, to the last block.
        assert!(!try_write_mib(&root.join("pool/src/fill"), 32));
        rustix::fs::syncfs(std::fs::File::open(&root).unwrap()).unwrap();

        let same = h
            .controller
            .create_volume(sized("same", 16 * MIB as i64, from("src")))
            .await;
        let same = same.unwrap_or_else(|e| panic!("full_quotas={full_quotas}: {e:?}"));
        assert_eq!(same.into_inner().volume.unwrap().capacity_bytes, 16 * MIB as i64);
        let no_size = h
            .controller
            .create_volume(sized("unsized", 0, from("src")))
            .await
            .unwrap();
        assert_eq!(no_size.into_inner().volume.unwrap().capacity_bytes, 16 * MIB as i64);
        let small = h
            .controller
            .create_volume(sized("small", 8 * MIB as i64, from("src")))
            .await
            .unwrap_err();
        assert_eq!(small.code(), tonic::Code::OutOfRange, "{small:?}");
        assert!(!root.join("pool/small").exists());

        // The tenant, through the published volume.
        h.controller
            .create_volume(sized("tenant", 16 * MIB as i64, None))
            .await
            .unwrap();
        let target = h.target(&format!("tenant-{full_quotas}"));
        h.node
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_context: common::params("b"),
                ..common::publish_req("tenant", &target, false)
            })
            .await
            .unwrap();
        make_subvolume(&target.join("nested"));
        if full_quotas {
            hpp_csi::service::health::contain_nested_once(&h.state);
        }
        assert!(
            !try_write_mib(&target.join("nested/f"), 48),
            "full_quotas={full_quotas}: 48 MiB went into a 16 MiB volume"
        );
        let snap = h
            .controller
            .create_snapshot(csi::CreateSnapshotRequest {
                source_volume_id: "tenant".into(),
                name: "snap".into(),
                parameters: common::params("b"),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(snap.code(), tonic::Code::FailedPrecondition, "{snap:?}");
        assert!(snap.message().contains("would not include"), "{snap:?}");
        h.unpublish("tenant", &target).await.unwrap();
        h.delete("tenant").await.unwrap();
        assert!(!root.join("pool/tenant").exists());
        h.stop().await;
    }
}
