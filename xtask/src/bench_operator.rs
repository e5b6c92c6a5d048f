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

use crate::bench_proc::{mib, print_smaps};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// The operator's namespace in the fake cluster.
const NAMESPACE: &str = "hostpath-provisioner";
/// How long the operator gets to make the CR Available.
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(120);
/// Quiet time after Available before sampling, so start-up allocations are behind.
const SETTLE: Duration = Duration::from_secs(5);

/// Options of `cargo xtask bench --operator`.
#[derive(Debug, Clone, clap::Args)]
pub struct OperatorArgs {
    /// Only measure the operator's steady resident memory against a fake API server, then exit.
    #[arg(long)]
    pub operator: bool,
    /// The hpp-operator executable (default: next to this one, in `target/<profile>/`).
    #[arg(long, value_name = "PATH")]
    pub operator_bin: Option<PathBuf>,
    /// Seconds of steady state to sample.
    #[arg(long, default_value_t = 30)]
    pub operator_seconds: u64,
    /// Ready nodes in the fake cluster.
    #[arg(long, default_value_t = 3)]
    pub operator_nodes: usize,
}

/// Runs the measurement.
pub async fn run(args: &OperatorArgs) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bin = operator_bin(args.operator_bin.as_deref())?;
    let fake = seeded_fake(args.operator_nodes)?;
    let pki = Pki::new()?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve(listener, pki.acceptor()?, fake.clone()));

    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, &pki.ca_pem)?;
    std::fs::write(&kubeconfig, Pki::kubeconfig(addr, &ca_file))?;
    let log_path = dir.path().join("operator.log");
    let child = OperatorProcess::spawn(&bin, &kubeconfig, dir.path(), &log_path)?;
    let pid = child.0.id();
    println!(
        "hpp-operator {} (pid {pid}) against a fake API server on https://{addr}, {} nodes",
        bin.display(),
        args.operator_nodes
    );

    let started = Instant::now();
    wait_available(&fake, args.operator_nodes, &log_path).await?;
    println!(
        "CR Available after {:.1}s; settling {}s",
        started.elapsed().as_secs_f64(),
        SETTLE.as_secs()
    );
    tokio::time::sleep(SETTLE).await;

    let mut samples = Vec::new();
    let sampling = Instant::now();
    while sampling.elapsed() < Duration::from_secs(args.operator_seconds.max(1)) {
        samples.push(Status::read(pid)?);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let last = Status::read(pid)?;
    let rss: Vec<u64> = samples.iter().map(|s| s.rss).collect();
    let (min, max) = (
        rss.iter().copied().min().unwrap_or(0),
        rss.iter().copied().max().unwrap_or(0),
    );
    println!(
        "steady state over {}s ({} samples): VmRSS min {} / max {} / last {}",
        args.operator_seconds,
        samples.len(),
        mib(min),
        mib(max),
        mib(last.rss)
    );
    println!(
        "  RssAnon {}  RssFile {}  RssShmem {}  VmHWM {}  Threads {}",
        mib(last.anon),
        mib(last.file),
        mib(last.shmem),
        mib(last.hwm),
        last.threads
    );
    print_smaps(pid, &bin)?;
    drop(child);
    Ok(())
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

/// The fake cluster: the CRD, `nodes` Ready Linux nodes and the example CR.
fn seeded_fake(nodes: usize) -> anyhow::Result<FakeApiServer> {
    let fake = FakeApiServer::new();
    fake.register::<HostPathProvisioner>(false, true);
    fake.seed(&hpp_api::crd::crd()?);
    for i in 0..nodes {
        fake.seed(&kubelet_node(&format!("node-{i}"))?);
    }
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/examples/hostpathprovisioner_cr.yaml"
    );
    let cr: HostPathProvisioner =
        serde_saphyr::from_str(&std::fs::read_to_string(example).with_context(|| format!("reading {example}"))?)
            .with_context(|| format!("parsing {example}"))?;
    fake.seed(&cr);
    Ok(fake)
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

/// Plays the DaemonSet controller until the CR is Available.
async fn wait_available(fake: &FakeApiServer, nodes: usize, log: &Path) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
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
        let available = fake
            .list::<HostPathProvisioner>()
            .iter()
            .flat_map(|h| h.status.iter().flat_map(|s| s.conditions.iter()))
            .any(|c| c.type_ == "Available" && c.status == "True");
        if available {
            return Ok(());
        }
        if start.elapsed() > RECONCILE_TIMEOUT {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(20).collect();
            anyhow::bail!(
                "the CR was not Available after {}s; operator log (last lines, newest first):\n{}",
                RECONCILE_TIMEOUT.as_secs(),
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
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
            .env("HPP_LOG_FORMAT", "json")
            .envs(std::env::vars().filter(|(k, _)| k == "GLIBC_TUNABLES"))
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self(child))
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `/proc/PID/status` figures, in KiB.
#[derive(Debug, Default)]
struct Status {
    rss: u64,
    anon: u64,
    file: u64,
    shmem: u64,
    hwm: u64,
    threads: u64,
}

impl Status {
    fn read(pid: u32) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("the operator (pid {pid}) exited"))?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0)
        };
        Ok(Self {
            rss: field("VmRSS"),
            anon: field("RssAnon"),
            file: field("RssFile"),
            shmem: field("RssShmem"),
            hwm: field("VmHWM"),
            threads: field("Threads"),
        })
    }
}
