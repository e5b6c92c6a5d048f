//! The controller's watches and caches: a plugged-in step's objects get the same drift repair
//! as the built-in ones, and a steady-state pass reads from the watch caches.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use hpp_reconcile::metrics::Metrics;
use hpp_reconcile::object::Kind;
use hpp_reconcile::operator::Context;
use hpp_reconcile::reconcilers::common::{object_meta, typed_ssa};
use hpp_reconcile::{ClusterFacts, DesiredObject, OperatorConfig, Pipeline, SubReconciler};
use hpp_testkit::FakeApiServer;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use support::{CR, Env, NS};

/// Generous bound so a broken controller fails the test instead of hanging it.
const PATIENCE: Duration = Duration::from_secs(20);

/// A step of an outside team: a ConfigMap (a kind no standard step manages) and a StorageClass.
struct TeamObjects;

#[async_trait]
impl SubReconciler for TeamObjects {
    fn name(&self) -> &str {
        "team-objects"
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        vec![Kind::of::<ConfigMap>(), Kind::of::<StorageClass>()]
    }

    fn desired(
        &self,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        _facts: &ClusterFacts,
    ) -> hpp_reconcile::Result<Vec<DesiredObject>> {
        Ok(vec![
            typed_ssa(&ConfigMap {
                metadata: object_meta("team-settings", Some(&cfg.namespace), cfg, &[], Some(hpp)),
                data: Some([("tier".to_owned(), "gold".to_owned())].into()),
                ..Default::default()
            })?,
            typed_ssa(&StorageClass {
                metadata: object_meta("team-class", None, cfg, &[], Some(hpp)),
                provisioner: hpp_api::constants::DRIVER_NAME.into(),
                ..Default::default()
            })?,
        ])
    }
}

/// The controller running in the background until stopped.
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(env: &support::Env) -> Self {
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(hpp_reconcile::controller::run(env.ctx.clone(), async move {
            let _ = stop_rx.await;
        }));
        Running { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(PATIENCE, self.task).await.unwrap().unwrap();
    }
}

/// Waits for the CSI DaemonSet and `n` pool claims (the pvcTemplate example).
async fn wait_for_claims(env: &support::Env, n: usize) {
    let ds = |f: &FakeApiServer| f.get::<DaemonSet>(Some(NS), "hostpath-provisioner-csi").is_some();
    tokio::time::timeout(PATIENCE, env.fake.wait_until(ds))
        .await
        .expect("installed");
    let claims = |f: &FakeApiServer| f.list::<PersistentVolumeClaim>().len() == n;
    tokio::time::timeout(PATIENCE, env.fake.wait_until(claims))
        .await
        .expect("claims");
}

/// Plays the cluster until the CR is Available: the DaemonSet rolls out on `n` nodes, the
/// claims bind, the `n` mounters roll out.
async fn finish_install(env: &support::Env, n: usize) {
    env.daemonset_ready("hostpath-provisioner-csi", n as i64);
    env.bind_claims();
    tokio::time::timeout(PATIENCE, env.fake.wait_until(|f| mounter_names(f).len() == n))
        .await
        .expect("mounters");
    env.mounters_ready();
    tokio::time::timeout(PATIENCE, env.fake.wait_until(available))
        .await
        .expect("available");
}

/// Waits for the install on `n` nodes, plays it to `Available`, and waits until the operator
/// settles.
async fn installed(env: &support::Env, n: usize) {
    wait_for_claims(env, n).await;
    finish_install(env, n).await;
    settle(env).await;
}

/// The label (key, value) the operator's objects carry, which the sweep selects on.
fn managed_label() -> (String, String) {
    hpp_reconcile::names::managed_selector()
        .split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .unwrap()
}

/// The pool mounter Deployments.
fn mounter_names(f: &FakeApiServer) -> Vec<String> {
    f.list::<k8s_openapi::api::apps::v1::Deployment>()
        .into_iter()
        .filter_map(|d| d.metadata.name)
        .filter(|n| n.starts_with("hpp-pool-"))
        .collect()
}

fn available(f: &FakeApiServer) -> bool {
    f.get::<HostPathProvisioner>(None, CR)
        .and_then(|h| h.status)
        .is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Available" && c.status == "True")
        })
}

#[tokio::test]
async fn objects_of_a_plugged_in_step_are_watched_and_repaired() {
    let env = Env::new("hostpathprovisioner_cr", &["node01"]);
    let pipeline = Pipeline::standard().with(TeamObjects).unwrap();
    let ctx = Context::new(
        env.fake.client(),
        support::config("v1.0.0"),
        pipeline,
        Metrics::default(),
    )
    .with_backoff(Duration::from_millis(20), Duration::from_millis(200));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(hpp_reconcile::controller::run(Arc::new(ctx), async move {
        let _ = stop_rx.await;
    }));
    let fake = env.fake.clone();
    let both = |f: &FakeApiServer| {
        f.get::<ConfigMap>(Some(NS), "team-settings").is_some() && f.get::<StorageClass>(None, "team-class").is_some()
    };
    tokio::time::timeout(PATIENCE, fake.wait_until(both))
        .await
        .expect("the custom step applied");
    env.daemonset_ready("hostpath-provisioner-csi", 1);
    tokio::time::timeout(PATIENCE, fake.wait_until(available))
        .await
        .expect("available");
    // Deleting what the custom step owns, one at a time: the watch on each of its kinds (a
    // ConfigMap no standard step manages, too) brings it back.
    // (Three rounds, so a reconcile still in flight from the install cannot be what repairs it.)
    for _ in 0..3 {
        assert!(env.fake.remove::<ConfigMap>(Some(NS), "team-settings"));
        tokio::time::timeout(PATIENCE, fake.wait_until(both))
            .await
            .expect("the custom step's ConfigMap is repaired through its watch");
    }
    assert!(env.fake.remove::<StorageClass>(None, "team-class"));
    tokio::time::timeout(PATIENCE, fake.wait_until(both))
        .await
        .expect("the custom step's StorageClass is repaired through its watch");
    let _ = stop_tx.send(());
    tokio::time::timeout(PATIENCE, controller).await.unwrap().unwrap();
}

/// Reads of a steady-state pass with the controller's caches synced: without the caches the
/// same pass costs 35 reads (`operator_lifecycle::steady_state_costs_only_reads`); with them,
/// discovery plus one GET for a claim that is not in the labelled cache.
#[tokio::test]
async fn steady_state_reads_come_from_the_watch_caches() {
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &["node01", "node02", "node03"]);
    // A pool claim an older operator created without hpp's labels: not in the (labelled)
    // cache, so the pass must look it up instead of trying to create it again every time.
    let mut unlabelled = support::example("hostpathprovisioner_pvctemplate_cr")
        .spec
        .storage_pools
        .unwrap()[0]
        .pvc_template
        .clone()
        .map(|spec| PersistentVolumeClaim {
            metadata: support::meta("hpp-pool-local-node01"),
            spec: Some(spec),
            ..Default::default()
        })
        .unwrap();
    unlabelled.metadata.namespace = Some(NS.into());
    env.fake.seed(&unlabelled);
    let controller = Running::start(&env);
    wait_for_claims(&env, 3).await;
    finish_install(&env, 3).await;
    // Stop the controller: its stores keep the last state they saw, and no reconcile of its
    // own runs while the passes below are counted.
    controller.stop().await;
    env.converge().await;
    env.fake.clear_requests();
    for _ in 0..3 {
        env.pass().await.unwrap();
    }
    let requests = env.fake.requests();
    assert!(requests.iter().all(|r| !r.is_write()), "{requests:#?}");
    let per_pass = requests.len() / 3;
    eprintln!("steady-state pass with 3 nodes and synced caches: {per_pass} read requests, 0 writes");
    let objects: Vec<String> = requests
        .iter()
        .filter(|r| {
            !r.path.starts_with("/apis/monitoring") && !r.path.starts_with("/apis/security") && r.path != "/apis"
        })
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    let unlabelled_get = format!("GET /api/v1/namespaces/{NS}/persistentvolumeclaims/hpp-pool-local-node01");
    assert_eq!(
        objects,
        vec![unlabelled_get; 3],
        "only the unlabelled claim is read from the API, once per pass"
    );
}

/// The watch caches hold objects trimmed of what no pass reads: a node's image list (tens of
/// kilobytes on a real node) is not kept, while everything placement reads (labels,
/// conditions) and the rest of the status are.
#[tokio::test]
async fn cached_nodes_keep_no_image_list() {
    use k8s_openapi::api::core::v1::Node;
    let env = Env::new("hostpathprovisioner_cr", &[]);
    let mut node = support::node("node01", true);
    let status = node.status.get_or_insert_with(Default::default);
    status.images = Some(vec![k8s_openapi::api::core::v1::ContainerImage {
        names: Some(vec!["registry.example.com/app:v1".into()]),
        size_bytes: Some(1),
    }]);
    status.node_info = Some(k8s_openapi::api::core::v1::NodeSystemInfo {
        kubelet_version: "v1.33.0".into(),
        ..Default::default()
    });
    env.fake.seed(&node);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(hpp_reconcile::controller::run(env.ctx.clone(), async move {
        let _ = stop_rx.await;
    }));
    let kind = Kind::of::<Node>();
    let cached = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(nodes) = env.ctx.cache.list(&kind, "", None)
                && !nodes.is_empty()
            {
                return nodes;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the node cache synced");
    let _ = stop_tx.send(());
    tokio::time::timeout(PATIENCE, controller).await.unwrap().unwrap();
    let node = &cached[0];
    assert!(node.data.pointer("/status/images").is_none(), "{:?}", node.data);
    assert_eq!(
        node.data.pointer("/status/nodeInfo/kubeletVersion"),
        Some(&serde_json::json!("v1.33.0"))
    );
    assert_eq!(
        node.data.pointer("/status/conditions/0/type"),
        Some(&serde_json::json!("Ready"))
    );
    assert_eq!(
        node.metadata.labels.as_ref().unwrap()["kubernetes.io/hostname"],
        "node01"
    );
    assert!(
        env.fake
            .get::<Node>(None, "node01")
            .unwrap()
            .status
            .unwrap()
            .images
            .is_some(),
        "the API still serves the full node"
    );
}

/// The operator's reconcile passes so far (the `hpp_operator_reconcile_total` counter).
fn passes(env: &support::Env) -> u64 {
    use hpp_reconcile::metrics::ResultLabels;
    ["ok", "error"]
        .into_iter()
        .map(|result| env.ctx.metrics.reconciles.get_or_create(&ResultLabels { result }).get())
        .sum()
}

/// Discovery requests (the optional APIs) in the fake's request log.
fn discovery_requests(fake: &FakeApiServer) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.path == "/apis" || r.path.starts_with("/apis/monitoring") || r.path.starts_with("/apis/security"))
        .count()
}

/// A kubelet's heartbeat: the node's status again with a new `lastHeartbeatTime`.
fn heartbeat(fake: &FakeApiServer, name: &str, beat: usize) {
    let node = fake.get::<k8s_openapi::api::core::v1::Node>(None, name).unwrap();
    let mut status = serde_json::to_value(node.status).unwrap();
    for c in status["conditions"].as_array_mut().unwrap() {
        c["lastHeartbeatTime"] = serde_json::json!(format!("2026-01-01T00:00:{:02}Z", beat % 60));
    }
    assert!(fake.set_status::<k8s_openapi::api::core::v1::Node>(None, name, status));
}

/// Scale (issue 31): once converged, a cluster where nothing relevant changes runs no pass, so
/// kubelet heartbeats on every node cost nothing; discovery is asked once at start-up and
/// remembered, so a pass a real change triggers (a mounter deleted) asks the API server for
/// nothing but what it writes.
#[tokio::test]
async fn a_quiet_cluster_runs_no_passes_and_discovery_is_remembered() {
    let nodes = ["node01", "node02", "node03"];
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &nodes);
    let controller = Running::start(&env);
    wait_for_claims(&env, 3).await;
    // A new claim costs its create only: the synced cache says it is not there.
    let claim_reads: Vec<String> = env
        .fake
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.contains("/persistentvolumeclaims/"))
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(claim_reads, Vec::<String>::new());
    finish_install(&env, 3).await;
    settle(&env).await;

    let before = passes(&env);
    env.fake.clear_requests();
    for beat in 0..5 {
        for node in nodes {
            heartbeat(&env.fake, node, beat);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(passes(&env), before, "heartbeats are not a change");
    assert!(env.fake.requests().is_empty(), "{:#?}", env.fake.requests());

    delete_mounter_and_wait(&env, 0).await;
    assert!(passes(&env) > before, "the deletion ran a pass");
    assert_eq!(discovery_requests(&env.fake), 0, "{:#?}", env.fake.requests());
    controller.stop().await;
}

/// Scale (issue 31): an install writes each per-node object once (a claim's create, a
/// mounter's apply) and asks nothing else about them: the synced caches say what exists.
#[tokio::test]
async fn an_install_costs_one_request_per_per_node_object() {
    let nodes = ["node01", "node02", "node03", "node04", "node05"];
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &nodes);
    env.fake.clear_requests();
    let controller = Running::start(&env);
    installed(&env, nodes.len()).await;
    let per_node: Vec<String> = env
        .fake
        .requests()
        .iter()
        .filter(|r| !r.query.contains("watch=true"))
        .filter(|r| {
            let claims = r.path.contains("/namespaces/") && r.path.contains("/persistentvolumeclaims");
            let listing =
                r.method == "GET" && (r.path.ends_with("/persistentvolumeclaims") || r.path.ends_with("/deployments"));
            (claims || r.path.contains("/deployments/hpp-pool-")) && !listing
        })
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(
        per_node.len(),
        2 * nodes.len(),
        "a claim and a mounter per node, one request each: {per_node:#?}"
    );
    controller.stop().await;
}

/// Scale (issue 31): an hour of a quiet cluster, in paused time, with every kubelet's
/// heartbeat every 10 s. The API server ends every watch after the timeout the client asks
/// for (kube asks for 290 s) and, as its watch cache, keeps 75 s of events: the watches come
/// back from the version their last bookmark gave them, without listing again, and start no
/// pass; nothing in the operator runs a pass on a timer (no periodic resync), and it reads
/// and writes nothing.
#[tokio::test(start_paused = true)]
async fn a_quiet_hour_runs_no_passes_while_the_watches_end_and_come_back() {
    let nodes = ["node01", "node02", "node03"];
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &nodes);
    let controller = Running::start(&env);
    installed(&env, 3).await;
    env.fake.keep_history_for(Duration::from_secs(75));
    let before = passes(&env);
    env.fake.clear_requests();
    for beat in 0..360 {
        for node in nodes {
            heartbeat(&env.fake, node, beat);
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    assert_eq!(
        passes(&env),
        before,
        "an hour of heartbeats and watch restarts is not a change"
    );
    let requests = env.fake.requests();
    let (watches, others): (Vec<_>, Vec<_>) = requests.iter().partition(|r| r.query.contains("watch=true"));
    assert!(others.is_empty(), "no list, no read, no write: {others:#?}");
    assert!(
        watches.len() >= 12,
        "the watches ended and came back (every 290 s, each): {}",
        watches.len()
    );
    controller.stop().await;
}

/// Deletes a mounter Deployment (the `nth` by name) and waits until the operator recreated
/// it; returns its name.
async fn delete_mounter_and_wait(env: &support::Env, nth: usize) -> String {
    let gone = mounter_names(&env.fake).remove(nth);
    assert!(
        env.fake
            .remove::<k8s_openapi::api::apps::v1::Deployment>(Some(NS), &gone)
    );
    tokio::time::timeout(PATIENCE, env.fake.wait_until(|f| mounter_names(f).contains(&gone)))
        .await
        .expect("the deleted mounter is repaired");
    gone
}

/// Passes so far by scope (`hpp_operator_passes_total{scope}`): (full, changed parts).
fn passes_by_scope(env: &support::Env) -> (u64, u64) {
    use hpp_reconcile::metrics::{SCOPE_CHANGED, SCOPE_FULL, ScopeLabels};
    let count = |scope| env.ctx.metrics.passes.get_or_create(&ScopeLabels { scope }).get();
    (count(SCOPE_FULL), count(SCOPE_CHANGED))
}

/// Waits until the operator settles, then checks it ran no full pass since `full_before`.
async fn settled_without_full_pass(env: &support::Env, full_before: u64, after: &str) {
    settle(env).await;
    assert_eq!(passes_by_scope(env).0, full_before, "{after}: no full pass");
}

/// Waits until the CR's pool statuses are as `want` says.
async fn wait_for_pools(env: &support::Env, what: &str, want: impl Fn(&[hpp_api::v1beta1::StoragePoolStatus]) -> bool) {
    tokio::time::timeout(
        PATIENCE,
        env.fake.wait_until(|f| {
            f.get::<HostPathProvisioner>(None, CR)
                .and_then(|cr| cr.status)
                .is_some_and(|s| want(&s.storage_pool_statuses))
        }),
    )
    .await
    .unwrap_or_else(|_| panic!("{what}"));
}

/// Sets the first pool claim's phase to `Lost` and returns its name.
fn lose_a_claim(env: &support::Env) -> String {
    let claim = env
        .fake
        .list::<PersistentVolumeClaim>()
        .into_iter()
        .find_map(|c| c.metadata.name)
        .unwrap();
    assert!(
        env.fake
            .set_status::<PersistentVolumeClaim>(Some(NS), &claim, serde_json::json!({ "phase": "Lost" }))
    );
    claim
}

/// Whether the pools' status shows `claim` (by name) `Lost` ([`lose_a_claim`]).
fn shows_lost(pools: &[hpp_api::v1beta1::StoragePoolStatus], claim: &str) -> bool {
    pools
        .iter()
        .flat_map(|p| &p.claim_statuses)
        .any(|c| c.name == claim && c.status.phase.as_deref() == Some("Lost"))
}

/// Whether the pool claim of `node` exists.
fn has_claim_of(fake: &FakeApiServer, node: &str) -> bool {
    fake.list::<PersistentVolumeClaim>()
        .iter()
        .any(|c| c.metadata.name.as_deref().is_some_and(|n| n.ends_with(node)))
}

/// Waits until no pass ran for half a second.
async fn settle(env: &support::Env) {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let before = passes(env);
            tokio::time::sleep(Duration::from_millis(500)).await;
            if passes(env) == before {
                return;
            }
        }
    })
    .await
    .expect("the operator settles");
}

/// A leftover the operator may not delete (a labelled StorageClass its RBAC grants no delete
/// on) is found by a full pass, and passes over parts, which do not read every cached key, try
/// it again: its Warning Event is published once, not again by the next full pass.
#[tokio::test]
async fn a_leftover_rbac_forbids_deleting_is_warned_once_across_passes_over_parts() {
    let nodes = ["node01", "node02"];
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &nodes);
    let controller = Running::start(&env);
    installed(&env, nodes.len()).await;
    let rules = hpp_reconcile::OperatorRules::for_pipeline(&Pipeline::standard());
    env.fake.enforce_rbac(
        hpp_testkit::RbacPolicy::from_yaml(&rules.to_yaml("hostpath-provisioner-operator", NS, "")).unwrap(),
    );
    let (key, value) = managed_label();
    let leftover = |note: &str| StorageClass {
        metadata: kube::api::ObjectMeta {
            name: Some("team-overlay".into()),
            labels: Some([(key.clone(), value.clone())].into()),
            annotations: Some([("example.com/note".to_owned(), note.to_owned())].into()),
            ..Default::default()
        },
        provisioner: hpp_api::constants::DRIVER_NAME.into(),
        ..Default::default()
    };
    let warned = |env: &Env| env.warnings_published(hpp_reconcile::apply::REASON_DELETE_FORBIDDEN, "team-overlay");
    env.fake.seed(&leftover("first"));
    tokio::time::timeout(PATIENCE, env.fake.wait_until(|_| warned(&env) == 1))
        .await
        .expect("the leftover is warned about");
    settle(&env).await;
    let (full_before, changed_before) = passes_by_scope(&env);

    // Passes over one node's part.
    delete_mounter_and_wait(&env, 0).await;
    env.mounters_ready();
    settle(&env).await;
    let (full, changed) = passes_by_scope(&env);
    assert!(changed > changed_before, "passes over parts ran");
    assert_eq!(full, full_before, "and no full pass");

    // The leftover changes (an object no pass rendered): a full pass sweeps it again.
    env.fake.seed(&leftover("second"));
    tokio::time::timeout(PATIENCE, async {
        while passes_by_scope(&env).0 == full_before {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a full pass");
    settle(&env).await;
    assert_eq!(warned(&env), 1, "published once while the leftover stays");
    assert!(
        env.fake.get::<StorageClass>(None, "team-overlay").is_some(),
        "left in place"
    );
    controller.stop().await;
}

/// Scale (issue 31): each node's csi-provisioner republishes its CSIStorageCapacity every
/// minute, with other free bytes each time on a live node. Those changes alone start at most
/// one pass per usage interval and write no status while its interval runs (the status lists
/// a claim per node); a status write for anything else carries the latest figures.
#[tokio::test]
async fn usage_figures_alone_are_written_at_most_once_per_interval() {
    let nodes = ["node01", "node02"];
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &nodes)
        .map_ctx(|c| c.with_usage_interval(Duration::from_secs(3600)));
    let controller = Running::start(&env);
    wait_for_claims(&env, nodes.len()).await;
    finish_install(&env, nodes.len()).await;
    let pool = env
        .fake
        .get::<HostPathProvisioner>(None, CR)
        .and_then(|cr| cr.status)
        .unwrap()
        .storage_pool_statuses[0]
        .name
        .clone();
    let class: StorageClass = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "capacity-class" },
        "provisioner": hpp_api::constants::DRIVER_NAME,
        "parameters": { "storagePool": pool },
    }))
    .unwrap();
    env.fake.seed(&class);
    settle(&env).await;

    env.fake.clear_requests();
    let passes_before = passes_by_scope(&env);
    let mib = 1u64 << 20;
    for i in 0..20u64 {
        let capacity: k8s_openapi::api::storage::v1::CSIStorageCapacity = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "csisc-node01", "namespace": NS },
            "storageClassName": "capacity-class",
            "nodeTopology": { "matchLabels": { (hpp_api::constants::TOPOLOGY_KEY): "node01" } },
            "capacity": ((100 << 10) * mib - i * mib).to_string(),
        }))
        .unwrap();
        env.fake.seed(&capacity);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    settle(&env).await;
    assert_eq!(
        cr_status_writes(&env.fake),
        0,
        "usage figures alone are not written within the interval"
    );
    let passes_after = passes_by_scope(&env);
    let passes = passes_after.0 + passes_after.1 - passes_before.0 - passes_before.1;
    assert!(passes <= 1, "20 capacity changes start at most one pass, ran {passes}");

    // A claim changes phase: the status write it causes carries the latest usage figures.
    let claim = lose_a_claim(&env);
    wait_for_pools(
        &env,
        "the claim's phase and the last capacity reach the status",
        |pools| {
            pools
                .iter()
                .any(|p| p.name == pool && p.available.as_deref() == Some("102381Mi"))
                && shows_lost(pools, &claim)
        },
    )
    .await;
    controller.stop().await;
}

/// The CR's status writes in the fake's log.
fn cr_status_writes(fake: &FakeApiServer) -> usize {
    fake.write_requests()
        .iter()
        .filter(|r| r.path.contains("/hostpathprovisioners/"))
        .count()
}

/// Scale (issue 31): the operator's own status write comes back as a watch event of the CR;
/// that echo starts no pass (at 1,000 nodes each was a pass over a 120 KiB status to find
/// nothing to do). A status someone else wrote does start one, which writes it back.
#[tokio::test]
async fn an_own_status_write_starts_no_pass_but_someone_elses_does() {
    let nodes = ["node01", "node02"];
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &nodes);
    let controller = Running::start(&env);
    installed(&env, nodes.len()).await;

    for round in 0..3 {
        env.fake.clear_requests();
        let before = passes(&env);
        // A claim changes phase: one pass, which writes the status; its echo runs nothing.
        let claim = lose_a_claim(&env);
        wait_for_pools(&env, "the claim's phase reaches the status", |pools| {
            shows_lost(pools, &claim)
        })
        .await;
        settle(&env).await;
        assert_eq!(cr_status_writes(&env.fake), 1, "round {round}: one status write");
        assert_eq!(passes(&env) - before, 1, "round {round}: one pass, none for the echo");
        // Back to Bound, for the next round.
        assert!(env.fake.set_status::<PersistentVolumeClaim>(
            Some(NS),
            &claim,
            serde_json::json!({ "phase": "Bound" })
        ));
        settle(&env).await;
    }

    // Someone else rewrites the status: a pass runs and puts it right.
    let written = env
        .fake
        .get::<HostPathProvisioner>(None, CR)
        .and_then(|cr| cr.status)
        .unwrap();
    let before = passes(&env);
    env.fake.clear_requests();
    // (The fake replaces the whole status.)
    assert!(env.fake.set_status::<HostPathProvisioner>(
        None,
        CR,
        serde_json::json!({ "observedVersion": "edited", "conditions": [] })
    ));
    tokio::time::timeout(PATIENCE, async {
        // The conditions come back with new transition times.
        let put_right = |s: &hpp_api::HostPathProvisionerStatus| {
            s.observed_version == written.observed_version
                && s.conditions
                    .iter()
                    .map(|c| (&c.type_, &c.status))
                    .eq(written.conditions.iter().map(|c| (&c.type_, &c.status)))
                && s.storage_pool_statuses == written.storage_pool_statuses
        };
        while !env
            .fake
            .get::<HostPathProvisioner>(None, CR)
            .and_then(|cr| cr.status)
            .is_some_and(|s| put_right(&s))
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the edited status is written back");
    settle(&env).await;
    assert_eq!(cr_status_writes(&env.fake), 1, "one write back");
    assert_eq!(
        passes(&env) - before,
        1,
        "one pass for the edit, none for the write back"
    );
    controller.stop().await;
}

/// A pass that read an older copy of the CR than the watch holds now (an own status write's
/// echo arrived meanwhile, and the filter dropped it as own) and found nothing to write does
/// not take that copy's status as right: it asks at once for a pass over the newer copy.
#[tokio::test]
async fn a_pass_over_an_older_copy_of_the_cr_asks_for_one_over_the_newer() {
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &["node01"]);
    env.converge().await;
    let current = env.hpp();
    let usual = env.pass().await.unwrap();
    assert_ne!(usual, kube::runtime::controller::Action::requeue(Duration::ZERO));

    // The watch's store holds a newer version of the CR.
    let (reader, mut writer) = kube::runtime::reflector::store::<HostPathProvisioner>();
    let mut newer = current.clone();
    newer.metadata.resource_version = Some("999999".into());
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(newer.clone()));
    env.ctx.cache.set_provisioners(reader);
    env.fake.clear_requests();
    let over_older = hpp_reconcile::operator::reconcile(Arc::new(current), env.ctx.clone())
        .await
        .unwrap();
    assert_eq!(over_older, kube::runtime::controller::Action::requeue(Duration::ZERO));
    assert_eq!(env.fake.write_requests().len(), 0, "{:#?}", env.fake.write_requests());
    // Over the copy the store holds, the pass is the usual one.
    let over_newer = hpp_reconcile::operator::reconcile(Arc::new(newer), env.ctx.clone())
        .await
        .unwrap();
    assert_eq!(over_newer, usual);
}

/// Scale (issue 31): a change to one node's objects costs a pass over that node. A deleted
/// mounter, a claim that changed, a Node whose labels changed, a Node tainted out of the pools
/// and back, and a deleted Node are handled by passes over their parts only, which leave the
/// objects and the status a full pass wants; an object no pass rendered (a labelled leftover)
/// still runs a full pass.
#[tokio::test]
async fn a_change_to_one_nodes_objects_costs_a_pass_over_that_node() {
    let nodes = ["node01", "node02", "node03", "node04"];
    // The provisioned volume's usage comes after other status writes: a short usage interval
    // has it written by the pass it is held back for.
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &nodes)
        .map_ctx(|c| c.with_usage_interval(Duration::from_secs(1)));
    let controller = Running::start(&env);
    installed(&env, nodes.len()).await;
    let cr = |f: &FakeApiServer| f.get::<HostPathProvisioner>(None, CR).unwrap();
    let settled_status = cr(&env.fake).status.unwrap();

    // One mounter deleted: recreated by passes over its node's part; no full pass.
    let (full_before, _) = passes_by_scope(&env);
    env.fake.clear_requests();
    let gone = delete_mounter_and_wait(&env, 1).await;
    env.mounters_ready();
    settle(&env).await;
    let (full_after, changed_after) = passes_by_scope(&env);
    assert_eq!(full_after, full_before, "no full pass for one node's mounter");
    assert!(changed_after > 0, "passes over the changed part ran");
    let writes: Vec<String> = env
        .fake
        .write_requests()
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .filter(|w| !w.contains("/events") && !w.contains("/leases/"))
        .collect();
    assert!(
        writes
            .iter()
            .all(|w| w.contains(&gone) || w.contains("hostpathprovisioners")),
        "only the repaired node's mounter and the CR's status are written: {writes:#?}"
    );
    let repaired = cr(&env.fake).status.unwrap();
    assert_eq!(repaired.storage_pool_statuses, settled_status.storage_pool_statuses);

    // A claim that changes phase: its pool's status follows, through a pass over its node.
    let claim = lose_a_claim(&env);
    wait_for_pools(&env, "the claim's new phase reaches the CR's status", |pools| {
        shows_lost(pools, &claim)
    })
    .await;
    settled_without_full_pass(&env, full_before, "a claim's phase").await;
    env.bind_claims();
    settle(&env).await;

    // A labelled object no step renders: a full pass sweeps it.
    let mut leftover = k8s_openapi::api::apps::v1::Deployment {
        metadata: support::meta("hpp-pool-leftover"),
        ..Default::default()
    };
    leftover.metadata.namespace = Some(NS.into());
    let (key, value) = managed_label();
    leftover.metadata.labels = Some([(key, value)].into());
    env.fake.seed(&leftover);
    tokio::time::timeout(
        PATIENCE,
        env.fake.wait_until(|f| {
            f.get::<k8s_openapi::api::apps::v1::Deployment>(Some(NS), "hpp-pool-leftover")
                .is_none()
        }),
    )
    .await
    .expect("the leftover is swept");
    assert!(
        passes_by_scope(&env).0 > full_before,
        "an unknown object runs a full pass"
    );
    settle(&env).await;
    // From here on, only passes over parts: the full pass at the end checks what they left.
    let full_before = passes_by_scope(&env).0;

    // A Node's labels change and the pools stay on it: a pass over that node's part.
    let (_, changed_before) = passes_by_scope(&env);
    let mut node = env
        .fake
        .get::<k8s_openapi::api::core::v1::Node>(None, "node02")
        .unwrap();
    node.metadata
        .labels
        .get_or_insert_default()
        .insert("example.com/rack".into(), "r2".into());
    env.fake.seed(&node);
    tokio::time::timeout(PATIENCE, async {
        while passes_by_scope(&env).1 == changed_before {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a pass over the node's part");
    settled_without_full_pass(&env, full_before, "a Node's labels").await;

    // A taint the CR does not tolerate takes the pools off the node: its part goes (its
    // mounter is swept; its claim stays for when it comes back), by a pass over parts too.
    let mounter_of = |node: &'static str| {
        move |f: &FakeApiServer| {
            f.list::<k8s_openapi::api::apps::v1::Deployment>()
                .into_iter()
                .any(|d| d.metadata.name.is_some_and(|n| n.ends_with(node)))
        }
    };
    assert!(mounter_of("node02")(&env.fake));
    node.spec
        .get_or_insert_default()
        .taints
        .get_or_insert_default()
        .push(k8s_openapi::api::core::v1::Taint {
            key: "example.com/maintenance".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        });
    env.fake.seed(&node);
    tokio::time::timeout(PATIENCE, env.fake.wait_until(|f| !mounter_of("node02")(f)))
        .await
        .expect("the tainted node's mounter goes");
    settled_without_full_pass(&env, full_before, "a node leaving the pools").await;
    assert!(
        has_claim_of(&env.fake, "node02"),
        "the claim of a node that left stays (its data is there if it comes back)"
    );
    // Back: the mounter is made again.
    node.spec = None;
    env.fake.seed(&node);
    tokio::time::timeout(PATIENCE, env.fake.wait_until(mounter_of("node02")))
        .await
        .expect("the node's mounter is back");
    env.mounters_ready();
    settle(&env).await;
    // A Node deleted: its part goes the same way.
    env.fake.remove::<k8s_openapi::api::core::v1::Node>(None, "node04");
    tokio::time::timeout(PATIENCE, env.fake.wait_until(|f| !mounter_of("node04")(f)))
        .await
        .expect("the deleted node's mounter goes");
    settled_without_full_pass(&env, full_before, "nodes joining and leaving the pools").await;
    assert!(has_claim_of(&env.fake, "node04"), "the claim of a deleted node stays");

    // A volume of the driver is provisioned in a pool: its usage reaches the pool's status
    // through a pass over none of the pools' parts.
    let pool = cr(&env.fake).status.unwrap().storage_pool_statuses[0].name.clone();
    let pv: k8s_openapi::api::core::v1::PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "pvc-provisioned" },
        "spec": { "capacity": { "storage": "3Gi" }, "accessModes": ["ReadWriteOnce"],
                  "csi": { "driver": hpp_api::constants::DRIVER_NAME, "volumeHandle": "pvc-provisioned",
                           "volumeAttributes": { "storagePool": pool } } },
        "status": { "phase": "Bound" },
    }))
    .unwrap();
    env.fake.seed(&pv);
    let committed = |bytes: &'static str| {
        let pool = pool.clone();
        move |pools: &[hpp_api::v1beta1::StoragePoolStatus]| {
            pools
                .iter()
                .any(|p| p.name == pool && p.committed.as_deref() == Some(bytes))
        }
    };
    wait_for_pools(&env, "the volume's size reaches the pool's status", committed("3Gi")).await;
    settled_without_full_pass(&env, full_before, "a volume provisioned").await;
    // Expanded, then deleted: the pool's sum follows each change (it is updated from the PVs
    // that changed, the old size taken out and the new one added).
    let mut expanded = pv.clone();
    expanded.spec.as_mut().unwrap().capacity = Some(
        [(
            "storage".to_owned(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("5Gi".into()),
        )]
        .into(),
    );
    env.fake.seed(&expanded);
    wait_for_pools(
        &env,
        "the volume's new size reaches the pool's status",
        committed("5Gi"),
    )
    .await;
    env.fake
        .remove::<k8s_openapi::api::core::v1::PersistentVolume>(None, "pvc-provisioned");
    wait_for_pools(&env, "the deleted volume leaves the pool's sum", committed("0")).await;
    env.fake.seed(&pv);
    wait_for_pools(&env, "the volume is back in the pool's status", committed("3Gi")).await;
    settled_without_full_pass(&env, full_before, "a volume expanded, deleted and made again").await;

    settle(&env).await;
    let status_after_parts = cr(&env.fake).status.unwrap();
    controller.stop().await;

    // Without the controller every pass is a full one; it finds nothing to write: the passes
    // over parts left the objects and the status a full pass wants.
    env.fake.clear_requests();
    env.pass().await.unwrap();
    let writes: Vec<String> = env
        .fake
        .write_requests()
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .filter(|w| !w.contains("/events"))
        .collect();
    assert_eq!(writes, Vec::<String>::new());
    assert_eq!(
        cr(&env.fake).status.unwrap().storage_pool_statuses,
        status_after_parts.storage_pool_statuses
    );
}
