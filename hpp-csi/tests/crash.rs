//! kill -9 in the middle of an expansion: a child process runs the controller's expansion step
//! against a backend that keeps its limits in files (so they outlive the process) and stops
//! for good right after raising the limit; the parent kills it, then retries in-process and
//! checks that limit and record converge.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use hpp_csi::PoolConfig;
use hpp_csi::mountinfo::MountTable;
use hpp_csi::ops::ledger::Ledger;
use hpp_csi::ops::sizing::Range;
use hpp_csi::ops::{expand, volumes};
use hpp_csi::pool::Pool;
use hpp_fs::quota::{QuotaBackend, QuotaError, QuotaUsage, Unlimited};

const G: u64 = 4096;
const CHILD_ENV: &str = "HPP_CRASH_CHILD_ROOT";

/// Limits as files in `<root>/limits`, outside the pool.
#[derive(Debug)]
struct FileQuota {
    limits: PathBuf,
    /// Stop forever after raising a limit (the child).
    hang_after_set_limit: bool,
}

impl FileQuota {
    fn limit(&self, name: &str) -> Option<u64> {
        std::fs::read_to_string(self.limits.join(name)).ok()?.parse().ok()
    }
}

impl QuotaBackend for FileQuota {
    fn name(&self) -> &'static str {
        "file"
    }

    fn granularity(&self) -> u64 {
        G
    }

    fn create(&self, pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<OwnedFd, QuotaError> {
        let fd = Unlimited.create(pool, name, limit_bytes)?;
        self.set_limit(pool, name, limit_bytes)?;
        Ok(fd)
    }

    fn set_limit(&self, _pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<(), QuotaError> {
        // Like an image: it grows, never shrinks.
        if self.limit(name).is_some_and(|have| have > limit_bytes) {
            return Err(QuotaError::OutOfRange(format!("{name} cannot shrink to {limit_bytes}")));
        }
        std::fs::create_dir_all(&self.limits).unwrap();
        let f = self.limits.join(name);
        std::fs::write(&f, limit_bytes.to_string()).unwrap();
        std::fs::File::open(&f).unwrap().sync_all().unwrap();
        if self.hang_after_set_limit {
            std::fs::write(self.limits.join("../child-raised-limit"), b"").unwrap();
            loop {
                std::thread::park();
            }
        }
        Ok(())
    }

    fn usage(&self, _pool: BorrowedFd<'_>, name: &str) -> Result<Option<QuotaUsage>, QuotaError> {
        Ok(self.limit(name).map(|limit_bytes| QuotaUsage {
            used_bytes: 0,
            limit_bytes,
            used_inodes: None,
            limit_inodes: None,
        }))
    }

    fn release(&self, _pool: BorrowedFd<'_>, _name: &str) -> Result<(), QuotaError> {
        Ok(())
    }
}

fn pool(root: &Path, hang: bool) -> (Pool, Arc<FileQuota>) {
    let mut pool = Pool::prepare(&PoolConfig::new("legacy", root.join("pool"))).unwrap();
    let q = Arc::new(FileQuota {
        limits: root.join("limits"),
        hang_after_set_limit: hang,
    });
    pool.quota = q.clone();
    (pool, q)
}

fn recorded(root: &Path, id: &str) -> Option<u64> {
    let dir = std::fs::File::open(root.join("pool")).unwrap();
    volumes::recorded_capacity(std::os::fd::AsFd::as_fd(&dir), id).unwrap()
}

fn expand_to(pool: &Pool, bytes: u64) -> expand::Expanded {
    let health = pool.health(&MountTable::read().unwrap());
    let range = Range {
        required: bytes,
        limit: 0,
    };
    expand::controller_expand(&Ledger::default(), pool, &health, "pvc-a", range).unwrap()
}

/// The child's half; does nothing unless started by the parent test.
#[test]
fn child_expands_and_hangs_after_raising_the_limit() {
    let Ok(root) = std::env::var(CHILD_ENV) else { return };
    let (pool, _) = pool(Path::new(&root), true);
    expand_to(&pool, 3 * G);
    panic!("the child must never get past raising the limit");
}

#[test]
fn kill_9_between_raising_the_limit_and_recording_it_converges() {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let (parent_pool, q) = pool(&root, false);
    volumes::create(
        &parent_pool,
        "pvc-a",
        None,
        volumes::Requested { required: G, limit: 0 },
    )
    .unwrap();
    q.set_limit(std::os::fd::AsFd::as_fd(&parent_pool.open().unwrap()), "pvc-a", G)
        .unwrap();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_expands_and_hangs_after_raising_the_limit",
            "--nocapture",
        ])
        .env(CHILD_ENV, &root)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let marker = root.join("child-raised-limit");
    while !marker.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("child exited before raising the limit: {status}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    // Killed between the two steps: limit raised, record still the old size.
    assert_eq!(q.limit("pvc-a"), Some(3 * G));
    assert_eq!(recorded(&root, "pvc-a"), Some(G));
    // The CO's retry converges.
    let done = expand_to(&parent_pool, 3 * G);
    assert_eq!(done.capacity, 3 * G);
    assert_eq!(q.limit("pvc-a"), Some(3 * G));
    assert_eq!(recorded(&root, "pvc-a"), Some(3 * G));

    // Killed the same way on the way to 5 G, then retried with less (Kubernetes lets a user
    // lower a failed expansion): the volume keeps the 5 G it has, it cannot shrink.
    q.set_limit(std::os::fd::AsFd::as_fd(&parent_pool.open().unwrap()), "pvc-a", 5 * G)
        .unwrap();
    let lowered = expand_to(&parent_pool, 4 * G);
    assert_eq!(lowered.capacity, 5 * G);
    assert_eq!(recorded(&root, "pvc-a"), Some(5 * G));
}

/// Removes like the plain backend, except that one entry cannot be removed (EROFS, say).
#[derive(Debug)]
struct StuckEntry(&'static str);

impl QuotaBackend for StuckEntry {
    fn name(&self) -> &'static str {
        "stuck"
    }

    fn granularity(&self) -> u64 {
        1
    }

    fn create(&self, pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<OwnedFd, QuotaError> {
        Unlimited.create(pool, name, limit_bytes)
    }

    fn set_limit(&self, _pool: BorrowedFd<'_>, _name: &str, _limit_bytes: u64) -> Result<(), QuotaError> {
        Ok(())
    }

    fn usage(&self, _pool: BorrowedFd<'_>, _name: &str) -> Result<Option<QuotaUsage>, QuotaError> {
        Ok(None)
    }

    fn release(&self, _pool: BorrowedFd<'_>, _name: &str) -> Result<(), QuotaError> {
        Ok(())
    }

    fn remove(&self, pool: BorrowedFd<'_>, name: &str) -> Result<(), QuotaError> {
        if name == self.0 {
            return Err(QuotaError::Unsupported(format!("{name} cannot be removed")));
        }
        Unlimited.remove(pool, name)
    }
}

/// After a crash, one leftover that cannot be removed must not keep every later one for ever:
/// the start-up sweep passes over it and removes the others.
#[test]
fn the_sweep_passes_over_an_entry_it_cannot_remove() {
    let root = tempfile::tempdir().unwrap();
    let pool = root.path().join("pool");
    let names = [
        ".hpp-tmp-a-00000001",
        ".hpp-tmp-stuck-00000002",
        ".hpp-del-b",
        ".hpp-tmp-c-00000003",
    ];
    for name in names {
        std::fs::create_dir_all(pool.join(name).join("inner")).unwrap();
    }
    std::fs::create_dir_all(pool.join("pvc-kept")).unwrap();
    let dir = std::fs::File::open(&pool).unwrap();
    let backend = StuckEntry(".hpp-tmp-stuck-00000002");
    let swept = volumes::sweep(std::os::fd::AsFd::as_fd(&dir), &backend).unwrap();
    assert_eq!(swept, 3);
    let mut left: Vec<_> = std::fs::read_dir(&pool)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, [".hpp-tmp-stuck-00000002", "pvc-kept"]);
}

/// A second driver started on the socket of a live one (a restart racing the old process, a
/// surge rollout) must not sweep the live driver's in-flight temporaries.
#[test]
fn a_second_driver_on_a_live_socket_touches_no_pool() {
    let root = tempfile::tempdir().unwrap();
    let socket = root.path().join("csi.sock");
    let _live = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let in_flight = root.path().join("pool/.hpp-tmp-pvc-1-12345678");
    std::fs::create_dir_all(&in_flight).unwrap();
    let err = hpp_csi::DriverBuilder::default()
        .node_id("node-a")
        .pool(PoolConfig::new("legacy", root.path().join("pool")))
        .endpoint(hpp_csi::Endpoint::Unix(socket.clone()))
        .build()
        .map(|_| ())
        .expect_err("a live socket is refused");
    assert!(
        matches!(err, hpp_csi::ConfigError::EndpointInUse(ref p) if *p == socket),
        "{err}"
    );
    assert!(in_flight.is_dir(), "the live driver's temporary was swept");
}
