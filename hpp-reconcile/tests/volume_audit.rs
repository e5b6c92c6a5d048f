//! The volume audit against the fake API server, with real HTTPS servers standing in for the
//! node drivers' `GET /volumes` (self-signed certificates, bearer token checked, each on its own
//! loopback address and a shared random port, as pod IPs share the driver's port). Time is the
//! operator's injectable clock, moved by hand.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod support;

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hpp_api::HostPathProvisioner;
use hpp_api::constants as c;
use hpp_api::inventory::{Inventory, PoolInventory, VolumeEntry};
use hpp_reconcile::metrics::{Metrics, PoolLabels};
use hpp_reconcile::names;
use hpp_reconcile::operator::{Context, reconcile};
use hpp_reconcile::reconcilers::VolumeAudit;
use hpp_reconcile::reconcilers::volume_audit::{
    CONDITION_ORPHANED_VOLUMES, REASON_AUDIT_PENDING, REASON_NO_NODE_AUDITED, REASON_NO_ORPHANS, REASON_ORPHANS_FOUND,
    REASON_VOLUME_MISSING,
};
use hpp_reconcile::{Pipeline, SubReconciler};
use hpp_testkit::FakeApiServer;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde_json::json;
use support::{CR, NS};
use tokio::net::TcpListener;

const T0: &str = "2025-06-01T10:00:00Z";
const APPS: &str = "apps";

fn t0() -> i64 {
    T0.parse::<Timestamp>().unwrap().as_second()
}

/// What a stand-in driver answers with: the token it accepts, given at each request (as the
/// driver re-reads its token file), and its volumes.
#[derive(Clone)]
enum Token {
    /// The token in the operator's Secret, read from the fake API server per request.
    FromSecret(FakeApiServer),
    /// A token of its own (a driver holding another Secret's token).
    Fixed(&'static str),
}

impl Token {
    fn current(&self) -> Option<String> {
        match self {
            Token::Fixed(t) => Some((*t).to_owned()),
            Token::FromSecret(fake) => {
                let secret = fake.get::<Secret>(Some(NS), names::VOLUME_REPORT_SECRET)?;
                let bytes = secret.data?.remove(names::VOLUME_REPORT_TOKEN_KEY)?.0;
                String::from_utf8(bytes).ok()
            }
        }
    }
}

/// A node driver's report server.
struct Node {
    requests: Arc<AtomicUsize>,
    usage_asked: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn tls_config() -> Arc<rustls::ServerConfig> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = ck.cert.der().clone();
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(rustls_pki_types::PrivatePkcs8KeyDer::from(
        ck.signing_key.serialize_der(),
    ));
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    Arc::new(config)
}

/// Answers one request as the driver does: 401 without the token, else the inventory with
/// `usedBytes` of the ids in `?usage=` (1 MiB each).
fn answer(
    req: &Request<Incoming>,
    token: &Token,
    inventory: &Inventory,
    usage_asked: &Mutex<Vec<String>>,
) -> Response<Full<Bytes>> {
    let given = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if req.uri().path() != "/volumes" {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::default())
            .unwrap();
    }
    if token.current().is_none() || given != token.current().as_deref() {
        return Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .body(Full::new(Bytes::from("unauthorized")))
            .unwrap();
    }
    let usage: Vec<String> = req
        .uri()
        .query()
        .and_then(|q| q.strip_prefix("usage="))
        .map(|ids| ids.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    usage_asked.lock().unwrap().extend(usage.iter().cloned());
    let mut inventory = inventory.clone();
    for pool in &mut inventory.pools {
        for v in &mut pool.volumes {
            if usage.contains(&v.id) {
                v.used_bytes = Some(1 << 20);
            }
        }
    }
    Response::builder()
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(&inventory).unwrap())))
        .unwrap()
}

/// Starts a report server on `ip:port`.
async fn serve(ip: IpAddr, port: u16, token: Token, inventory: Inventory) -> std::io::Result<Node> {
    let listener = TcpListener::bind(SocketAddr::new(ip, port)).await?;
    let acceptor = tokio_rustls::TlsAcceptor::from(tls_config());
    let requests = Arc::new(AtomicUsize::new(0));
    let usage_asked = Arc::new(Mutex::new(Vec::new()));
    let (count, asked) = (requests.clone(), usage_asked.clone());
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let (acceptor, token, inventory, count, asked) = (
                acceptor.clone(),
                token.clone(),
                inventory.clone(),
                count.clone(),
                asked.clone(),
            );
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    count.fetch_add(1, Ordering::SeqCst);
                    let response = answer(&req, &token, &inventory, &asked);
                    async move { Ok::<_, Infallible>(response) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Ok(Node {
        requests,
        usage_asked,
        task,
    })
}

fn volume(id: &str, age_secs: i64, published: bool) -> VolumeEntry {
    VolumeEntry {
        id: id.into(),
        created_at: Some(t0() - age_secs),
        published,
        capacity_bytes: Some(1 << 30),
        used_bytes: None,
    }
}

fn inventory(node: &str, usable: bool, volumes: Vec<VolumeEntry>) -> Inventory {
    Inventory {
        node: node.into(),
        pools: vec![PoolInventory {
            name: "local".into(),
            shared: false,
            usable,
            reason: (!usable).then(|| "not mounted".into()),
            volumes,
        }],
    }
}

/// A CSI driver pod on `node` at `ip`, Running and ready, started with the report token.
fn driver_pod(node: &str, ip: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("hostpath-provisioner-csi-{node}"), "namespace": NS,
                     "labels": {c::LABEL_APP: c::LABEL_APP_VALUE, c::LABEL_PROMETHEUS: "true"}},
        "spec": {"nodeName": node, "containers": [{"name": "hostpath-provisioner",
                 "args": ["--volume-report-token-file=/etc/hpp/volume-report/token"]}]},
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .unwrap()
}

/// A claim and its Bound PV of the driver in pool `local`, pinned to `node`, made an hour
/// before T0.
fn seed_volume(fake: &FakeApiServer, name: &str, node: &str) {
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": APPS},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": format!("pvc-{name}"),
                 "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound"},
    }))
    .unwrap();
    let pvc = fake.seed(&pvc);
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": format!("pvc-{name}"), "creationTimestamp": "2025-06-01T09:00:00Z"},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": c::DRIVER_NAME, "volumeHandle": format!("pvc-{name}"),
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

/// The cluster of every test: node01 and node02, the basic CR with the audit on, driver pods
/// at 127.0.0.1 (node01) and 127.0.0.2 (node02), and PVs `pvc-db` (node01, present) and
/// `pvc-web` (node02).
struct Cluster {
    fake: FakeApiServer,
    clock: Arc<Mutex<Timestamp>>,
    port: u16,
}

impl Cluster {
    fn new() -> Self {
        let fake = FakeApiServer::new();
        fake.register::<HostPathProvisioner>(false, true);
        for n in ["node01", "node02"] {
            fake.seed(&support::node(n, true));
        }
        let mut hpp = support::example("hostpathprovisioner_cr");
        hpp.spec.volume_audit = Some(hpp_api::v1beta1::VolumeAudit {
            interval: Some("10m".into()),
        });
        // Already holding the finalizer, so the first pass applies (and audits).
        hpp.metadata.finalizers = Some(vec![c::FINALIZER.to_owned()]);
        fake.seed(&hpp);
        fake.seed(&driver_pod("node01", "127.0.0.1"));
        fake.seed(&driver_pod("node02", "127.0.0.2"));
        seed_volume(&fake, "db", "node01");
        seed_volume(&fake, "web", "node02");
        Cluster {
            fake,
            clock: Arc::new(Mutex::new(T0.parse().unwrap())),
            port: 0,
        }
    }

    /// Starts the report servers of node01 and node02 on one free port (node02 `None`: nothing
    /// listens there).
    async fn drivers(&mut self, one: (Token, Inventory), two: Option<(Token, Inventory)>) -> (Node, Option<Node>) {
        for _ in 0..20 {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = probe.local_addr().unwrap().port();
            drop(probe);
            let Ok(first) = serve("127.0.0.1".parse().unwrap(), port, one.0.clone(), one.1.clone()).await else {
                continue;
            };
            let second = match &two {
                None => None,
                Some((token, inv)) => match serve("127.0.0.2".parse().unwrap(), port, token.clone(), inv.clone()).await
                {
                    Ok(n) => Some(n),
                    Err(_) => continue,
                },
            };
            self.port = port;
            return (first, second);
        }
        panic!("no free port on 127.0.0.1 and 127.0.0.2");
    }

    /// A fresh operator process whose audit asks the stand-ins' port, reading this clock.
    fn operator(&self) -> Arc<Context> {
        let clock = self.clock.clone();
        let mut pipeline = Pipeline::standard();
        let step = VolumeAudit::default()
            .with_port(self.port)
            .with_timeout(Duration::from_secs(5));
        pipeline.replace(step.name(), Box::new(step.clone())).unwrap();
        let ctx = Context::new(
            self.fake.client(),
            support::config("v1.0.0"),
            pipeline,
            Metrics::default(),
        )
        .with_clock(Arc::new(move || *clock.lock().unwrap()))
        .with_backoff(Duration::from_millis(20), Duration::from_millis(200));
        Arc::new(ctx)
    }

    fn at(&self, secs: i64) {
        *self.clock.lock().unwrap() = T0.parse::<Timestamp>().unwrap() + SignedDuration::from_secs(secs);
    }

    fn hpp(&self) -> HostPathProvisioner {
        self.fake.get::<HostPathProvisioner>(None, CR).unwrap()
    }

    /// One pass; what it asks the controller for (when to come back).
    async fn pass(&self, ctx: &Arc<Context>) -> Action {
        reconcile(Arc::new(self.hpp()), ctx.clone()).await.unwrap()
    }

    fn condition(&self) -> Option<(String, String, String)> {
        let status = self.hpp().status?;
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_ORPHANED_VOLUMES)?;
        Some((
            c.status.clone(),
            c.reason.clone().unwrap_or_default(),
            c.message.clone().unwrap_or_default(),
        ))
    }

    fn pool_audit(&self) -> Option<hpp_api::v1beta1::PoolVolumeAudit> {
        self.hpp()
            .status?
            .storage_pool_statuses
            .into_iter()
            .find(|p| p.name == "local")?
            .volume_audit
    }

    fn audit_status(&self) -> Option<hpp_api::v1beta1::VolumeAuditStatus> {
        self.hpp().status?.volume_audit
    }

    /// Events with this reason, as (regarding kind, regarding name).
    fn events(&self, reason: &str) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .fake
            .list::<Event>()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .map(|e| {
                let r = e.regarding.unwrap_or_default();
                (r.kind.unwrap_or_default(), r.name.unwrap_or_default())
            })
            .collect();
        out.sort();
        out
    }
}

/// The value of a per-pool gauge for pool `local`.
fn gauge(family: &Family<PoolLabels, Gauge>) -> i64 {
    family.get_or_create(&PoolLabels { pool: "local".into() }).get()
}

/// node01 holds `pvc-db` (its PV's volume) and an old stray directory no PV refers to, plus a
/// young one, a mounted inline volume and `pvc-db`; node02 answers without `pvc-web`.
fn node01_volumes() -> Vec<VolumeEntry> {
    vec![
        volume("pvc-db", 3600, true),
        volume("stray", 7200, false),
        volume("just-made", 60, false),
        volume("csi-inline-1", 7200, true),
    ]
}

#[tokio::test]
async fn an_orphan_is_reported_with_its_bytes_and_a_missing_volume_warns_on_pv_and_claim() {
    let mut cluster = Cluster::new();
    let token = Token::FromSecret(cluster.fake.clone());
    let (one, two) = cluster
        .drivers(
            (token.clone(), inventory("node01", true, node01_volumes())),
            Some((token, inventory("node02", true, vec![]))),
        )
        .await;
    let two = two.unwrap();
    let op = cluster.operator();
    let requeue = cluster.pass(&op).await;
    // The token Secret exists and the driver container reads it.
    let secret = cluster
        .fake
        .get::<Secret>(Some(NS), names::VOLUME_REPORT_SECRET)
        .unwrap();
    assert_eq!(secret.data.unwrap()["token"].0.len(), 64);
    let ds = cluster
        .fake
        .get::<DaemonSet>(Some(NS), "hostpath-provisioner-csi")
        .unwrap();
    let driver = &ds.spec.unwrap().template.spec.unwrap().containers[0];
    assert!(
        driver
            .args
            .as_ref()
            .unwrap()
            .contains(&"--volume-report-token-file=/etc/hpp/volume-report/token".to_owned())
    );
    // The orphan: condition, pool status, metric; the young, mounted and owned volumes are not.
    let (status, reason, message) = cluster.condition().expect("OrphanedVolumes");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", REASON_ORPHANS_FOUND),
        "{message}"
    );
    assert!(message.contains("pool local: node01/stray"), "{message}");
    assert!(message.contains("trash move stray --pool local"), "{message}");
    assert!(message.contains("Nothing is deleted automatically"), "{message}");
    let pool = cluster.pool_audit().expect("pool status");
    assert_eq!(pool.orphaned_volumes, 1);
    assert_eq!(pool.orphans, ["node01/stray"]);
    assert_eq!(pool.orphaned_bytes, 1 << 20, "measured with ?usage=");
    assert_eq!(*one.usage_asked.lock().unwrap(), ["stray"]);
    assert!(
        two.usage_asked.lock().unwrap().is_empty(),
        "no orphan there, no second request"
    );
    assert_eq!(gauge(&op.metrics.orphaned_volumes), 1);
    assert_eq!(gauge(&op.metrics.orphaned_volume_bytes), 1 << 20);
    // The missing volume: counted, and a Warning on the PV and its claim.
    assert_eq!(
        (pool.missing_volumes, pool.missing.clone()),
        (1, vec!["pvc-web".to_owned()])
    );
    assert_eq!(gauge(&op.metrics.missing_volumes), 1);
    assert_eq!(
        cluster.events(REASON_VOLUME_MISSING),
        [
            ("PersistentVolume".to_owned(), "pvc-web".to_owned()),
            ("PersistentVolumeClaim".to_owned(), "web".to_owned())
        ]
    );
    let audit = cluster.audit_status().unwrap();
    assert_eq!(audit.last_audit_time.as_deref(), Some(T0));
    assert_eq!((audit.nodes_audited, audit.nodes_not_audited), (2, 0));
    assert_eq!(
        requeue,
        Action::requeue(Duration::from_secs(600)),
        "back at the next audit"
    );
    // Nothing was deleted or changed.
    assert!(cluster.fake.get::<PersistentVolume>(None, "pvc-web").is_some());
    assert!(cluster.fake.get::<PersistentVolumeClaim>(Some(APPS), "web").is_some());
    // Later passes before the interval ask no node, keep the status, and warn once.
    let asked = (one.requests.load(Ordering::SeqCst), two.requests.load(Ordering::SeqCst));
    assert_eq!(asked, (2, 1));
    cluster.at(300);
    let requeue = cluster.pass(&op).await;
    assert_eq!(requeue, Action::requeue(Duration::from_secs(300)));
    cluster.at(599);
    cluster.pass(&op).await;
    assert_eq!(
        (one.requests.load(Ordering::SeqCst), two.requests.load(Ordering::SeqCst)),
        asked,
        "no audit before the interval"
    );
    assert_eq!(cluster.pool_audit().unwrap().orphaned_volumes, 1);
    assert_eq!(cluster.events(REASON_VOLUME_MISSING).len(), 2, "each Warning once");
    // At the interval: audited again.
    cluster.at(600);
    cluster.pass(&op).await;
    assert_eq!(one.requests.load(Ordering::SeqCst), 4);
    assert_eq!(two.requests.load(Ordering::SeqCst), 2);
    assert_eq!(cluster.events(REASON_VOLUME_MISSING).len(), 2, "still the same problem");
}

#[tokio::test]
async fn a_node_that_does_not_answer_is_not_audited_and_none_of_its_volumes_is_missing() {
    let mut cluster = Cluster::new();
    let token = Token::FromSecret(cluster.fake.clone());
    // node02's driver pod is at 127.0.0.2, where nothing listens.
    let (_one, _) = cluster
        .drivers(
            (token, inventory("node01", true, vec![volume("pvc-db", 3600, true)])),
            None,
        )
        .await;
    let op = cluster.operator();
    cluster.pass(&op).await;
    let audit = cluster.audit_status().unwrap();
    assert_eq!((audit.nodes_audited, audit.nodes_not_audited), (1, 1));
    assert_eq!(audit.not_audited[0].name, "node02");
    assert!(
        audit.not_audited[0].reason.contains("cannot connect"),
        "{:?}",
        audit.not_audited
    );
    let pool = cluster.pool_audit().unwrap();
    assert_eq!((pool.orphaned_volumes, pool.missing_volumes), (0, 0));
    assert!(cluster.events(REASON_VOLUME_MISSING).is_empty());
    let (status, reason, message) = cluster.condition().unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", REASON_NO_ORPHANS));
    assert!(message.contains("1 node(s) not audited"), "{message}");
    assert_eq!(
        op.metrics
            .volume_audit_nodes
            .get_or_create(&hpp_reconcile::metrics::AuditResultLabels { result: "not_audited" })
            .get(),
        1
    );
}

#[tokio::test]
async fn a_driver_holding_another_token_answers_401_and_its_node_is_not_audited() {
    let mut cluster = Cluster::new();
    let (one, two) = cluster
        .drivers(
            (
                Token::Fixed("some-other-token"),
                inventory("node01", true, node01_volumes()),
            ),
            Some((Token::Fixed("some-other-token"), inventory("node02", true, vec![]))),
        )
        .await;
    let two = two.unwrap();
    let op = cluster.operator();
    cluster.pass(&op).await;
    assert_eq!(one.requests.load(Ordering::SeqCst), 1);
    assert_eq!(two.requests.load(Ordering::SeqCst), 1);
    let audit = cluster.audit_status().unwrap();
    assert_eq!((audit.nodes_audited, audit.nodes_not_audited), (0, 2));
    assert!(
        audit.not_audited[0].reason.contains("HTTP 401"),
        "{:?}",
        audit.not_audited
    );
    let (status, reason, _) = cluster.condition().unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", REASON_NO_NODE_AUDITED));
    assert!(cluster.events(REASON_VOLUME_MISSING).is_empty(), "nothing judged");
    let pool = cluster.hpp().status.unwrap().storage_pool_statuses;
    assert!(pool.iter().all(|p| p.volume_audit.is_none()), "no pool was read");
}

#[tokio::test]
async fn a_restarted_operator_waits_for_the_interval_of_the_stored_audit() {
    let mut cluster = Cluster::new();
    let token = Token::FromSecret(cluster.fake.clone());
    let (one, _two) = cluster
        .drivers(
            (token.clone(), inventory("node01", true, node01_volumes())),
            Some((token, inventory("node02", true, vec![volume("pvc-web", 3600, false)]))),
        )
        .await;
    cluster.pass(&cluster.operator()).await;
    let asked = one.requests.load(Ordering::SeqCst);
    // A new process, five minutes later: the stored audit stands, the condition is kept.
    cluster.at(300);
    let op = cluster.operator();
    let requeue = cluster.pass(&op).await;
    assert_eq!(
        one.requests.load(Ordering::SeqCst),
        asked,
        "no early audit after a restart"
    );
    assert_eq!(requeue, Action::requeue(Duration::from_secs(300)));
    assert_eq!(cluster.condition().unwrap().1, REASON_ORPHANS_FOUND);
    assert_eq!(gauge(&op.metrics.orphaned_volumes), 1, "gauges from the stored status");
}

#[tokio::test]
async fn a_due_audit_waits_for_the_driver_pods_to_get_the_token() {
    let mut cluster = Cluster::new();
    let mut old = driver_pod("node02", "127.0.0.2");
    old.spec.as_mut().unwrap().containers[0].args = Some(vec![]);
    cluster.fake.seed(&old);
    let token = Token::FromSecret(cluster.fake.clone());
    let (one, _) = cluster
        .drivers((token, inventory("node01", true, node01_volumes())), None)
        .await;
    let op = cluster.operator();
    let requeue = cluster.pass(&op).await;
    assert_eq!(one.requests.load(Ordering::SeqCst), 0, "waits for the rollout");
    assert_eq!(requeue, Action::requeue(Duration::from_secs(600)));
    assert_eq!(cluster.condition().unwrap().1, REASON_AUDIT_PENDING);
    // The rollout reaches node02: the next pass audits.
    cluster.fake.seed(&driver_pod("node02", "127.0.0.2"));
    cluster.at(30);
    cluster.pass(&op).await;
    assert_eq!(one.requests.load(Ordering::SeqCst), 2);
    assert_eq!(cluster.condition().unwrap().1, REASON_ORPHANS_FOUND);
}

#[tokio::test]
async fn a_first_install_waits_for_a_driver_pod_to_ask() {
    let mut cluster = Cluster::new();
    for node in ["node01", "node02"] {
        assert!(
            cluster
                .fake
                .remove::<Pod>(Some(NS), &format!("hostpath-provisioner-csi-{node}"))
        );
    }
    let token = Token::FromSecret(cluster.fake.clone());
    let (one, _) = cluster
        .drivers((token, inventory("node01", true, node01_volumes())), None)
        .await;
    let op = cluster.operator();
    let requeue = cluster.pass(&op).await;
    assert_eq!(requeue, Action::requeue(Duration::from_secs(600)));
    assert_eq!(
        cluster.condition().unwrap().1,
        REASON_AUDIT_PENDING,
        "no audit of nothing"
    );
    assert_eq!(cluster.audit_status().unwrap().last_audit_time, None);
    // The DaemonSet's pods come up.
    cluster.fake.seed(&driver_pod("node01", "127.0.0.1"));
    cluster.at(60);
    cluster.pass(&op).await;
    assert_eq!(one.requests.load(Ordering::SeqCst), 2);
    assert_eq!(cluster.condition().unwrap().1, REASON_ORPHANS_FOUND);
}

#[tokio::test]
async fn without_the_audit_there_is_no_secret_no_flag_and_nothing_in_status() {
    let mut cluster = Cluster::new();
    let token = Token::FromSecret(cluster.fake.clone());
    let (one, _) = cluster
        .drivers((token, inventory("node01", true, node01_volumes())), None)
        .await;
    let op = cluster.operator();
    cluster.pass(&op).await;
    assert!(
        cluster
            .fake
            .get::<Secret>(Some(NS), names::VOLUME_REPORT_SECRET)
            .is_some()
    );
    // Turned off: the Secret is swept, the driver loses the flag, status and gauges go.
    let off = json!({"spec": {"volumeAudit": null}});
    Api::<HostPathProvisioner>::all(cluster.fake.client())
        .patch(CR, &PatchParams::default(), &Patch::Merge(&off))
        .await
        .unwrap();
    let asked = one.requests.load(Ordering::SeqCst);
    cluster.at(3600);
    for _ in 0..3 {
        cluster.pass(&op).await;
    }
    assert_eq!(one.requests.load(Ordering::SeqCst), asked, "no audit while off");
    assert!(
        cluster
            .fake
            .get::<Secret>(Some(NS), names::VOLUME_REPORT_SECRET)
            .is_none()
    );
    let ds = cluster
        .fake
        .get::<DaemonSet>(Some(NS), "hostpath-provisioner-csi")
        .unwrap();
    let text = serde_json::to_string(&ds.spec).unwrap();
    assert!(!text.contains("volume-report"), "{text}");
    let status = cluster.hpp().status.unwrap();
    assert!(status.volume_audit.is_none());
    assert!(status.conditions.iter().all(|c| c.type_ != CONDITION_ORPHANED_VOLUMES));
    assert!(status.storage_pool_statuses.iter().all(|p| p.volume_audit.is_none()));
    assert_eq!(gauge(&op.metrics.orphaned_volumes), 0, "the series went with the audit");
    // A cluster that never turned it on: no Secret at all.
    let plain = FakeApiServer::new();
    plain.register::<HostPathProvisioner>(false, true);
    plain.seed(&support::node("node01", true));
    plain.seed(&support::example("hostpathprovisioner_cr"));
    let ctx = Arc::new(
        Context::new(
            plain.client(),
            support::config("v1.0.0"),
            Pipeline::standard(),
            Metrics::default(),
        )
        .with_backoff(Duration::from_millis(20), Duration::from_millis(200)),
    );
    for _ in 0..2 {
        let cr = plain.get::<HostPathProvisioner>(None, CR).unwrap();
        reconcile(Arc::new(cr), ctx.clone()).await.unwrap();
    }
    assert!(
        plain.get::<DaemonSet>(Some(NS), "hostpath-provisioner-csi").is_some(),
        "applied"
    );
    assert!(plain.list::<Secret>().is_empty());
    let cr = plain.get::<HostPathProvisioner>(None, CR).unwrap();
    assert!(cr.status.unwrap().volume_audit.is_none());
}

#[tokio::test]
async fn an_unreadable_pool_judges_none_of_its_volumes() {
    let mut cluster = Cluster::new();
    let token = Token::FromSecret(cluster.fake.clone());
    let (_one, _two) = cluster
        .drivers(
            (
                token.clone(),
                inventory("node01", true, vec![volume("pvc-db", 3600, true)]),
            ),
            Some((token, inventory("node02", false, vec![]))),
        )
        .await;
    let op = cluster.operator();
    cluster.pass(&op).await;
    assert_eq!(
        cluster.pool_audit().unwrap().missing_volumes,
        0,
        "pvc-web is not judged"
    );
    assert!(cluster.events(REASON_VOLUME_MISSING).is_empty());
}

/// A driver that takes the request and then neither answers nor closes (a hung node): the
/// audit gives up after its timeout and lets the connection go, rather than keeping a task and
/// a socket per hung node for good. (hyper closes a connection whose pending answer is
/// dropped by itself; the fetch also aborts the connection's task, for one that is stuck
/// elsewhere, such as a write to a peer that stopped reading.)
#[tokio::test]
async fn a_request_that_times_out_closes_its_connection() {
    use tokio::io::AsyncReadExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls_config());
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = acceptor.accept(tcp).await.unwrap();
        // Reads the request and whatever follows until the client closes: never answers.
        let mut buf = vec![0u8; 4096];
        let mut read = 0;
        loop {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => return read,
                Ok(n) => read += n,
            }
        }
    });
    let client =
        hpp_reconcile::reconcilers::volume_audit::fetch::ReportClient::new("token", Duration::from_millis(300))
            .unwrap();
    let answer = client.get(addr, "/volumes").await;
    assert!(
        matches!(
            answer,
            Err(hpp_reconcile::reconcilers::volume_audit::fetch::FetchError::Timeout { .. })
        ),
        "{answer:?}"
    );
    let read = tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .expect("the connection is still open after the request timed out")
        .unwrap();
    assert!(read > 0, "the request never reached the server");
}
