//! End to end in KubeVirt legacy mode against the fake API server: node matching, hostname
//! label affinity, oversize and block refusals with Events, deletion by the owning node only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use hpp_api::constants::{
    ANNOTATION_PROVISION_ON_NODE, ANNOTATION_PROVISIONED_BY, ANNOTATION_PROVISIONER_IDENTITY, ANNOTATION_SELECTED_NODE,
    LEGACY_PROVISIONER_NAME as KV,
};
use hpp_legacy::Mode;
use hpp_legacy::decision::{IgnoreReason, RefusalReason};
use hpp_legacy::fsops::Removed;
use hpp_legacy::provisioner::{ClaimOutcome, VolumeOutcome};
use hpp_testkit::FakeApiServer;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

fn setup(fake: &FakeApiServer, wffc: bool) {
    fake.seed(&storage_class("hpp", KV, wffc, "Delete", &[]));
    fake.seed(&node("node-a", "host-a.example.com"));
    fake.seed(&node("node-b", "host-b.example.com"));
}

#[tokio::test]
async fn provision_on_named_node_bind_release_delete() {
    let fake = FakeApiServer::new();
    setup(&fake, false);
    let disk = Tmpfs::new("64m");
    let cfg = config(Mode::Kubevirt, Some("node-a"), Some(disk.path()));
    let (a, registry) = provisioner_with_registry(&fake, cfg, disk.path(), "node-a");
    let b = provisioner(
        &fake,
        config(Mode::Kubevirt, Some("node-b"), Some(disk.path())),
        disk.path(),
    );
    let c = seed_claim(
        &fake,
        &claim(
            "vm",
            "disk0",
            "hpp",
            KV,
            "10Mi",
            &["ReadWriteOnce"],
            &[(ANNOTATION_PROVISION_ON_NODE, "node-a")],
        ),
    );
    let name = pv_name(&c);

    assert_eq!(
        b.reconcile_claim(&c).await.unwrap(),
        ClaimOutcome::Ignored(IgnoreReason::OtherNode)
    );
    assert_eq!(
        a.reconcile_claim(&c).await.unwrap(),
        ClaimOutcome::Provisioned(name.clone())
    );
    // A second look (e.g. after a restart) does not create anything twice.
    assert_eq!(
        a.reconcile_claim(&c).await.unwrap(),
        ClaimOutcome::AlreadyExists(name.clone())
    );

    let pv = pv(&fake, &name);
    let ann = pv.metadata.annotations.clone().unwrap();
    assert_eq!(ann[ANNOTATION_PROVISIONED_BY], KV);
    assert_eq!(ann[ANNOTATION_PROVISIONER_IDENTITY], KV);
    assert_eq!(ann[ANNOTATION_PROVISION_ON_NODE], "node-a");
    let spec = pv.spec.clone().unwrap();
    let term = &spec.node_affinity.unwrap().required.unwrap().node_selector_terms[0];
    let values = term.match_expressions.as_ref().unwrap()[0].values.clone().unwrap();
    assert_eq!(
        values,
        vec!["host-a.example.com"],
        "affinity uses the hostname label, not the node name"
    );
    assert_eq!(spec.storage_class_name.as_deref(), Some("hpp"));
    assert_eq!(spec.access_modes.unwrap(), vec!["ReadWriteOnce"]);
    assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Delete"));
    let dir = host_path(&pv);
    assert_eq!(dir, disk.path().join(&name));
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o777);
    assert_eq!(events_for(&fake, "disk0", "ProvisioningSucceeded").len(), 1);

    bind(&fake, "vm", "disk0", &name).await;
    std::fs::write(dir.join("disk.img"), b"data").unwrap();
    let bound = fake.get::<PersistentVolume>(None, &name).unwrap();
    assert_eq!(
        a.reconcile_volume(&bound).await.unwrap(),
        VolumeOutcome::Ignored("not released")
    );

    release(&fake, "vm", "disk0", &name);
    let released = fake.get::<PersistentVolume>(None, &name).unwrap();
    assert_eq!(
        b.reconcile_volume(&released).await.unwrap(),
        VolumeOutcome::Ignored("provisioned on another node")
    );
    assert!(dir.exists());
    assert_eq!(
        a.reconcile_volume(&released).await.unwrap(),
        VolumeOutcome::Deleted(Removed::Deleted)
    );
    assert!(!dir.exists());
    assert!(fake.get::<PersistentVolume>(None, &name).is_none());
    let text = metrics_text(&registry);
    assert!(
        text.contains("hpp_provisioner_volumes_provisioned_total{mode=\"kubevirt\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("hpp_provisioner_volumes_deleted_total{action=\"deleted\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("hpp_provisioner_operation_duration_seconds_count{operation=\"delete\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn wait_for_first_consumer_uses_selected_node_and_naming_prefix() {
    let fake = FakeApiServer::new();
    setup(&fake, true);
    let disk = tempfile::tempdir().unwrap();
    let mut cfg = config(Mode::Kubevirt, Some("node-b"), Some(disk.path()));
    cfg.use_naming_prefix = true;
    let b = provisioner(&fake, cfg, disk.path());
    let waiting = seed_claim(&fake, &claim("ns", "early", "hpp", KV, "1Mi", &["ReadWriteOnce"], &[]));
    assert_eq!(
        b.reconcile_claim(&waiting).await.unwrap(),
        ClaimOutcome::Ignored(IgnoreReason::NoNodeYet)
    );
    let elsewhere = seed_claim(
        &fake,
        &claim(
            "ns",
            "elsewhere",
            "hpp",
            KV,
            "1Mi",
            &["ReadWriteOnce"],
            &[(ANNOTATION_SELECTED_NODE, "node-a")],
        ),
    );
    assert_eq!(
        b.reconcile_claim(&elsewhere).await.unwrap(),
        ClaimOutcome::Ignored(IgnoreReason::OtherNode)
    );
    let here = seed_claim(
        &fake,
        &claim(
            "ns",
            "here",
            "hpp",
            KV,
            "1Mi",
            &["ReadWriteOnce"],
            &[(ANNOTATION_SELECTED_NODE, "node-b")],
        ),
    );
    let name = pv_name(&here);
    assert_eq!(
        b.reconcile_claim(&here).await.unwrap(),
        ClaimOutcome::Provisioned(name.clone())
    );
    assert_eq!(host_path(&pv(&fake, &name)), disk.path().join(format!("here-{name}")));
    assert_eq!(fake.list::<PersistentVolume>().len(), 1);
}

#[tokio::test]
async fn oversize_and_block_claims_are_refused_with_events() {
    let fake = FakeApiServer::new();
    setup(&fake, false);
    let disk = Tmpfs::new("16m");
    let a = provisioner(
        &fake,
        config(Mode::Kubevirt, Some("node-a"), Some(disk.path())),
        disk.path(),
    );
    let on_a = [(ANNOTATION_PROVISION_ON_NODE, "node-a")];
    let big = seed_claim(&fake, &claim("ns", "big", "hpp", KV, "1Gi", &["ReadWriteOnce"], &on_a));
    assert_eq!(
        a.reconcile_claim(&big).await.unwrap(),
        ClaimOutcome::Refused(RefusalReason::TooLarge)
    );
    let ev = refusals_for(&fake, "big", "RequestTooLarge");
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].type_.as_deref(), Some("Warning"));
    assert!(ev[0].note.as_deref().unwrap().contains("filesystem holds only"));

    let mut block = claim("ns", "raw", "hpp", KV, "1Mi", &["ReadWriteOnce"], &on_a);
    block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    let block = seed_claim(&fake, &block);
    assert_eq!(
        a.reconcile_claim(&block).await.unwrap(),
        ClaimOutcome::Refused(RefusalReason::BlockMode)
    );
    let ev = refusals_for(&fake, "raw", "BlockModeNotSupported");
    assert!(
        ev[0]
            .note
            .as_deref()
            .unwrap()
            .contains("volumeMode Block is not supported")
    );

    assert!(fake.list::<PersistentVolume>().is_empty());
    assert_eq!(
        std::fs::read_dir(disk.path()).unwrap().count(),
        0,
        "no directory for refused claims"
    );
}

#[tokio::test]
async fn node_without_hostname_label_is_refused() {
    let fake = FakeApiServer::new();
    fake.seed(&storage_class("hpp", KV, false, "Delete", &[]));
    let mut bare = node("node-a", "x");
    bare.metadata.labels = None;
    fake.seed(&bare);
    let disk = tempfile::tempdir().unwrap();
    let a = provisioner(
        &fake,
        config(Mode::Kubevirt, Some("node-a"), Some(disk.path())),
        disk.path(),
    );
    let c = seed_claim(
        &fake,
        &claim(
            "ns",
            "c",
            "hpp",
            KV,
            "1Mi",
            &["ReadWriteOnce"],
            &[(ANNOTATION_PROVISION_ON_NODE, "node-a")],
        ),
    );
    assert_eq!(
        a.reconcile_claim(&c).await.unwrap(),
        ClaimOutcome::Refused(RefusalReason::NodeUnknown)
    );
    assert_eq!(refusals_for(&fake, "c", "NodeUnknown").len(), 1);
}

#[tokio::test]
async fn watch_loop_provisions_and_cleans_up() {
    let fake = FakeApiServer::new();
    setup(&fake, false);
    let disk = tempfile::tempdir().unwrap();
    let a = Arc::new(provisioner(
        &fake,
        config(Mode::Kubevirt, Some("node-a"), Some(disk.path())),
        disk.path(),
    ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let loops = tokio::spawn(hpp_legacy::controller::run_controllers(a, stop_rx));
    let c = seed_claim(
        &fake,
        &claim(
            "ns",
            "w",
            "hpp",
            KV,
            "1Mi",
            &["ReadWriteOnce"],
            &[(ANNOTATION_PROVISION_ON_NODE, "node-a")],
        ),
    );
    let name = pv_name(&c);
    tokio::time::timeout(
        Duration::from_secs(120),
        fake.wait_until(|f| f.get::<PersistentVolume>(None, &name).is_some()),
    )
    .await
    .expect("PV created by the watch loop");
    let dir = host_path(&pv(&fake, &name));
    assert!(dir.is_dir());
    bind(&fake, "ns", "w", &name).await;
    release(&fake, "ns", "w", &name);
    tokio::time::timeout(
        Duration::from_secs(120),
        fake.wait_until(|f| f.get::<PersistentVolume>(None, &name).is_none()),
    )
    .await
    .expect("PV deleted by the watch loop");
    assert!(!dir.exists());
    assert!(fake.get::<PersistentVolumeClaim>(Some("ns"), "w").is_none());
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(120), loops)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn cached_classes_spare_api_calls_for_other_nodes_claims() {
    use k8s_openapi::api::storage::v1::StorageClass;
    use kube::runtime::{reflector, watcher};
    let fake = FakeApiServer::new();
    setup(&fake, false);
    let disk = tempfile::tempdir().unwrap();
    let (store, mut writer) = reflector::store::<StorageClass>();
    // A stale cache entry: the class was re-created since with a template the cache does not know.
    writer.apply_watcher_event(&watcher::Event::Apply(storage_class("hpp", KV, false, "Delete", &[])));
    fake.seed(&storage_class(
        "hpp",
        KV,
        false,
        "Delete",
        &[("pathTemplate", "{namespace}-{pv}")],
    ));
    let b = provisioner(
        &fake,
        config(Mode::Kubevirt, Some("node-b"), Some(disk.path())),
        disk.path(),
    );
    b.set_class_cache(Some(store));
    let class_gets = |f: &FakeApiServer| {
        f.requests()
            .iter()
            .filter(|r| r.method.as_str() == "GET" && r.path.ends_with("/storageclasses/hpp"))
            .count()
    };
    let elsewhere = seed_claim(
        &fake,
        &claim(
            "ns",
            "a",
            "hpp",
            KV,
            "1Mi",
            &["ReadWriteOnce"],
            &[(ANNOTATION_PROVISION_ON_NODE, "node-a")],
        ),
    );
    fake.clear_requests();
    assert_eq!(
        b.reconcile_claim(&elsewhere).await.unwrap(),
        ClaimOutcome::Ignored(IgnoreReason::OtherNode)
    );
    assert_eq!(class_gets(&fake), 0, "another node's claim costs no API call");
    let here = seed_claim(
        &fake,
        &claim(
            "ns",
            "b",
            "hpp",
            KV,
            "1Mi",
            &["ReadWriteOnce"],
            &[(ANNOTATION_PROVISION_ON_NODE, "node-b")],
        ),
    );
    fake.clear_requests();
    assert_eq!(
        b.reconcile_claim(&here).await.unwrap(),
        ClaimOutcome::Provisioned(pv_name(&here))
    );
    assert_eq!(class_gets(&fake), 1, "acting on a claim re-reads its class");
    assert_eq!(
        host_path(&pv(&fake, &pv_name(&here))),
        disk.path().join(format!("ns-{}", pv_name(&here)))
    );
}

#[tokio::test]
async fn an_unmounted_node_local_disk_keeps_the_pv_and_warns_until_it_is_back() {
    // Before: the guard ran only in shared mode, so this delete found no directory, deleted the
    // PV and orphaned the data on the disk that was not mounted.
    let fake = FakeApiServer::new();
    let disk = Tmpfs::new("16m");
    let base = disk.path().to_str().unwrap().to_owned();
    fake.seed(&storage_class(
        "guarded",
        KV,
        false,
        "Delete",
        &[("expectedMount", &base)],
    ));
    fake.seed(&node("node-a", "host-a.example.com"));
    let p = provisioner(
        &fake,
        config(Mode::Kubevirt, Some("node-a"), Some(disk.path())),
        disk.path(),
    );
    let c = seed_claim(
        &fake,
        &claim(
            "vm",
            "disk0",
            "guarded",
            KV,
            "1Mi",
            &["ReadWriteOnce"],
            &[(ANNOTATION_PROVISION_ON_NODE, "node-a")],
        ),
    );
    let name = pv_name(&c);
    assert_eq!(
        p.reconcile_claim(&c).await.unwrap(),
        ClaimOutcome::Provisioned(name.clone())
    );
    bind(&fake, "vm", "disk0", &name).await;
    release(&fake, "vm", "disk0", &name);
    let status = std::process::Command::new("umount").arg(disk.path()).status().unwrap();
    assert!(status.success());
    assert!(matches!(
        p.reconcile_volume(&pv(&fake, &name)).await.unwrap(),
        VolumeOutcome::Refused(_)
    ));
    assert!(fake.get::<PersistentVolume>(None, &name).is_some(), "PV kept");
    let warnings = events_for(&fake, &name, "VolumeFailedDelete");
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].type_.as_deref(), Some("Warning"));
}

/// Issue 13: the PV's capacity is what the claim asked for, spelled as it asked, never the size
/// of the filesystem holding the directory (a 64 MiB tmpfs here).
#[tokio::test]
async fn pv_capacity_is_the_requested_size_not_the_filesystem_size() {
    let fake = FakeApiServer::new();
    setup(&fake, false);
    let disk = Tmpfs::new("64m");
    let a = provisioner(
        &fake,
        config(Mode::Kubevirt, Some("node-a"), Some(disk.path())),
        disk.path(),
    );
    for (claim_name, request) in [("small", "10Mi"), ("odd", "1.5M")] {
        let c = seed_claim(
            &fake,
            &claim(
                "vm",
                claim_name,
                "hpp",
                KV,
                request,
                &["ReadWriteOnce"],
                &[(ANNOTATION_PROVISION_ON_NODE, "node-a")],
            ),
        );
        let name = pv_name(&c);
        assert_eq!(
            a.reconcile_claim(&c).await.unwrap(),
            ClaimOutcome::Provisioned(name.clone())
        );
        let capacity = pv(&fake, &name).spec.unwrap().capacity.unwrap();
        assert_eq!(capacity["storage"].0, request, "capacity of {claim_name}");
    }
}
