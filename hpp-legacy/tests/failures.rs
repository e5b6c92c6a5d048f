//! API failures mid-operation leave no debris and are retried to completion; the watch loop
//! survives an API server outage.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use hpp_legacy::Mode;
use hpp_legacy::fsops::Removed;
use hpp_legacy::provisioner::{ClaimOutcome, VolumeOutcome};
use hpp_testkit::{FailureRule, FakeApiServer};
use k8s_openapi::api::core::v1::PersistentVolume;

const NAME: &str = "hostpath";

fn entries(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

/// The first PV create fails with `status`; then `dirs_left` directories remain, no PV exists,
/// and the retry provisions the claim with its directory.
async fn failed_pv_create_then_retry(status: u16, dirs_left: usize, why: &str) {
    let fake = FakeApiServer::new();
    fake.seed(&storage_class("local", NAME, false, "Delete", &[]));
    let base = tempfile::tempdir().unwrap();
    let p = provisioner(&fake, config(Mode::SingleNode, None, Some(base.path())), base.path());
    let c = seed_claim(&fake, &claim("ns", "c", "local", NAME, "1Mi", &["ReadWriteOnce"], &[]));
    fake.fail_requests(
        FailureRule::new(status)
            .method(http::Method::POST)
            .path_contains("/persistentvolumes")
            .times(1),
    );
    let err = p.reconcile_claim(&c).await.unwrap_err();
    assert_eq!(err.category(), "kube");
    assert_eq!(entries(base.path()), dirs_left, "{why}");
    // The API server's refusal (4xx) is the user's to see on the claim; its outage (5xx) is not.
    let told = events_for(&fake, "c", "ProvisioningFailed");
    assert_eq!(told.len(), usize::from(status < 500), "{told:?}");
    assert!(fake.list::<PersistentVolume>().is_empty());
    assert_eq!(
        p.reconcile_claim(&c).await.unwrap(),
        ClaimOutcome::Provisioned(pv_name(&c))
    );
    assert!(host_path(&pv(&fake, &pv_name(&c))).is_dir());
}

#[tokio::test]
async fn a_rejected_pv_create_removes_the_new_directory_and_retry_succeeds() {
    failed_pv_create_then_retry(422, 0, "the directory of the rejected attempt is gone").await;
}

#[tokio::test]
async fn a_pv_create_that_may_have_been_stored_keeps_the_directory() {
    // A 5xx (or a timeout) does not say the PV was not stored: removing the directory could
    // leave a PV pointing at nothing, which no pod could ever mount.
    failed_pv_create_then_retry(500, 1, "the directory stays for the PV that may exist").await;
}

#[tokio::test]
async fn api_outage_creates_nothing() {
    let fake = FakeApiServer::new();
    fake.seed(&storage_class("local", NAME, false, "Delete", &[]));
    let base = tempfile::tempdir().unwrap();
    let p = provisioner(&fake, config(Mode::SingleNode, None, Some(base.path())), base.path());
    let c = seed_claim(&fake, &claim("ns", "c", "local", NAME, "1Mi", &["ReadWriteOnce"], &[]));
    fake.set_unavailable(true);
    assert!(p.reconcile_claim(&c).await.is_err());
    fake.set_unavailable(false);
    assert_eq!(entries(base.path()), 0);
    assert!(fake.list::<PersistentVolume>().is_empty());
    assert!(
        events_for(&fake, "c", "ProvisioningFailed").is_empty(),
        "API errors are not the user's business"
    );
}

#[tokio::test]
async fn failed_pv_delete_is_finished_on_retry() {
    let fake = FakeApiServer::new();
    fake.seed(&storage_class("local", NAME, false, "Delete", &[]));
    let base = tempfile::tempdir().unwrap();
    let p = provisioner(&fake, config(Mode::SingleNode, None, Some(base.path())), base.path());
    let c = seed_claim(&fake, &claim("ns", "c", "local", NAME, "1Mi", &["ReadWriteOnce"], &[]));
    let name = pv_name(&c);
    p.reconcile_claim(&c).await.unwrap();
    bind(&fake, "ns", "c", &name).await;
    release(&fake, "ns", "c", &name);
    fake.fail_requests(
        FailureRule::new(503)
            .method(http::Method::DELETE)
            .path_contains("/persistentvolumes/")
            .times(1),
    );
    assert!(p.reconcile_volume(&pv(&fake, &name)).await.is_err());
    assert_eq!(entries(base.path()), 0, "the directory went before the API call failed");
    assert_eq!(
        p.reconcile_volume(&pv(&fake, &name)).await.unwrap(),
        VolumeOutcome::Deleted(Removed::Missing)
    );
    assert!(fake.get::<PersistentVolume>(None, &name).is_none());
}

#[tokio::test]
async fn watch_loop_recovers_after_an_outage() {
    let fake = FakeApiServer::new();
    fake.seed(&storage_class("local", NAME, false, "Delete", &[]));
    let base = tempfile::tempdir().unwrap();
    let p = Arc::new(provisioner(
        &fake,
        config(Mode::SingleNode, None, Some(base.path())),
        base.path(),
    ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let loops = tokio::spawn(hpp_legacy::controller::run_controllers(p, stop_rx));
    let first = seed_claim(
        &fake,
        &claim("ns", "before", "local", NAME, "1Mi", &["ReadWriteOnce"], &[]),
    );
    let first_pv = pv_name(&first);
    tokio::time::timeout(
        Duration::from_secs(120),
        fake.wait_until(|f| f.get::<PersistentVolume>(None, &first_pv).is_some()),
    )
    .await
    .expect("provisioned before the outage");
    fake.set_unavailable(true);
    let second = seed_claim(
        &fake,
        &claim("ns", "during", "local", NAME, "1Mi", &["ReadWriteOnce"], &[]),
    );
    fake.set_unavailable(false);
    let second_pv = pv_name(&second);
    tokio::time::timeout(
        Duration::from_secs(120),
        fake.wait_until(|f| f.get::<PersistentVolume>(None, &second_pv).is_some()),
    )
    .await
    .expect("provisioned after the outage");
    assert_eq!(fake.list::<PersistentVolume>().len(), 2);
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(120), loops)
        .await
        .unwrap()
        .unwrap();
}
