//! The volume journal after a crash: what a power cut took back (a volume directory that was
//! never written, a deletion's rename that never reached the disk) comes back when the driver
//! starts again (a fresh `Pool`, as `Driver::build` makes one), and only what the journal says.
//! The loss is made by hand, since a test cannot cut the power: the directory is removed, or
//! put back, behind the first pool's back.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod crash_child;

use std::os::fd::AsFd;

use hpp_csi::PoolConfig;
use hpp_csi::ops::volume_journal::{DirIdentity, JOURNAL_NAME, Record};
use hpp_csi::ops::volumes::{self, Requested};
use hpp_csi::pool::Pool;
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
    match &records(&first)[..] {
        [
            Record::Create {
                id,
                required,
                limit: 0,
                tuning,
                // Made in place: no temporary to rename.
                temp: None,
            },
        ] if id == "pvc-a" && *required == SIZE.required && tuning.is_empty() => {}
        other => panic!("{other:?}"),
    }
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

/// The journal as a crash leaves it when the rename of a deletion never reached the disk: the
/// deletion's record, and the very directory it renamed still in place.
fn lost_deletion(pool: &Pool, id: &str) -> Record {
    let dir = pool.open().unwrap();
    let was = DirIdentity::of(dir.as_fd(), id).unwrap();
    let (journal, _) = Journal::open(dir.as_fd(), JOURNAL_NAME, 1 << 20).unwrap();
    journal.checkpoint(dir.as_fd()).unwrap();
    let record = Record::Delete { id: id.into(), was };
    journal
        .append(dir.as_fd(), &serde_json::to_vec(&record).unwrap())
        .unwrap();
    record
}

#[test]
fn a_deleted_volume_a_crash_brought_back_is_deleted_again() {
    let t = tempfile::tempdir().unwrap();
    let first = pool(t.path());
    volumes::create(&first, "pvc-b", None, SIZE).unwrap();
    std::fs::write(t.path().join("pool/pvc-b/data"), b"tenant").unwrap();
    drop(first);
    lost_deletion(&pool(t.path()), "pvc-b");

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
    let ids: Vec<String> = records(&first).into_iter().map(|r| r.id().to_owned()).collect();
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

/// Another filesystem mounted over the pool after the journal was opened: the next create
/// uses (and first replays) the journal of the filesystem now mounted there, never the hidden
/// one.
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
    let created = volumes::create(&p, "pvc-over", None, SIZE);
    let over_records = records(&p);
    rustix::mount::unmount(&over, rustix::mount::UnmountFlags::DETACH).unwrap();
    created.unwrap();
    assert_eq!(over_records.len(), 1, "{over_records:?}");
    // The journal under the mount kept only its own volume.
    assert_eq!(records(&pool(t.path())).len(), 1);
}

/// A deletion is redone only on the directory that was deleted: a volume made again under the
/// same id since (a clone or restore, which is synced, not journaled) is left alone.
#[test]
fn a_volume_made_again_under_a_deleted_id_is_not_deleted_by_the_replay() {
    let t = tempfile::tempdir().unwrap();
    let first = pool(t.path());
    let mounts = MountTableCache::default();
    volumes::create(&first, "pvc-src", None, SIZE).unwrap();
    std::fs::write(t.path().join("pool/pvc-src/data"), b"restored").unwrap();
    volumes::create(&first, "pvc-x", None, SIZE).unwrap();
    volumes::delete(&first, "pvc-x", &mounts).unwrap();
    let src = volumes::open(&first, "pvc-src").unwrap();
    volumes::create(&first, "pvc-x", Some(&src), SIZE).unwrap();
    drop((src, first));

    let again = pool(t.path());
    again.journal().unwrap();
    assert_eq!(std::fs::read(t.path().join("pool/pvc-x/data")).unwrap(), b"restored");
}

/// A crash kept the temporary but lost its rename (a create built under a temporary, as on a
/// pool whose backend enforces sizes): the temporary, with what the tenant wrote into it since,
/// is renamed into place (not swept, not replaced by an empty directory).
#[test]
fn a_lost_rename_brings_back_the_temporary_with_its_data() {
    let t = tempfile::tempdir().unwrap();
    let first = pool(t.path());
    let temp = volumes::temp_name("pvc-t");
    std::fs::create_dir(t.path().join("pool").join(&temp)).unwrap();
    std::fs::write(t.path().join("pool").join(&temp).join("synced"), b"tenant data").unwrap();
    let dir = first.open().unwrap();
    let (journal, _) = Journal::open(dir.as_fd(), JOURNAL_NAME, 1 << 20).unwrap();
    journal.checkpoint(dir.as_fd()).unwrap();
    let record = Record::create("pvc-t", SIZE, &Default::default(), Some(temp.clone()));
    journal
        .append(dir.as_fd(), &serde_json::to_vec(&record).unwrap())
        .unwrap();
    drop((journal, dir, first));

    let again = pool(t.path());
    again.journal().unwrap();
    assert_eq!(
        std::fs::read(t.path().join("pool/pvc-t/synced")).unwrap(),
        b"tenant data"
    );
    assert!(!t.path().join("pool").join(&temp).exists());
}

/// What a crash leaves of an in-place create: the directory, without the mode and capacity
/// record set after the `mkdir`.
fn cut_short(root: &std::path::Path, id: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = root.join("pool").join(id);
    std::fs::create_dir(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
    path
}

fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// An acknowledged create whose record survived but whose mode and capacity record did not:
/// the start finishes the volume.
#[test]
fn the_start_finishes_an_acknowledged_volume_a_crash_cut_short() {
    let t = tempfile::tempdir().unwrap();
    let first = pool(t.path());
    volumes::create(&first, "pvc-c", None, SIZE).unwrap();
    drop(first);
    std::fs::remove_dir(t.path().join("pool/pvc-c")).unwrap();
    let path = cut_short(t.path(), "pvc-c");

    let again = pool(t.path());
    again.journal().unwrap();
    assert_eq!(mode(&path), volumes::VOLUME_MODE);
    let dir = again.open().unwrap();
    assert_eq!(
        volumes::recorded_capacity(dir.as_fd(), "pvc-c").unwrap(),
        Some(SIZE.required)
    );
}

/// A retried create that finds what a crash left of its first attempt (nothing acknowledged,
/// no record) finishes it; an existing volume with contents and no record (adopted from
/// KubeVirt) is answered as it is, untouched.
#[test]
fn a_retry_finishes_a_create_a_crash_cut_short_and_leaves_a_kubevirt_volume_alone() {
    use std::os::unix::fs::PermissionsExt as _;
    let t = tempfile::tempdir().unwrap();
    let p = pool(t.path());
    p.journal().unwrap();
    let path = cut_short(t.path(), "pvc-r");
    assert_eq!(
        volumes::create(&p, "pvc-r", None, SIZE).unwrap(),
        volumes::Created::Existing
    );
    assert_eq!(mode(&path), volumes::VOLUME_MODE);

    // Empty, without a record, but a mode someone widened (KubeVirt's legacy provisioner makes
    // 0777): the record is added, the mode kept.
    let wide = cut_short(t.path(), "pvc-wide");
    std::fs::set_permissions(&wide, std::fs::Permissions::from_mode(0o2777)).unwrap();
    volumes::create(&p, "pvc-wide", None, SIZE).unwrap();
    assert_eq!(mode(&wide), 0o2777);

    let legacy = cut_short(t.path(), "pvc-kubevirt");
    std::fs::write(legacy.join("disk.img"), b"data").unwrap();
    assert_eq!(
        volumes::create(&p, "pvc-kubevirt", None, SIZE).unwrap(),
        volumes::Created::Existing
    );
    assert_eq!(mode(&legacy), 0o700);
    let dir = p.open().unwrap();
    assert_eq!(volumes::recorded_capacity(dir.as_fd(), "pvc-kubevirt").unwrap(), None);
}

/// An empty filesystem mounted where a volume would be (no record, the root of another
/// filesystem) is not what a cut-short create leaves: a retry answers it as it is, untouched.
#[test]
fn a_retry_leaves_another_filesystem_mounted_under_the_volume_name_alone() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: mounting needs root");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let p = pool(t.path());
    p.journal().unwrap();
    let path = cut_short(t.path(), "pvc-mnt");
    rustix::mount::mount(
        "tmpfs",
        &path,
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        c"mode=0700",
    )
    .unwrap();
    let created = volumes::create(&p, "pvc-mnt", None, SIZE);
    let (kept_mode, record) = (
        mode(&path),
        volumes::recorded_capacity(p.open().unwrap().as_fd(), "pvc-mnt"),
    );
    rustix::mount::unmount(&path, rustix::mount::UnmountFlags::DETACH).unwrap();
    assert_eq!(created.unwrap(), volumes::Created::Existing);
    assert_eq!(kept_mode, 0o700);
    assert_eq!(record.unwrap(), None);
}

/// A change that cannot be redone at start (the resurrected volume is mounted) is recorded
/// again, not checkpointed away: the next start redoes it.
#[test]
fn a_change_that_cannot_be_redone_is_kept_for_the_next_start() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: mounting needs root");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let first = pool(t.path());
    volumes::create(&first, "pvc-m", None, SIZE).unwrap();
    drop(first);
    let record = lost_deletion(&pool(t.path()), "pvc-m");
    // A pod still has it mounted.
    let target = t.path().join("target");
    std::fs::create_dir(&target).unwrap();
    rustix::mount::mount_bind(t.path().join("pool/pvc-m"), &target).unwrap();

    let again = pool(t.path());
    again.journal().unwrap();
    let kept = records(&again);
    rustix::mount::unmount(&target, rustix::mount::UnmountFlags::DETACH).unwrap();
    assert!(t.path().join("pool/pvc-m").exists(), "a mounted volume is left");
    assert_eq!(kept, vec![record]);
    drop(again);

    let third = pool(t.path());
    third.journal().unwrap();
    assert!(!t.path().join("pool/pvc-m").exists(), "redone once it was unmounted");
}

const CRASH_CHILD: &str = "HPP_TEST_JOURNAL_CRASH_CHILD_ROOT";

/// Not a test on its own: when the kill test runs this binary with [`CRASH_CHILD`] set, it
/// creates plain volumes and deletes every third, until it is killed, writing what it was
/// answered to `<root>/answers` (`c ID` after a create, `D ID` before a delete, `d ID` after).
#[test]
fn plain_crash_child() {
    use std::io::Write as _;
    let Ok(root) = std::env::var(CRASH_CHILD) else {
        return;
    };
    let root = std::path::PathBuf::from(root);
    let p = pool(&root);
    let mut answers = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("answers"))
        .unwrap();
    let mounts = MountTableCache::default();
    crash_child::mark_started(&root);
    for i in 0u64.. {
        let id = format!("pvc-{}-{i}", std::process::id());
        volumes::create(&p, &id, None, SIZE).unwrap();
        answers.write_all(format!("c {id}\n").as_bytes()).unwrap();
        if i % 3 == 2 {
            let old = format!("pvc-{}-{}", std::process::id(), i - 1);
            answers.write_all(format!("D {old}\n").as_bytes()).unwrap();
            volumes::delete(&p, &old, &mounts).unwrap();
            answers.write_all(format!("d {old}\n").as_bytes()).unwrap();
        }
    }
}

/// kill -9 of a process creating and deleting plain volumes (made in place, journaled), at many
/// moments: after a start (the journal's redo and the sweep), every volume whose create was
/// answered is complete (mode and size record), every answered deletion stays done, and a
/// retried create finishes whatever else a kill left.
#[test]
fn killing_a_process_creating_plain_volumes_converges() {
    use std::collections::BTreeSet;
    let t = tempfile::tempdir().unwrap();
    let root = t.path().canonicalize().unwrap();
    drop(pool(&root));
    crash_child::kill_at_moments(
        "plain_crash_child",
        CRASH_CHILD,
        &root,
        10,
        std::time::Duration::from_millis(7),
    );

    let answered = || std::fs::read_to_string(root.join("answers")).unwrap_or_default();
    // Each create waits for its own flush, so a slow disk fits few into the moments above: more
    // children, each given longer, until enough creates were answered to check anything.
    for round in 1..=20 {
        if answered().lines().filter(|l| l.starts_with("c ")).count() >= 10 {
            break;
        }
        crash_child::kill_after(
            "plain_crash_child",
            CRASH_CHILD,
            &root,
            std::time::Duration::from_millis(100 * round),
        );
    }
    let answers = answered();
    let with = |tag: &str| -> BTreeSet<String> {
        answers
            .lines()
            .filter_map(|l| l.strip_prefix(tag))
            .map(str::to_owned)
            .collect()
    };
    let (created, deleting, deleted) = (with("c "), with("D "), with("d "));
    assert!(
        created.len() >= 10,
        "the children created too little: {}",
        created.len()
    );
    eprintln!("answered: {} creates, {} deletes", created.len(), deleted.len());

    // What the driver does when it starts.
    let again = pool(&root);
    again.journal().unwrap();
    let dir = again.open().unwrap();
    volumes::sweep(dir.as_fd(), &*again.quota).unwrap();
    let on_disk: BTreeSet<String> = again.list_volumes().unwrap().into_iter().collect();
    let complete = |id: &str| {
        assert_eq!(mode(&root.join("pool").join(id)), volumes::VOLUME_MODE, "{id}");
        assert_eq!(
            volumes::recorded_capacity(dir.as_fd(), id).unwrap(),
            Some(SIZE.required),
            "{id}"
        );
    };
    for id in created.difference(&deleting) {
        assert!(on_disk.contains(id), "{id} was answered created and is gone");
        complete(id);
    }
    for id in &deleted {
        assert!(!on_disk.contains(id), "{id} was answered deleted and is back");
    }
    // The CO retries every create it was not answered; each one is finished.
    let unanswered: Vec<_> = on_disk.difference(&created).collect();
    eprintln!("{} volumes on disk whose create was not answered", unanswered.len());
    for id in unanswered {
        volumes::create(&again, id, None, SIZE).unwrap();
        complete(id);
    }
}
