//! `cargo xtask bench --operator`: the resident memory of the real `hpp-operator` executable in
//! steady state, against the in-process fake API server (`hpp-testkit`) served over HTTPS on
//! 127.0.0.1 so the operator runs unchanged (kubeconfig, rustls, one HTTP/1 connection per
//! watch, as against a real API server).
//!
//! The fake holds the HostPathProvisioner CRD, a few Ready nodes and the example CR
//! (`deploy/examples/hostpathprovisioner_cr.yaml`). The operator runs as its Deployment runs it
//! (leader election, in-process webhook, admin and HTTPS metrics listeners, on loopback ports);
//! this process plays the DaemonSet controller (marks the CSI DaemonSet rolled out) until the
//! CR is `Available`, waits for the operator to settle, then samples `/proc/PID/status` once a
//! second and prints VmRSS, RssAnon, RssFile and Threads, then where the resident pages are,
//! from `/proc/PID/smaps`: the executable's own mappings, shared libraries, the main heap,
//! malloc arenas, thread stacks and other anonymous mappings.
//!
//! `GLIBC_TUNABLES` is passed on to the operator (its environment is otherwise only what the
//! Deployment sets), to try allocator settings without rebuilding. The shipped executables are
//! built with the `image` profile, statically linked (`images/build.sh`); measure those with
//! `images/build.sh` (or its cargo command) and
//! `--operator-bin target/x86_64-unknown-linux-gnu/image/hpp-operator`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hpp_api::HostPathProvisioner;
use hpp_testkit::FakeApiServer;

use crate::bench_proc::{ProcStatus, mib, print_smaps, threads_cpu_time};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Taint};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// The operator's namespace in the fake cluster.
const NAMESPACE: &str = "hostpath-provisioner";
/// How long the operator gets to make the CR Available.
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(300);
/// Quiet time after Available before sampling, so start-up allocations are behind.
const SETTLE: Duration = Duration::from_secs(5);
/// How often each node's kubelet rewrites its status in the quiet window (a heartbeat: only
/// `lastHeartbeatTime` changes), as kubelets did before node leases and still do on change.
const HEARTBEAT: Duration = Duration::from_secs(10);
/// Status rewrites of mounter Deployments a second in the churn stage: controller-manager's
/// pace when pods come and go across the cluster (its default client allows 20 a second per
/// controller; several controllers write at once).
const CHURN_RATE: usize = 50;
/// How long the churn stage writes.
const CHURN: Duration = Duration::from_secs(10);
/// How often each node's csi-provisioner sidecar asks the driver for its capacity
/// (`--capacity-poll-interval`, default one minute) and rewrites its CSIStorageCapacity when
/// the free bytes moved, which on a live node they always have (logs, images, volumes).
const CAPACITY_POLL: Duration = Duration::from_secs(60);
/// The free bytes each node's capacity object starts with.
const CAPACITY_BYTES: u64 = 100 << 30;

/// Options of `cargo xtask bench --operator`.
#[derive(Debug, Clone, clap::Args)]
pub struct OperatorArgs {
    /// Only measure the operator against a fake API server (memory, passes, requests), then exit.
    #[arg(long)]
    pub operator: bool,
    /// The hpp-operator executable (default: next to this one, in `target/<profile>/`).
    #[arg(long, value_name = "PATH")]
    pub operator_bin: Option<PathBuf>,
    /// Seconds of steady state to sample (node heartbeats go on meanwhile).
    #[arg(long, default_value_t = 30)]
    pub operator_seconds: u64,
    /// Ready nodes in the fake cluster; several sizes (`300,1000`) are measured one after the
    /// other and each figure is printed with its growth between the first and the last.
    #[arg(long, value_delimiter = ',', default_value = "3")]
    pub operator_nodes: Vec<usize>,
    /// The CR applied, by its name under `deploy/examples/` (`hostpathprovisioner_pvctemplate_cr`
    /// has one claim and one mounter Deployment per node).
    #[arg(long, default_value = "hostpathprovisioner_cr")]
    pub operator_cr: String,
    /// Bound PersistentVolumes of the driver in the fake cluster, spread over the nodes (every
    /// PV is watched, for the pools' usage and node loss); several counts (`1000,10000`) are
    /// measured at each node count, and the growth is printed between the first and the last
    /// run.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub operator_pvs: Vec<usize>,
}

/// What one run at one cluster size measured.
#[derive(Debug, Clone, Default)]
struct Row {
    nodes: usize,
    /// Bound PersistentVolumes in the fake cluster.
    pvs: usize,
    /// Per-node objects the CR asks for (claims and mounter Deployments), all written.
    node_objects: usize,
    /// From the CR's creation to every per-node object written.
    objects_after: Option<Duration>,
    /// API requests from the CR's creation until every per-node object was written.
    requests_to_objects: usize,
    /// The operator's CPU time from the CR's creation until every per-node object was written
    /// (the install's wall time is mostly the fake's, a debug build on the same cores).
    cpu_to_objects: Duration,
    /// From the CR's creation to `Available`.
    available_after: Duration,
    /// Reconcile passes until `Available`, and their mean duration.
    converge_passes: u64,
    mean_pass: Duration,
    /// Reconcile passes during the quiet window.
    quiet_passes: u64,
    /// Requests during the quiet window: discovery, other reads, writes.
    quiet_discovery: usize,
    quiet_reads: usize,
    quiet_writes: usize,
    /// Node status heartbeats written in the quiet window.
    heartbeats: usize,
    /// Deleting one node's mounter Deployment: time until it is back, passes and requests.
    repair: Option<(Duration, u64, usize)>,
    /// Mean duration of the repair's passes.
    repair_pass: Duration,
    /// CPU time the operator spent from the deletion to 1 s after the repair, less what the
    /// same time costs it without a pass (node heartbeats).
    repair_cpu: Duration,
    /// One node lost while the cluster holds `--operator-pvs` PVs (see [`node_loss`]).
    node_loss: Option<StatusFigures>,
    /// One PV added while the cluster holds `--operator-pvs` PVs (see [`volume_added`]).
    volume_added: Option<StatusFigures>,
    /// Status churn of the mounter Deployments (see [`churn`]).
    churn: Option<ChurnFigures>,
    /// The CSI DaemonSet's ready pods going up and down (see [`daemonset_flaps`]).
    flaps: Option<StatusWrites>,
    /// Every node's capacity republished once a minute (see [`capacity_churn`]).
    capacity: Option<CapacityFigures>,
    /// A label added to one Node (see [`relabel`]).
    relabel: Option<StageCost>,
    /// JSON bytes in the operator's watch caches (its `hpp_operator_cache_bytes`).
    cache_bytes: f64,
    rss_kib: u64,
    hwm_kib: u64,
    anon_kib: u64,
}

/// Runs the measurement at each size and prints the figures and their growth.
pub async fn run(args: &OperatorArgs) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bin = operator_bin(args.operator_bin.as_deref())?;
    let cr = example_cr(&args.operator_cr)?;
    let mut rows = Vec::new();
    let sizes: Vec<(usize, usize)> = args
        .operator_nodes
        .iter()
        .flat_map(|&nodes| args.operator_pvs.iter().map(move |&pvs| (nodes, pvs)))
        .collect();
    for (i, &(nodes, pvs)) in sizes.iter().enumerate() {
        let last = i + 1 == sizes.len();
        rows.push(measure(args, &bin, &cr, nodes, pvs, last).await?);
    }
    print_growth(&rows);
    Ok(())
}

async fn measure(
    args: &OperatorArgs,
    bin: &Path,
    cr: &HostPathProvisioner,
    nodes: usize,
    pvs: usize,
    print_where: bool,
) -> anyhow::Result<Row> {
    let fake = seeded_fake(nodes)?;
    if pvs > 0 {
        fake.seed(&recreate_class()?);
    }
    for i in 0..pvs {
        fake.seed(&bound_volume(i, nodes)?);
    }
    let pki = Pki::new()?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(serve(listener, pki.acceptor()?, fake.clone()));

    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, &pki.ca_pem)?;
    std::fs::write(&kubeconfig, Pki::kubeconfig(addr, &ca_file))?;
    let log_path = dir.path().join("operator.log");
    let child = OperatorProcess::spawn(bin, &kubeconfig, dir.path(), &log_path)?;
    let pid = child.0.id();
    println!(
        "\n== {nodes} nodes, {} PVs: hpp-operator {} (pid {pid}) against a fake API server on https://{addr} \
         (objects with managedFields, kubelet-sized nodes), CR {}",
        pvs,
        bin.display(),
        args.operator_cr
    );
    let admin = wait_controller(&fake, &log_path).await?;

    let mut row = Row {
        nodes,
        pvs,
        ..Row::default()
    };
    fake.clear_requests();
    let cpu_before = threads_cpu_time(pid);
    let started = Instant::now();
    fake.seed(cr);
    let expect_node_objects = if cr.spec.storage_pools.iter().flatten().any(|p| p.pvc_template.is_some()) {
        2 * nodes
    } else {
        0
    };
    loop {
        play_controllers(&fake, nodes);
        let written = node_objects(&fake);
        if row.objects_after.is_none() && written >= expect_node_objects {
            row.objects_after = Some(started.elapsed());
            row.node_objects = written;
            row.requests_to_objects = fake.requests().len();
            row.cpu_to_objects = threads_cpu_time(pid).saturating_sub(cpu_before);
        }
        if row.objects_after.is_some() && available(&fake) {
            row.available_after = started.elapsed();
            break;
        }
        if started.elapsed() > RECONCILE_TIMEOUT {
            let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(20).collect();
            anyhow::bail!(
                "the CR was not Available after {}s ({} of {expect_node_objects} per-node objects); \
                 operator log (last lines, newest first):\n{}",
                RECONCILE_TIMEOUT.as_secs(),
                node_objects(&fake),
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (count, seconds, _) = pass_figures(admin).await?;
    row.converge_passes = count;
    row.mean_pass = Duration::from_secs_f64(seconds / count.max(1) as f64);
    println!(
        "{} passes until Available, {:.1} ms each on average",
        row.converge_passes,
        row.mean_pass.as_secs_f64() * 1000.0
    );
    println!(
        "per-node objects: {} written after {} (operator CPU {:.0} ms) with {} API requests ({:.2} per object); \
         CR Available after {:.2}s; settling {}s",
        row.node_objects,
        row.objects_after
            .map_or("-".into(), |d| format!("{:.2}s", d.as_secs_f64())),
        row.cpu_to_objects.as_secs_f64() * 1000.0,
        row.requests_to_objects,
        row.requests_to_objects as f64 / row.node_objects.max(1) as f64,
        row.available_after.as_secs_f64(),
        SETTLE.as_secs()
    );
    tokio::time::sleep(SETTLE).await;

    // The quiet window: nothing the operator owns changes; kubelets keep heartbeating.
    let passes_before = passes(admin).await?;
    fake.clear_requests();
    let mut samples = Vec::new();
    let window = Duration::from_secs(args.operator_seconds.max(1));
    let sampling = Instant::now();
    let mut beat = 0usize;
    while sampling.elapsed() < window {
        samples.push(ProcStatus::of(pid).with_context(|| format!("the operator (pid {pid}) exited"))?);
        // Spread the heartbeats evenly: every node once per HEARTBEAT.
        let due = ((sampling.elapsed().as_secs_f64() / HEARTBEAT.as_secs_f64()) * nodes as f64) as usize;
        while beat < due {
            heartbeat(&fake, &format!("node-{}", beat % nodes.max(1)));
            beat += 1;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    row.heartbeats = beat;
    row.quiet_passes = passes(admin).await?.saturating_sub(passes_before);
    for r in fake.requests() {
        if r.is_write() {
            row.quiet_writes += 1;
        } else if r.path == "/apis"
            || r.path == "/api"
            || r.path.starts_with("/apis/") && r.path.matches('/').count() <= 3
        {
            row.quiet_discovery += 1;
        } else {
            row.quiet_reads += 1;
        }
    }
    let last = ProcStatus::of(pid).with_context(|| format!("the operator (pid {pid}) exited"))?;
    row.rss_kib = samples.iter().map(|s| s.rss_kib).max().unwrap_or(last.rss_kib);
    row.hwm_kib = last.hwm_kib;
    row.anon_kib = last.anon_kib;
    println!(
        "quiet {}s ({} node heartbeats): {} passes; requests: {} discovery, {} other reads, {} writes",
        window.as_secs(),
        row.heartbeats,
        row.quiet_passes,
        row.quiet_discovery,
        row.quiet_reads,
        row.quiet_writes
    );
    let caches = cache_sizes(admin).await?;
    row.cache_bytes = caches.iter().map(|c| c.2).sum();
    println!(
        "  watch caches: {:.2} MiB of JSON in {} objects",
        row.cache_bytes / 1_048_576.0,
        caches.iter().map(|c| c.1).sum::<f64>()
    );
    for (series, objects, bytes) in &caches {
        println!(
            "    {series:<70} {objects:>6} objects {:>9.1} KiB ({:.0} B each)",
            bytes / 1024.0,
            bytes / objects.max(1.0)
        );
    }
    println!(
        "  VmRSS max {}  RssAnon {}  RssFile {}  VmHWM {}  Threads {}",
        mib(row.rss_kib),
        mib(last.anon_kib),
        mib(last.file_kib),
        mib(last.hwm_kib),
        last.threads
    );
    let allocator = allocator_bytes(admin).await?;
    if !allocator.is_empty() {
        let shown: Vec<String> = allocator
            .iter()
            .map(|(state, bytes)| format!("{state} {:.2} MiB", bytes / 1_048_576.0))
            .collect();
        println!("  jemalloc (hpp_operator_allocator_bytes): {}", shown.join("  "));
    }

    // One node's object goes away: what its repair costs.
    if let Some(name) = fake
        .list::<Deployment>()
        .iter()
        .filter_map(|d| d.metadata.name.clone())
        .find(|n| n.contains("node-0"))
    {
        let idle = idle_cpu_per_second(pid).await;
        let (before, seconds_before, full_before) = pass_figures(admin).await?;
        let cpu_before = threads_cpu_time(pid);
        let window = Instant::now();
        fake.clear_requests();
        let t = Instant::now();
        fake.remove::<Deployment>(Some(NAMESPACE), &name);
        while fake.get::<Deployment>(Some(NAMESPACE), &name).is_none() && t.elapsed() < RECONCILE_TIMEOUT {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let took = t.elapsed();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (after, seconds_after, full_after) = pass_figures(admin).await?;
        let spent = threads_cpu_time(pid).saturating_sub(cpu_before);
        row.repair_cpu = spent.saturating_sub(idle.mul_f64(window.elapsed().as_secs_f64()));
        let repair = (took, after.saturating_sub(before), fake.requests().len());
        println!(
            "repair of one deleted mounter Deployment: {:.0} ms, {} passes ({} of them full) of {:.1} ms each on average, {} requests (1 s after)",
            repair.0.as_secs_f64() * 1000.0,
            repair.1,
            full_after.saturating_sub(full_before),
            (seconds_after - seconds_before) * 1000.0 / repair.1.max(1) as f64,
            repair.2
        );
        row.repair_pass = Duration::from_secs_f64((seconds_after - seconds_before).max(0.0) / repair.1.max(1) as f64);
        println!(
            "  operator CPU from the deletion to 1 s after the repair: {:.1} ms, {:.1} ms of it beyond what the same time costs idle ({:.1} ms a second: node heartbeats)",
            spent.as_secs_f64() * 1000.0,
            row.repair_cpu.as_secs_f64() * 1000.0,
            idle.as_secs_f64() * 1000.0
        );
        row.repair = Some(repair);
    }
    row.churn = churn(&fake, admin, pid).await?;
    row.relabel = Some(relabel(&fake, admin, pid).await?);
    if pvs > 0 {
        row.node_loss = Some(node_loss(&fake, admin, pid, nodes, pvs).await?);
        row.volume_added = Some(volume_added(&fake, admin, pid, nodes, pvs).await?);
    }
    row.flaps = Some(daemonset_flaps(&fake, admin, pid, nodes).await?);
    // Last: what it holds back is written up to a usage interval later.
    row.capacity = Some(capacity_churn(&fake, admin, pid, nodes).await?);
    if print_where {
        print_smaps(pid, bin)?;
    }
    drop(child);
    server.abort();
    Ok(row)
}

/// What a stretch of status churn on the operator's per-node objects cost it.
#[derive(Debug, Clone, Copy, Default)]
struct ChurnFigures {
    /// Status rewrites made.
    changes: usize,
    /// Requests the operator made meanwhile (status writes of the CR included).
    requests: usize,
    /// Passes and CPU from the first rewrite to 1 s after the last.
    cost: StageCost,
}

/// Rewrites mounter Deployments' status at [`CHURN_RATE`] a second for [`CHURN`], as the
/// deployment controller does while pods come and go (a new `lastUpdateTime` on
/// `Progressing`; the Deployments stay available, so the CR's status need not change). Each
/// rewrite is a change to one node's object: what it costs should not grow with the nodes.
async fn churn(fake: &FakeApiServer, admin: SocketAddr, pid: u32) -> anyhow::Result<Option<ChurnFigures>> {
    let mounters: Vec<Deployment> = fake
        .list::<Deployment>()
        .into_iter()
        .filter(|d| d.metadata.name.as_deref().is_some_and(|n| n.contains("node-")))
        .collect();
    if mounters.is_empty() {
        return Ok(None);
    }
    let meter = StageMeter::start(admin, pid).await?;
    fake.clear_requests();
    let t = Instant::now();
    let mut changes = 0usize;
    while t.elapsed() < CHURN {
        let due = (t.elapsed().as_secs_f64() * CHURN_RATE as f64) as usize;
        while changes < due {
            let d = &mounters[changes % mounters.len()];
            let mut status = serde_json::to_value(d.status.clone().unwrap_or_default())?;
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            if let Some(conditions) = status.get_mut("conditions").and_then(serde_json::Value::as_array_mut) {
                for c in conditions.iter_mut().filter(|c| c["type"] == "Progressing") {
                    c["lastUpdateTime"] = json!(now);
                }
            }
            fake.set_status::<Deployment>(
                d.metadata.namespace.as_deref(),
                d.metadata.name.as_deref().unwrap_or_default(),
                status,
            );
            changes += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The requests are counted after the second the stage's cost waits for.
    let cost = meter.finish().await?;
    let figures = ChurnFigures {
        changes,
        requests: fake.requests().len(),
        cost,
    };
    println!(
        "status churn: {changes} mounter Deployment status rewrites in {}s: {} passes ({} full), {} requests, \
         operator CPU beyond idle {:.1} ms ({:.2} ms a rewrite)",
        CHURN.as_secs(),
        figures.cost.passes,
        figures.cost.full_passes,
        figures.requests,
        figures.cost.cpu.as_secs_f64() * 1000.0,
        figures.cost.cpu.as_secs_f64() * 1000.0 / changes.max(1) as f64
    );
    Ok(Some(figures))
}

/// What a stage of changes that reach the CR's status cost the operator, and the API server.
#[derive(Debug, Clone, Copy, Default)]
struct StatusWrites {
    changes: usize,
    /// Writes of the CR's status meanwhile, and their JSON bytes.
    writes: usize,
    bytes: usize,
    cost: StageCost,
}

impl StatusWrites {
    /// `changes` made and what they cost, with the writes of the CR the fake received since
    /// its log was cleared.
    fn read(fake: &FakeApiServer, changes: usize, cost: StageCost) -> Self {
        let writes: Vec<_> = fake
            .requests()
            .into_iter()
            .filter(|r| r.is_write() && r.path.contains("/hostpathprovisioners/"))
            .collect();
        StatusWrites {
            changes,
            writes: writes.len(),
            bytes: writes.iter().map(|r| r.body.to_string().len()).sum(),
            cost,
        }
    }

    fn kib(&self) -> f64 {
        self.bytes as f64 / 1024.0
    }

    fn kib_a_write(&self) -> f64 {
        self.kib() / self.writes.max(1) as f64
    }

    fn cpu_ms(&self) -> f64 {
        self.cost.cpu.as_secs_f64() * 1000.0
    }

    fn cpu_ms_a_change(&self) -> f64 {
        self.cpu_ms() / self.changes.max(1) as f64
    }
}

/// Pods of the CSI DaemonSet restart here and there across the cluster, as they do all day
/// on a large one: its `numberReady` goes one or two below the desired count and back, twice
/// a second for [`CHURN`]. Each change is a new condition message ("has 999 of 1000 pods
/// ready") and a write of the CR's status; what the write carries should not grow with the
/// nodes.
async fn daemonset_flaps(
    fake: &FakeApiServer,
    admin: SocketAddr,
    pid: u32,
    nodes: usize,
) -> anyhow::Result<StatusWrites> {
    const NAME: &str = "hostpath-provisioner-csi";
    // The mounter the repair stage recreated rolls out, so the CR is Available and not
    // Progressing: the DaemonSet's readiness is then what its conditions say.
    play_controllers(fake, nodes);
    wait_for_quiet(admin).await?;
    let ds = fake
        .get::<DaemonSet>(Some(NAMESPACE), NAME)
        .context("the CSI DaemonSet is gone")?;
    let status = serde_json::to_value(ds.status.clone().unwrap_or_default())?;
    let desired = status["desiredNumberScheduled"].as_i64().unwrap_or(0);
    let meter = StageMeter::start(admin, pid).await?;
    fake.clear_requests();
    let t = Instant::now();
    let mut changes = 0usize;
    while t.elapsed() < CHURN {
        let mut flapped = status.clone();
        // 999, 998, 1000, 999, ...: every change a new count.
        let ready = desired - [1, 2, 0][changes % 3];
        flapped["numberReady"] = json!(ready);
        flapped["numberAvailable"] = json!(ready);
        fake.set_status::<DaemonSet>(Some(NAMESPACE), NAME, flapped);
        changes += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    fake.set_status::<DaemonSet>(Some(NAMESPACE), NAME, status);
    let cost = meter.finish().await?;
    let figures = StatusWrites::read(fake, changes, cost);
    println!(
        "CSI DaemonSet readiness flapping ({changes} changes in {}s): {} passes ({} full), {} status writes of the CR \
         ({:.1} KiB, {:.2} KiB each), operator CPU beyond idle {:.1} ms",
        CHURN.as_secs(),
        cost.passes,
        cost.full_passes,
        figures.writes,
        figures.kib(),
        figures.kib_a_write(),
        figures.cpu_ms()
    );
    Ok(figures)
}

/// What a stretch of capacity republishing cost the operator, and the API server.
#[derive(Debug, Clone, Copy, Default)]
struct CapacityFigures {
    /// From the first change to the pool's `available` showing the last ones.
    written_after: Duration,
    /// The changes and the CR's status writes, with the passes and CPU from the first change
    /// to 1 s after the last figures were written.
    writes: StatusWrites,
}

/// Seeds what the csi-provisioner sidecars publish with capacity tracking on (a class of the
/// `local` pool and a CSIStorageCapacity per node), waits for the operator to take them in,
/// then republishes each node's at the sidecars' pace ([`CAPACITY_POLL`]) with a few MiB less
/// free each time, for [`CHURN`]. What the pools' `available` reads changes all the time on a
/// cluster: what it costs should not be a write of the CR's status (a claim per node) per pass.
async fn capacity_churn(
    fake: &FakeApiServer,
    admin: SocketAddr,
    pid: u32,
    nodes: usize,
) -> anyhow::Result<CapacityFigures> {
    fake.seed(&capacity_class()?);
    for i in 0..nodes {
        fake.seed(&capacity_object(i, CAPACITY_BYTES)?);
    }
    wait_for_quiet(admin).await?;
    let meter = StageMeter::start(admin, pid).await?;
    fake.clear_requests();
    let t = Instant::now();
    let per_second = nodes as f64 / CAPACITY_POLL.as_secs_f64();
    let mut changes = 0usize;
    let mut free = vec![CAPACITY_BYTES; nodes];
    while t.elapsed() < CHURN {
        let due = (t.elapsed().as_secs_f64() * per_second) as usize;
        while changes < due {
            let node = changes % nodes.max(1);
            free[node] -= (4 << 20) + changes as u64 * 4096;
            fake.seed(&capacity_object(node, free[node])?);
            changes += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The figures held back are written within the usage interval of the last write: the
    // stage's cost runs until then, so it counts the passes and the write that brings them.
    let want = hpp_api::quantity::format_bytes(free.iter().sum());
    let written = |fake: &FakeApiServer| {
        fake.list::<HostPathProvisioner>().iter().any(|cr| {
            cr.status.as_ref().is_some_and(|s| {
                s.storage_pool_statuses
                    .iter()
                    .any(|p| p.name == "local" && p.available.as_deref() == Some(want.as_str()))
            })
        })
    };
    let waited = Instant::now();
    while !written(fake) {
        anyhow::ensure!(
            waited.elapsed() < RECONCILE_TIMEOUT,
            "the pool's available bytes never reached {want}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let written_after = t.elapsed();
    let cost = meter.finish().await?;
    let figures = CapacityFigures {
        written_after,
        writes: StatusWrites::read(fake, changes, cost),
    };
    println!(
        "capacity republished ({changes} CSIStorageCapacity changes in {churn}s, every node once a minute): \
         the last figures in the status {after:.1} s after the first change; until then {passes} passes ({full} full), \
         {writes} status writes of the CR ({kib:.1} KiB), operator CPU beyond idle {cpu:.1} ms ({per:.2} ms a change)",
        churn = CHURN.as_secs(),
        after = written_after.as_secs_f64(),
        passes = cost.passes,
        full = cost.full_passes,
        writes = figures.writes.writes,
        kib = figures.writes.kib(),
        cpu = figures.writes.cpu_ms(),
        per = figures.writes.cpu_ms_a_change(),
    );
    Ok(figures)
}

/// Waits until the operator has taken in what changed: a second without a pass.
async fn wait_for_quiet(admin: SocketAddr) -> anyhow::Result<()> {
    let t = Instant::now();
    let mut last = passes(admin).await?;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = passes(admin).await?;
        if now == last {
            return Ok(());
        }
        anyhow::ensure!(t.elapsed() < RECONCILE_TIMEOUT, "passes did not stop");
        last = now;
    }
}

/// A StorageClass of the `local` pool, for [`capacity_object`]s.
fn capacity_class() -> anyhow::Result<k8s_openapi::api::storage::v1::StorageClass> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": "hostpath-csi-capacity"},
        "provisioner": hpp_api::constants::DRIVER_NAME,
        "parameters": {"storagePool": "local"},
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
    }))?)
}

/// Node `i`'s CSIStorageCapacity for [`capacity_class`], as its csi-provisioner sidecar
/// writes it.
fn capacity_object(i: usize, bytes: u64) -> anyhow::Result<k8s_openapi::api::storage::v1::CSIStorageCapacity> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("csisc-node-{i}"), "namespace": NAMESPACE,
                     "labels": {"csi.storage.k8s.io/drivername": hpp_api::constants::DRIVER_NAME,
                                "csi.storage.k8s.io/managed-by": "external-provisioner"}},
        "storageClassName": "hostpath-csi-capacity",
        "nodeTopology": {"matchLabels": {(hpp_api::constants::TOPOLOGY_KEY): format!("node-{i}")}},
        "capacity": bytes.to_string(),
        "maximumVolumeSize": bytes.to_string(),
    }))?)
}

/// Adds a label to node-0 (the pools stay on it: nothing to write) and waits for the passes
/// it starts: a pass over that node's part, not over every node's.
async fn relabel(fake: &FakeApiServer, admin: SocketAddr, pid: u32) -> anyhow::Result<StageCost> {
    let meter = StageMeter::start(admin, pid).await?;
    let t = Instant::now();
    let mut node = fake.get::<Node>(None, "node-0").context("node-0 is gone")?;
    node.metadata
        .labels
        .get_or_insert_default()
        .insert("example.com/rack".into(), "r7".into());
    fake.seed(&node);
    while passes(admin).await? == meter.passes {
        anyhow::ensure!(t.elapsed() < RECONCILE_TIMEOUT, "no pass after node-0's label changed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let cost = meter.finish().await?;
    println!(
        "node-0 relabelled: {} passes ({} full), operator CPU beyond idle {:.1} ms (1 s after)",
        cost.passes,
        cost.full_passes,
        cost.cpu.as_secs_f64() * 1000.0
    );
    Ok(cost)
}

/// What a change cost the operator until the CR's status showed it (a lost node, a new PV).
#[derive(Debug, Clone, Copy, Default)]
struct StatusFigures {
    /// From the change to the CR's status showing it.
    seen_after: Duration,
    requests: usize,
    /// Passes and CPU from the taint to 1 s after the status.
    cost: StageCost,
}

/// Taints node-0 out-of-service while the cluster holds `pvs` PVs of a `Recreate` class
/// spread over the nodes, and waits until the CR's `status.nodeLoss` lists it (the grace
/// period is an hour: nothing is released). The node-loss step asks its PV index for the PVs
/// of lost nodes only, so what this costs should not grow with the PVs of the other nodes:
/// `--operator-pvs 1000,10000` measures both in one run.
async fn node_loss(
    fake: &FakeApiServer,
    admin: SocketAddr,
    pid: u32,
    nodes: usize,
    pvs: usize,
) -> anyhow::Result<StatusFigures> {
    let meter = StageMeter::start(admin, pid).await?;
    fake.clear_requests();
    let t = Instant::now();
    let mut node = fake.get::<Node>(None, "node-0").context("node-0 is gone")?;
    node.spec
        .get_or_insert_default()
        .taints
        .get_or_insert_default()
        .push(Taint {
            key: hpp_api::constants::TAINT_OUT_OF_SERVICE.into(),
            effect: "NoExecute".into(),
            value: Some("nodeshutdown".into()),
            ..Default::default()
        });
    fake.seed(&node);
    let listed = |fake: &FakeApiServer| {
        fake.list::<HostPathProvisioner>().iter().any(|cr| {
            cr.status
                .as_ref()
                .and_then(|s| s.node_loss.as_ref())
                .is_some_and(|l| l.lost_nodes.iter().any(|n| n.name == "node-0"))
        })
    };
    while !listed(fake) {
        anyhow::ensure!(
            t.elapsed() < RECONCILE_TIMEOUT,
            "node-0 was not in status.nodeLoss after {}s",
            RECONCILE_TIMEOUT.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen_after = t.elapsed();
    let cost = meter.finish().await?;
    let figures = StatusFigures {
        seen_after,
        requests: fake.requests().len(),
        cost,
    };
    println!(
        "node-0 lost (out-of-service taint; {} of {pvs} PVs on it): in status.nodeLoss after {:.0} ms, {} passes ({} full), \
         {} requests, operator CPU beyond idle {:.1} ms (1 s after)",
        pvs.div_ceil(nodes.max(1)),
        seen_after.as_secs_f64() * 1000.0,
        figures.cost.passes,
        figures.cost.full_passes,
        figures.requests,
        figures.cost.cpu.as_secs_f64() * 1000.0
    );
    Ok(figures)
}

/// Adds one Bound PV of the driver while the cluster holds `pvs`: the passes and CPU it costs
/// (read 1 s after), then how long until the CR's pool status counts it in `committed` (a
/// change of the usage figures alone is written at most once per usage interval, so this is
/// mostly that wait). The pools' usage is kept up to date from the PVs that changed, so what
/// this costs should not grow with the other PVs: `--operator-pvs 1000,10000` measures both in
/// one run.
async fn volume_added(
    fake: &FakeApiServer,
    admin: SocketAddr,
    pid: u32,
    nodes: usize,
    pvs: usize,
) -> anyhow::Result<StatusFigures> {
    let committed = |fake: &FakeApiServer| {
        fake.list::<HostPathProvisioner>().iter().find_map(|cr| {
            cr.status
                .as_ref()?
                .storage_pool_statuses
                .iter()
                .find(|p| p.name == "local")?
                .committed
                .clone()
        })
    };
    let before = committed(fake);
    let meter = StageMeter::start(admin, pid).await?;
    fake.clear_requests();
    let t = Instant::now();
    // On node-1: node-0 was just lost (the stage before), and its PVs are node loss's to act on.
    fake.seed(&bound_volume(pvs + 1, nodes)?);
    let cost = meter.finish().await?;
    let requests = fake.requests().len();
    while committed(fake) == before {
        anyhow::ensure!(
            t.elapsed() < RECONCILE_TIMEOUT,
            "the pool's committed bytes did not count the new PV after {}s",
            RECONCILE_TIMEOUT.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let figures = StatusFigures {
        seen_after: t.elapsed(),
        requests,
        cost,
    };
    println!(
        "one PV added to {pvs}: {} passes ({} full), {} requests, operator CPU beyond idle {:.1} ms (1 s after); \
         committed {} -> {} in the status after {:.1} s (usage figures alone are written once per interval)",
        figures.cost.passes,
        figures.cost.full_passes,
        figures.requests,
        figures.cost.cpu.as_secs_f64() * 1000.0,
        before.as_deref().unwrap_or("-"),
        committed(fake).as_deref().unwrap_or("-"),
        figures.seen_after.as_secs_f64(),
    );
    Ok(figures)
}

/// What a bench stage cost the operator, read one second after it: its passes (all, and the
/// full ones) and its CPU beyond what the same time costs it idle.
#[derive(Debug, Clone, Copy, Default)]
struct StageCost {
    passes: u64,
    full_passes: u64,
    cpu: Duration,
}

/// The operator's figures as a stage starts, for [`StageCost`].
struct StageMeter {
    admin: SocketAddr,
    pid: u32,
    /// CPU a second of idle costs (node heartbeats).
    idle: Duration,
    /// Passes so far (all, and the full ones).
    passes: u64,
    full_passes: u64,
    cpu: Duration,
    started: Instant,
}

impl StageMeter {
    async fn start(admin: SocketAddr, pid: u32) -> anyhow::Result<Self> {
        let idle = idle_cpu_per_second(pid).await;
        let (passes, _, full_passes) = pass_figures(admin).await?;
        Ok(StageMeter {
            admin,
            pid,
            idle,
            passes,
            full_passes,
            cpu: threads_cpu_time(pid),
            started: Instant::now(),
        })
    }

    /// Waits a second for the stage's last passes, then reads what it cost.
    async fn finish(&self) -> anyhow::Result<StageCost> {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (passes, _, full_passes) = pass_figures(self.admin).await?;
        let spent = threads_cpu_time(self.pid).saturating_sub(self.cpu);
        Ok(StageCost {
            passes: passes.saturating_sub(self.passes),
            full_passes: full_passes.saturating_sub(self.full_passes),
            cpu: spent.saturating_sub(self.idle.mul_f64(self.started.elapsed().as_secs_f64())),
        })
    }
}

/// The CPU one second of node heartbeats costs the operator without a pass: subtracted from
/// a measured window to tell the passes' own share.
async fn idle_cpu_per_second(pid: u32) -> Duration {
    let start = threads_cpu_time(pid);
    tokio::time::sleep(Duration::from_secs(1)).await;
    threads_cpu_time(pid).saturating_sub(start)
}

/// The StorageClass of [`bound_volume`]'s PVs, with `nodeLossPolicy: Recreate` and an hour's
/// grace period.
fn recreate_class() -> anyhow::Result<k8s_openapi::api::storage::v1::StorageClass> {
    use hpp_api::constants as c;
    Ok(serde_json::from_value(json!({
        "metadata": {"name": "hostpath-csi"},
        "provisioner": c::DRIVER_NAME,
        "parameters": {"storagePool": "local", (c::PARAM_NODE_LOSS_POLICY): "Recreate", (c::PARAM_NODE_LOSS_GRACE_PERIOD): "1h"},
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
    }))?)
}

/// Prints each figure at the first and last size with its growth, and memory per node.
fn print_growth(rows: &[Row]) {
    let (Some(a), Some(b)) = (rows.first(), rows.last()) else {
        return;
    };
    if rows.len() < 2 || (a.nodes, a.pvs) == (b.nodes, b.pvs) {
        return;
    }
    let size = |r: &Row| match rows.iter().all(|x| x.pvs == a.pvs) {
        true => format!("{}", r.nodes),
        false => format!("{}n/{}pv", r.nodes, r.pvs),
    };
    let times = |what: &str, x: usize, y: usize| match x {
        0 => String::new(),
        _ if x == y => String::new(),
        _ => format!(" ({:.1}x the {what})", y as f64 / x as f64),
    };
    println!(
        "\n== growth from {} nodes, {} PVs to {} nodes, {} PVs{}{}",
        a.nodes,
        a.pvs,
        b.nodes,
        b.pvs,
        times("nodes", a.nodes, b.nodes),
        times("PVs", a.pvs, b.pvs),
    );
    let ratio = |x: f64, y: f64| if x > 0.0 { format!("{:.2}x", y / x) } else { "-".into() };
    let secs = |d: Option<Duration>| d.map_or(0.0, |d| d.as_secs_f64());
    let mut lines: Vec<(&str, f64, f64)> = vec![
        (
            "per-node objects written (s)",
            secs(a.objects_after),
            secs(b.objects_after),
        ),
        (
            "operator CPU until then (ms)",
            a.cpu_to_objects.as_secs_f64() * 1000.0,
            b.cpu_to_objects.as_secs_f64() * 1000.0,
        ),
        (
            "requests per per-node object",
            per(a.requests_to_objects, a.node_objects),
            per(b.requests_to_objects, b.node_objects),
        ),
        (
            "CR Available (s)",
            a.available_after.as_secs_f64(),
            b.available_after.as_secs_f64(),
        ),
        (
            "passes until Available",
            a.converge_passes as f64,
            b.converge_passes as f64,
        ),
        (
            "mean pass (ms)",
            a.mean_pass.as_secs_f64() * 1000.0,
            b.mean_pass.as_secs_f64() * 1000.0,
        ),
        (
            "repair: mean pass (ms)",
            a.repair_pass.as_secs_f64() * 1000.0,
            b.repair_pass.as_secs_f64() * 1000.0,
        ),
        (
            "repair: operator CPU (ms)",
            a.repair_cpu.as_secs_f64() * 1000.0,
            b.repair_cpu.as_secs_f64() * 1000.0,
        ),
        (
            "passes in the quiet window",
            a.quiet_passes as f64,
            b.quiet_passes as f64,
        ),
        (
            "discovery requests in the quiet window",
            a.quiet_discovery as f64,
            b.quiet_discovery as f64,
        ),
        (
            "other requests in the quiet window",
            (a.quiet_reads + a.quiet_writes) as f64,
            (b.quiet_reads + b.quiet_writes) as f64,
        ),
        ("VmRSS (MiB)", a.rss_kib as f64 / 1024.0, b.rss_kib as f64 / 1024.0),
        ("VmHWM (MiB)", a.hwm_kib as f64 / 1024.0, b.hwm_kib as f64 / 1024.0),
    ];
    if let (Some(x), Some(y)) = (a.churn, b.churn) {
        let per_change = |c: ChurnFigures| c.cost.cpu.as_secs_f64() * 1000.0 / c.changes.max(1) as f64;
        lines.extend([
            ("churn: passes", x.cost.passes as f64, y.cost.passes as f64),
            (
                "churn: full passes",
                x.cost.full_passes as f64,
                y.cost.full_passes as f64,
            ),
            ("churn: requests", x.requests as f64, y.requests as f64),
            ("churn: operator CPU a rewrite (ms)", per_change(x), per_change(y)),
        ]);
    }
    if let (Some(x), Some(y)) = (a.flaps, b.flaps) {
        lines.extend([
            ("DaemonSet flaps: changes", x.changes as f64, y.changes as f64),
            ("DaemonSet flaps: CR status writes", x.writes as f64, y.writes as f64),
            ("DaemonSet flaps: KiB a status write", x.kib_a_write(), y.kib_a_write()),
            ("DaemonSet flaps: operator CPU (ms)", x.cpu_ms(), y.cpu_ms()),
        ]);
    }
    if let (Some(c), Some(d)) = (a.capacity, b.capacity) {
        let (x, y) = (c.writes, d.writes);
        lines.extend([
            ("capacity: changes", x.changes as f64, y.changes as f64),
            ("capacity: passes", x.cost.passes as f64, y.cost.passes as f64),
            ("capacity: CR status writes", x.writes as f64, y.writes as f64),
            ("capacity: CR status KiB written", x.kib(), y.kib()),
            (
                "capacity: operator CPU a change (ms)",
                x.cpu_ms_a_change(),
                y.cpu_ms_a_change(),
            ),
            (
                "capacity: last figures written after (s)",
                c.written_after.as_secs_f64(),
                d.written_after.as_secs_f64(),
            ),
        ]);
    }
    if let (Some(x), Some(y)) = (a.relabel, b.relabel) {
        lines.extend([
            ("node relabelled: passes", x.passes as f64, y.passes as f64),
            (
                "node relabelled: full passes",
                x.full_passes as f64,
                y.full_passes as f64,
            ),
            (
                "node relabelled: operator CPU (ms)",
                x.cpu.as_secs_f64() * 1000.0,
                y.cpu.as_secs_f64() * 1000.0,
            ),
        ]);
    }
    if let (Some(x), Some(y)) = (a.node_loss, b.node_loss) {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        lines.extend([
            ("node loss: in status after (ms)", ms(x.seen_after), ms(y.seen_after)),
            ("node loss: passes", x.cost.passes as f64, y.cost.passes as f64),
            (
                "node loss: full passes",
                x.cost.full_passes as f64,
                y.cost.full_passes as f64,
            ),
            ("node loss: requests", x.requests as f64, y.requests as f64),
            ("node loss: operator CPU (ms)", ms(x.cost.cpu), ms(y.cost.cpu)),
        ]);
    }
    if let (Some(x), Some(y)) = (a.volume_added, b.volume_added) {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        lines.extend([
            ("PV added: passes", x.cost.passes as f64, y.cost.passes as f64),
            ("PV added: operator CPU (ms)", ms(x.cost.cpu), ms(y.cost.cpu)),
        ]);
    }
    println!("{:<42} {:>10} {:>10} {:>8}", "figure", size(a), size(b), "growth");
    for (name, x, y) in lines {
        println!("{name:<42} {x:>10.2} {y:>10.2} {:>8}", ratio(x, y));
    }
    let grew = b.rss_kib as f64 - a.rss_kib as f64;
    if a.pvs == b.pvs && b.nodes > a.nodes {
        let nodes = (b.nodes - a.nodes) as f64;
        let objects = b.node_objects.saturating_sub(a.node_objects) as f64;
        println!(
            "RSS grows {:.1} KiB per node{}",
            grew / nodes,
            if objects > 0.0 {
                format!(
                    " ({:.1} KiB per owned per-node object; {:.1} KiB per object, counting the Nodes as objects)",
                    grew / objects,
                    grew / (nodes + objects)
                )
            } else {
                String::new()
            }
        );
    } else if a.nodes == b.nodes && b.pvs > a.pvs {
        println!(
            "RSS grows {:.2} KiB per PersistentVolume",
            grew / (b.pvs - a.pvs) as f64
        );
    }
}

fn per(n: usize, d: usize) -> f64 {
    if d == 0 { 0.0 } else { n as f64 / d as f64 }
}

/// Waits until the operator's controller watches the CRs; returns its admin address (metrics).
async fn wait_controller(fake: &FakeApiServer, log: &Path) -> anyhow::Result<SocketAddr> {
    let start = Instant::now();
    loop {
        let admin = std::fs::read_to_string(log).ok().and_then(|text| {
            text.lines()
                .filter(|l| l.contains("admin server listening"))
                .find_map(|l| {
                    serde_json::from_str::<serde_json::Value>(l).ok()?["fields"]["addr"]
                        .as_str()?
                        .parse()
                        .ok()
                })
        });
        let watching = fake
            .requests()
            .iter()
            .any(|r| r.path.ends_with("/hostpathprovisioners") && r.query.contains("watch=true"));
        if let (Some(admin), true) = (admin, watching) {
            return Ok(admin);
        }
        if start.elapsed() > RECONCILE_TIMEOUT {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            anyhow::bail!("the operator did not start its controller:\n{tail}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The operator's reconcile pass count, from its admin port's `/metrics`.
async fn passes(admin: SocketAddr) -> anyhow::Result<u64> {
    Ok(pass_figures(admin).await?.0)
}

/// The operator's reconcile pass count and the seconds they took in all.
async fn pass_figures(admin: SocketAddr) -> anyhow::Result<(u64, f64, u64)> {
    let body = scrape(admin).await?;
    let sum = |prefix: &str| {
        body.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    Ok((
        sum("hpp_operator_reconcile_total{") as u64,
        sum("hpp_operator_reconcile_duration_seconds_sum"),
        sum("hpp_operator_passes_total{scope=\"full\"}") as u64,
    ))
}

/// The operator's metrics, as its admin port serves them.
async fn scrape(admin: SocketAddr) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(admin).await?;
    tcp.write_all(b"GET /metrics HTTP/1.0\r\nHost: operator\r\n\r\n")
        .await?;
    let mut body = String::new();
    tcp.read_to_string(&mut body).await?;
    Ok(body)
}

/// The series of metric `name` in a scrape: (labels, value).
fn series(body: &str, name: &str) -> std::collections::BTreeMap<String, f64> {
    body.lines()
        .filter_map(|l| l.strip_prefix(name))
        .filter(|l| l.starts_with('{') || l.starts_with(' '))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once(' ')?;
            Some((labels.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The operator's allocator counters (`hpp_operator_allocator_bytes`): (state, bytes), in
/// the order the metric lists them.
async fn allocator_bytes(admin: SocketAddr) -> anyhow::Result<Vec<(String, f64)>> {
    let body = scrape(admin).await?;
    let by_state = series(&body, "hpp_operator_allocator_bytes");
    Ok(["allocated", "active", "metadata", "resident"]
        .into_iter()
        .filter_map(|state| {
            let bytes = by_state.get(&format!("{{state=\"{state}\"}}"))?;
            Some((state.to_owned(), *bytes))
        })
        .collect())
}

/// The operator's watch caches from its metrics: (kind and selector, objects, JSON bytes).
async fn cache_sizes(admin: SocketAddr) -> anyhow::Result<Vec<(String, f64, f64)>> {
    let body = scrape(admin).await?;
    let objects = series(&body, "hpp_operator_cache_objects");
    let bytes = series(&body, "hpp_operator_cache_bytes");
    Ok(objects
        .into_iter()
        .map(|(labels, n)| {
            let b = bytes.get(&labels).copied().unwrap_or(0.0);
            (labels, n, b)
        })
        .collect())
}

/// Per-node objects written so far: pool claims and mounter Deployments.
fn node_objects(fake: &FakeApiServer) -> usize {
    let labelled = |labels: Option<&std::collections::BTreeMap<String, String>>, key: &str| {
        labels.is_some_and(|l| l.contains_key(key))
    };
    fake.list::<PersistentVolumeClaim>()
        .iter()
        .filter(|p| labelled(p.metadata.labels.as_ref(), hpp_api::constants::LABEL_STORAGE_POOL))
        .count()
        + fake
            .list::<Deployment>()
            .iter()
            .filter(|d| labelled(d.metadata.labels.as_ref(), hpp_api::constants::LABEL_HPP_POOL))
            .count()
}

fn available(fake: &FakeApiServer) -> bool {
    fake.list::<HostPathProvisioner>()
        .iter()
        .flat_map(|h| h.status.iter().flat_map(|s| s.conditions.iter()))
        .any(|c| c.type_ == "Available" && c.status == "True")
}

/// A kubelet's heartbeat: the node's status again, with a new `lastHeartbeatTime`.
fn heartbeat(fake: &FakeApiServer, name: &str) {
    let Some(node) = fake.get::<Node>(None, name) else {
        return;
    };
    let Ok(mut status) = serde_json::to_value(node.status) else {
        return;
    };
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    if let Some(conditions) = status.get_mut("conditions").and_then(serde_json::Value::as_array_mut) {
        for c in conditions {
            c["lastHeartbeatTime"] = json!(now);
        }
    }
    fake.set_status::<Node>(None, name, status);
}
/// The operator executable: the given path, or the one built next to this xtask.
fn operator_bin(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match given {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()?
            .parent()
            .context("the xtask executable has no directory")?
            .join("hpp-operator"),
    };
    anyhow::ensure!(
        path.is_file(),
        "{} not found: build it (`cargo build --release -p hpp-bin --bin hpp-operator`) or pass --operator-bin",
        path.display()
    );
    Ok(path)
}

/// The fake cluster: the CRD and `nodes` Ready Linux nodes, every object with the
/// `managedFields` a real API server keeps.
fn seeded_fake(nodes: usize) -> anyhow::Result<FakeApiServer> {
    let fake = FakeApiServer::new();
    fake.track_managed_fields();
    fake.register::<HostPathProvisioner>(false, true);
    fake.seed(&hpp_api::crd::crd()?);
    for i in 0..nodes {
        fake.seed(&kubelet_node(&format!("node-{i}"))?);
    }
    Ok(fake)
}

/// The driver's `i`th Bound PersistentVolume, on node `i % nodes`, as the external provisioner
/// creates them (about 1.5 KiB of JSON before `managedFields`).
fn bound_volume(i: usize, nodes: usize) -> anyhow::Result<k8s_openapi::api::core::v1::PersistentVolume> {
    let node = format!("node-{}", i % nodes.max(1));
    let name = format!("pvc-{:08x}-0000-4000-8000-{:012x}", i, i);
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "finalizers": ["kubernetes.io/pv-protection", "external-provisioner.volume.kubernetes.io/finalizer"],
                     "annotations": {"pv.kubernetes.io/provisioned-by": hpp_api::constants::DRIVER_NAME,
                                     "volume.kubernetes.io/provisioner-deletion-secret-name": "",
                                     "volume.kubernetes.io/provisioner-deletion-secret-namespace": ""}},
        "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "10Gi"},
                 "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": format!("team-{}", i % 50),
                              "name": format!("data-{i}"), "uid": format!("{:08x}-1111-4000-8000-{:012x}", i, i), "resourceVersion": "1"},
                 "csi": {"driver": hpp_api::constants::DRIVER_NAME, "volumeHandle": name, "fsType": "ext4",
                         "volumeAttributes": {"storagePool": "local", "storage.kubernetes.io/csiProvisionerIdentity": "1700000000000-1234-kubevirt.io.hostpath-provisioner"}},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": hpp_api::constants::TOPOLOGY_KEY, "operator": "In", "values": [node]}]}]}},
                 "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "hostpath-csi", "volumeMode": "Filesystem"},
        "status": {"phase": "Bound", "lastPhaseTransitionTime": "2026-01-01T00:00:00Z"},
    }))?)
}

/// The example CR `deploy/examples/<name>.yaml`.
fn example_cr(name: &str) -> anyhow::Result<HostPathProvisioner> {
    let path = format!("{}/../deploy/examples/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
    serde_saphyr::from_str(&std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?)
        .with_context(|| format!("parsing {path}"))
}

/// A Ready node as a kubelet reports it (about 8 KiB of JSON): the usual annotations,
/// addresses, capacity, conditions, node info and the images it holds, which is most of a real
/// node object and nothing the operator reads. (The fake keeps no `managedFields`, which a real
/// API server adds to every object, so the figures here are a floor.)
fn kubelet_node(name: &str) -> anyhow::Result<Node> {
    let condition = |ty: &str, status: &str, reason: &str| {
        json!({ "type": ty, "status": status, "reason": reason, "message": format!("kubelet reports {reason}"),
                "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z" })
    };
    let images: Vec<_> = (0..40)
        .map(|i| {
            json!({ "names": [
                format!("registry.example.com/team-{i}/service-{i}@sha256:{:064x}", i * 7919),
                format!("registry.example.com/team-{i}/service-{i}:v1.{i}.0"),
            ], "sizeBytes": 50_000_000 + i * 1_000_003 })
        })
        .collect();
    Ok(serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": { "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name,
                        "node-role.kubernetes.io/worker": "", "topology.kubernetes.io/zone": "zone-a" },
            "annotations": { "node.alpha.kubernetes.io/ttl": "0",
                             "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                             "csi.volume.kubernetes.io/nodeid": format!("{{\"kubevirt.io.hostpath-provisioner\":\"{name}\"}}") },
        },
        "spec": { "podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"], "providerID": format!("kind://docker/kind/{name}") },
        "status": {
            "addresses": [{ "type": "InternalIP", "address": "172.18.0.3" }, { "type": "Hostname", "address": name }],
            "allocatable": { "cpu": "8", "ephemeral-storage": "102400000Ki", "memory": "32000000Ki", "pods": "110" },
            "capacity": { "cpu": "8", "ephemeral-storage": "102400000Ki", "memory": "32000000Ki", "pods": "110" },
            "conditions": [condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                           condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                           condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                           condition("Ready", "True", "KubeletReady")],
            "daemonEndpoints": { "kubeletEndpoint": { "Port": 10250 } },
            "images": images,
            "nodeInfo": { "architecture": "amd64", "bootID": "0b0d3c1e-0000-4000-8000-000000000000",
                          "containerRuntimeVersion": "containerd://2.0.0", "kernelVersion": "6.8.0",
                          "kubeProxyVersion": "v1.33.0", "kubeletVersion": "v1.33.0",
                          "machineID": "0123456789abcdef0123456789abcdef", "operatingSystem": "linux",
                          "osImage": "Debian GNU/Linux 12 (bookworm)", "systemUUID": "0123-4567" },
        },
    }))?)
}

/// Plays the controllers a cluster runs once: DaemonSets roll out, pool claims bind, mounter
/// Deployments become available. Each status is written once per object generation.
fn play_controllers(fake: &FakeApiServer, nodes: usize) {
    for ds in fake.list::<DaemonSet>() {
        let name = ds.metadata.name.clone().unwrap_or_default();
        let generation = ds.metadata.generation.unwrap_or(1);
        let observed = ds.status.as_ref().and_then(|s| s.observed_generation);
        if observed != Some(generation) {
            fake.set_status::<DaemonSet>(
                ds.metadata.namespace.as_deref(),
                &name,
                json!({ "observedGeneration": generation, "numberReady": nodes, "desiredNumberScheduled": nodes,
                        "numberAvailable": nodes, "updatedNumberScheduled": nodes, "currentNumberScheduled": nodes }),
            );
        }
    }
    for pvc in fake.list::<PersistentVolumeClaim>() {
        if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
            let size = pvc
                .spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage").cloned());
            fake.set_status::<PersistentVolumeClaim>(
                pvc.metadata.namespace.as_deref(),
                pvc.metadata.name.as_deref().unwrap_or_default(),
                json!({ "phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": { "storage": size } }),
            );
        }
    }
    for d in fake.list::<Deployment>() {
        let generation = d.metadata.generation.unwrap_or(1);
        if d.status.as_ref().and_then(|s| s.observed_generation) != Some(generation) {
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            fake.set_status::<Deployment>(
                d.metadata.namespace.as_deref(),
                d.metadata.name.as_deref().unwrap_or_default(),
                json!({ "observedGeneration": generation, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1,
                        "availableReplicas": 1,
                        "conditions": [
                            { "type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                              "message": "Deployment has minimum availability.", "lastUpdateTime": now, "lastTransitionTime": now },
                            { "type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                              "message": "ReplicaSet has successfully progressed.", "lastUpdateTime": now, "lastTransitionTime": now }] }),
            );
        }
    }
}

/// A throw-away CA and the API server's certificate for 127.0.0.1.
struct Pki {
    ca_pem: String,
    cert: CertificateDer<'static>,
    key: Vec<u8>,
}

impl Pki {
    fn new() -> anyhow::Result<Self> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate()?;
        let ca = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate()?;
        let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])?.signed_by(&key, &issuer)?;
        Ok(Self {
            ca_pem: ca.pem(),
            cert: cert.der().clone(),
            key: key.serialize_der(),
        })
    }

    fn acceptor(&self) -> anyhow::Result<TlsAcceptor> {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone()));
        let mut config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![self.cert.clone()], key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }

    /// A kubeconfig for the server at `addr`, trusting only the CA in `ca_file`, with a bearer
    /// token (as in a pod: the service-account CA and token).
    fn kubeconfig(addr: SocketAddr, ca_file: &Path) -> String {
        json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{ "name": "fake", "cluster": {
                "server": format!("https://{addr}"),
                "certificate-authority": ca_file,
            }}],
            "users": [{ "name": "operator", "user": { "token": "bench" } }],
            "contexts": [{ "name": "fake", "context": { "cluster": "fake", "user": "operator" } }],
            "current-context": "fake",
        })
        .to_string()
    }
}

/// Serves the fake over HTTPS: each request is handed to the fake's tower service through a
/// `kube::Client` (whose `send` returns the response as the fake wrote it, status and all), and
/// watch bodies stream back as the fake produces them.
async fn serve(listener: TcpListener, acceptor: TlsAcceptor, fake: FakeApiServer) {
    let client = fake.client();
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let (acceptor, client) = (acceptor.clone(), client.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = hyper::service::service_fn(move |req| forward(client.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

async fn forward(
    client: kube::Client,
    req: http::Request<Incoming>,
) -> Result<http::Response<kube::client::Body>, kube::Error> {
    let (parts, body) = req.into_parts();
    let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    client.send(http::Request::from_parts(parts, bytes.into())).await
}

/// The operator child process; killed and reaped when dropped.
struct OperatorProcess(Child);

impl OperatorProcess {
    fn spawn(bin: &Path, kubeconfig: &Path, dir: &Path, log: &Path) -> anyhow::Result<Self> {
        let log_file = std::fs::File::create(log)?;
        let child = Command::new(bin)
            .arg("run")
            .args(["--admin-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"])
            .args(["--webhook-listen", "127.0.0.1:0", "--webhook-cert-dir"])
            .arg(dir)
            .env_clear()
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAMESPACE", NAMESPACE)
            .env("POD_NAME", "hpp-operator-bench")
            .env("OPERATOR_VERSION", "v0.26.0")
            .env("VERBOSITY", "1")
            .env(
                "RUST_LOG",
                std::env::var("HPP_BENCH_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(std::env::vars().filter(|(k, _)| k == "HPP_PASS_INTERVAL" || k == "HPP_USAGE_INTERVAL"))
            .env("HPP_LOG_FORMAT", "json")
            .envs(std::env::vars().filter(|(k, _)| k == "GLIBC_TUNABLES" || k == "_RJEM_MALLOC_CONF"))
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self(child))
    }
}

impl Drop for OperatorProcess {
    /// Asks the process to stop (SIGTERM, as the kubelet does), so a profiler or heaptrack
    /// wrapped around it (`--operator-bin` a script) writes its data; kills it after 10 s.
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let asked = Instant::now();
        while asked.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
