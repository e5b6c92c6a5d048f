//! The volume journal after a crash: what a power cut took back (a volume directory that was
//! never written, a deletion's rename that never reached the disk) comes back when the driver
//! starts again (a fresh `Pool`, as `Driver::build` makes one), and only what the journal says.
//! The loss is made by hand, since a test cannot cut the power: the directory is removed, or
//! put back, behind the first pool's back.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::fd::AsFd;

use hpp_csi::PoolConfig;
use hpp_csi::pool::Pool;
use hpp_csi::volume_journal::{JOURNAL_NAME, Record};
use hpp_csi::volumes::{self, Requested};
use hpp_fs::MountTableCache;
use hpp_fs::journal::Journal;

const SIZE: Requested = Requested {
    required: 1 << 20,
    limit: 0,
};

fn pool(root: &std::path::Path) -> Pool {
    Pool::prepare(&PoolConfig::new("p", root.join("pool"))).unwrap()
}

/// What the journal holds now (read as a start would, without redoing or checkpointing).
fn records(pool: &Pool) -> Vec<Record> {
    let dir = pool.open().unwrap();
    let (_, records) = Journal::open(dir.as_fd(), JOURNAL_NAME, 1 << 20).unwrap();
    records.iter().map(|r| serde_json::from_slice(r).unwrap()).collect()
}

#[test]
fn a_created_volume_a_crash_lost_comes_back_with_its_capacity() {
    let t = tempfile::tempdir().unwrap();
    let first = pool(t.path());
    volumes::create(&first, "pvc-a", None, SIZE).unwrap();
    assert_eq!(
        records(&first),
        vec![Record::Create {
            id: "pvc-a".into(),
            required: SIZE.required,
            limit: 0,
            tuning: Default::default()
        }]
    );
    drop(first);
    std::fs::remove_dir(t.path().join("pool/pvc-a")).unwrap();

    let again = pool(t.path());
    again.journal().unwrap();
    assert!(volumes::exists(&again, "pvc-a").unwrap());
    let dir = again.open().unwrap();
    assert_eq!(
        volumes::recorded_capacity(dir.as_fd(), "pvc-a").unwrap(),
        Some(SIZE.required)
    );
    // The start checkpointed: nothing is redone twice.
    assert!(records(&again).is_empty());
}

#[test]
fn a_deleted_volume_a_crash_brought_back_is_deleted_again() {
    let t = tempfile::tempdir().unwrap();
    let first = pool(t.path());
    volumes::create(&first, "pvc-b", None, SIZE).unwrap();
    assert!(volumes::delete(&first, "pvc-b", &MountTableCache::default()).unwrap());
    drop(first);
    // The rename away never reached the disk: the volume is back, with what the tenant wrote.
    std::fs::create_dir(t.path().join("pool/pvc-b")).unwrap();
    std::fs::write(t.path().join("pool/pvc-b/data"), b"tenant").unwrap();

    let again = pool(t.path());
    again.journal().unwrap();
    assert!(!volumes::exists(&again, "pvc-b").unwrap());
    let left: Vec<_> = std::fs::read_dir(t.path().join("pool"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, [JOURNAL_NAME]);
}

#[test]
fn the_last_record_of_a_volume_decides_and_untouched_volumes_stay() {
    let t = tempfile::tempdir().unwrap();
    let first = pool(t.path());
    let mounts = MountTableCache::default();
    volumes::create(&first, "pvc-c", None, SIZE).unwrap();
    volumes::delete(&first, "pvc-c", &mounts).unwrap();
    volumes::create(&first, "pvc-c", None, SIZE).unwrap();
    volumes::create(&first, "pvc-d", None, SIZE).unwrap();
    volumes::delete(&first, "pvc-d", &mounts).unwrap();
    // Made by hand (a KubeVirt volume, say): never journaled, never touched.
    std::fs::create_dir(t.path().join("pool/pvc-kubevirt")).unwrap();
    drop(first);
    std::fs::remove_dir(t.path().join("pool/pvc-c")).unwrap();

    let again = pool(t.path());
    again.journal().unwrap();
    let mut have = again.list_volumes().unwrap();
    have.sort();
    assert_eq!(have, ["pvc-c", "pvc-kubevirt"]);
}

#[test]
fn a_clone_is_synced_with_the_pool_directory_not_journaled() {
    let t = tempfile::tempdir().unwrap();
    let first = pool(t.path());
    volumes::create(&first, "pvc-src", None, SIZE).unwrap();
    std::fs::write(t.path().join("pool/pvc-src/data"), b"payload").unwrap();
    let src = volumes::open(&first, "pvc-src").unwrap();
    volumes::create(&first, "pvc-clone", Some(&src), SIZE).unwrap();
    // A record could bring back only an empty directory, never the copied data.
    let ids: Vec<String> = records(&first)
        .into_iter()
        .map(|r| match r {
            Record::Create { id, .. } | Record::Delete { id } => id,
        })
        .collect();
    assert_eq!(ids, ["pvc-src"]);
}

#[test]
fn a_shared_pool_has_no_journal() {
    let t = tempfile::tempdir().unwrap();
    let shared = Pool::prepare(&PoolConfig::new("s", t.path().join("pool")).shared(true)).unwrap();
    assert!(shared.journal().unwrap().is_none());
    volumes::create(&shared, "pvc-s", None, SIZE).unwrap();
    assert!(!t.path().join("pool").join(JOURNAL_NAME).exists());
}

#[test]
fn a_foreign_file_under_the_journal_name_is_left_alone_and_the_directory_is_synced_instead() {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("pool")).unwrap();
    std::fs::write(t.path().join("pool").join(JOURNAL_NAME), b"not ours").unwrap();
    let p = pool(t.path());
    assert!(p.journal().unwrap().is_none());
    volumes::create(&p, "pvc-f", None, SIZE).unwrap();
    assert_eq!(
        std::fs::read(t.path().join("pool").join(JOURNAL_NAME)).unwrap(),
        b"not ours"
    );
}

/// Another filesystem mounted over the pool after the journal was opened: the next create is
/// Aborted rather than recorded in the hidden journal, and the one after it uses the journal of
/// the filesystem now mounted there.
#[test]
fn a_filesystem_mounted_over_the_pool_gets_its_own_journal() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: mounting needs root");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let p = pool(t.path());
    volumes::create(&p, "pvc-under", None, SIZE).unwrap();
    let over = t.path().join("pool");
    rustix::mount::mount("tmpfs", &over, "tmpfs", rustix::mount::MountFlags::empty(), c"size=16m").unwrap();
    let result = volumes::create(&p, "pvc-over", None, SIZE);
    let retried = volumes::create(&p, "pvc-over", None, SIZE);
    let over_records = records(&p);
    rustix::mount::unmount(&over, rustix::mount::UnmountFlags::DETACH).unwrap();
    assert_eq!(
        result.unwrap_err().code(),
        tonic::Code::Aborted,
        "recorded in a journal the mount hides"
    );
    retried.unwrap();
    assert_eq!(over_records.len(), 1, "{over_records:?}");
    // The journal under the mount kept only its own volume.
    assert_eq!(records(&pool(t.path())).len(), 1);
}
