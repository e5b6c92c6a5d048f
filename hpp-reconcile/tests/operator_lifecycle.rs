//! End-to-end: node changes, drift repair (by a pass and through the controller's watches),
//! deletion cleanup and API failures, against the fake API server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod support;

use std::time::Duration;

use hpp_api::HostPathProvisioner;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use support::{CR, Env, NS};

/// Generous bound so a broken controller fails the test instead of hanging it.
const PATIENCE: Duration = Duration::from_secs(60);

fn job_succeeded(env: &Env, name: &str) {
    assert!(env.fake.set_status::<Job>(Some(NS), name, json!({ "succeeded": 1 })));
}

#[tokio::test]
async fn nodes_joining_and_leaving_pvc_template_pools() {
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &["node01", "node02"]);
    env.converge().await;
    // A node joins: its claim and mounter appear.
    env.fake.seed(&support::node("node03", true));
    env.converge().await;
    assert_eq!(
        env.names::<Deployment>(),
        [
            "hpp-pool-local-node01",
            "hpp-pool-local-node02",
            "hpp-pool-local-node03"
        ]
    );
    assert_eq!(env.names::<PersistentVolumeClaim>().len(), 3);
    // node02 stops matching the workload selector: its mounter goes, an unmount Job runs there,
    // its claim (and data) stays.
    let mut n2 = support::node("node02", true);
    n2.metadata.labels = Some([("kubernetes.io/os".to_owned(), "windows".to_owned())].into());
    env.fake.seed(&n2);
    env.converge().await;
    assert_eq!(
        env.names::<Deployment>(),
        ["hpp-pool-local-node01", "hpp-pool-local-node03"]
    );
    assert_eq!(env.names::<Job>(), ["cleanup-pool-local-node02"]);
    let job = env.fake.get::<Job>(Some(NS), "cleanup-pool-local-node02").unwrap();
    let args = job.spec.unwrap().template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    assert_eq!(args[..3], ["--unmount", "--mountPath", "/var/hpvolumes/csi"]);
    assert_eq!(env.names::<PersistentVolumeClaim>().len(), 3);
    job_succeeded(&env, "cleanup-pool-local-node02");
    env.converge().await;
    assert!(env.names::<Job>().is_empty(), "a finished cleanup Job is removed");
    // node03 is deleted from the cluster: no Job can run there, the mounter just goes.
    env.fake.remove::<Node>(None, "node03");
    env.converge().await;
    assert_eq!(env.names::<Deployment>(), ["hpp-pool-local-node01"]);
    assert!(env.names::<Job>().is_empty());
    assert_eq!(
        env.names::<PersistentVolumeClaim>().len(),
        3,
        "claims are never dropped on node changes"
    );
}

#[tokio::test]
async fn drift_is_repaired_in_one_pass() {
    let env = Env::new("hostpathprovisioner_cr", &["node01"]);
    env.converge().await;
    let client = env.fake.client();
    // Someone edits an owned field with another field manager.
    let ds_api: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    let edit = json!({ "spec": { "template": { "spec": { "serviceAccountName": "intruder" } } } });
    ds_api
        .patch(
            "hostpath-provisioner-csi",
            &PatchParams::default(),
            &Patch::Merge(&edit),
        )
        .await
        .unwrap();
    // ... and deletes a cluster-scoped one.
    env.fake.remove::<CSIDriver>(None, "kubevirt.io.hostpath-provisioner");
    env.fake.clear_requests();
    env.pass().await.unwrap();
    let ds = env.fake.get::<DaemonSet>(Some(NS), "hostpath-provisioner-csi").unwrap();
    assert_eq!(
        ds.spec.unwrap().template.spec.unwrap().service_account_name.as_deref(),
        Some("hostpath-provisioner-admin-csi")
    );
    assert!(
        env.fake
            .get::<CSIDriver>(None, "kubevirt.io.hostpath-provisioner")
            .is_some()
    );
    let writes = env.fake.write_requests();
    assert_eq!(writes.len(), 2, "only the two drifted objects are written: {writes:#?}");
    // A label a user adds to an owned object is left alone.
    let label = json!({ "metadata": { "labels": { "team": "storage" } } });
    ds_api
        .patch(
            "hostpath-provisioner-csi",
            &PatchParams::default(),
            &Patch::Merge(&label),
        )
        .await
        .unwrap();
    env.fake.clear_requests();
    env.pass().await.unwrap();
    assert!(env.fake.write_requests().is_empty());
}

#[tokio::test]
async fn deletion_unmounts_then_removes_everything_including_claims() {
    let env = Env::new("hostpathprovisioner_overlay_csi_cr", &["node01", "node02"]);
    env.fake.seed(&support::node("node03", false)); // NotReady: must not block deletion
    env.converge().await;
    assert_eq!(env.names::<Deployment>().len(), 3);
    env.fake.remove::<HostPathProvisioner>(None, CR);
    assert!(env.hpp().metadata.deletion_timestamp.is_some(), "held by the finalizer");
    let err = env.pass().await.unwrap_err();
    assert_eq!(err.category(), "cleanup_pending");
    assert!(env.names::<Deployment>().is_empty(), "mounters are stopped first");
    assert_eq!(
        env.names::<Job>(),
        ["cleanup-pool-nfs-backend-node01", "cleanup-pool-nfs-backend-node02"]
    );
    // Still waiting while a Job on a Ready node runs.
    assert_eq!(env.pass().await.unwrap_err().category(), "cleanup_pending");
    job_succeeded(&env, "cleanup-pool-nfs-backend-node01");
    job_succeeded(&env, "cleanup-pool-nfs-backend-node02");
    env.pass().await.unwrap();
    assert!(
        env.fake.get::<HostPathProvisioner>(None, CR).is_none(),
        "finalizer removed, CR gone"
    );
    assert!(env.names::<Job>().is_empty());
    assert!(
        env.names::<PersistentVolumeClaim>().is_empty(),
        "pool claims are cleaned up (KubeVirt leaked them)"
    );
    assert!(
        env.names::<StorageClass>().is_empty(),
        "overlay class is cleaned up (KubeVirt leaked it)"
    );
    assert!(env.names::<CSIDriver>().is_empty());
    assert!(env.names::<ClusterRole>().is_empty());
    assert!(env.names::<DaemonSet>().is_empty());
}

#[tokio::test]
async fn api_failures_are_reported_and_recovered_without_duplicates() {
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &["node01"]);
    env.pass().await.unwrap(); // finalizer
    env.fake.fail_requests(
        hpp_testkit::FailureRule::new(500)
            .method(http::Method::PATCH)
            .path_contains("/daemonsets/")
            .times(1),
    );
    let err = env.pass().await.unwrap_err();
    assert_eq!(err.category(), "api_unavailable");
    let (status, reason, message) = env.condition("Degraded");
    assert_eq!((status.as_str(), reason.as_deref()), ("True", Some("ReconcileFailed")));
    assert!(
        message
            .unwrap()
            .starts_with("Unable to successfully reconcile: apply apps/DaemonSet")
    );
    // The API server goes away entirely: errors, no panic.
    env.fake.set_unavailable(true);
    let err = env.pass().await.unwrap_err();
    assert_eq!(err.category(), "api_unavailable");
    env.fake.set_unavailable(false);
    env.converge().await;
    assert_eq!(env.names::<DaemonSet>(), ["hostpath-provisioner-csi"]);
    assert_eq!(env.names::<PersistentVolumeClaim>(), ["hpp-pool-local-node01"]);
    assert_eq!(env.names::<Deployment>(), ["hpp-pool-local-node01"]);
    // While deletion waits for cleanup Jobs, the controller polls at the base backoff.
    let err_policy = hpp_reconcile::operator::error_policy(
        std::sync::Arc::new(env.hpp()),
        &hpp_reconcile::Error::CleanupPending("x".into()),
        env.ctx.clone(),
    );
    assert_eq!(
        err_policy,
        kube::runtime::controller::Action::requeue(Duration::from_millis(20))
    );
}

#[tokio::test]
async fn controller_watches_repair_drift_and_survive_an_outage() {
    let env = Env::new("hostpathprovisioner_cr", &["node01"]);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let ctx = env.ctx.clone();
    let controller = tokio::spawn(hpp_reconcile::controller::run(ctx, async move {
        let _ = stop_rx.await;
    }));
    let fake = env.fake.clone();
    tokio::time::timeout(
        PATIENCE,
        fake.wait_until(|f| f.get::<DaemonSet>(Some(NS), "hostpath-provisioner-csi").is_some()),
    )
    .await
    .expect("installed by the controller");
    env.daemonset_ready("hostpath-provisioner-csi", 1);
    let available = |f: &hpp_testkit::FakeApiServer| {
        f.get::<HostPathProvisioner>(None, CR)
            .and_then(|h| h.status)
            .is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Available" && c.status == "True")
            })
    };
    tokio::time::timeout(PATIENCE, fake.wait_until(available))
        .await
        .expect("available");
    // Delete an owned object: the owner-reference watch triggers a reconcile that recreates it.
    env.fake.remove::<ClusterRole>(None, "hostpath-provisioner-admin-csi");
    tokio::time::timeout(
        PATIENCE,
        fake.wait_until(|f| f.get::<ClusterRole>(None, "hostpath-provisioner-admin-csi").is_some()),
    )
    .await
    .expect("drift repaired through the watch");
    // Outage: watches break, the controller keeps running; after it, drift is repaired again.
    env.fake.set_unavailable(true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.fake.set_unavailable(false);
    env.fake.remove::<CSIDriver>(None, "kubevirt.io.hostpath-provisioner");
    tokio::time::timeout(
        PATIENCE,
        fake.wait_until(|f| f.get::<CSIDriver>(None, "kubevirt.io.hostpath-provisioner").is_some()),
    )
    .await
    .expect("repaired after the outage");
    assert!(!controller.is_finished(), "the controller survived the outage");
    assert_eq!(env.fake.list::<ClusterRole>().len(), 1);
    assert_eq!(env.fake.list::<DaemonSet>().len(), 1);
    let _ = stop_tx.send(());
    tokio::time::timeout(PATIENCE, controller)
        .await
        .expect("stops on shutdown")
        .unwrap();
}

#[tokio::test]
async fn controller_follows_nodes_and_pool_claims_through_watches() {
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &["node01"]);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(hpp_reconcile::controller::run(env.ctx.clone(), async move {
        let _ = stop_rx.await;
    }));
    let fake = env.fake.clone();
    let has_deployment =
        |name: &'static str| move |f: &hpp_testkit::FakeApiServer| f.get::<Deployment>(Some(NS), name).is_some();
    tokio::time::timeout(PATIENCE, fake.wait_until(has_deployment("hpp-pool-local-node01")))
        .await
        .expect("installed");
    // A node joins: the node watch (not a resync) brings its mounter.
    env.fake.seed(&support::node("node02", true));
    tokio::time::timeout(PATIENCE, fake.wait_until(has_deployment("hpp-pool-local-node02")))
        .await
        .expect("node02 prepared");
    // A pool claim is deleted: the PVC watch brings it back.
    env.fake
        .remove::<PersistentVolumeClaim>(Some(NS), "hpp-pool-local-node01");
    tokio::time::timeout(
        PATIENCE,
        fake.wait_until(|f| {
            f.get::<PersistentVolumeClaim>(Some(NS), "hpp-pool-local-node01")
                .is_some()
        }),
    )
    .await
    .expect("claim recreated");
    let _ = stop_tx.send(());
    tokio::time::timeout(PATIENCE, controller)
        .await
        .expect("stops")
        .unwrap();
}

#[tokio::test]
async fn steady_state_costs_only_reads() {
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &["node01", "node02", "node03"]);
    env.converge().await;
    env.daemonset_ready("hostpath-provisioner-csi", 3);
    env.bind_claims();
    env.converge().await;
    env.fake.clear_requests();
    for _ in 0..3 {
        env.pass().await.unwrap();
    }
    let requests = env.fake.requests();
    assert!(requests.iter().all(|r| !r.is_write()), "{requests:#?}");
    // Reads per pass without the controller's watch caches (as here, calling `reconcile`
    // directly): the CR list, facts (nodes, mounters, jobs, claims, discovery), one GET per
    // desired object and one LIST per swept kind; bounded, independent of history. With synced
    // caches only discovery remains (`controller_watches::steady_state_reads_come_from_the_watch_caches`).
    let per_pass = requests.len() / 3;
    eprintln!("steady-state pass with 3 nodes: {per_pass} read requests, 0 writes");
    assert!(per_pass < 60, "{per_pass} reads per pass");
}

/// The RWX pool of the overlay example with a custom `overlayClassName`, and a 403 on deleting
/// that class, as the operator's RBAC (delete on `hpp-overlay` only) answers.
async fn custom_overlay_class_whose_delete_is_forbidden() -> Env {
    let env = Env::new("hostpathprovisioner_overlay_csi_cr", &["node01"]);
    let pools = json!({ "spec": { "storagePools": [{
        "name": "nfs-backend", "path": "/nfs-vol", "overlayClassName": "nfs-overlay",
        "pvcTemplate": { "accessModes": ["ReadWriteMany"], "storageClassName": "nfs-csi",
                         "resources": { "requests": { "storage": "10Gi" } } },
    }] } });
    Api::<HostPathProvisioner>::all(env.fake.client())
        .patch(CR, &PatchParams::default(), &Patch::Merge(&pools))
        .await
        .unwrap();
    env.converge().await;
    assert_eq!(env.names::<StorageClass>(), ["nfs-overlay"]);
    // The operator's RBAC as the standard pipeline derives it, enforced: it grants deleting the
    // default overlay class only. The shipped deploy/operator/rbac.yaml is this plus what the
    // process calls besides the pipeline (webhook, TLS profile, leader election Lease), which
    // xtask/tests/deploy_operator_rbac.rs keeps so.
    let rules = hpp_reconcile::OperatorRules::for_pipeline(&hpp_reconcile::Pipeline::standard());
    let rbac = rules.to_yaml("hostpath-provisioner-operator", NS, "");
    env.fake
        .enforce_rbac(hpp_testkit::RbacPolicy::from_yaml(&rbac).unwrap());
    env
}

/// The requests the enforced RBAC refused: the custom overlay class's delete, nothing else.
fn only_the_class_delete_was_denied(env: &Env) {
    let denied = env.fake.denied_requests();
    assert!(!denied.is_empty());
    assert!(
        denied
            .iter()
            .all(|r| r.method == http::Method::DELETE && r.path.ends_with("/storageclasses/nfs-overlay")),
        "{denied:#?}"
    );
}

/// Removing a pool whose custom overlay class the operator may not delete: the sweep logs the
/// 403, leaves the class and warns once, instead of failing every pass.
#[tokio::test]
async fn a_forbidden_overlay_class_delete_leaves_the_class_and_the_pass_succeeds() {
    let env = custom_overlay_class_whose_delete_is_forbidden().await;
    let local = json!({ "spec": { "storagePools": [{ "name": "local", "path": "/var/hpvolumes" }] } });
    Api::<HostPathProvisioner>::all(env.fake.client())
        .patch(CR, &PatchParams::default(), &Patch::Merge(&local))
        .await
        .unwrap();
    env.pass().await.unwrap();
    env.pass().await.unwrap();
    assert_eq!(env.names::<StorageClass>(), ["nfs-overlay"], "left in place");
    assert_eq!(
        env.warnings_published(hpp_reconcile::apply::REASON_DELETE_FORBIDDEN, "nfs-overlay"),
        1,
        "one Warning Event on the class, not one per pass"
    );
    only_the_class_delete_was_denied(&env);
}

/// Deleting the CR with such a class: cleanup leaves the class and the finalizer goes.
#[tokio::test]
async fn a_forbidden_overlay_class_delete_does_not_hold_the_finalizer() {
    let env = custom_overlay_class_whose_delete_is_forbidden().await;
    env.fake.remove::<HostPathProvisioner>(None, CR);
    assert_eq!(env.pass().await.unwrap_err().category(), "cleanup_pending");
    job_succeeded(&env, "cleanup-pool-nfs-backend-node01");
    env.pass().await.unwrap();
    assert!(
        env.fake.get::<HostPathProvisioner>(None, CR).is_none(),
        "finalizer removed, CR gone"
    );
    assert_eq!(env.names::<StorageClass>(), ["nfs-overlay"], "left in place");
    assert_eq!(
        env.warnings_published(hpp_reconcile::apply::REASON_DELETE_FORBIDDEN, "nfs-overlay"),
        1
    );
    only_the_class_delete_was_denied(&env);
}

/// Only StorageClasses may stay: a 403 on deleting anything else still fails the pass.
#[tokio::test]
async fn a_forbidden_delete_of_another_kind_still_fails() {
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &["node01"]);
    env.converge().await;
    env.fake.fail_requests(
        hpp_testkit::FailureRule::new(403)
            .method(http::Method::DELETE)
            .path_contains("/deployments/"),
    );
    env.fake.remove::<HostPathProvisioner>(None, CR);
    assert!(env.pass().await.is_err());
    assert!(env.fake.get::<HostPathProvisioner>(None, CR).is_some(), "still held");
}
