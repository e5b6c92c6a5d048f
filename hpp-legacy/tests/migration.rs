//! PVs written by the original provisioners are adopted in place: the new binary deletes (or
//! keeps) them exactly as the original would have, without moving any data.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use std::path::Path;

use common::*;
use hpp_api::constants::{
    ANNOTATION_PROVISION_ON_NODE, ANNOTATION_PROVISIONED_BY, ANNOTATION_PROVISIONER_IDENTITY,
    LEGACY_PROVISIONER_NAME as KV,
};
use hpp_legacy::Mode;
use hpp_legacy::config::ANNOTATION_TORCHBOX_IDENTITY;
use hpp_legacy::fsops::Removed;
use hpp_legacy::provisioner::{ClaimOutcome, VolumeOutcome};
use hpp_testkit::FakeApiServer;
use k8s_openapi::api::core::v1::{HostPathVolumeSource, PersistentVolume, PersistentVolumeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

/// A released PV as an original provisioner left it: no base-dir annotation, untyped hostPath.
fn old_pv(fake: &FakeApiServer, name: &str, class: &str, dir: &Path, annotations: &[(&str, &str)]) -> PersistentVolume {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("data"), "old").unwrap();
    fake.seed(&PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: Some(pairs(annotations)),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            persistent_volume_reclaim_policy: Some("Delete".into()),
            storage_class_name: Some(class.into()),
            host_path: Some(HostPathVolumeSource {
                path: dir.display().to_string(),
                type_: None,
            }),
            ..Default::default()
        }),
        status: None,
    });
    fake.set_status::<PersistentVolume>(None, name, json!({"phase": "Released"}));
    fake.get::<PersistentVolume>(None, name).unwrap()
}

#[tokio::test]
async fn kubevirt_legacy_pvs_are_deleted_by_their_node_only() {
    let fake = FakeApiServer::new();
    let pv_dir = tempfile::tempdir().unwrap();
    let dir = pv_dir.path().join("pvc-old");
    let ann = [
        (ANNOTATION_PROVISIONED_BY, KV),
        (ANNOTATION_PROVISIONER_IDENTITY, KV),
        (ANNOTATION_PROVISION_ON_NODE, "node-a"),
    ];
    let old = old_pv(&fake, "pvc-old", "hostpath-provisioner", &dir, &ann);
    let b = provisioner(
        &fake,
        config(Mode::Kubevirt, Some("node-b"), Some(pv_dir.path())),
        pv_dir.path(),
    );
    assert!(matches!(
        b.reconcile_volume(&old).await.unwrap(),
        VolumeOutcome::Ignored(_)
    ));
    assert!(dir.exists());
    let a = provisioner(
        &fake,
        config(Mode::Kubevirt, Some("node-a"), Some(pv_dir.path())),
        pv_dir.path(),
    );
    assert_eq!(
        a.reconcile_volume(&old).await.unwrap(),
        VolumeOutcome::Deleted(Removed::Deleted)
    );
    assert!(!dir.exists());
    assert!(fake.get::<PersistentVolume>(None, "pvc-old").is_none());
}

#[tokio::test]
async fn single_node_pvs_use_the_node_name_as_identity() {
    let fake = FakeApiServer::new();
    let pv_dir = tempfile::tempdir().unwrap();
    let dir = pv_dir.path().join("default-data-pvc-old");
    let ann = [
        (ANNOTATION_PROVISIONED_BY, "hostpath"),
        (ANNOTATION_PROVISIONER_IDENTITY, "box"),
    ];
    let old = old_pv(&fake, "pvc-old", "hostpath", &dir, &ann);
    let other = provisioner(
        &fake,
        config(Mode::SingleNode, Some("new-box"), Some(pv_dir.path())),
        pv_dir.path(),
    );
    assert!(matches!(
        other.reconcile_volume(&old).await.unwrap(),
        VolumeOutcome::Ignored(_)
    ));
    // After a node rename, the old identity can be accepted explicitly.
    let mut cfg = config(Mode::SingleNode, Some("new-box"), Some(pv_dir.path()));
    cfg.accepted_identities.push("box".into());
    let renamed = provisioner(&fake, cfg, pv_dir.path());
    assert_eq!(
        renamed.reconcile_volume(&old).await.unwrap(),
        VolumeOutcome::Deleted(Removed::Deleted)
    );
    assert!(!dir.exists());
}

#[tokio::test]
async fn torchbox_pvs_and_classes_keep_working() {
    let fake = FakeApiServer::new();
    let fs = Tmpfs::new("16m");
    let base = fs.path().to_str().unwrap().to_owned();
    // An unchanged torchbox.com/hostpath StorageClass (lower-case key, as its docs showed).
    fake.seed(&storage_class(
        "cephfs",
        "torchbox.com/hostpath",
        false,
        "Delete",
        &[("pvdir", &base)],
    ));
    let name = "torchbox.com/hostpath";
    let dir = fs.path().join("pvc-old");
    let old = old_pv(
        &fake,
        "pvc-old",
        "cephfs",
        &dir,
        &[(ANNOTATION_PROVISIONED_BY, name), (ANNOTATION_TORCHBOX_IDENTITY, name)],
    );
    let p = provisioner(&fake, config(Mode::Shared, None, None), fs.path());
    assert_eq!(
        p.reconcile_volume(&old).await.unwrap(),
        VolumeOutcome::Deleted(Removed::Deleted)
    );
    assert!(!dir.exists());
    // New claims on the same class land next to the old volumes, named the same way.
    let c = seed_claim(
        &fake,
        &claim("ns", "new", "cephfs", name, "1Mi", &["ReadWriteMany"], &[]),
    );
    assert_eq!(
        p.reconcile_claim(&c).await.unwrap(),
        ClaimOutcome::Provisioned(pv_name(&c))
    );
    let made = pv(&fake, &pv_name(&c));
    assert_eq!(host_path(&made), fs.path().join(pv_name(&c)));
    assert_eq!(made.metadata.annotations.unwrap()[ANNOTATION_TORCHBOX_IDENTITY], name);
}

#[tokio::test]
async fn cephfs_quota_on_a_non_ceph_filesystem_fails_visibly() {
    let fake = FakeApiServer::new();
    let fs = Tmpfs::new("16m");
    let base = fs.path().to_str().unwrap().to_owned();
    fake.seed(&storage_class(
        "q",
        "torchbox.com/hostpath",
        false,
        "Delete",
        &[("pvDir", &base), ("cephFSQuota", "true")],
    ));
    let p = provisioner(&fake, config(Mode::Shared, None, None), fs.path());
    let c = seed_claim(
        &fake,
        &claim("ns", "q", "q", "torchbox.com/hostpath", "1Mi", &["ReadWriteMany"], &[]),
    );
    assert!(p.reconcile_claim(&c).await.is_err());
    let ev = events_for(&fake, "q", "ProvisioningFailed");
    assert!(
        ev[0].note.as_deref().unwrap().contains("ceph.quota.max_bytes"),
        "{:?}",
        ev[0].note
    );
    assert!(fake.list::<PersistentVolume>().is_empty());
    assert_eq!(std::fs::read_dir(fs.path()).unwrap().count(), 0);
}
