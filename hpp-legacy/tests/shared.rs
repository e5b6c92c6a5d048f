//! End to end in shared-filesystem mode: pvDir from the StorageClass, RWX, no node affinity, the
//! mount guard on real tmpfs mounts, and two instances racing for one claim.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use hpp_legacy::Mode;
use hpp_legacy::controller::{LeaseSettings, run_with_leader_election};
use hpp_legacy::decision::RefusalReason;
use hpp_legacy::fsops::Removed;
use hpp_legacy::provisioner::{ClaimOutcome, VolumeOutcome};
use hpp_testkit::FakeApiServer;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::PersistentVolume;

const NAME: &str = "torchbox.com/hostpath";

fn successful_pv_creates(fake: &FakeApiServer) -> usize {
    fake.write_requests()
        .iter()
        .filter(|r| r.method.as_str() == "POST" && r.path == "/api/v1/persistentvolumes" && r.status == 201)
        .count()
}

#[tokio::test]
async fn rwx_volume_on_guarded_mount_end_to_end() {
    let fake = FakeApiServer::new();
    let fs = Tmpfs::new("32m");
    let vols = fs.path().join("k8s");
    std::fs::create_dir(&vols).unwrap();
    let mount = fs.path().to_str().unwrap().to_owned();
    fake.seed(&storage_class(
        "cephfs",
        NAME,
        false,
        "Delete",
        &[
            ("pvDir", vols.to_str().unwrap()),
            ("expectedMount", &mount),
            ("expectedFsType", "tmpfs"),
        ],
    ));
    let p = provisioner(&fake, config(Mode::Shared, None, None), fs.path());
    let c = seed_claim(
        &fake,
        &claim("web", "media", "cephfs", NAME, "5Mi", &["ReadWriteMany"], &[]),
    );
    let name = pv_name(&c);
    assert_eq!(
        p.reconcile_claim(&c).await.unwrap(),
        ClaimOutcome::Provisioned(name.clone())
    );
    let made = pv(&fake, &name);
    let spec = made.spec.clone().unwrap();
    assert!(spec.node_affinity.is_none());
    assert_eq!(spec.access_modes.unwrap(), vec!["ReadWriteMany"]);
    let dir = host_path(&made);
    assert_eq!(dir, vols.join(&name));
    assert!(dir.is_dir());
    bind(&fake, "web", "media", &name).await;
    std::fs::write(dir.join("upload.jpg"), "x").unwrap();
    release(&fake, "web", "media", &name);
    assert_eq!(
        p.reconcile_volume(&pv(&fake, &name)).await.unwrap(),
        VolumeOutcome::Deleted(Removed::Deleted)
    );
    assert!(!dir.exists());
    assert!(fake.get::<PersistentVolume>(None, &name).is_none());
}

#[tokio::test]
async fn mount_guard_refuses_plain_directory_and_unmounted_filesystem() {
    let fake = FakeApiServer::new();
    let plain = tempfile::tempdir().unwrap();
    let plain_dir = plain.path().to_str().unwrap().to_owned();
    fake.seed(&storage_class(
        "plain",
        NAME,
        false,
        "Delete",
        &[("pvDir", &plain_dir), ("expectedMount", &plain_dir)],
    ));
    let p = provisioner(&fake, config(Mode::Shared, None, None), plain.path());
    let c = seed_claim(&fake, &claim("ns", "p", "plain", NAME, "1Mi", &["ReadWriteMany"], &[]));
    assert_eq!(
        p.reconcile_claim(&c).await.unwrap(),
        ClaimOutcome::Refused(RefusalReason::MountGuard)
    );
    let ev = refusals_for(&fake, "p", "BaseDirectoryNotMounted");
    assert!(
        ev[0].note.as_deref().unwrap().contains("is the filesystem mounted?"),
        "{:?}",
        ev[0].note
    );
    assert_eq!(std::fs::read_dir(plain.path()).unwrap().count(), 0);

    // The same path works once a filesystem is mounted there, and stops working when it goes.
    let fs = Tmpfs::new("8m");
    let mounted = fs.path().to_str().unwrap().to_owned();
    fake.seed(&storage_class(
        "net",
        NAME,
        false,
        "Delete",
        &[("pvDir", &mounted), ("expectedMount", &mounted)],
    ));
    let ok = seed_claim(&fake, &claim("ns", "ok", "net", NAME, "1Mi", &["ReadWriteMany"], &[]));
    let name = pv_name(&ok);
    assert_eq!(
        p.reconcile_claim(&ok).await.unwrap(),
        ClaimOutcome::Provisioned(name.clone())
    );
    bind(&fake, "ns", "ok", &name).await;
    release(&fake, "ns", "ok", &name);
    let status = std::process::Command::new("umount").arg(fs.path()).status().unwrap();
    assert!(status.success());
    let later = seed_claim(
        &fake,
        &claim("ns", "later", "net", NAME, "1Mi", &["ReadWriteMany"], &[]),
    );
    assert_eq!(
        p.reconcile_claim(&later).await.unwrap(),
        ClaimOutcome::Refused(RefusalReason::MountGuard)
    );
    assert_eq!(
        std::fs::read_dir(fs.path()).unwrap().count(),
        0,
        "nothing written to the host disk"
    );
    // Deleting a released volume while the filesystem is away must not treat it as gone.
    assert!(matches!(
        p.reconcile_volume(&pv(&fake, &name)).await.unwrap(),
        VolumeOutcome::Refused(_)
    ));
    assert!(fake.get::<PersistentVolume>(None, &name).is_some());
    assert_eq!(events_for(&fake, &name, "VolumeFailedDelete").len(), 1);
}

#[tokio::test]
async fn marker_file_guard() {
    let fake = FakeApiServer::new();
    let fs = Tmpfs::new("8m");
    let dir = fs.path().to_str().unwrap().to_owned();
    fake.seed(&storage_class(
        "m",
        NAME,
        false,
        "Delete",
        &[("pvDir", &dir), ("mountMarker", ".hpp-mounted")],
    ));
    let p = provisioner(&fake, config(Mode::Shared, None, None), fs.path());
    let c = seed_claim(&fake, &claim("ns", "m", "m", NAME, "1Mi", &["ReadWriteOnce"], &[]));
    assert_eq!(
        p.reconcile_claim(&c).await.unwrap(),
        ClaimOutcome::Refused(RefusalReason::MountGuard)
    );
    assert!(
        refusals_for(&fake, "m", "BaseDirectoryNotMounted")[0]
            .note
            .as_deref()
            .unwrap()
            .contains(".hpp-mounted")
    );
    std::fs::write(fs.path().join(".hpp-mounted"), "").unwrap();
    assert_eq!(
        p.reconcile_claim(&c).await.unwrap(),
        ClaimOutcome::Provisioned(pv_name(&c))
    );
}

#[tokio::test]
async fn missing_pv_dir_is_refused() {
    let fake = FakeApiServer::new();
    fake.seed(&storage_class("nodir", NAME, false, "Delete", &[]));
    let scratch = tempfile::tempdir().unwrap();
    let p = provisioner(&fake, config(Mode::Shared, None, None), scratch.path());
    let c = seed_claim(&fake, &claim("ns", "x", "nodir", NAME, "1Mi", &["ReadWriteMany"], &[]));
    assert_eq!(
        p.reconcile_claim(&c).await.unwrap(),
        ClaimOutcome::Refused(RefusalReason::NoBaseDir)
    );
    assert!(
        refusals_for(&fake, "x", "NoBaseDirectory")[0]
            .note
            .as_deref()
            .unwrap()
            .contains("pvDir")
    );
}

#[tokio::test]
async fn two_instances_racing_create_one_volume() {
    let fake = FakeApiServer::new();
    let fs = Tmpfs::new("8m");
    let dir = fs.path().to_str().unwrap().to_owned();
    fake.seed(&storage_class(
        "race",
        NAME,
        false,
        "Delete",
        &[("pvDir", &dir), ("expectedMount", &dir)],
    ));
    let a = provisioner(&fake, config(Mode::Shared, None, None), fs.path());
    let b = provisioner(&fake, config(Mode::Shared, None, None), fs.path());
    for i in 0..5 {
        let c = seed_claim(
            &fake,
            &claim("ns", &format!("r{i}"), "race", NAME, "1Mi", &["ReadWriteMany"], &[]),
        );
        let name = pv_name(&c);
        let (ra, rb) = tokio::join!(a.reconcile_claim(&c), b.reconcile_claim(&c));
        let outcomes = [ra.unwrap(), rb.unwrap()];
        let won = outcomes
            .iter()
            .filter(|o| **o == ClaimOutcome::Provisioned(name.clone()))
            .count();
        let lost = outcomes
            .iter()
            .filter(|o| **o == ClaimOutcome::AlreadyExists(name.clone()))
            .count();
        assert_eq!((won, lost), (1, 1), "{outcomes:?}");
        assert!(
            host_path(&pv(&fake, &name)).is_dir(),
            "the loser did not remove the winner's directory"
        );
    }
    assert_eq!(fake.list::<PersistentVolume>().len(), 5);
    assert_eq!(successful_pv_creates(&fake), 5);
}

#[tokio::test]
async fn leader_election_lets_one_instance_provision() {
    let fake = FakeApiServer::new();
    let fs = Tmpfs::new("8m");
    let dir = fs.path().to_str().unwrap().to_owned();
    fake.seed(&storage_class(
        "le",
        NAME,
        false,
        "Delete",
        &[("pvDir", &dir), ("expectedMount", &dir)],
    ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for id in ["instance-a", "instance-b"] {
        let p = Arc::new(provisioner_named(
            &fake,
            config(Mode::Shared, None, None),
            fs.path(),
            id,
        ));
        let lease = LeaseSettings::new("hpp-shared", "kube-system", id);
        let mut rx = stop_rx.clone();
        tasks.push(tokio::spawn(run_with_leader_election(p, lease, async move {
            let _ = rx.wait_for(|s| *s).await;
        })));
    }
    let claims: Vec<_> = (0..3)
        .map(|i| {
            seed_claim(
                &fake,
                &claim("ns", &format!("le{i}"), "le", NAME, "1Mi", &["ReadWriteMany"], &[]),
            )
        })
        .collect();
    // The success Event is recorded after the PV is stored, so wait for both.
    let provisioned = |f: &FakeApiServer| {
        f.list::<PersistentVolume>().len() == 3
            && claims.iter().all(|c| {
                !events_for(
                    f,
                    c.metadata.name.as_deref().unwrap_or_default(),
                    "ProvisioningSucceeded",
                )
                .is_empty()
            })
    };
    tokio::time::timeout(Duration::from_secs(120), fake.wait_until(provisioned))
        .await
        .expect("the leader provisions every claim");
    for c in &claims {
        assert!(host_path(&pv(&fake, &pv_name(c))).is_dir());
    }
    let lease = fake
        .get::<Lease>(Some("kube-system"), "hpp-shared")
        .expect("lease exists");
    let holder = lease.spec.unwrap().holder_identity.unwrap();
    assert!(holder == "instance-a" || holder == "instance-b", "{holder}");
    for c in &claims {
        let name = c.metadata.name.as_deref().unwrap();
        let ev = events_for(&fake, name, "ProvisioningSucceeded");
        assert_eq!(ev.len(), 1, "{name}");
        assert_eq!(
            ev[0].reporting_instance.as_deref(),
            Some(holder.as_str()),
            "only the leader provisions"
        );
    }
    stop_tx.send(true).unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    assert_eq!(successful_pv_creates(&fake), 3);
}

#[tokio::test]
async fn standby_takes_over_when_the_leader_stops() {
    let fake = FakeApiServer::new();
    let fs = Tmpfs::new("8m");
    let dir = fs.path().to_str().unwrap().to_owned();
    fake.seed(&storage_class(
        "ha",
        NAME,
        false,
        "Delete",
        &[("pvDir", &dir), ("expectedMount", &dir)],
    ));
    let start = |id: &'static str| {
        let p = Arc::new(provisioner_named(
            &fake,
            config(Mode::Shared, None, None),
            fs.path(),
            id,
        ));
        // Short enough that the standby's wait for the released lease takes seconds, with a
        // renewal margin a loaded machine's scheduling delays cannot eat.
        let lease = LeaseSettings::new("hpp-ha", "kube-system", id).with_timing(6, 3);
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(run_with_leader_election(p, lease, async move {
            let _ = rx.wait_for(|s| *s).await;
        }));
        (tx, task)
    };
    let holder = |f: &FakeApiServer| {
        f.get::<Lease>(Some("kube-system"), "hpp-ha")
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .unwrap_or_default()
    };
    let wait = Duration::from_secs(120);
    let (stop_a, task_a) = start("first");
    tokio::time::timeout(wait, fake.wait_until(|f| holder(f) == "first"))
        .await
        .expect("first leads");
    let (stop_b, task_b) = start("second");
    let c1 = seed_claim(&fake, &claim("ns", "one", "ha", NAME, "1Mi", &["ReadWriteMany"], &[]));
    tokio::time::timeout(
        wait,
        fake.wait_until(|f| !events_for(f, "one", "ProvisioningSucceeded").is_empty()),
    )
    .await
    .expect("leader provisions");
    assert_eq!(
        events_for(&fake, "one", "ProvisioningSucceeded")[0]
            .reporting_instance
            .as_deref(),
        Some("first")
    );

    stop_a.send(true).unwrap();
    tokio::time::timeout(wait, task_a).await.unwrap().unwrap().unwrap();
    tokio::time::timeout(wait, fake.wait_until(|f| holder(f) == "second"))
        .await
        .expect("standby takes over");
    let c2 = seed_claim(&fake, &claim("ns", "two", "ha", NAME, "1Mi", &["ReadWriteMany"], &[]));
    tokio::time::timeout(
        wait,
        fake.wait_until(|f| !events_for(f, "two", "ProvisioningSucceeded").is_empty()),
    )
    .await
    .expect("new leader provisions");
    assert_eq!(
        events_for(&fake, "two", "ProvisioningSucceeded")[0]
            .reporting_instance
            .as_deref(),
        Some("second")
    );
    for c in [&c1, &c2] {
        assert!(host_path(&pv(&fake, &pv_name(c))).is_dir());
    }
    stop_b.send(true).unwrap();
    tokio::time::timeout(wait, task_b).await.unwrap().unwrap().unwrap();
}

/// An API server that stops answering (a partition) fails no call. The leader's work waiting
/// on it must be dropped once the lease goes unrenewed, not waited for: otherwise it would go
/// on as leader in its head while another instance takes the lease, and could not even be
/// stopped. The claim arrives while nothing is answered, so its provisioning waits on its
/// first call.
#[tokio::test]
async fn a_leader_whose_api_server_stops_answering_drops_its_work_and_can_be_stopped() {
    let fake = FakeApiServer::new();
    let fs = Tmpfs::new("8m");
    let dir = fs.path().to_str().unwrap().to_owned();
    fake.seed(&storage_class(
        "mute",
        NAME,
        false,
        "Delete",
        &[("pvDir", &dir), ("expectedMount", &dir)],
    ));
    let p = Arc::new(provisioner_named(
        &fake,
        config(Mode::Shared, None, None),
        fs.path(),
        "only",
    ));
    // Renewed every 2 s, given up 3 s after the last renewal.
    let lease = LeaseSettings::new("hpp-mute", "kube-system", "only").with_timing(4, 2);
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(run_with_leader_election(p, lease, async move {
        let _ = stop_rx.wait_for(|s| *s).await;
    }));
    let wait = Duration::from_secs(120);
    let watching_claims = |f: &FakeApiServer| {
        f.requests()
            .iter()
            .any(|r| r.path.ends_with("/persistentvolumeclaims") && r.query.contains("watch=true"))
    };
    tokio::time::timeout(
        wait,
        fake.wait_until(|f| {
            watching_claims(f)
                && f.get::<Lease>(Some("kube-system"), "hpp-mute")
                    .and_then(|l| l.spec?.holder_identity)
                    .as_deref()
                    == Some("only")
        }),
    )
    .await
    .expect("the instance leads and watches claims");
    fake.set_unresponsive(true);
    seed_claim(
        &fake,
        &claim("ns", "muted", "mute", NAME, "1Mi", &["ReadWriteMany"], &[]),
    );
    // Well past the 3 s the lease is held without a renewal: the work is dropped by now,
    // and the instance waits to lead again.
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop_tx.send(true).unwrap();
    tokio::time::timeout(wait, task)
        .await
        .expect("stopped while the API server still does not answer")
        .unwrap()
        .unwrap();
    fake.set_unresponsive(false);
}
