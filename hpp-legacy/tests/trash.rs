//! The trash of the legacy provisioner (`--trash-retention`): a released volume's directory is
//! moved into `<base>/.hpp-trash` instead of removed, the PV is deleted as before, and a purge
//! removes it once the retention is over; a class's archiveOnDelete still archives.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, SystemTime};

use common::*;
use hpp_fs::trash::{PurgeReason, Settings, TRASH_DIR};
use hpp_legacy::Mode;
use hpp_legacy::fsops::{self, Removed};
use hpp_legacy::provisioner::VolumeOutcome;
use hpp_testkit::FakeApiServer;
use k8s_openapi::api::core::v1::PersistentVolume;

const NAME: &str = "hostpath";
const DAY: Duration = Duration::from_secs(86400);

#[tokio::test]
async fn a_released_volume_goes_to_the_trash_and_is_purged_after_the_retention() {
    let fake = FakeApiServer::new();
    fake.seed(&storage_class("local", NAME, false, "Delete", &[]));
    fake.seed(&storage_class(
        "archive",
        NAME,
        false,
        "Delete",
        &[("archiveOnDelete", "true")],
    ));
    let base = tempfile::tempdir().unwrap();
    let mut cfg = config(Mode::SingleNode, None, Some(base.path()));
    let settings = Settings {
        retention: DAY,
        min_free_percent: 0,
    };
    cfg.trash = Some(settings);
    let p = provisioner(&fake, cfg, base.path());

    let c = seed_claim(
        &fake,
        &claim("apps", "db", "local", NAME, "1Mi", &["ReadWriteOnce"], &[]),
    );
    let name = pv_name(&c);
    p.reconcile_claim(&c).await.unwrap();
    let dir = host_path(&pv(&fake, &name));
    std::fs::write(dir.join("table"), "rows").unwrap();
    bind(&fake, "apps", "db", &name).await;
    release(&fake, "apps", "db", &name);
    let outcome = p.reconcile_volume(&pv(&fake, &name)).await.unwrap();
    let VolumeOutcome::Deleted(Removed::Trashed(entry)) = outcome else {
        panic!("not trashed: {outcome:?}")
    };
    let leaf = dir.file_name().unwrap().to_str().unwrap();
    assert!(entry.starts_with(&format!("{leaf}@")), "{entry}");
    assert!(!dir.exists());
    let trash = base.path().join(TRASH_DIR);
    assert_eq!(
        std::fs::read_to_string(trash.join(&entry).join("table")).unwrap(),
        "rows"
    );
    assert!(
        fake.get::<PersistentVolume>(None, &name).is_none(),
        "the PV is deleted as before"
    );

    // archiveOnDelete still archives.
    let a = seed_claim(
        &fake,
        &claim("apps", "logs", "archive", NAME, "1Mi", &["ReadWriteOnce"], &[]),
    );
    let archived_pv = pv_name(&a);
    p.reconcile_claim(&a).await.unwrap();
    bind(&fake, "apps", "logs", &archived_pv).await;
    release(&fake, "apps", "logs", &archived_pv);
    assert!(matches!(
        p.reconcile_volume(&pv(&fake, &archived_pv)).await.unwrap(),
        VolumeOutcome::Deleted(Removed::Archived(_))
    ));

    // Not due yet: the background purge leaves it.
    p.purge_trash().await;
    assert!(trash.join(&entry).is_dir());
    // A day later it goes, and only it.
    let later = SystemTime::now() + DAY + Duration::from_secs(1);
    let report = fsops::purge_trash(base.path(), settings, later, &hpp_fs::quota::Unlimited).unwrap();
    assert_eq!(report.purged, vec![(entry.clone(), PurgeReason::Age)]);
    assert!(!trash.join(&entry).exists());
    assert!(base.path().join(format!("archived-apps-logs-{archived_pv}")).is_dir());
}

#[test]
fn trashing_refuses_what_a_removal_refuses() {
    let base = tempfile::tempdir().unwrap();
    std::fs::create_dir(base.path().join("real")).unwrap();
    std::os::unix::fs::symlink("/etc", base.path().join("link")).unwrap();
    let now = SystemTime::now();
    assert!(fsops::trash_volume_dir(base.path(), &base.path().join("link"), now).is_err());
    assert!(
        std::fs::symlink_metadata(base.path().join("link")).is_ok(),
        "the link is left alone"
    );
    assert!(fsops::trash_volume_dir(base.path(), std::path::Path::new("/etc"), now).is_err());
    assert_eq!(
        fsops::trash_volume_dir(base.path(), &base.path().join("gone"), now).unwrap(),
        Removed::Missing
    );
    assert!(matches!(
        fsops::trash_volume_dir(base.path(), &base.path().join("real"), now).unwrap(),
        Removed::Trashed(_)
    ));
}
