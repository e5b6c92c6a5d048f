//! The trash: DeleteVolume in a pool with a retention moves the volume into
//! `<pool>/.hpp-trash`, where it stays restorable until a purge removes it by age, by space or
//! by hand; kill -9 while moving and purging converges and never touches anything else.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod crash_child;

use std::collections::{BTreeSet, HashMap};
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use hpp_csi::PoolConfig;
use hpp_csi::admin::TrashClient;
use hpp_csi::admin::proto;
use hpp_csi::ops::trash::{self, Purge, PurgeReason, TRASH_DIR};
use hpp_csi::ops::volume_journal::{JOURNAL_NAME, Record};
use hpp_csi::ops::volumes::{self, Requested};
use hpp_csi::pool::Pool;
use hpp_fs::MountTableCache;
use hpp_fs::journal::Journal;
use tonic::Code;

const HOUR: Duration = Duration::from_secs(3600);

async fn with_trash(retention: Duration) -> (Harness, TrashClient<tonic::transport::Channel>) {
    // No free-space floor: the host's disk may be fuller than 10 % at any time, and the floor
    // has a test of its own.
    let h = Harness::with(move |root, b| b.pool(legacy_pool(root).trash(retention, Some(0)))).await;
    let admin = TrashClient::new(hpp_csi::client::connect(&h.endpoint).await.unwrap());
    (h, admin)
}

fn claim_req(name: &str, ns: &str, claim: &str) -> hpp_csi::csi::CreateVolumeRequest {
    hpp_csi::csi::CreateVolumeRequest {
        parameters: HashMap::from([
            (trash::PARAM_CLAIM_NAMESPACE.to_owned(), ns.to_owned()),
            (trash::PARAM_CLAIM_NAME.to_owned(), claim.to_owned()),
        ]),
        ..create_req(name)
    }
}

async fn list(admin: &mut TrashClient<tonic::transport::Channel>) -> Vec<proto::TrashEntry> {
    admin
        .list_trash(proto::ListTrashRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
}

async fn listed_volumes(h: &mut Harness) -> BTreeSet<String> {
    h.controller
        .list_volumes(hpp_csi::csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .map(|e| e.volume.unwrap().volume_id)
        .collect()
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

#[tokio::test]
async fn a_deleted_volume_waits_in_the_trash_and_comes_back_under_a_new_id() {
    let (mut h, mut admin) = with_trash(HOUR).await;
    h.controller
        .create_volume(claim_req("pvc-1", "shop", "data"))
        .await
        .unwrap();
    h.create("pvc-2").await;
    populate(&h.pool_path().join("pvc-1"));
    let before = unix_now();
    h.delete("pvc-1").await.unwrap();

    // Gone for every CSI caller, still on disk.
    assert!(!h.pool_path().join("pvc-1").exists());
    assert_eq!(listed_volumes(&mut h).await, BTreeSet::from(["pvc-2".to_owned()]));
    let entries = list(&mut admin).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    let e = &entries[0];
    assert_eq!((e.pool.as_str(), e.volume_id.as_str()), ("legacy", "pvc-1"));
    assert_eq!((e.claim_namespace.as_str(), e.claim_name.as_str()), ("shop", "data"));
    assert!(e.deleted_at >= before && e.deleted_at <= unix_now(), "{e:?}");
    assert_eq!(e.purge_at, e.deleted_at + 3600);
    assert_eq!(e.entry, format!("pvc-1@{}", e.deleted_at));
    assert_populated(&h.pool_path().join(TRASH_DIR).join(&e.entry));
    // A retried DeleteVolume of the same id is answered OK and trashes nothing else.
    h.delete("pvc-1").await.unwrap();
    assert_eq!(list(&mut admin).await.len(), 1);

    // Restored under a new id (the default: <id>-restored), data and all.
    let restored = admin
        .restore_trash(proto::RestoreTrashRequest {
            entry: e.entry.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (restored.pool.as_str(), restored.volume_id.as_str()),
        ("legacy", "pvc-1-restored")
    );
    assert_populated(&h.pool_path().join("pvc-1-restored"));
    assert!(list(&mut admin).await.is_empty());
    assert_eq!(
        listed_volumes(&mut h).await,
        BTreeSet::from(["pvc-1-restored".to_owned(), "pvc-2".to_owned()])
    );
    // It is a volume like any other: deleted again, it is trashed again.
    h.delete("pvc-1-restored").await.unwrap();
    let again = list(&mut admin).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].volume_id, "pvc-1-restored");
    assert_eq!(
        again[0].claim_name, "",
        "a restored volume no longer names the old claim"
    );
    h.stop().await;
}

#[tokio::test]
async fn restore_and_purge_refuse_what_they_cannot_do_with_the_right_codes() {
    let (mut h, mut admin) = with_trash(HOUR).await;
    h.create("pvc-a").await;
    h.create("taken").await;
    h.delete("pvc-a").await.unwrap();
    let entry = list(&mut admin).await[0].entry.clone();

    let restore = |entry: &str, id: &str| proto::RestoreTrashRequest {
        entry: entry.to_owned(),
        volume_id: id.to_owned(),
        ..Default::default()
    };
    let code = |r: Result<tonic::Response<proto::RestoreTrashResponse>, tonic::Status>| match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    };
    assert_eq!(
        code(admin.restore_trash(restore(&entry, "taken")).await),
        Code::AlreadyExists
    );
    assert_eq!(
        code(admin.restore_trash(restore(&entry, "../x")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(admin.restore_trash(restore("no-at-sign", "x")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(admin.restore_trash(restore("ghost@12", "x")).await),
        Code::NotFound
    );
    assert_eq!(
        code(
            admin
                .restore_trash(proto::RestoreTrashRequest {
                    pool: "nope".into(),
                    ..restore(&entry, "x")
                })
                .await
        ),
        Code::NotFound
    );
    // Nothing was lost on the way.
    assert_eq!(list(&mut admin).await.len(), 1);

    // Purged by hand: gone, and purging it again is NotFound.
    admin
        .purge_trash(proto::PurgeTrashRequest {
            pool: String::new(),
            entry: entry.clone(),
        })
        .await
        .unwrap();
    assert!(list(&mut admin).await.is_empty());
    assert!(!h.pool_path().join(TRASH_DIR).join(&entry).exists());
    let again = admin
        .purge_trash(proto::PurgeTrashRequest {
            pool: String::new(),
            entry,
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::NotFound);
    assert!(h.pool_path().join("taken").is_dir());
    let metrics = h.metrics_text();
    assert!(
        metrics.contains("hpp_pool_trash_purged_total{pool=\"legacy\",reason=\"admin\"} 1"),
        "{metrics}"
    );
    h.stop().await;
}

#[tokio::test]
async fn without_a_retention_delete_removes_and_an_orphan_can_still_be_trashed_by_hand() {
    // KubeVirt's behaviour: no trash directory at all.
    let mut h = Harness::start().await;
    let mut admin = TrashClient::new(hpp_csi::client::connect(&h.endpoint).await.unwrap());
    h.create("pvc-gone").await;
    h.delete("pvc-gone").await.unwrap();
    assert!(!h.pool_path().join("pvc-gone").exists());
    assert!(!h.pool_path().join(TRASH_DIR).exists());

    // An orphan (a directory no PV refers to), moved into the trash by an admin: kept until
    // purged by hand.
    std::fs::create_dir(h.pool_path().join("orphan")).unwrap();
    std::fs::write(h.pool_path().join("orphan/file"), b"keep me").unwrap();
    let moved = admin
        .trash_volume(proto::TrashVolumeRequest {
            volume_id: "orphan".into(),
            pool: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(moved.pool, "legacy");
    let entries = list(&mut admin).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].purge_at, 0, "no retention: never purged by itself");
    assert_eq!(
        std::fs::read(h.pool_path().join(TRASH_DIR).join(&moved.entry).join("file")).unwrap(),
        b"keep me"
    );
    let missing = admin
        .trash_volume(proto::TrashVolumeRequest {
            volume_id: "orphan".into(),
            pool: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    h.stop().await;
}

#[tokio::test]
async fn a_published_volume_is_not_trashed() {
    let (mut h, mut admin) = with_trash(HOUR).await;
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipping: needs root to bind-mount");
        return;
    }
    h.create("busy").await;
    let target = h.target("busy");
    h.publish("busy", &target, false).await.unwrap();
    let err = h.delete("busy").await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(list(&mut admin).await.is_empty());
    h.unpublish("busy", &target).await.unwrap();
    h.delete("busy").await.unwrap();
    assert_eq!(list(&mut admin).await.len(), 1);
    h.stop().await;
}

fn trash_pool(root: &Path, retention: Duration, floor: Option<u32>) -> Pool {
    Pool::prepare(&PoolConfig::new("p", root.join("pool")).trash(retention, floor)).unwrap()
}

fn trash_names(pool: &Pool) -> Vec<String> {
    trash::list(pool).unwrap().iter().map(|e| e.name.to_string()).collect()
}

#[test]
fn purge_by_age_removes_only_what_is_due_and_only_trash_entries() {
    let t = tempfile::tempdir().unwrap();
    let p = trash_pool(t.path(), HOUR, Some(0));
    let mounts = MountTableCache::default();
    for id in ["old", "young", "kept"] {
        volumes::create(&p, id, None, Requested::default()).unwrap();
        std::fs::write(t.path().join("pool").join(id).join("f"), id).unwrap();
    }
    volumes::delete(&p, "old", &mounts).unwrap();
    volumes::delete(&p, "young", &mounts).unwrap();
    // Things in the trash directory that are not entries of its form are never touched.
    let trash_dir = t.path().join("pool").join(TRASH_DIR);
    std::fs::write(trash_dir.join("README"), b"not an entry").unwrap();
    std::fs::create_dir(trash_dir.join("no-timestamp")).unwrap();
    // Make `old` older by an hour and a second (its entry name carries the time).
    let old = trash_names(&p).into_iter().find(|n| n.starts_with("old@")).unwrap();
    let secs: u64 = old.rsplit_once('@').unwrap().1.parse().unwrap();
    let older = format!("old@{}", secs - 3601);
    std::fs::rename(trash_dir.join(&old), trash_dir.join(&older)).unwrap();

    let report = trash::purge(&p, Purge::Due { now: SystemTime::now() }).unwrap();
    assert_eq!(report.purged, vec![(older.clone(), PurgeReason::Age)]);
    assert!(!trash_dir.join(&older).exists());
    assert_eq!(trash_names(&p).len(), 1, "the young entry stays");
    assert!(trash_dir.join("README").exists() && trash_dir.join("no-timestamp").is_dir());
    assert_eq!(std::fs::read(t.path().join("pool/kept/f")).unwrap(), b"kept");
    // Nothing is due any more.
    assert!(
        trash::purge(&p, Purge::Due { now: SystemTime::now() })
            .unwrap()
            .purged
            .is_empty()
    );
    // An hour later everything is.
    let later = SystemTime::now() + HOUR + Duration::from_secs(2);
    assert_eq!(trash::purge(&p, Purge::Due { now: later }).unwrap().purged.len(), 1);
    assert!(trash_names(&p).is_empty());
    assert_eq!(std::fs::read(t.path().join("pool/kept/f")).unwrap(), b"kept");
}

#[test]
fn purge_by_space_removes_the_oldest_first_until_the_floor_is_met() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipping: needs root to mount a tmpfs");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let mnt = t.path().join("fs");
    std::fs::create_dir(&mnt).unwrap();
    rustix::mount::mount("tmpfs", &mnt, "tmpfs", rustix::mount::MountFlags::empty(), c"size=32m").unwrap();
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = rustix::mount::unmount(self.0, rustix::mount::UnmountFlags::DETACH);
        }
    }
    let _unmount = Unmount(&mnt);
    // Three trashed volumes of 4 MiB in 32 MiB (beside the journal's preallocated file); the
    // floor is set so that purging one entry is enough.
    let p = trash_pool(&mnt, HOUR * 24, Some(99));
    let mounts = MountTableCache::default();
    let trash_dir = mnt.join("pool").join(TRASH_DIR);
    let base = unix_now() - 60;
    for (i, id) in ["first", "second", "third"].into_iter().enumerate() {
        volumes::create(&p, id, None, Requested::default()).unwrap();
        std::fs::write(mnt.join("pool").join(id).join("data"), vec![1u8; 4 << 20]).unwrap();
        volumes::delete(&p, id, &mounts).unwrap();
        // Distinct, ordered deletion times.
        let name = trash_names(&p)
            .into_iter()
            .find(|n| n.starts_with(&format!("{id}@")))
            .unwrap();
        std::fs::rename(
            trash_dir.join(&name),
            trash_dir.join(format!("{id}@{}", base + i as i64)),
        )
        .unwrap();
    }
    let st = rustix::fs::statvfs(&mnt).unwrap();
    let free = st.f_bavail as f64 * 100.0 / st.f_blocks as f64;
    let one_entry = (4u64 << 20) as f64 * 100.0 / (st.f_blocks * st.f_frsize) as f64;
    let floor = (free + one_entry / 2.0).ceil() as u32;
    let p = trash_pool(&mnt, HOUR * 24, Some(floor));
    let report = trash::purge(&p, Purge::Due { now: SystemTime::now() }).unwrap();
    assert_eq!(
        report.purged,
        vec![(format!("first@{base}"), PurgeReason::Space)],
        "floor {floor}%"
    );
    assert_eq!(
        trash_names(&p),
        [format!("second@{}", base + 1), format!("third@{}", base + 2)]
    );
    // Above the floor now: nothing more goes.
    assert!(
        trash::purge(&p, Purge::Due { now: SystemTime::now() })
            .unwrap()
            .purged
            .is_empty()
    );
}

/// What the journal holds now (read as a start would, without redoing or checkpointing).
fn records(pool: &Pool) -> Vec<Record> {
    let dir = pool.open().unwrap();
    let (_, records) = Journal::open(dir.as_fd(), JOURNAL_NAME, 1 << 20).unwrap();
    records.iter().map(|r| serde_json::from_slice(r).unwrap()).collect()
}

#[test]
fn a_trash_move_or_restore_a_crash_lost_is_redone_at_the_start() {
    let t = tempfile::tempdir().unwrap();
    let pool_dir = t.path().join("pool");
    let trash_dir = pool_dir.join(TRASH_DIR);
    let p = trash_pool(t.path(), HOUR, Some(0));
    let mounts = MountTableCache::default();
    volumes::create(&p, "pvc-t", None, Requested::default()).unwrap();
    std::fs::write(pool_dir.join("pvc-t/f"), b"data").unwrap();
    volumes::delete(&p, "pvc-t", &mounts).unwrap();
    let entry = trash_names(&p).pop().unwrap();
    assert!(matches!(records(&p).last(), Some(Record::Trash { id, entry: e, .. }) if id == "pvc-t" && *e == entry));
    drop(p);
    // The power cut took the rename back.
    std::fs::rename(trash_dir.join(&entry), pool_dir.join("pvc-t")).unwrap();
    let again = trash_pool(t.path(), HOUR, Some(0));
    again.journal().unwrap();
    assert!(!pool_dir.join("pvc-t").exists(), "moved into the trash again");
    assert_eq!(std::fs::read(trash_dir.join(&entry).join("f")).unwrap(), b"data");

    // A restore the power cut took back is redone too.
    trash::restore(&again, &entry, "pvc-back").unwrap();
    assert!(matches!(records(&again).last(), Some(Record::Restore { id, .. }) if id == "pvc-back"));
    drop(again);
    std::fs::rename(pool_dir.join("pvc-back"), trash_dir.join(&entry)).unwrap();
    let third = trash_pool(t.path(), HOUR, Some(0));
    third.journal().unwrap();
    assert_eq!(std::fs::read(pool_dir.join("pvc-back/f")).unwrap(), b"data");
    assert!(trash_names(&third).is_empty());
}

const CRASH_CHILD: &str = "HPP_TEST_TRASH_CRASH_CHILD_ROOT";

/// Not a test on its own: when the kill test runs this binary with [`CRASH_CHILD`] set, it
/// creates volumes holding a file, trashes every one it made before, and purges everything due
/// an hour from now, until it is killed; what it was answered goes to `<root>/answers`.
#[test]
fn trash_crash_child() {
    use std::io::Write as _;
    let Ok(root) = std::env::var(CRASH_CHILD) else {
        return;
    };
    let root = std::path::PathBuf::from(root);
    let p = trash_pool(&root, HOUR, Some(0));
    let mut answers = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("answers"))
        .unwrap();
    let mounts = MountTableCache::default();
    crash_child::mark_started(&root);
    for i in 0u64.. {
        let id = format!("pvc-{}-{i}", std::process::id());
        volumes::create(&p, &id, None, Requested::default()).unwrap();
        let dir = root.join("pool").join(&id);
        std::fs::create_dir_all(dir.join("a/b/c")).unwrap();
        std::fs::write(dir.join("a/b/c/file"), vec![3u8; 64 << 10]).unwrap();
        answers.write_all(format!("c {id}\n").as_bytes()).unwrap();
        if i > 0 {
            let old = format!("pvc-{}-{}", std::process::id(), i - 1);
            volumes::delete(&p, &old, &mounts).unwrap();
            answers.write_all(format!("d {old}\n").as_bytes()).unwrap();
        }
        if i % 4 == 3 {
            trash::purge(
                &p,
                Purge::Due {
                    now: SystemTime::now() + HOUR * 2,
                },
            )
            .unwrap();
        }
    }
}

/// kill -9 of a process trashing and purging volumes, at many moments: after a start (the
/// journal's redo) and one purge pass, every volume answered deleted is out of the pool, no
/// half-removed entry is left, every entry still in the trash is whole, and the sentinels
/// (a volume never deleted, a foreign file in the trash) are untouched.
#[test]
fn killing_a_process_moving_and_purging_trash_converges() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().canonicalize().unwrap();
    let p = trash_pool(&root, HOUR, Some(0));
    volumes::create(&p, "sentinel", None, Requested::default()).unwrap();
    std::fs::write(root.join("pool/sentinel/f"), b"never touched").unwrap();
    trash::open_dir(&p, p.open().unwrap().as_fd(), true).unwrap();
    std::fs::write(root.join("pool").join(TRASH_DIR).join("foreign"), b"not ours").unwrap();
    drop(p);
    crash_child::kill_at_moments("trash_crash_child", CRASH_CHILD, &root, 10, Duration::from_millis(9));
    let answered = || std::fs::read_to_string(root.join("answers")).unwrap_or_default();
    for round in 1..=20 {
        if answered().lines().filter(|l| l.starts_with("d ")).count() >= 8 {
            break;
        }
        crash_child::kill_after(
            "trash_crash_child",
            CRASH_CHILD,
            &root,
            Duration::from_millis(100 * round),
        );
    }
    let answers = answered();
    let deleted: BTreeSet<&str> = answers.lines().filter_map(|l| l.strip_prefix("d ")).collect();
    assert!(deleted.len() >= 8, "the children deleted too little: {}", deleted.len());

    // What the driver does when it starts, then one purge pass of nothing due.
    let again = trash_pool(&root, HOUR, Some(0));
    again.journal().unwrap();
    trash::purge(&again, Purge::Due { now: SystemTime::now() }).unwrap();
    let on_disk: BTreeSet<String> = again.list_volumes().unwrap().into_iter().collect();
    for id in &deleted {
        assert!(!on_disk.contains(*id), "{id} was answered deleted and is back");
    }
    let trash_dir = root.join("pool").join(TRASH_DIR);
    for name in std::fs::read_dir(&trash_dir).unwrap() {
        let name = name.unwrap().file_name().into_string().unwrap();
        assert!(!name.starts_with(".hpp-del-"), "a half-purged entry is left: {name}");
        if name == "foreign" {
            continue;
        }
        let file = trash_dir.join(&name).join("a/b/c/file");
        if file.exists() {
            assert_eq!(std::fs::read(&file).unwrap().len(), 64 << 10, "{name} is not whole");
        }
    }
    assert_eq!(std::fs::read(trash_dir.join("foreign")).unwrap(), b"not ours");
    assert_eq!(std::fs::read(root.join("pool/sentinel/f")).unwrap(), b"never touched");
    // Everything left in the trash purges cleanly.
    let later = SystemTime::now() + HOUR * 2;
    while trash::purge(&again, Purge::Due { now: later }).unwrap().more {}
    assert!(trash_names(&again).is_empty());
    assert_eq!(std::fs::read(trash_dir.join("foreign")).unwrap(), b"not ours");
}

#[tokio::test]
async fn the_gauges_show_what_the_trash_holds() {
    let (mut h, _admin) = with_trash(HOUR).await;
    h.create("pvc-g").await;
    std::fs::write(h.pool_path().join("pvc-g/blob"), vec![5u8; 1 << 20]).unwrap();
    h.delete("pvc-g").await.unwrap();
    hpp_csi::service::health::purge_trash_once(&h.state);
    let text = h.metrics_text();
    assert!(text.contains("hpp_pool_trash_entries{pool=\"legacy\"} 1"), "{text}");
    let bytes: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("hpp_pool_trash_bytes{pool=\"legacy\"} "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(bytes >= 1 << 20, "{bytes}");
    h.stop().await;
}
