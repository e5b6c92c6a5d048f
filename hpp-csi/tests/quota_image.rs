//! A `quota: image` pool through the real gRPC services: CreateVolume makes an image of the
//! requested size, NodePublish loop-mounts it (df in the pod shows the volume), writes past
//! the size fail, DeleteVolume refuses while the image is mounted, NodeUnpublish frees it.
//! And kill -9 of a driver creating, publishing, cloning, expanding and deleting image volumes
//! at many different moments converges.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod crash_child;
use hpp_testkit::loopfs;

use common::*;
use hpp_api::quota::QuotaMode;
use std::io::Write;
use tonic::Code;

const MIB: u64 = 1 << 20;

/// Whether image volumes can be made here (root, loop devices, mkfs.ext4); says why not.
fn image_tools() -> bool {
    if !rustix::process::geteuid().is_root() || !std::path::Path::new("/dev/loop-control").exists() {
        eprintln!("skipped: needs root and loop devices");
        return false;
    }
    if std::process::Command::new("mkfs.ext4").arg("-V").output().is_err() {
        eprintln!("skipped: mkfs.ext4 is not installed");
        return false;
    }
    true
}

#[tokio::test]
async fn image_volumes_are_loop_mounted_limited_and_freed() {
    if !image_tools() {
        return;
    }
    let mut h = Harness::with(|root, b| b.pool(legacy_pool(root).quota(QuotaMode::Image, 100))).await;
    let mut req = create_req("pvc-img");
    req.capacity_range = Some(hpp_csi::csi::CapacityRange {
        required_bytes: 16 * MIB as i64,
        limit_bytes: 0,
    });
    h.controller.create_volume(req).await.unwrap();
    assert!(h.pool_path().join("pvc-img/disk.img").is_file());

    let target = h.target("img");
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
        }
    }
    let _cleanup = Cleanup(target.clone());
    h.publish("pvc-img", &target, false).await.unwrap();
    h.publish("pvc-img", &target, false).await.unwrap();
    let st = rustix::fs::statvfs(&target).unwrap();
    assert!(st.f_blocks * st.f_frsize <= 16 * MIB, "df shows the volume");
    let mut f = std::fs::File::create(target.join("big")).unwrap();
    let chunk = vec![3u8; MIB as usize];
    let err = (0..32)
        .try_for_each(|_| f.write_all(&chunk))
        .and_then(|()| f.sync_all())
        .unwrap_err();
    assert_eq!(rustix::io::Errno::from_io_error(&err), Some(rustix::io::Errno::NOSPC));
    drop(f);

    let delete = hpp_csi::csi::DeleteVolumeRequest {
        volume_id: "pvc-img".into(),
        secrets: Default::default(),
    };
    assert_eq!(
        code(h.controller.delete_volume(delete.clone()).await),
        Code::FailedPrecondition
    );

    h.unpublish("pvc-img", &target).await.unwrap();
    assert!(!target.exists());
    // The loop device goes with the unmount (autoclear, done by the kernel right after).
    let mut deleted = Err(tonic::Status::internal("not tried"));
    for _ in 0..500 {
        deleted = h.controller.delete_volume(delete.clone()).await.map(|_| ());
        if deleted.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    deleted.unwrap();
    assert!(!h.pool_path().join("pvc-img").exists());
    h.stop().await;
}

/// Environment variable that turns [`image_crash_child`] into the workload the crash test kills
/// (the pool's root), and the round it runs in.
const CRASH_CHILD: &str = "HPP_TEST_IMAGE_CRASH_ROOT";
const CRASH_ROUND: &str = "HPP_TEST_IMAGE_CRASH_ROUND";
/// Set when the child also grows its volumes with NodeExpandVolume (`--expansion=node`).
const CRASH_NODE_EXPAND: &str = "HPP_TEST_IMAGE_CRASH_NODE_EXPAND";

fn image_pool(root: &std::path::Path) -> hpp_csi::pool::Pool {
    let cfg = hpp_csi::PoolConfig::new("i", root.join("pool")).quota(QuotaMode::Image, 100);
    hpp_csi::pool::Pool::prepare(&cfg).unwrap()
}

fn sized(bytes: u64) -> hpp_csi::ops::volumes::Requested {
    hpp_csi::ops::volumes::Requested {
        required: bytes,
        limit: 0,
    }
}

fn expand_image(pool: &hpp_csi::pool::Pool, id: &str, bytes: u64) -> hpp_csi::ops::expand::Expanded {
    let health = pool.health(&hpp_csi::mountinfo::MountTable::read().unwrap());
    let range = hpp_csi::ops::sizing::Range {
        required: bytes,
        limit: 0,
    };
    hpp_csi::ops::expand::controller_expand(&hpp_csi::ops::ledger::Ledger::default(), pool, &health, id, range).unwrap()
}

/// Deletes `id`, waiting while the kernel is still detaching a loop device that was
/// autocleared by an unmount (the detach runs just after it).
fn delete_image(pool: &hpp_csi::pool::Pool, id: &str) -> bool {
    for _ in 0..1000 {
        let mounts = hpp_fs::MountTableCache::new();
        match hpp_csi::ops::volumes::delete(pool, id, &mounts) {
            Err(hpp_csi::Error::FailedPrecondition(m)) if m.contains("attached to /dev/loop") => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other.unwrap(),
        }
    }
    panic!("{id} stays attached to a loop device");
}

/// Loop devices whose backing file is inside `dir`.
fn loops_backed_under(dir: &std::path::Path) -> Vec<String> {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/sys/block")
        .unwrap()
        .filter_map(|e| {
            let dev = e.unwrap().file_name().to_string_lossy().into_owned();
            let backing = std::fs::read_to_string(format!("/sys/block/{dev}/loop/backing_file")).ok()?;
            backing
                .starts_with(&format!("{dir}/"))
                .then(|| format!("{dev}: {}", backing.trim_end()))
        })
        .collect()
}

/// Waits (bounded) for the loop devices of the killed child's mounts to be detached; the
/// ones left are leaks.
fn leaked_loops(dir: &std::path::Path) -> Vec<String> {
    for _ in 0..1000 {
        if loops_backed_under(dir).is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    loops_backed_under(dir)
}

/// Volume `id` is complete: its image is `bytes` long, its recorded size is `bytes`, and the
/// filesystem inside is clean (`e2fsck -fn`).
fn assert_complete_image(pool: &hpp_csi::pool::Pool, id: &str, bytes: u64) {
    let dir = pool.open().unwrap();
    let img = pool.path.join(id).join("disk.img");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), bytes, "{id}: image size");
    assert_eq!(
        hpp_csi::ops::volumes::recorded_capacity(std::os::fd::AsFd::as_fd(&dir), id).unwrap(),
        Some(bytes),
        "{id}: recorded size"
    );
    let out = std::process::Command::new("e2fsck")
        .arg("-fn")
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{id}: e2fsck -fn: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The kinds of step of the workload, as the journal names them.
const STEPS: [&str; 6] = ["create", "publish", "clone", "expand", "node-expand", "delete"];

/// Sizes of the workload (the ext4 image minimum is 8 MiB).
const CREATED: u64 = 8 * MIB;
const CLONED: u64 = 12 * MIB;
const EXPANDED: u64 = 16 * MIB;
/// Grown by NodeExpandVolume in `--expansion=node` mode (limit raised and filesystem grown).
const NODE_EXPANDED: u64 = 20 * MIB;

/// NodeExpandVolume in `--expansion=node` mode of volume `id` published at `target`.
fn node_expand_image(pool: &hpp_csi::pool::Pool, id: &str, target: &std::path::Path) -> u64 {
    let health = pool.health(&hpp_csi::mountinfo::MountTable::read().unwrap());
    let range = hpp_csi::ops::sizing::Range {
        required: NODE_EXPANDED,
        limit: 0,
    };
    let ledger = hpp_csi::ops::ledger::Ledger::default();
    hpp_csi::ops::expand::node_expand(pool, id, target, range, Some((&ledger, &health))).unwrap()
}

/// Whether this process may grow a mounted ext4 (CAP_SYS_RESOURCE, which the ext4 resize
/// ioctl needs: containers often drop it).
fn can_grow_ext4_online() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

/// Size of the ext4 filesystem inside image volume `id` (from its superblock).
fn filesystem_bytes(pool: &hpp_csi::pool::Pool, id: &str) -> u64 {
    let out = std::process::Command::new("dumpe2fs")
        .arg("-h")
        .arg(pool.path.join(id).join("disk.img"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim_start_matches(':').trim().parse().ok())
            .unwrap_or_else(|| panic!("dumpe2fs of {id} has no {name}: {text}"))
    };
    field("Block count") * field("Block size")
}

/// Not a test on its own: when the crash test runs this binary with [`CRASH_CHILD`] set (in a
/// mount namespace of its own, like a pod's mounts that go away with it), it creates,
/// publishes, clones, expands and deletes image volumes forever, writing each step to a
/// journal before taking it, until it is killed.
#[test]
fn image_crash_child() {
    let Ok(root) = std::env::var(CRASH_CHILD) else {
        return;
    };
    let round = std::env::var(CRASH_ROUND).unwrap();
    let node_mode = std::env::var_os(CRASH_NODE_EXPAND).is_some_and(|v| v == "1");
    let root = std::path::PathBuf::from(root);
    let pool = image_pool(&root);
    let target = root.join(format!("target-{round}"));
    std::fs::create_dir_all(&target).unwrap();
    let mut journal = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join(format!("journal-{round}")))
        .unwrap();
    let mut step = |line: String| writeln!(journal, "{line}").unwrap();
    crash_child::mark_started(&root);
    for i in 0u64.. {
        let (vol, clone) = (format!("r{round}-vol-{i}"), format!("r{round}-clone-{i}"));
        step(format!("create {vol}"));
        hpp_csi::ops::volumes::create(&pool, &vol, None, sized(CREATED)).unwrap();
        step(format!("publish {vol}"));
        let fd = hpp_csi::ops::volumes::open(&pool, &vol).unwrap();
        pool.quota
            .mount_at(
                std::os::fd::AsFd::as_fd(&fd),
                &target,
                rustix::mount::MountFlags::empty(),
            )
            .unwrap();
        std::fs::write(target.join("data"), i.to_string()).unwrap();
        rustix::mount::unmount(&target, rustix::mount::UnmountFlags::empty()).unwrap();
        step(format!("clone {clone} {vol}"));
        hpp_csi::ops::volumes::create(&pool, &clone, Some(&fd), sized(CLONED)).unwrap();
        drop(fd);
        step(format!("expand {vol}"));
        expand_image(&pool, &vol, EXPANDED);
        if !node_mode {
            step(format!("delete {vol}"));
            delete_image(&pool, &vol);
            step(format!("delete {clone}"));
            delete_image(&pool, &clone);
            continue;
        }
        step(format!("node-expand {vol}"));
        let fd = hpp_csi::ops::volumes::open(&pool, &vol).unwrap();
        pool.quota
            .mount_at(
                std::os::fd::AsFd::as_fd(&fd),
                &target,
                rustix::mount::MountFlags::empty(),
            )
            .unwrap();
        drop(fd);
        node_expand_image(&pool, &vol, &target);
        rustix::mount::unmount(&target, rustix::mount::UnmountFlags::empty()).unwrap();
        step(format!("delete {vol}"));
        delete_image(&pool, &vol);
        step(format!("delete {clone}"));
        delete_image(&pool, &clone);
    }
}

/// kill -9 of a driver working on image volumes, at many different moments. After each kill,
/// the driver's start-up sweep leaves no temporary, no loop device stays attached to an image
/// of the pool, and the CO's retry of the interrupted call succeeds with the volume in the
/// state the call asks for; at the end every volume is a complete, fsck-clean image of its
/// recorded size, and deleting them all leaves the pool empty.
#[test]
fn killing_the_driver_working_on_image_volumes_converges() {
    let Some(fs) = loopfs::LoopFs::new("ext4", 1024, "") else {
        return;
    };
    if std::process::Command::new("unshare").arg("--version").output().is_err() {
        eprintln!("skipped: unshare (util-linux) is not installed");
        return;
    }
    let root = fs.path().to_path_buf();
    let pool = image_pool(&root);
    let exe = std::env::current_exe().unwrap();
    let mut interrupted = std::collections::BTreeMap::<String, usize>::new();
    let node_mode = can_grow_ext4_online();
    let steps: Vec<&str> = match node_mode {
        true => STEPS.to_vec(),
        false => {
            eprintln!("skipped the node-expand step: growing a mounted ext4 needs CAP_SYS_RESOURCE");
            STEPS.into_iter().filter(|s| *s != "node-expand").collect()
        }
    };
    for round in 0..4 * steps.len() as u64 {
        let mut child = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private"])
            .arg(&exe)
            .args(["--exact", "image_crash_child", "--nocapture", "--test-threads=1"])
            .env(CRASH_CHILD, &root)
            .env(CRASH_ROUND, round.to_string())
            .env(CRASH_NODE_EXPAND, if node_mode { "1" } else { "" })
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(root.join(format!("child-{round}.log"))).unwrap())
            .spawn()
            .unwrap();
        assert!(
            crash_child::wait_started(&mut child, &root),
            "round {round}: the child never started"
        );
        // Each round aims at one kind of step, a little later into it every time it comes round.
        let aim = steps[round as usize % steps.len()];
        let journal = root.join(format!("journal-{round}"));
        loop {
            let log = std::fs::read_to_string(&journal).unwrap_or_default();
            if log.lines().last().is_some_and(|l| l.starts_with(aim)) {
                break;
            }
            assert!(child.try_wait().unwrap().is_none(), "round {round}: the child died");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::thread::sleep(std::time::Duration::from_millis(round / steps.len() as u64 * 7));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        // Killed at work, not dead of a failure of its own.
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "round {round}: the child ended with {status}: {}",
            std::fs::read_to_string(root.join(format!("child-{round}.log"))).unwrap()
        );
        std::fs::remove_file(crash_child::started_marker(&root, &child)).unwrap();

        // What the driver does when it starts again: a fresh pool, swept, its journal replayed.
        let pool = image_pool(&root);
        assert_eq!(leaked_loops(&pool.path), Vec::<String>::new(), "round {round}");
        let dir = pool.open().unwrap();
        hpp_csi::ops::volumes::sweep(std::os::fd::AsFd::as_fd(&dir), &*pool.quota).unwrap();
        pool.journal().unwrap();
        let temporaries: Vec<String> = std::fs::read_dir(&pool.path)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".hpp-") && n != hpp_csi::ops::volume_journal::JOURNAL_NAME)
            .collect();
        assert_eq!(temporaries, Vec::<String>::new(), "round {round}");

        // The CO retries the call the kill interrupted.
        let journal = std::fs::read_to_string(root.join(format!("journal-{round}"))).unwrap();
        let last = journal.lines().last().unwrap().to_owned();
        let words: Vec<&str> = last.split(' ').collect();
        *interrupted.entry(words[0].to_owned()).or_default() += 1;
        match words[..] {
            ["create", vol] => {
                hpp_csi::ops::volumes::create(&pool, vol, None, sized(CREATED)).unwrap();
                assert_complete_image(&pool, vol, CREATED);
            }
            // The pod's mount went with its namespace: nothing to retry.
            ["publish", vol] => assert_complete_image(&pool, vol, CREATED),
            ["clone", clone, vol] => {
                let fd = hpp_csi::ops::volumes::open(&pool, vol).unwrap();
                hpp_csi::ops::volumes::create(&pool, clone, Some(&fd), sized(CLONED)).unwrap();
                assert_complete_image(&pool, clone, CLONED);
            }
            ["expand", vol] => {
                assert_eq!(expand_image(&pool, vol, EXPANDED).capacity, EXPANDED);
                assert_complete_image(&pool, vol, EXPANDED);
            }
            // The CO publishes the volume again and retries.
            ["node-expand", vol] => {
                let target = root.join("retry-target");
                std::fs::create_dir_all(&target).unwrap();
                let fd = hpp_csi::ops::volumes::open(&pool, vol).unwrap();
                pool.quota
                    .mount_at(
                        std::os::fd::AsFd::as_fd(&fd),
                        &target,
                        rustix::mount::MountFlags::empty(),
                    )
                    .unwrap();
                let grown = node_expand_image(&pool, vol, &target);
                rustix::mount::unmount(&target, rustix::mount::UnmountFlags::empty()).unwrap();
                assert_eq!(grown, NODE_EXPANDED);
                assert_eq!(leaked_loops(&pool.path), Vec::<String>::new(), "round {round}");
                assert_complete_image(&pool, vol, NODE_EXPANDED);
                assert_eq!(filesystem_bytes(&pool, vol), NODE_EXPANDED, "{vol}: filesystem grown");
            }
            ["delete", vol] => {
                delete_image(&pool, vol);
                assert!(!pool.path.join(vol).exists(), "{vol} is gone");
            }
            _ => panic!("unexpected journal line {last:?}"),
        }
    }
    eprintln!("kills interrupted: {interrupted:?}");

    // Every volume left is complete, of the size its last finished step gave it.
    let volumes = pool.list_volumes().unwrap();
    for id in &volumes {
        let round = id.split('-').next().unwrap().trim_start_matches('r');
        let journal = std::fs::read_to_string(root.join(format!("journal-{round}"))).unwrap();
        let did = |step: &str| journal.lines().any(|l| l == format!("{step} {id}"));
        let want = match (id.contains("-clone-"), did("expand"), did("node-expand")) {
            (true, _, _) => CLONED,
            (false, _, true) => NODE_EXPANDED,
            (false, true, false) => EXPANDED,
            (false, false, false) => CREATED,
        };
        assert_complete_image(&pool, id, want);
        if did("node-expand") {
            assert_eq!(filesystem_bytes(&pool, id), NODE_EXPANDED, "{id}: filesystem grown");
        }
    }
    for id in &volumes {
        assert!(delete_image(&pool, id), "{id}");
    }
    let left: Vec<String> = std::fs::read_dir(&pool.path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != hpp_csi::ops::volume_journal::JOURNAL_NAME)
        .collect();
    assert_eq!(left, Vec::<String>::new(), "the pool is empty but for the journal");
    assert_eq!(leaked_loops(&pool.path), Vec::<String>::new());
}

/// A publish target on a filesystem that itself sits on a loop device (a loop-mounted kubelet
/// directory; here the test's pool) is not taken for an already mounted image: publish mounts
/// the image there, and growing an unmounted target is refused rather than resizing the
/// filesystem the target lives on.
#[test]
fn a_target_on_a_loop_backed_filesystem_is_not_taken_for_a_mounted_image() {
    let Some(fs) = loopfs::LoopFs::new("ext4", 64, "") else {
        return;
    };
    let root = fs.path().to_path_buf();
    let pool = image_pool(&root);
    hpp_csi::ops::volumes::create(&pool, "pvc-t", None, sized(CREATED)).unwrap();
    let target = root.join("target");
    std::fs::create_dir(&target).unwrap();
    let host_size = rustix::fs::statvfs(&root).unwrap().f_blocks;
    let err = pool.quota.expand_mounted(&target).unwrap_err();
    assert!(
        matches!(err, hpp_fs::quota::QuotaError::Unsupported(ref m) if m.contains("not a loop-mounted image")),
        "{err}"
    );
    assert_eq!(rustix::fs::statvfs(&root).unwrap().f_blocks, host_size);
    let fd = hpp_csi::ops::volumes::open(&pool, "pvc-t").unwrap();
    let mounted = pool.quota.mount_at(
        std::os::fd::AsFd::as_fd(&fd),
        &target,
        rustix::mount::MountFlags::empty(),
    );
    let st = rustix::fs::statvfs(&target).unwrap();
    rustix::mount::unmount(&target, rustix::mount::UnmountFlags::DETACH).ok();
    assert!(mounted.unwrap());
    assert!(
        st.f_blocks * st.f_frsize <= CREATED,
        "the image is mounted at the target"
    );
}

/// The one moment of an expansion a kill can split: the image grown, its new size not yet
/// recorded. The retry records it; the image is not grown twice.
#[test]
fn an_image_expansion_killed_before_recording_the_size_converges_on_retry() {
    let Some(fs) = loopfs::LoopFs::new("ext4", 64, "") else {
        return;
    };
    let pool = image_pool(fs.path());
    hpp_csi::ops::volumes::create(&pool, "pvc-x", None, sized(CREATED)).unwrap();
    let dir = pool.open().unwrap();
    pool.quota
        .set_limit(std::os::fd::AsFd::as_fd(&dir), "pvc-x", EXPANDED)
        .unwrap();
    assert_eq!(
        hpp_csi::ops::volumes::recorded_capacity(std::os::fd::AsFd::as_fd(&dir), "pvc-x").unwrap(),
        Some(CREATED)
    );
    assert_eq!(expand_image(&pool, "pvc-x", EXPANDED).capacity, EXPANDED);
    assert_complete_image(&pool, "pvc-x", EXPANDED);
}

/// Set to the image a [`child_attaches_a_loop_device_and_hangs`] attaches.
const ATTACH_CHILD: &str = "HPP_TEST_IMAGE_ATTACH_CHILD";

/// Not a test on its own: with [`ATTACH_CHILD`] set, attaches the image as publish does and
/// stops for good before mounting it.
#[test]
fn child_attaches_a_loop_device_and_hangs() {
    let Ok(image) = std::env::var(ATTACH_CHILD) else {
        return;
    };
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&image).unwrap();
    let dev = hpp_sys::loopdev::attach(std::os::fd::AsFd::as_fd(&file), false).unwrap();
    std::fs::write(format!("{image}.attached"), dev.path().to_string_lossy().as_bytes()).unwrap();
    loop {
        std::thread::park();
    }
}

/// kill -9 between attaching an image's loop device and mounting it (the one moment of a
/// publish that holds a device no mount owns): the device is attached with autoclear, so it
/// goes with the killed process's descriptor.
#[test]
fn a_publish_killed_before_mounting_leaves_no_loop_device() {
    let Some(fs) = loopfs::LoopFs::new("ext4", 64, "") else {
        return;
    };
    let pool = image_pool(fs.path());
    hpp_csi::ops::volumes::create(&pool, "pvc-l", None, sized(CREATED)).unwrap();
    let image = pool.path.join("pvc-l/disk.img");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_attaches_a_loop_device_and_hangs", "--nocapture"])
        .env(ATTACH_CHILD, &image)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let marker = pool.path.join("pvc-l/disk.img.attached");
    while !marker.exists() {
        assert!(child.try_wait().unwrap().is_none(), "the child died before attaching");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(loops_backed_under(&pool.path).len(), 1, "the child holds a loop device");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(leaked_loops(&pool.path), Vec::<String>::new());
    std::fs::remove_file(&marker).unwrap();
    assert!(delete_image(&pool, "pvc-l"));
}

/// Loop devices whose backing file is exactly `image`.
fn loops_backing(image: &std::path::Path) -> usize {
    let image = image.to_string_lossy().into_owned();
    std::fs::read_dir("/sys/block")
        .unwrap()
        .filter(|e| {
            let dev = e.as_ref().unwrap().file_name().to_string_lossy().into_owned();
            std::fs::read_to_string(format!("/sys/block/{dev}/loop/backing_file"))
                .is_ok_and(|b| b.trim_end_matches('\n') == image)
        })
        .count()
}

/// Publishes `id` at `target`, retrying while another publish of the volume holds it
/// (ABORTED: the CO retries).
async fn publish_retrying(
    node: &mut hpp_csi::csi::node_client::NodeClient<tonic::transport::Channel>,
    id: &str,
    target: &std::path::Path,
) {
    for _ in 0..1000 {
        match node.node_publish_volume(publish_req(id, target, false)).await {
            Ok(_) => return,
            Err(s) if s.code() == Code::Aborted => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
            Err(s) => panic!("publishing {id} at {}: {s}", target.display()),
        }
    }
    panic!("publishing {id} at {} stays aborted", target.display());
}

/// Two targets of one image volume share one loop device and one filesystem (two ext4 mounts of
/// one image corrupt it): the second publish binds the first's mount, sequentially or
/// concurrently; unpublishing one target leaves the other working, the last one frees the device.
#[tokio::test]
async fn an_image_volume_published_at_two_targets_is_mounted_once() {
    if !image_tools() {
        return;
    }
    let mut h = Harness::with(|root, b| b.pool(legacy_pool(root).quota(QuotaMode::Image, 100))).await;
    for id in ["pvc-two", "pvc-race"] {
        let mut req = create_req(id);
        req.capacity_range = Some(hpp_csi::csi::CapacityRange {
            required_bytes: 16 * MIB as i64,
            limit_bytes: 0,
        });
        h.controller.create_volume(req).await.unwrap();
    }
    let (t1, t2, t3, t4) = (h.target("t1"), h.target("t2"), h.target("t3"), h.target("t4"));
    struct Cleanup(Vec<std::path::PathBuf>);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            for t in &self.0 {
                while rustix::mount::unmount(t, rustix::mount::UnmountFlags::DETACH).is_ok() {}
            }
        }
    }
    let _cleanup = Cleanup(vec![t1.clone(), t2.clone(), t3.clone(), t4.clone()]);
    let image = h.pool_path().join("pvc-two/disk.img");

    h.publish("pvc-two", &t1, false).await.unwrap();
    h.publish("pvc-two", &t2, false).await.unwrap();
    // A retry at either target changes nothing.
    h.publish("pvc-two", &t2, false).await.unwrap();
    h.publish("pvc-two", &t1, false).await.unwrap();
    assert_eq!(loops_backing(&image), 1, "one loop device for the image");
    std::fs::write(t1.join("f"), b"through t1").unwrap();
    assert_eq!(std::fs::read(t2.join("f")).unwrap(), b"through t1");
    // Both are mounts of the same filesystem, each with the driver's restrictions.
    let table = hpp_csi::mountinfo::MountTable::read().unwrap();
    let (m1, m2) = (table.mount_at(&t1).unwrap(), table.mount_at(&t2).unwrap());
    assert_eq!((m1.dev, &m1.root), (m2.dev, &m2.root));
    assert!(m2.options.iter().any(|o| o == "nosuid") && m2.options.iter().any(|o| o == "nodev"));

    // A read-only publish of the same volume is a read-only bind of it.
    let ro = h.target("ro");
    h.publish("pvc-two", &ro, true).await.unwrap();
    assert_eq!(loops_backing(&image), 1);
    let err = std::fs::write(ro.join("g"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(30), "EROFS");
    assert_eq!(std::fs::read(ro.join("f")).unwrap(), b"through t1");
    h.unpublish("pvc-two", &ro).await.unwrap();

    h.unpublish("pvc-two", &t1).await.unwrap();
    assert!(!t1.exists());
    assert_eq!(loops_backing(&image), 1, "t2 still holds the device");
    std::fs::write(t2.join("after"), b"still here").unwrap();
    assert_eq!(std::fs::read(t2.join("f")).unwrap(), b"through t1");
    h.unpublish("pvc-two", &t2).await.unwrap();
    assert!(!t2.exists());
    let mut gone = false;
    for _ in 0..500 {
        gone = loops_backing(&image) == 0;
        if gone {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(gone, "the last unpublish frees the loop device (autoclear)");

    // Two publishes of one volume at once cannot both attach it.
    let (mut n3, mut n4) = (h.node.clone(), h.node.clone());
    tokio::join!(
        publish_retrying(&mut n3, "pvc-race", &t3),
        publish_retrying(&mut n4, "pvc-race", &t4)
    );
    assert_eq!(loops_backing(&h.pool_path().join("pvc-race/disk.img")), 1);
    std::fs::write(t3.join("f"), b"three").unwrap();
    assert_eq!(std::fs::read(t4.join("f")).unwrap(), b"three");
    h.unpublish("pvc-race", &t3).await.unwrap();
    h.unpublish("pvc-race", &t4).await.unwrap();

    // Published read-only first, the image is attached read-only: a writable publish elsewhere
    // is refused (it cannot be writable), another read-only one binds it.
    h.publish("pvc-race", &t3, true).await.unwrap();
    assert_eq!(code(h.publish("pvc-race", &t4, false).await), Code::FailedPrecondition);
    h.publish("pvc-race", &t4, true).await.unwrap();
    assert_eq!(loops_backing(&h.pool_path().join("pvc-race/disk.img")), 1);
    assert_eq!(std::fs::read(t4.join("f")).unwrap(), b"three");
    h.unpublish("pvc-race", &t3).await.unwrap();
    h.unpublish("pvc-race", &t4).await.unwrap();
    h.stop().await;
}

/// Issue 29's `image` findings through the driver: stats of a published volume are what `df`
/// shows inside it; a clone on a filesystem without reflinks costs what its source holds, not
/// its size; a NodeExpandVolume whose online growth fails records nothing (the size and the
/// charge stay what the filesystem holds) and a retry that can grow records it.
#[tokio::test]
async fn image_stats_are_dfs_clones_stay_sparse_and_failed_growth_records_nothing() {
    if !image_tools() {
        return;
    }
    let mut h = Harness::with(|root, b| {
        b.pool(legacy_pool(root).quota(QuotaMode::Image, 100))
            .expansion(hpp_csi::ExpansionMode::Node)
    })
    .await;
    h.controller
        .create_volume(sized_req("src", 64 * MIB as i64, 0))
        .await
        .unwrap();
    let target = h.target("src");
    h.publish("src", &target, false).await.unwrap();
    let mut f = std::fs::File::create(target.join("ten")).unwrap();
    for _ in 0..10 {
        f.write_all(&vec![3u8; MIB as usize]).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);

    let stats = h
        .node
        .node_get_volume_stats(hpp_csi::csi::NodeGetVolumeStatsRequest {
            volume_id: "src".into(),
            volume_path: target.to_string_lossy().into_owned(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let bytes = &stats.usage[0];
    let df = rustix::fs::statvfs(&target).unwrap();
    assert_eq!(bytes.total as u64, df.f_blocks * df.f_frsize, "{stats:?}");
    assert_eq!(bytes.available as u64, df.f_bavail * df.f_frsize, "{stats:?}");
    assert!(
        bytes.used as u64 >= 10 * MIB && (bytes.used as u64) < 20 * MIB,
        "{stats:?}"
    );
    assert!(bytes.available > 0, "not the image's allocated blocks: {stats:?}");

    h.unpublish("src", &target).await.unwrap();
    let mut clone = sized_req("copy", 64 * MIB as i64, 0);
    clone.volume_content_source = Some(hpp_csi::csi::VolumeContentSource {
        r#type: Some(hpp_csi::csi::volume_content_source::Type::Volume(
            hpp_csi::csi::volume_content_source::VolumeSource {
                volume_id: "src".into(),
            },
        )),
    });
    h.controller.create_volume(clone).await.unwrap();
    let allocated = |id: &str| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(h.pool_path().join(id).join("disk.img"))
            .unwrap()
            .blocks()
            * 512
    };
    assert!(
        allocated("copy") < 32 * MIB,
        "a clone of 10 MiB in a 64 MiB image costs {} bytes",
        allocated("copy")
    );

    // Growing online needs CAP_SYS_RESOURCE; without it the growth fails and records nothing.
    h.publish("src", &target, false).await.unwrap();
    let grown = h
        .node
        .node_expand_volume(hpp_csi::csi::NodeExpandVolumeRequest {
            volume_id: "src".into(),
            volume_path: target.to_string_lossy().into_owned(),
            capacity_range: Some(hpp_csi::csi::CapacityRange {
                required_bytes: 128 * MIB as i64,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await;
    let recorded = || {
        let mut buf = [0u8; 32];
        let dir = std::fs::File::open(h.pool_path().join("src")).unwrap();
        let n = rustix::fs::fgetxattr(&dir, "trusted.hpp.capacity", &mut buf).unwrap();
        std::str::from_utf8(&buf[..n]).unwrap().parse::<u64>().unwrap()
    };
    match grown {
        Ok(r) => {
            assert!(can_grow_ext4_online());
            assert_eq!(r.into_inner().capacity_bytes as u64, 128 * MIB);
            assert_eq!(recorded(), 128 * MIB);
        }
        Err(e) => {
            assert!(!can_grow_ext4_online(), "{e:?}");
            assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
            assert_eq!(recorded(), 64 * MIB, "recorded ahead of the filesystem");
        }
    }
    h.unpublish("src", &target).await.unwrap();
    h.stop().await;
}
