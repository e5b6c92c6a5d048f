//! `hpp-operator run`: telemetry, the plain-HTTP admin server for probes (/livez /readyz
//! /metrics), the HTTPS metrics listener the ServiceMonitor scrapes (port `metrics`), leader
//! election, then the controller until SIGTERM or lost leadership.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use axum::routing::get;
use futures::FutureExt;
use hpp_reconcile::leader::Election;
use hpp_reconcile::metrics::Metrics;
use hpp_reconcile::operator::Context;
use hpp_reconcile::{OperatorConfig, Pipeline};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::{info, warn};

use super::leader;
use crate::admin;
use crate::metrics_tls::{self, MetricsListenArgs, SelfSignedNames};
use crate::telemetry::{self, LogFormat};
use crate::webhook_cmd::{self, WebhookArgs, WebhookDeps};

/// Where the service-account namespace is mounted in a pod.
const SA_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Arguments of `run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Address of the plain-HTTP admin server (/livez, /readyz, /metrics). All interfaces by
    /// default, as KubeVirt's operator (controller-runtime's `:6060`): the kubelet's httpGet
    /// probes in KubeVirt's Deployment reach the pod IP on port 6060 (deploy/networkpolicy.yaml
    /// admits no one but the node to it).
    #[arg(long, env = "HPP_ADMIN_ADDR", default_value = "0.0.0.0:6060")]
    pub admin_addr: SocketAddr,
    /// The HTTPS metrics listener.
    #[command(flatten)]
    pub metrics: MetricsListenArgs,
    /// Log line format.
    #[arg(long, env = "HPP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Namespace of the operator and its namespaced objects (default: the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// Leader-election identity (default: the pod name or host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Skip leader election (only for a single replica).
    #[arg(long)]
    pub no_leader_election: bool,
    /// Do not serve the admission webhook in this process.
    #[arg(long, env = "HPP_DISABLE_WEBHOOK")]
    pub disable_webhook: bool,
    /// Least time between two reconcile passes started by watch events (`100ms`; `0s` for a
    /// pass per event): changes closer together are taken by one pass, so a rollout across
    /// many nodes costs at most ten passes a second.
    #[arg(long, env = "HPP_PASS_INTERVAL", default_value = "100ms", value_parser = parse_duration)]
    pub pass_interval: std::time::Duration,
    /// Least time between two writes of the CR's status that change only the pools' usage
    /// figures (`committed`, `available`), and between two passes started by
    /// CSIStorageCapacity changes alone (`60s`; `0s` writes every change at once). The first
    /// change after a quiet spell is written at once.
    #[arg(long, env = "HPP_USAGE_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    pub usage_interval: std::time::Duration,
    /// Webhook flags (served in-process unless `--disable-webhook`).
    #[command(flatten)]
    pub webhook: WebhookArgs,
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    hpp_api::duration::parse(s).map_err(|e| e.to_string())
}

fn namespace(args: &RunArgs) -> String {
    args.namespace
        .clone()
        .or_else(|| {
            std::fs::read_to_string(SA_NAMESPACE_FILE)
                .ok()
                .map(|s| s.trim().to_owned())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| hpp_reconcile::config::DEFAULT_NAMESPACE.to_owned())
}

/// Why this replica cannot take admission reviews, once its webhook server has stopped. The
/// webhook Service routes to every Ready operator pod, and with `failurePolicy: Fail` a pod whose
/// webhook is gone would refuse every HostPathProvisioner write sent to it.
#[derive(Clone, Debug, Default)]
pub struct WebhookHealth(Arc<std::sync::Mutex<Option<String>>>);

impl WebhookHealth {
    /// Records that the webhook stopped serving, and why.
    pub fn stopped(&self, why: String) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(why);
    }

    /// Why the webhook is not serving, if it stopped.
    pub fn failure(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// Admin routes: metrics plus liveness/readiness. Readiness does not wait for the lease, so a
/// rolling upgrade never deadlocks on a standby replica (KubeVirt PR #171); it fails (503, with
/// the reason) once this replica's admission webhook has stopped, so the Service stops sending
/// reviews to it.
pub fn admin_router(registry: Arc<Registry>, webhook: WebhookHealth) -> Router {
    use axum::http::StatusCode;
    admin::metrics_router(registry)
        .route("/livez", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let failure = webhook.failure();
                async move {
                    match failure {
                        Some(why) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("admission webhook stopped: {why}"),
                        ),
                        None => (StatusCode::OK, "ok".to_owned()),
                    }
                }
            }),
        )
}

/// Runs the operator until SIGTERM/SIGINT or lost leadership.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let _telemetry = telemetry::init("hpp-operator", args.log_format)?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API")?;
    run_with_client(args, client, admin::shutdown_signal(), None).await
}

/// [`run`] with a client, until `shutdown` resolves or leadership is lost. `admin_bound`
/// receives the admin server's address once it listens (tests bind port 0).
pub async fn run_with_client(
    args: RunArgs,
    client: kube::Client,
    shutdown: impl Future<Output = ()> + Send + 'static,
    admin_bound: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) -> anyhow::Result<()> {
    let shutdown = shutdown.shared();
    let mut env: Vec<(String, String)> = std::env::vars().collect();
    env.push(("POD_NAMESPACE".into(), namespace(&args)));
    let config = OperatorConfig::from_env(env);
    info!(namespace = %config.namespace, version = %config.version, "starting hpp-operator");

    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    crate::operator::allocator::register(&mut registry);
    // One TLS policy (overrides, else the OpenShift profile) for the webhook and the CSI
    // DaemonSet's --metrics-tls-version.
    let policy = webhook_cmd::start_tls_policy(&args.webhook, Some(client.clone()))?;
    let webhook_health = WebhookHealth::default();
    let webhook_task = if args.disable_webhook {
        None
    } else {
        let deps = WebhookDeps {
            client: Some(client.clone()),
            policy: Some(policy.clone()),
            metrics: Some(hpp_webhook::metrics::Metrics::register(&mut registry)),
        };
        let webhook = webhook_cmd::run_with(args.webhook.clone(), deps, shutdown.clone());
        let health = webhook_health.clone();
        Some(tokio::spawn(async move {
            if let Err(e) = webhook.await {
                let why = crate::causes(&e);
                tracing::error!(error = %why, "admission webhook stopped; this replica is no longer ready");
                health.stopped(why);
            }
        }))
    };
    let listener = TcpListener::bind(args.admin_addr)
        .await
        .with_context(|| format!("binding {}", args.admin_addr))?;
    let admin_addr = listener.local_addr()?;
    info!(addr = %admin_addr, "admin server listening");
    let registry = Arc::new(registry);
    // The same registry over HTTPS for Prometheus, with the webhook's TLS policy.
    let names = SelfSignedNames {
        namespace: Some(config.namespace.clone()),
        ..SelfSignedNames::from_env()
    };
    metrics_tls::start_metrics_listener(
        &args.metrics,
        policy.clone(),
        &names,
        registry.clone(),
        shutdown.clone(),
    )
    .await?;
    let admin_task = tokio::spawn(admin::serve(
        listener,
        admin_router(registry, webhook_health),
        shutdown.clone(),
    ));
    if let Some(tx) = admin_bound {
        let _ = tx.send(admin_addr);
    }

    let (stop, lost, election) = if args.no_leader_election {
        (shutdown.clone().boxed(), futures::future::pending().boxed(), None)
    } else {
        let identity = args
            .identity
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| format!("hpp-operator-{}", std::process::id()));
        // Contends in the background; while the API server cannot be reached each failure is
        // logged and retried, and this replica stays live and ready as a standby meanwhile, as
        // KubeVirt's operator does while controller-runtime's election retries.
        let mut election = Election::start(client.clone(), leader::settings(&config.namespace, &identity)).await?;
        tokio::select! {
            r = election.acquired() => r?,
            () = shutdown.clone() => return Ok(()),
        }
        // Stop the controller on shutdown or when another replica took the lease; the election
        // comes back afterwards so the lease is released only once the controller has stopped.
        // `Some(lost)` once the controller is to stop.
        let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(None::<bool>);
        let mut lost_rx = stop_rx.clone();
        let until_stop = shutdown.clone();
        // Told when the controller has stopped: until then the lease is watched, shutdown or not.
        let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
        let watcher = tokio::spawn(async move {
            let mut lost = tokio::select! {
                () = election.lost() => {
                    warn!("lost leadership, stopping");
                    true
                }
                () = until_stop => false,
            };
            let _ = stop_tx.send(Some(lost));
            if !lost {
                // Stopping gracefully: the passes running finish, unless the lease goes first.
                tokio::select! {
                    () = election.lost() => {
                        warn!("lost leadership while stopping");
                        lost = true;
                        let _ = stop_tx.send(Some(true));
                    }
                    _ = stopped_rx => {}
                }
            }
            (election, lost)
        });
        let stop = async move {
            let _ = stop_rx.wait_for(Option::is_some).await;
        };
        let lost = async move {
            if lost_rx.wait_for(|stop| *stop == Some(true)).await.is_err() {
                futures::future::pending::<()>().await;
            }
        };
        (stop.boxed(), lost.boxed(), Some((watcher, stopped_tx)))
    };
    let tls_source = policy.clone();
    let ctx =
        Context::new(client, config, Pipeline::standard(), metrics).with_metrics_tls_version(Arc::new(move || {
            tls_source.borrow().metrics_tls_version_flag().to_owned()
        }));
    let ctx = Arc::new(
        ctx.with_pass_interval(args.pass_interval)
            .with_usage_interval(args.usage_interval),
    );
    // On a lost lease the passes still running are dropped, not waited for (as
    // controller-runtime's manager exits at once): another replica may be leading by now, and
    // their calls may be waiting on an API server that does not answer. A pass cut short is
    // one a restart would have cut short; the next leader's passes converge.
    tokio::select! {
        () = hpp_reconcile::controller::run(ctx, stop.shared()) => {}
        () = lost => warn!("leadership lost: passes still running are abandoned"),
    }
    let mut lost = false;
    if let Some((watcher, stopped)) = election {
        let _ = stopped.send(());
        match watcher.await {
            Ok((election, was_lost)) => {
                lost = was_lost;
                if let Err(e) = election.step_down().await {
                    warn!(error = %e, "releasing the leader lease");
                }
            }
            Err(e) => warn!(error = %e, "leader election task failed"),
        }
    }
    info!("controller stopped");
    admin_task.abort();
    if let Some(task) = webhook_task {
        task.abort();
    }
    if lost {
        // As controller-runtime's manager ("leader election lost", exit status 1): the kubelet
        // restarts the container (its restart count goes up), and the new process contends
        // for the lease again from a clean state.
        tracing::error!("leader election lost; exiting with status 1 so the container restarts");
        return Err(LeadershipLost.into());
    }
    Ok(())
}

/// The error `run` ends with when this replica lost the lease while leading (it could not
/// renew it for the renew deadline, or another replica took it): the process exits with
/// status 1, as controller-runtime's manager does, and the kubelet restarts it.
#[derive(Debug, thiserror::Error)]
#[error(
    "leader election lost: the operator could not renew its Lease in time (API server unreachable?) or another replica took it"
)]
pub struct LeadershipLost;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    /// `hpp-operator run` against a fake API server, with the admin server on a free port; the
    /// returned sender stops it.
    async fn standby(
        fake: &hpp_reconcile::testkit::FakeApiServer,
    ) -> (
        SocketAddr,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    ) {
        use clap::Parser;
        let args = crate::operator::Args::parse_from([
            "hpp-operator",
            "run",
            "--admin-addr",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
            "--disable-webhook",
            "--namespace",
            "hostpath-provisioner",
            "--identity",
            "hpp-pod",
        ]);
        let Some(crate::operator::Command::Run(run)) = args.command else {
            panic!("run expected")
        };
        let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run_with_client(
            run,
            fake.client(),
            async move {
                let _ = stop_rx.await;
            },
            Some(bound_tx),
        ));
        (bound_rx.await.unwrap(), stop_tx, task)
    }

    fn lease_holder(fake: &hpp_reconcile::testkit::FakeApiServer) -> Option<String> {
        fake.get::<k8s_openapi::api::coordination::v1::Lease>(Some("hostpath-provisioner"), super::leader::LEASE_NAME)
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
    }

    async fn live_and_ready(addr: SocketAddr) {
        assert!(get(addr, "/livez").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
    }

    /// A rolling update from KubeVirt's operator: the new pod waits for the lease the old one
    /// holds and renews, and is live and ready meanwhile (so the Deployment goes on and stops
    /// the old pod); once the old pod stops renewing, the new one takes the lease.
    #[tokio::test]
    async fn a_standby_is_live_and_ready_and_takes_the_lease_when_it_is_let_go() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let fake = hpp_reconcile::testkit::FakeApiServer::new();
        fake.register::<hpp_api::HostPathProvisioner>(false, true);
        // KubeVirt's pod (controller-runtime): a 4 s lease here, renewed every second.
        let lease = |now: String| -> k8s_openapi::api::coordination::v1::Lease {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": super::leader::LEASE_NAME, "namespace": "hostpath-provisioner" },
                "spec": { "holderIdentity": "hostpath-provisioner-operator-kubevirt", "leaseDurationSeconds": 4,
                          "acquireTime": now, "renewTime": now, "leaseTransitions": 0 },
            }))
            .unwrap()
        };
        fake.seed(&lease(k8s_openapi::jiff::Timestamp::now().to_string()));
        let renewer = {
            let fake = fake.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    let mut renewed = lease(k8s_openapi::jiff::Timestamp::now().to_string());
                    renewed.metadata.resource_version = None;
                    if let Some(current) = fake.get::<k8s_openapi::api::coordination::v1::Lease>(
                        Some("hostpath-provisioner"),
                        super::leader::LEASE_NAME,
                    ) && current.spec.and_then(|s| s.holder_identity).as_deref()
                        != Some("hostpath-provisioner-operator-kubevirt")
                    {
                        return;
                    }
                    fake.seed(&renewed);
                }
            })
        };
        let (addr, stop, task) = standby(&fake).await;
        for _ in 0..3 {
            live_and_ready(addr).await;
            assert_eq!(
                lease_holder(&fake).as_deref(),
                Some("hostpath-provisioner-operator-kubevirt"),
                "a standby never takes a lease that is renewed"
            );
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        // The old pod is stopped: no more renewals.
        renewer.abort();
        tokio::time::timeout(
            std::time::Duration::from_secs(120),
            fake.wait_until(|f| lease_holder(f).as_deref() == Some("hpp-pod")),
        )
        .await
        .expect("the standby takes the lease once it is no longer renewed");
        live_and_ready(addr).await;
        let _ = stop.send(());
        task.await.unwrap().unwrap();
    }

    /// Without an API server to ask for the lease, the operator neither exits nor goes unready:
    /// it says why and asks again, and contends once the API server answers.
    #[tokio::test]
    async fn an_unreachable_api_server_keeps_the_replica_live_and_ready_while_it_retries() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let fake = hpp_reconcile::testkit::FakeApiServer::new();
        fake.register::<hpp_api::HostPathProvisioner>(false, true);
        fake.set_unavailable(true);
        let (addr, stop, task) = standby(&fake).await;
        live_and_ready(addr).await;
        assert!(!task.is_finished());
        fake.set_unavailable(false);
        tokio::time::timeout(
            std::time::Duration::from_secs(120),
            fake.wait_until(|f| lease_holder(f).as_deref() == Some("hpp-pod")),
        )
        .await
        .expect("the lease is taken once the API server answers");
        live_and_ready(addr).await;
        let _ = stop.send(());
        task.await.unwrap().unwrap();
    }

    /// When the API server goes away, the leader cannot renew its lease: it stops and the
    /// process ends with an error (exit status 1), as controller-runtime's manager does, so the
    /// kubelet restarts it, instead of ending as if asked to stop.
    #[tokio::test]
    async fn a_leader_cut_off_from_the_api_server_exits_with_an_error() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let fake = hpp_reconcile::testkit::FakeApiServer::new();
        fake.register::<hpp_api::HostPathProvisioner>(false, true);
        let (_addr, _stop, task) = standby(&fake).await;
        tokio::time::timeout(
            std::time::Duration::from_secs(120),
            fake.wait_until(|f| lease_holder(f).as_deref() == Some("hpp-pod")),
        )
        .await
        .expect("the lease is taken");
        fake.set_unavailable(true);
        let ended = tokio::time::timeout(std::time::Duration::from_secs(120), task)
            .await
            .expect("the operator stops once it cannot renew its lease")
            .unwrap();
        let err = ended.expect_err("a lost lease is an error");
        assert!(err.downcast_ref::<LeadershipLost>().is_some(), "{err:#}");
    }

    /// Waits until the operator leads and watches the CRs, then stops answering and lets a CR
    /// arrive: its pass waits on its first call.
    async fn silent_with_a_cr_arriving(fake: &hpp_reconcile::testkit::FakeApiServer) {
        let watching_crs = |f: &hpp_reconcile::testkit::FakeApiServer| {
            f.requests()
                .iter()
                .any(|r| r.path.ends_with("/hostpathprovisioners") && r.query.contains("watch=true"))
        };
        tokio::time::timeout(
            std::time::Duration::from_secs(120),
            fake.wait_until(|f| lease_holder(f).as_deref() == Some("hpp-pod") && watching_crs(f)),
        )
        .await
        .expect("the lease is taken and the CRs watched");
        fake.set_unresponsive(true);
        let cr: hpp_api::HostPathProvisioner = serde_json::from_value(serde_json::json!({
            "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1",
            "kind": "HostPathProvisioner",
            "metadata": {"name": "hostpath-provisioner"},
            "spec": {"imagePullPolicy": "IfNotPresent",
                     "storagePools": [{"name": "local", "path": "/var/hpvolumes"}],
                     "workload": {}},
        }))
        .unwrap();
        fake.seed(&cr);
    }

    /// An API server that stops answering (a partition) fails no call: the lease calls must
    /// give up on their own, and a pass waiting on its calls must not keep the process from
    /// ending. The CR arrives while nothing is answered, so its pass waits on its first call.
    #[tokio::test]
    async fn a_leader_whose_api_server_stops_answering_exits_with_an_error() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let fake = hpp_reconcile::testkit::FakeApiServer::new();
        fake.register::<hpp_api::HostPathProvisioner>(false, true);
        let (_addr, _stop, task) = standby(&fake).await;
        silent_with_a_cr_arriving(&fake).await;
        let ended = tokio::time::timeout(std::time::Duration::from_secs(120), task)
            .await
            .expect("the operator stops once its lease goes unrenewed, whatever waits on the API server")
            .unwrap();
        let err = ended.expect_err("a lost lease is an error");
        assert!(err.downcast_ref::<LeadershipLost>().is_some(), "{err:#}");
        fake.set_unresponsive(false);
    }

    /// Asked to stop while a pass waits on an API server that does not answer: the pass is
    /// waited for only while the lease holds, then dropped.
    #[tokio::test]
    async fn a_leader_stopping_while_its_api_server_does_not_answer_ends_once_its_lease_lapses() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let fake = hpp_reconcile::testkit::FakeApiServer::new();
        fake.register::<hpp_api::HostPathProvisioner>(false, true);
        let (_addr, stop, task) = standby(&fake).await;
        silent_with_a_cr_arriving(&fake).await;
        // The pass has started and waits on its first call.
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let _ = stop.send(());
        let ended = tokio::time::timeout(std::time::Duration::from_secs(120), task)
            .await
            .expect("the operator stops once its lease goes unrenewed, whatever waits on the API server")
            .unwrap();
        assert!(ended.is_err(), "the lease was lost while stopping");
        fake.set_unresponsive(false);
    }

    #[tokio::test]
    async fn admin_router_serves_health_and_operator_metrics() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.observe(0.1, Some("conflict"));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let webhook = WebhookHealth::default();
        let router = admin_router(Arc::new(registry), webhook.clone());
        let server = tokio::spawn(admin::serve(listener, router, async move {
            let _ = rx.await;
        }));
        assert!(get(addr, "/livez").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        // A replica whose webhook stopped must leave the webhook Service's endpoints.
        webhook.stopped("cannot listen on 0.0.0.0:9443".into());
        let ready = get(addr, "/readyz").await;
        assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
        assert!(ready.contains("admission webhook stopped: cannot listen"), "{ready}");
        assert!(get(addr, "/livez").await.starts_with("HTTP/1.1 200"));
        let body = get(addr, "/metrics").await;
        assert!(body.contains("kubevirt_hpp_cr_ready -1"), "{body}");
        assert!(
            body.contains("hpp_operator_reconcile_errors_total{category=\"conflict\"} 1"),
            "{body}"
        );
        let _ = tx.send(());
        server.await.unwrap().unwrap();
    }

    /// The listener the ServiceMonitor scrapes: HTTPS, self-signed, the same registry (operator
    /// and webhook metrics) as the admin port.
    #[tokio::test]
    async fn https_metrics_listener_serves_operator_and_webhook_metrics() {
        use crate::metrics_tls::test_client::{Trust, https_get};
        use clap::Parser;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let args = crate::operator::Args::parse_from(["hpp-operator", "--metrics-addr", "127.0.0.1:0"]);
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.observe(0.1, Some("conflict"));
        let _webhook = hpp_webhook::metrics::Metrics::register(&mut registry);
        let policy = webhook_cmd::start_tls_policy(&args.run.webhook, None).unwrap();
        let names = SelfSignedNames {
            pod_ip: Some("10.0.0.9".into()),
            namespace: Some("hpp".into()),
            service: Some("hpp-prometheus-metrics".into()),
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let addr = metrics_tls::start_metrics_listener(&args.run.metrics, policy, &names, Arc::new(registry), async {
            let _ = rx.await;
        })
        .await
        .unwrap();
        // As the ServiceMonitor scrapes (insecureSkipVerify), here over TLS 1.3.
        let scrape = https_get(addr, "/metrics", Trust::Any, &[&rustls::version::TLS13])
            .await
            .unwrap();
        let body = &scrape.response;
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(body.contains("kubevirt_hpp_cr_ready -1"), "{body}");
        assert!(
            body.contains("# TYPE webhook_"),
            "webhook metrics in the same registry: {body}"
        );
        // The certificate names the metrics Service.
        let s = https_get(
            addr,
            "/metrics",
            Trust::Cert(&scrape.peer_cert, "hpp-prometheus-metrics.hpp.svc"),
            &[&rustls::version::TLS13],
        )
        .await
        .unwrap();
        assert!(s.response.starts_with("HTTP/1.1 200"), "{}", s.response);
        let _ = tx.send(());
    }

    /// With no flags at all (KubeVirt's Deployment runs `hostpath-provisioner-operator` bare),
    /// the probes' port 6060 and the metrics port 8443 listen on every interface, as KubeVirt's
    /// operator does, and the webhook is served on 9443 from KubeVirt's certificate directory.
    #[test]
    fn bare_command_line_listens_where_kubevirts_deployment_looks() {
        use clap::Parser;
        let args = crate::operator::Args::parse_from(["hostpath-provisioner-operator"]);
        assert!(args.command.is_none());
        assert_eq!(args.run.admin_addr, "0.0.0.0:6060".parse().unwrap());
        assert_eq!(args.run.metrics.addr, "0.0.0.0:8443".parse().unwrap());
        assert_eq!(args.run.webhook.listen, "0.0.0.0:9443".parse().unwrap());
        assert_eq!(
            args.run.webhook.cert_dir,
            std::path::Path::new("/tmp/k8s-webhook-server/serving-certs")
        );
        assert!(!args.run.disable_webhook && !args.run.no_leader_election);
    }

    #[test]
    fn run_is_the_default_and_flags_have_env_names() {
        use clap::Parser;
        let args =
            crate::operator::Args::parse_from(["hpp-operator", "--admin-addr", "127.0.0.1:0", "--disable-webhook"]);
        assert!(args.command.is_none());
        assert!(args.run.disable_webhook);
        assert_eq!(args.run.admin_addr.port(), 0);
        assert_eq!(args.run.metrics.addr, "0.0.0.0:8443".parse().unwrap());
    }
}
