//! Node loss against the fake API server: claims of a `nodeLossPolicy: Recreate` class pinned
//! to a lost node are released after the grace period, and nothing else is ever touched.
//! Time is the operator's injectable clock, moved by hand.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hpp_api::HostPathProvisioner;
use hpp_api::constants as c;
use hpp_api::v1beta1::{NodeLossReason, NodeLossStatus};
use hpp_reconcile::Pipeline;
use hpp_reconcile::metrics::{Metrics, StorageClassLabels};
use hpp_reconcile::operator::{Context, reconcile};
use hpp_reconcile::reconcilers::node_loss::{
    REASON_CLAIM_RELEASED, REASON_INVALID_NODE_LOSS_POLICY, REASON_NODE_LOSS_CANCELLED, REASON_NODE_LOST,
    REASON_RELEASE_FAILED,
};
use hpp_testkit::{FailureRule, FakeApiServer};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use serde_json::json;
use support::CR;

const T0: &str = "2025-06-01T10:00:00Z";
const APPS: &str = "apps";
const OTHER_DRIVER: &str = "other.csi.example.com";

fn class(name: &str, params: serde_json::Value) -> StorageClass {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "provisioner": c::DRIVER_NAME,
        "volumeBindingMode": "WaitForFirstConsumer",
        "parameters": params,
    }))
    .unwrap()
}

/// A PVC bound to `pv-<name>` and that PV, pinned to `node` (the driver's shape: the
/// external provisioner's finalizer and the PV protection finalizer).
fn seed_volume(fake: &FakeApiServer, name: &str, node: &str, class: &str, driver: &str) {
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": APPS},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class, "volumeName": format!("pv-{name}"),
                 "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound"},
    }))
    .unwrap();
    let pvc = fake.seed(&pvc);
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": format!("pv-{name}"),
                     "finalizers": ["kubernetes.io/pv-protection", c::FINALIZER_EXTERNAL_PROVISIONER]},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": class,
            "csi": {"driver": driver, "volumeHandle": format!("pv-{name}"),
                    "volumeAttributes": {"storagePool": "local"}},
            "claimRef": {"namespace": APPS, "name": name, "uid": pvc.metadata.uid.clone().unwrap()},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": c::TOPOLOGY_KEY, "operator": "In", "values": [node]}]}]}},
        },
        "status": {"phase": "Bound"},
    }))
    .unwrap();
    fake.seed(&pv);
}

/// The cluster of every test: two nodes, a `Recreate` class (5 minutes) and a class without
/// the parameter, and claims: `db-0` (Recreate, node02: the one released), `cache-0` (no
/// policy, node02), `ext-0` (another driver's PV, node02), `db-1` (Recreate, node01).
struct Cluster {
    fake: FakeApiServer,
    clock: Arc<Mutex<Timestamp>>,
}

impl Cluster {
    fn new() -> Self {
        Self::with_recreate_class(json!({"storagePool": "local", "nodeLossPolicy": "Recreate",
                                         "nodeLossGracePeriod": "5m"}))
    }

    fn with_recreate_class(params: serde_json::Value) -> Self {
        let fake = FakeApiServer::new();
        fake.register::<HostPathProvisioner>(false, true);
        for n in ["node01", "node02"] {
            fake.seed(&support::node(n, true));
        }
        fake.seed(&support::example("hostpathprovisioner_cr"));
        fake.seed(&class("hpp-recreate", params));
        fake.seed(&class("hpp-retain", json!({"storagePool": "local"})));
        seed_volume(&fake, "db-0", "node02", "hpp-recreate", c::DRIVER_NAME);
        seed_volume(&fake, "cache-0", "node02", "hpp-retain", c::DRIVER_NAME);
        seed_volume(&fake, "ext-0", "node02", "hpp-recreate", OTHER_DRIVER);
        seed_volume(&fake, "db-1", "node01", "hpp-recreate", c::DRIVER_NAME);
        Cluster {
            fake,
            clock: Arc::new(Mutex::new(T0.parse().unwrap())),
        }
    }

    /// A new operator instance (a fresh process: nothing in memory) reading this clock.
    fn operator(&self) -> Arc<Context> {
        let clock = self.clock.clone();
        let ctx = Context::new(
            self.fake.client(),
            support::config("v1.0.0"),
            Pipeline::standard(),
            Metrics::default(),
        )
        .with_clock(Arc::new(move || *clock.lock().unwrap()))
        .with_backoff(Duration::from_millis(20), Duration::from_millis(200));
        Arc::new(ctx)
    }

    /// Sets the clock to `T0 + secs`.
    fn at(&self, secs: i64) {
        *self.clock.lock().unwrap() = T0.parse::<Timestamp>().unwrap() + SignedDuration::from_secs(secs);
    }

    fn hpp(&self) -> HostPathProvisioner {
        self.fake.get::<HostPathProvisioner>(None, CR).unwrap()
    }

    async fn pass(&self, ctx: &Arc<Context>) {
        reconcile(Arc::new(self.hpp()), ctx.clone()).await.unwrap();
    }

    /// Passes until one writes nothing.
    async fn converge(&self, ctx: &Arc<Context>) {
        for _ in 0..10 {
            self.fake.clear_requests();
            self.pass(ctx).await;
            if self.fake.write_requests().is_empty() {
                return;
            }
        }
        panic!("no steady state: {:#?}", self.fake.write_requests());
    }

    fn node_loss(&self) -> Option<NodeLossStatus> {
        self.hpp().status.and_then(|s| s.node_loss)
    }

    fn claim_exists(&self, name: &str) -> bool {
        self.fake.get::<PersistentVolumeClaim>(Some(APPS), name).is_some()
    }

    fn volume(&self, name: &str) -> Option<PersistentVolume> {
        self.fake.get::<PersistentVolume>(None, &format!("pv-{name}"))
    }

    /// The claim is still there and its PV untouched (not deleting, both finalizers).
    fn untouched(&self, name: &str) -> bool {
        self.claim_exists(name)
            && self.volume(name).is_some_and(|pv| {
                pv.metadata.deletion_timestamp.is_none()
                    && pv.finalizers() == ["kubernetes.io/pv-protection", c::FINALIZER_EXTERNAL_PROVISIONER]
            })
    }

    /// The claim is gone and its PV is being deleted, holding only the PV protection finalizer.
    fn released(&self, name: &str) -> bool {
        !self.claim_exists(name)
            && self.volume(name).is_some_and(|pv| {
                pv.metadata.deletion_timestamp.is_some() && pv.finalizers() == ["kubernetes.io/pv-protection"]
            })
    }

    /// What kube-controller-manager does once the claim is gone: the PV protection finalizer
    /// goes, and with it the PV.
    async fn pv_protection_done(&self, name: &str) {
        let api: kube::Api<PersistentVolume> = kube::Api::all(self.fake.client());
        let patch = json!({"metadata": {"finalizers": null}});
        api.patch(
            &format!("pv-{name}"),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
        assert!(self.volume(name).is_none());
    }

    /// Events with this reason, as (type, regarding kind, regarding name, note).
    fn events(&self, reason: &str) -> Vec<(String, String, String, String)> {
        self.fake
            .list::<Event>()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .map(|e| {
                let r = e.regarding.unwrap_or_default();
                (
                    e.type_.unwrap_or_default(),
                    r.kind.unwrap_or_default(),
                    r.name.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                )
            })
            .collect()
    }

    fn set_out_of_service(&self, node: &str) {
        let mut n = support::node(node, false);
        n.spec = Some(
            serde_json::from_value(json!({"taints": [
            {"key": c::TAINT_OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute"}]}))
            .unwrap(),
        );
        self.fake.seed(&n);
    }
}

fn released_metric(ctx: &Context, storageclass: &str) -> u64 {
    ctx.metrics
        .node_loss_claims_released
        .get_or_create(&StorageClassLabels {
            storageclass: storageclass.into(),
        })
        .get()
}

fn the_others_are_untouched(cluster: &Cluster) {
    for name in ["cache-0", "ext-0", "db-1"] {
        assert!(cluster.untouched(name), "{name} was touched");
    }
}

#[tokio::test]
async fn a_deleted_node_releases_recreate_claims_after_the_grace_period_and_nothing_else() {
    let cluster = Cluster::new();
    let op = cluster.operator();
    cluster.converge(&op).await;
    assert_eq!(cluster.node_loss(), None, "nothing lost, nothing recorded");

    assert!(cluster.fake.remove::<Node>(None, "node02"));
    cluster.pass(&op).await;
    let status = cluster.node_loss().expect("the loss is recorded");
    assert_eq!(status.lost_nodes.len(), 1);
    let lost = &status.lost_nodes[0];
    assert_eq!(
        (
            lost.name.as_str(),
            lost.reason,
            lost.since.as_str(),
            lost.claims_released
        ),
        ("node02", NodeLossReason::NodeDeleted, T0, 0)
    );
    let noticed = cluster.events(REASON_NODE_LOST);
    assert_eq!(noticed.len(), 1, "{noticed:?}");
    assert_eq!(
        (noticed[0].0.as_str(), noticed[0].1.as_str()),
        ("Warning", "HostPathProvisioner")
    );
    assert!(
        noticed[0].3.contains("node02") && noticed[0].3.contains("apps/db-0") && noticed[0].3.contains("10:05:00"),
        "{noticed:?}"
    );
    assert!(cluster.untouched("db-0"), "the grace period has only started");

    // Grace not over: nothing deleted, and a pass with nothing new writes nothing.
    cluster.at(299);
    cluster.fake.clear_requests();
    cluster.pass(&op).await;
    assert!(cluster.untouched("db-0"));
    assert!(
        cluster.fake.write_requests().is_empty(),
        "{:#?}",
        cluster.fake.write_requests()
    );
    assert_eq!(cluster.events(REASON_NODE_LOST).len(), 1, "the loss is announced once");

    // Grace over: the claim and its PV go, with Events on both the claim and the CR.
    cluster.at(300);
    cluster.pass(&op).await;
    assert!(cluster.released("db-0"));
    the_others_are_untouched(&cluster);
    let released = cluster.events(REASON_CLAIM_RELEASED);
    let on: Vec<(&str, &str, &str)> = released
        .iter()
        .map(|(t, k, n, _)| (t.as_str(), k.as_str(), n.as_str()))
        .collect();
    assert!(
        on.contains(&("Warning", "PersistentVolumeClaim", "db-0")),
        "{released:?}"
    );
    assert!(on.contains(&("Warning", "HostPathProvisioner", CR)), "{released:?}");
    for (_, _, _, note) in &released {
        assert!(
            note.contains("node02") && note.contains("pv-db-0") && note.contains("Recreate"),
            "{note}"
        );
    }
    assert_eq!(released_metric(&op, "hpp-recreate"), 1);
    assert_eq!(released_metric(&op, "hpp-retain"), 0);
    let status = cluster.node_loss().unwrap();
    assert_eq!(status.claims_released, 1);
    assert_eq!(status.lost_nodes[0].claims_released, 1, "listed until its PV is gone");

    // Another pass changes nothing; once the PV is gone the loss is resolved, the total stays.
    cluster.pass(&op).await;
    assert_eq!(cluster.events(REASON_CLAIM_RELEASED).len(), 2);
    cluster.pv_protection_done("db-0").await;
    cluster.pass(&op).await;
    let status = cluster.node_loss().unwrap();
    assert_eq!((status.claims_released, status.lost_nodes.len()), (1, 0));
    the_others_are_untouched(&cluster);
    assert_eq!(released_metric(&op, "hpp-recreate"), 1);
}

#[tokio::test]
async fn an_out_of_service_taint_is_a_loss() {
    let cluster = Cluster::new();
    let op = cluster.operator();
    cluster.converge(&op).await;
    cluster.set_out_of_service("node02");
    cluster.pass(&op).await;
    let status = cluster.node_loss().unwrap();
    assert_eq!(status.lost_nodes[0].reason, NodeLossReason::OutOfService);
    assert!(cluster.events(REASON_NODE_LOST)[0].3.contains("out-of-service"));
    cluster.at(300);
    cluster.pass(&op).await;
    assert!(cluster.released("db-0"));
    the_others_are_untouched(&cluster);
}

#[tokio::test]
async fn a_node_back_in_time_cancels_the_loss() {
    let cluster = Cluster::new();
    let op = cluster.operator();
    cluster.converge(&op).await;
    cluster.fake.remove::<Node>(None, "node02");
    cluster.pass(&op).await;
    assert!(cluster.node_loss().is_some());
    cluster.at(120);
    cluster.fake.seed(&support::node("node02", true));
    cluster.pass(&op).await;
    assert_eq!(cluster.node_loss(), None, "nothing left to report");
    let back = cluster.events(REASON_NODE_LOSS_CANCELLED);
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!(back[0].0, "Normal");
    assert!(back[0].3.contains("node02"), "{back:?}");
    // Long after the old deadline: still nothing released.
    cluster.at(3600);
    cluster.pass(&op).await;
    assert!(cluster.untouched("db-0"));
    the_others_are_untouched(&cluster);
    assert_eq!(released_metric(&op, "hpp-recreate"), 0);
}

#[tokio::test]
async fn a_restarted_operator_keeps_the_original_deadline() {
    let cluster = Cluster::new();
    let first = cluster.operator();
    cluster.converge(&first).await;
    cluster.fake.remove::<Node>(None, "node02");
    cluster.pass(&first).await;
    drop(first);

    // A new operator instance three minutes later: the deadline is T0 + 5m, not now + 5m.
    cluster.at(180);
    let second = cluster.operator();
    cluster.pass(&second).await;
    assert_eq!(cluster.node_loss().unwrap().lost_nodes[0].since, T0);
    assert!(cluster.untouched("db-0"));
    assert_eq!(cluster.events(REASON_NODE_LOST).len(), 1, "not announced again");
    cluster.at(300);
    cluster.pass(&second).await;
    assert!(cluster.released("db-0"), "released at the original deadline");
    the_others_are_untouched(&cluster);
    assert_eq!(released_metric(&second, "hpp-recreate"), 1);
}

#[tokio::test]
async fn a_cluster_without_recreate_classes_records_nothing() {
    let cluster = Cluster::with_recreate_class(json!({"storagePool": "local", "nodeLossPolicy": "Retain"}));
    let op = cluster.operator();
    cluster.converge(&op).await;
    cluster.fake.remove::<Node>(None, "node02");
    cluster.at(86_400);
    cluster.converge(&op).await;
    assert_eq!(cluster.node_loss(), None);
    assert!(cluster.events(REASON_NODE_LOST).is_empty());
    for name in ["db-0", "cache-0", "ext-0", "db-1"] {
        assert!(cluster.untouched(name), "{name}");
    }
    let deletes: Vec<_> = cluster
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.method == http::Method::DELETE)
        .collect();
    assert!(deletes.is_empty(), "{deletes:#?}");
}

#[tokio::test]
async fn an_invalid_policy_is_reported_on_the_class_and_treated_as_retain() {
    let cluster = Cluster::with_recreate_class(json!({"storagePool": "local", "nodeLossPolicy": "recreate"}));
    let op = cluster.operator();
    cluster.converge(&op).await;
    let warned = cluster.events(REASON_INVALID_NODE_LOSS_POLICY);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(
        (warned[0].1.as_str(), warned[0].2.as_str()),
        ("StorageClass", "hpp-recreate")
    );
    assert!(
        warned[0].3.contains("\"recreate\"") && warned[0].3.contains("Retain"),
        "{warned:?}"
    );
    cluster.fake.remove::<Node>(None, "node02");
    cluster.at(86_400);
    cluster.converge(&op).await;
    assert!(cluster.untouched("db-0"));
    assert_eq!(cluster.node_loss(), None);
    assert_eq!(
        cluster.events(REASON_INVALID_NODE_LOSS_POLICY).len(),
        1,
        "once while it lasts"
    );
}

#[tokio::test]
async fn a_newer_claim_of_the_same_name_is_never_deleted() {
    let cluster = Cluster::new();
    let op = cluster.operator();
    cluster.converge(&op).await;
    cluster.fake.remove::<Node>(None, "node02");
    cluster.pass(&op).await;
    // Someone deleted the claim meanwhile and a new one took its name (a new uid).
    assert!(cluster.fake.remove::<PersistentVolumeClaim>(Some(APPS), "db-0"));
    let newer: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "db-0", "namespace": APPS},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "hpp-recreate",
                 "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    let newer = cluster.fake.seed(&newer);
    cluster.at(300);
    cluster.pass(&op).await;
    let still = cluster.fake.get::<PersistentVolumeClaim>(Some(APPS), "db-0").unwrap();
    assert_eq!(still.metadata.uid, newer.metadata.uid, "the new claim is kept");
    let pv = cluster.volume("db-0").unwrap();
    assert!(pv.metadata.deletion_timestamp.is_some(), "the old claim's PV goes");
    let on_claims: Vec<_> = cluster
        .events(REASON_CLAIM_RELEASED)
        .into_iter()
        .filter(|e| e.1 == "PersistentVolumeClaim")
        .collect();
    assert!(
        on_claims.is_empty(),
        "no Event on a claim that was not deleted: {on_claims:?}"
    );
}

#[tokio::test]
async fn a_failed_release_is_reported_and_retried() {
    let cluster = Cluster::new();
    let op = cluster.operator();
    cluster.converge(&op).await;
    cluster.fake.remove::<Node>(None, "node02");
    cluster.pass(&op).await;
    cluster.fake.fail_requests(
        FailureRule::new(403)
            .method(http::Method::DELETE)
            .path_contains("/persistentvolumeclaims/db-0"),
    );
    cluster.at(300);
    cluster.pass(&op).await;
    assert!(cluster.untouched("db-0"), "the PV is not deleted without its claim");
    let failed = cluster.events(REASON_RELEASE_FAILED);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].3.contains("apps/db-0"), "{failed:?}");
    assert_eq!(released_metric(&op, "hpp-recreate"), 0);
    assert_eq!(cluster.node_loss().unwrap().claims_released, 0);
    cluster.fake.clear_failures();
    cluster.pass(&op).await;
    assert!(cluster.released("db-0"));
    assert_eq!(released_metric(&op, "hpp-recreate"), 1);
    assert_eq!(
        cluster.events(REASON_RELEASE_FAILED).len(),
        1,
        "reported once while it lasted"
    );
}

/// With the controller running (PV index fed by the watch, the requeue at the deadline), a
/// deleted node's Recreate claims go once the grace period ends, and nothing else does.
#[tokio::test]
async fn the_controller_releases_at_the_deadline_on_its_own() {
    const PATIENCE: Duration = Duration::from_secs(20);
    let cluster = Cluster::with_recreate_class(json!({"storagePool": "local", "nodeLossPolicy": "Recreate",
                                                        "nodeLossGracePeriod": "1s"}));
    let ctx = Arc::new(
        Context::new(
            cluster.fake.client(),
            support::config("v1.0.0"),
            Pipeline::standard(),
            Metrics::default(),
        )
        .with_backoff(Duration::from_millis(20), Duration::from_millis(200)),
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(hpp_reconcile::controller::run(ctx.clone(), async move {
        let _ = stop_rx.await;
    }));
    let fake = cluster.fake.clone();
    tokio::time::timeout(
        PATIENCE,
        fake.wait_until(|f| {
            f.get::<k8s_openapi::api::apps::v1::DaemonSet>(Some(support::NS), "hostpath-provisioner-csi")
                .is_some()
        }),
    )
    .await
    .expect("the operator deployed the driver");
    assert!(cluster.fake.set_status::<k8s_openapi::api::apps::v1::DaemonSet>(
        Some(support::NS),
        "hostpath-provisioner-csi",
        json!({"observedGeneration": 1, "numberReady": 2, "desiredNumberScheduled": 2, "numberAvailable": 2,
               "updatedNumberScheduled": 2}),
    ));
    let available = |f: &FakeApiServer| {
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
    // From here on only the node's deletion (and then the grace period's requeue) can start
    // a pass that releases the claim.
    assert!(cluster.fake.remove::<Node>(None, "node02"));
    tokio::time::timeout(
        PATIENCE,
        fake.wait_until(|f| f.get::<PersistentVolumeClaim>(Some(APPS), "db-0").is_none()),
    )
    .await
    .expect("the claim is released after its grace period");
    tokio::time::timeout(
        PATIENCE,
        fake.wait_until(|f| {
            f.get::<PersistentVolume>(None, "pv-db-0")
                .is_some_and(|pv| pv.finalizers() == ["kubernetes.io/pv-protection"])
        }),
    )
    .await
    .expect("the provisioner's finalizer is removed");
    the_others_are_untouched(&cluster);
    assert!(ctx.pipeline.indexes()[0].2.is_ready(), "the index was fed by the watch");
    let _ = stop_tx.send(());
    tokio::time::timeout(PATIENCE, controller).await.unwrap().unwrap();
}
