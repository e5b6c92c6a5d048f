//! End to end in single-node (DIY) mode: names from namespace/claim/PV, reclaim policy from the
//! StorageClass or the override, archive-on-delete, template traversal attempts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::*;
use hpp_legacy::decision::RefusalReason;
use hpp_legacy::fsops::Removed;
use hpp_legacy::provisioner::{ClaimOutcome, VolumeOutcome};
use hpp_legacy::{Mode, ReclaimOverride};
use hpp_testkit::FakeApiServer;
use k8s_openapi::api::core::v1::PersistentVolume;

const NAME: &str = "hostpath";

fn only_entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn delete_policy_removes_directory() {
    let fake = FakeApiServer::new();
    fake.seed(&storage_class(
        "local",
        NAME,
        false,
        "Delete",
        &[("uid", "1000"), ("gid", "2000"), ("dirMode", "2770")],
    ));
    fake.seed(&node("box", "box"));
    let base = tempfile::tempdir().unwrap();
    let p = provisioner(
        &fake,
        config(Mode::SingleNode, Some("box"), Some(base.path())),
        base.path(),
    );
    let c = seed_claim(
        &fake,
        &claim("apps", "db", "local", NAME, "1Mi", &["ReadWriteOnce"], &[]),
    );
    let name = pv_name(&c);
    assert_eq!(
        p.reconcile_claim(&c).await.unwrap(),
        ClaimOutcome::Provisioned(name.clone())
    );
    let dir = host_path(&pv(&fake, &name));
    assert_eq!(dir, base.path().join(format!("apps-db-{name}")));
    let md = std::fs::metadata(&dir).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0o2770);
    assert_eq!((md.uid(), md.gid()), (1000, 2000));
    bind(&fake, "apps", "db", &name).await;
    std::fs::create_dir_all(dir.join("sub/deeper")).unwrap();
    std::fs::write(dir.join("sub/deeper/f"), "x").unwrap();
    release(&fake, "apps", "db", &name);
    let released = pv(&fake, &name);
    assert_eq!(
        p.reconcile_volume(&released).await.unwrap(),
        VolumeOutcome::Deleted(Removed::Deleted)
    );
    assert!(only_entries(base.path()).is_empty());
    assert!(fake.get::<PersistentVolume>(None, &name).is_none());
}

#[tokio::test]
async fn retain_from_class_or_override_keeps_directory() {
    for (class_policy, over) in [("Retain", None), ("Delete", Some(ReclaimOverride::Retain))] {
        let fake = FakeApiServer::new();
        fake.seed(&storage_class("local", NAME, false, class_policy, &[]));
        let base = tempfile::tempdir().unwrap();
        let mut cfg = config(Mode::SingleNode, None, Some(base.path()));
        cfg.reclaim_override = over;
        let p = provisioner(&fake, cfg, base.path());
        let c = seed_claim(
            &fake,
            &claim("apps", "keep", "local", NAME, "1Mi", &["ReadWriteOnce"], &[]),
        );
        let name = pv_name(&c);
        p.reconcile_claim(&c).await.unwrap();
        let made = pv(&fake, &name);
        assert_eq!(
            made.spec.as_ref().unwrap().persistent_volume_reclaim_policy.as_deref(),
            Some("Retain")
        );
        assert!(
            made.spec.as_ref().unwrap().node_affinity.is_none(),
            "no node name, no affinity"
        );
        bind(&fake, "apps", "keep", &name).await;
        release(&fake, "apps", "keep", &name);
        let released = pv(&fake, &name);
        assert!(matches!(
            p.reconcile_volume(&released).await.unwrap(),
            VolumeOutcome::Ignored(_)
        ));
        assert!(host_path(&released).is_dir(), "Retain keeps the directory");
        assert!(
            fake.get::<PersistentVolume>(None, &name).is_some(),
            "Retain keeps the PV"
        );
    }
}

#[tokio::test]
async fn archive_on_delete_renames() {
    let fake = FakeApiServer::new();
    fake.seed(&storage_class(
        "local",
        NAME,
        false,
        "Delete",
        &[("archiveOnDelete", "true")],
    ));
    let base = tempfile::tempdir().unwrap();
    let p = provisioner(&fake, config(Mode::SingleNode, None, Some(base.path())), base.path());
    let c = seed_claim(
        &fake,
        &claim("apps", "logs", "local", NAME, "1Mi", &["ReadWriteOnce"], &[]),
    );
    let name = pv_name(&c);
    p.reconcile_claim(&c).await.unwrap();
    let dir = host_path(&pv(&fake, &name));
    std::fs::write(dir.join("app.log"), "keep me").unwrap();
    bind(&fake, "apps", "logs", &name).await;
    release(&fake, "apps", "logs", &name);
    let archived = format!("archived-apps-logs-{name}");
    assert_eq!(
        p.reconcile_volume(&pv(&fake, &name)).await.unwrap(),
        VolumeOutcome::Deleted(Removed::Archived(archived.clone()))
    );
    assert_eq!(
        std::fs::read_to_string(base.path().join(&archived).join("app.log")).unwrap(),
        "keep me"
    );
    assert!(fake.get::<PersistentVolume>(None, &name).is_none());
}

#[tokio::test]
async fn template_traversal_attempts_stay_inside_base() {
    let fake = FakeApiServer::new();
    fake.seed(&storage_class(
        "tpl",
        NAME,
        false,
        "Delete",
        &[(
            "pathTemplate",
            "{namespace}/{label:team}/{annotation:owner}-{claim}-{pv}",
        )],
    ));
    let outer = tempfile::tempdir().unwrap();
    let base = outer.path().join("base");
    std::fs::create_dir(&base).unwrap();
    let p = provisioner(&fake, config(Mode::SingleNode, None, Some(&base)), outer.path());
    let long = "v".repeat(5000);
    let deep = "o/".repeat(300);
    let hostile = [
        ("../../etc", "%2e%2e%2f%2e%2e"),
        ("..", "/etc/passwd"),
        ("a/b/../../..", "x\u{0}y"),
        ("team", long.as_str()),
        (".", deep.as_str()),
    ];
    for (i, (team, owner)) in hostile.iter().enumerate() {
        let mut c = claim(
            "ns",
            &format!("c{i}"),
            "tpl",
            NAME,
            "1Mi",
            &["ReadWriteOnce"],
            &[("owner", owner)],
        );
        c.metadata.labels = Some(pairs(&[("team", team)]));
        let c = seed_claim(&fake, &c);
        let name = pv_name(&c);
        assert_eq!(
            p.reconcile_claim(&c).await.unwrap(),
            ClaimOutcome::Provisioned(name.clone()),
            "case {i}"
        );
        let dir = host_path(&pv(&fake, &name));
        assert!(dir.starts_with(&base), "case {i}: {}", dir.display());
        assert!(dir.components().all(|c| !matches!(c, std::path::Component::ParentDir)));
        assert!(
            std::fs::canonicalize(&dir)
                .unwrap()
                .starts_with(std::fs::canonicalize(&base).unwrap())
        );
    }
    assert_eq!(
        only_entries(outer.path()),
        vec!["base"],
        "nothing escaped the base directory"
    );

    // Hostile literals in the template itself are refused with an Event, and nothing is created.
    for (i, tpl) in ["../{pv}", "/abs/{pv}", "{namespace}/../../{pv}", "{claim}"]
        .iter()
        .enumerate()
    {
        let sc = format!("evil{i}");
        fake.seed(&storage_class(&sc, NAME, false, "Delete", &[("pathTemplate", tpl)]));
        let c = seed_claim(
            &fake,
            &claim("ns", &format!("evil{i}"), &sc, NAME, "1Mi", &["ReadWriteOnce"], &[]),
        );
        assert_eq!(
            p.reconcile_claim(&c).await.unwrap(),
            ClaimOutcome::Refused(RefusalReason::BadTemplate),
            "{tpl}"
        );
        assert_eq!(refusals_for(&fake, &format!("evil{i}"), "UnsafeDirectoryName").len(), 1);
    }
    assert_eq!(only_entries(outer.path()), vec!["base"]);
}

#[tokio::test]
async fn missing_label_and_rwx_are_refused() {
    let fake = FakeApiServer::new();
    fake.seed(&storage_class(
        "tpl",
        NAME,
        false,
        "Delete",
        &[("pathTemplate", "{label:team}/{pv}")],
    ));
    let base = tempfile::tempdir().unwrap();
    let p = provisioner(&fake, config(Mode::SingleNode, None, Some(base.path())), base.path());
    let c = seed_claim(
        &fake,
        &claim("ns", "nolabel", "tpl", NAME, "1Mi", &["ReadWriteOnce"], &[]),
    );
    assert_eq!(
        p.reconcile_claim(&c).await.unwrap(),
        ClaimOutcome::Refused(RefusalReason::BadTemplate)
    );
    let ev = refusals_for(&fake, "nolabel", "UnsafeDirectoryName");
    assert!(ev[0].note.as_deref().unwrap().contains("team"));
    let rwx = seed_claim(&fake, &claim("ns", "rwx", "tpl", NAME, "1Mi", &["ReadWriteMany"], &[]));
    assert_eq!(
        p.reconcile_claim(&rwx).await.unwrap(),
        ClaimOutcome::Refused(RefusalReason::AccessMode)
    );
    assert_eq!(refusals_for(&fake, "rwx", "AccessModeNotSupported").len(), 1);
}

#[tokio::test]
async fn selinux_enforcing_hosts_get_container_file_t_directories() {
    let fake = FakeApiServer::new();
    fake.seed(&storage_class(
        "local",
        NAME,
        false,
        "Delete",
        &[("pathTemplate", "{namespace}/{pv}")],
    ));
    let fs = Tmpfs::new("8m");
    let base = fs.path().join("volumes");
    std::fs::create_dir(&base).unwrap();
    let parent_ctx = b"unconfined_u:object_r:var_lib_t:s0:c1,c2\0";
    rustix::fs::setxattr(&base, "security.selinux", parent_ctx, rustix::fs::XattrFlags::empty()).unwrap();
    let flag = fs.path().join("enforce");
    std::fs::write(&flag, "1\n").unwrap();
    let p = provisioner(&fake, config(Mode::SingleNode, None, Some(&base)), fs.path())
        .with_labeler(hpp_legacy::selinux::Labeler::new(&flag));
    let c = seed_claim(
        &fake,
        &claim("apps", "vm", "local", NAME, "1Mi", &["ReadWriteOnce"], &[]),
    );
    assert_eq!(
        p.reconcile_claim(&c).await.unwrap(),
        ClaimOutcome::Provisioned(pv_name(&c))
    );
    let dir = host_path(&pv(&fake, &pv_name(&c)));
    let mut buf = vec![0u8; 256];
    let n = rustix::fs::getxattr(&dir, "security.selinux", &mut buf[..]).unwrap();
    assert_eq!(&buf[..n], b"system_u:object_r:container_file_t:s0\0");

    // Permissive (or no SELinux at all): no label is written.
    std::fs::write(&flag, "0\n").unwrap();
    let p = provisioner(&fake, config(Mode::SingleNode, None, Some(&base)), fs.path())
        .with_labeler(hpp_legacy::selinux::Labeler::new(&flag));
    let c = seed_claim(
        &fake,
        &claim("apps", "vm2", "local", NAME, "1Mi", &["ReadWriteOnce"], &[]),
    );
    p.reconcile_claim(&c).await.unwrap();
    let dir = host_path(&pv(&fake, &pv_name(&c)));
    assert!(rustix::fs::getxattr(&dir, "security.selinux", &mut buf[..]).is_err());
}

#[tokio::test]
async fn fixing_the_storage_class_unblocks_refused_claims() {
    let fake = FakeApiServer::new();
    fake.seed(&storage_class("local", NAME, false, "Delete", &[("dirmod", "0770")]));
    let base = tempfile::tempdir().unwrap();
    let p = std::sync::Arc::new(provisioner(
        &fake,
        config(Mode::SingleNode, None, Some(base.path())),
        base.path(),
    ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let loops = tokio::spawn(hpp_legacy::controller::run_controllers(p, stop_rx));
    let c = seed_claim(
        &fake,
        &claim("ns", "typo", "local", NAME, "1Mi", &["ReadWriteOnce"], &[]),
    );
    let wait = std::time::Duration::from_secs(120);
    tokio::time::timeout(
        wait,
        fake.wait_until(|f| !refusals_for(f, "typo", "InvalidStorageClassParameters").is_empty()),
    )
    .await
    .expect("refusal reported");
    assert!(fake.list::<PersistentVolume>().is_empty());
    // The admin fixes the class; its watch re-checks the claim (the refusal requeue is 10 min).
    fake.seed(&storage_class("local", NAME, false, "Delete", &[("dirMode", "0770")]));
    let name = pv_name(&c);
    tokio::time::timeout(
        wait,
        fake.wait_until(|f| f.get::<PersistentVolume>(None, &name).is_some()),
    )
    .await
    .expect("provisioned after the class was fixed");
    stop_tx.send(true).unwrap();
    tokio::time::timeout(wait, loops).await.unwrap().unwrap();
}

#[tokio::test]
async fn class_mount_options_stay_off_the_pv_and_the_claim_says_so() {
    let fake = FakeApiServer::new();
    let mut class = storage_class("local", NAME, false, "Delete", &[]);
    class.mount_options = Some(vec!["noatime".into(), "nodev".into()]);
    fake.seed(&class);
    let base = tempfile::tempdir().unwrap();
    let p = provisioner(&fake, config(Mode::SingleNode, None, Some(base.path())), base.path());
    let c = seed_claim(
        &fake,
        &claim("ns", "opts", "local", NAME, "1Mi", &["ReadWriteOnce"], &[]),
    );
    let name = pv_name(&c);
    assert_eq!(
        p.reconcile_claim(&c).await.unwrap(),
        ClaimOutcome::Provisioned(name.clone())
    );
    // The kubelet refuses to mount a hostPath PV that carries mount options.
    assert_eq!(pv(&fake, &name).spec.unwrap().mount_options, None);
    let warned = events_for(&fake, "opts", "MountOptionsIgnored");
    assert_eq!(warned.len(), 1);
    assert!(warned[0].note.as_deref().unwrap().contains("noatime,nodev"));
    // As the provisioner library does, the claim also shows that provisioning started.
    assert_eq!(events_for(&fake, "opts", "Provisioning").len(), 1);
}
