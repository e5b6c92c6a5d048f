//! Flags and start-up of the admission webhook, for `hpp-operator webhook` (standalone, no
//! cluster needed) and for the operator serving it in-process.
//!
//! Every flag also reads an environment variable. `TLS_MIN_VERSION_OVERRIDE` and
//! `TLS_CIPHERS_OVERRIDE` keep KubeVirt's names so existing deployments carry over.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::FutureExt as _;
use hpp_webhook::cluster::{ClusterState, KubeClusterState};
use hpp_webhook::metrics::Metrics;
use hpp_webhook::names::{DEFAULT_CERT_DIR, DEFAULT_LISTEN_ADDR, ENV_TLS_CIPHERS, ENV_TLS_MIN_VERSION};
use hpp_webhook::server::DEFAULT_MAX_BODY_BYTES;
use hpp_webhook::tls::{self, AcceptorSource, CertStore, PolicyWatch, Resolved};
use hpp_webhook::{ServerOptions, Webhook};
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::metrics_tls::{MetricsListenArgs, SelfSignedNames};

/// Whether the webhook talks to the API server (for the singleton rule, the delete guard and the
/// OpenShift TLS profile).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ClusterMode {
    /// Use the in-cluster config or kubeconfig when there is one; otherwise run without.
    #[default]
    Auto,
    /// Fail to start without a cluster.
    Required,
    /// Never contact a cluster: only the per-object rules run.
    None,
}

/// Webhook flags; flatten them into a command (`#[command(flatten)]`).
#[derive(Clone, Debug, clap::Args)]
pub struct WebhookArgs {
    /// Address the HTTPS webhook listens on.
    #[arg(long = "webhook-listen", env = "HPP_WEBHOOK_LISTEN", default_value = DEFAULT_LISTEN_ADDR)]
    pub listen: SocketAddr,
    /// Directory holding tls.crt and tls.key (re-read when they change).
    #[arg(long = "webhook-cert-dir", env = "HPP_WEBHOOK_CERT_DIR", default_value = DEFAULT_CERT_DIR)]
    pub cert_dir: PathBuf,
    /// Minimum TLS version: VersionTLS12 or VersionTLS13 (overrides the cluster profile).
    #[arg(long = "tls-min-version", env = ENV_TLS_MIN_VERSION)]
    pub tls_min_version: Option<String>,
    /// Comma-separated cipher suites, IANA or OpenSSL names (overrides the cluster profile).
    #[arg(long = "tls-ciphers", env = ENV_TLS_CIPHERS)]
    pub tls_ciphers: Option<String>,
    /// Whether to use a cluster for the singleton and delete checks and the OpenShift TLS profile.
    #[arg(
        long = "webhook-cluster",
        env = "HPP_WEBHOOK_CLUSTER",
        value_enum,
        default_value = "auto"
    )]
    pub cluster: ClusterMode,
    /// Largest accepted request body in bytes.
    #[arg(long = "webhook-max-body-bytes", env = "HPP_WEBHOOK_MAX_BODY_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Seconds a client has to send the request headers.
    #[arg(
        long = "webhook-header-read-timeout-seconds",
        env = "HPP_WEBHOOK_HEADER_READ_TIMEOUT_SECONDS",
        default_value_t = 10
    )]
    pub header_read_timeout_seconds: u64,
    /// Seconds to read a request and answer it.
    #[arg(
        long = "webhook-request-timeout-seconds",
        env = "HPP_WEBHOOK_REQUEST_TIMEOUT_SECONDS",
        default_value_t = 25
    )]
    pub request_timeout_seconds: u64,
    /// Connections served at once; more clients wait in the listen backlog.
    #[arg(
        long = "webhook-max-connections",
        env = "HPP_WEBHOOK_MAX_CONNECTIONS",
        default_value_t = 1024
    )]
    pub max_connections: usize,
}

impl WebhookArgs {
    /// The TLS override variables resolved; an error names the bad value so startup fails loudly.
    pub fn tls_overrides(&self) -> anyhow::Result<Option<Resolved>> {
        tls::resolve_overrides(self.tls_min_version.as_deref(), self.tls_ciphers.as_deref())
            .with_context(|| format!("invalid {ENV_TLS_MIN_VERSION} / {ENV_TLS_CIPHERS}"))
    }

    /// Server limits from the flags.
    pub fn server_options(&self) -> ServerOptions {
        ServerOptions {
            header_read_timeout: Duration::from_secs(self.header_read_timeout_seconds),
            request_timeout: Duration::from_secs(self.request_timeout_seconds),
            max_body_bytes: self.max_body_bytes,
            max_connections: self.max_connections,
            ..ServerOptions::default()
        }
    }
}

/// What a caller may already have; anything missing is created from the flags.
#[derive(Default)]
pub struct WebhookDeps {
    /// The API client (the operator passes its own); overrides `--webhook-cluster`.
    pub client: Option<kube::Client>,
    /// The TLS policy source, when the operator shares one with the CSI DaemonSet flag.
    pub policy: Option<PolicyWatch>,
    /// Metrics registered in the caller's registry (`Metrics::register(&mut registry)`, named
    /// `webhook_*`).
    pub metrics: Option<Metrics>,
}

/// Resolves the TLS policy from the flags and, without overrides, the OpenShift profile (when a
/// client is given). Share the result between the webhook and the CSI DaemonSet's
/// `--metrics-tls-version` flag (`policy.borrow().metrics_tls_version_flag()`).
pub fn start_tls_policy(args: &WebhookArgs, client: Option<kube::Client>) -> anyhow::Result<PolicyWatch> {
    Ok(tls::start_policy(args.tls_overrides()?, client))
}

async fn cluster_client(mode: ClusterMode) -> anyhow::Result<Option<kube::Client>> {
    match mode {
        ClusterMode::None => Ok(None),
        ClusterMode::Required => {
            Ok(Some(kube::Client::try_default().await.context(
                "--webhook-cluster=required but no kubeconfig or in-cluster config was found",
            )?))
        }
        ClusterMode::Auto => match kube::Client::try_default().await {
            Ok(c) => Ok(Some(c)),
            Err(e) => {
                info!(error = %e, "no kubeconfig or in-cluster config: running without a cluster");
                Ok(None)
            }
        },
    }
}

/// Binds `--webhook-listen` and serves until `shutdown` resolves.
pub async fn run(args: WebhookArgs, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    run_with(args, WebhookDeps::default(), shutdown).await
}

/// `hpp-operator webhook`: the webhook on `--webhook-listen` plus its metrics (`webhook_*`)
/// over HTTPS on `--metrics-addr`, with the webhook's TLS policy, until `shutdown` resolves.
pub async fn run_standalone(
    args: WebhookArgs,
    metrics: &MetricsListenArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let overrides = args.tls_overrides()?;
    let client = cluster_client(args.cluster).await?;
    let policy = tls::start_policy(overrides.clone(), client.clone());
    let mut registry = prometheus_client::registry::Registry::default();
    let webhook_metrics = Metrics::register(&mut registry);
    let shutdown = shutdown.shared();
    crate::metrics_tls::start_metrics_listener(
        metrics,
        policy.clone(),
        &SelfSignedNames::from_env(),
        Arc::new(registry),
        shutdown.clone(),
    )
    .await?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let deps = WebhookDeps {
        client,
        policy: Some(policy),
        metrics: Some(webhook_metrics),
    };
    // The cluster was looked up above; do not look again when there is none.
    let args = WebhookArgs {
        cluster: ClusterMode::None,
        ..args
    };
    serve_on(listener, args, deps, overrides, shutdown).await
}

/// [`run`] with dependencies the caller already has.
pub async fn run_with(
    args: WebhookArgs,
    deps: WebhookDeps,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Validate the overrides before binding, so a typo fails fast.
    let overrides = args.tls_overrides()?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    serve_on(listener, args, deps, overrides, shutdown).await
}

/// Serves on an already bound listener (tests bind `127.0.0.1:0`).
pub async fn serve_on(
    listener: TcpListener,
    args: WebhookArgs,
    deps: WebhookDeps,
    overrides: Option<Resolved>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Only ring is compiled in; installing it is a no-op when main already did.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = match deps.client {
        Some(c) => Some(c),
        None => cluster_client(args.cluster).await?,
    };
    let cluster: Option<Arc<dyn ClusterState>> = match &client {
        Some(c) => Some(Arc::new(KubeClusterState::new(c.clone()))),
        None => {
            warn!(
                "no cluster: the one-HostPathProvisioner rule and the delete guard (PersistentVolumes still in use) are disabled; only per-object validation runs"
            );
            None
        }
    };
    let policy = match deps.policy {
        Some(p) => p,
        None => tls::start_policy(overrides, client),
    };
    let certs = Arc::new(CertStore::in_dir(&args.cert_dir));
    match certs.current() {
        Ok(_) => info!(dir = %args.cert_dir.display(), "serving certificate loaded"),
        Err(e) => warn!(
            error = %e,
            "no serving certificate yet; TLS handshakes fail until tls.crt and tls.key appear (they are re-read on every connection)"
        ),
    }
    let webhook = Webhook {
        cluster,
        tls: Arc::new(AcceptorSource::new(policy, certs)),
        options: args.server_options(),
        metrics: deps.metrics.unwrap_or_default(),
    };
    webhook.serve(listener, shutdown).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        webhook: WebhookArgs,
    }

    fn parse(args: &[&str]) -> WebhookArgs {
        Cli::try_parse_from(std::iter::once("test").chain(args.iter().copied()))
            .unwrap()
            .webhook
    }

    #[test]
    fn defaults_match_kubevirt() {
        let args = parse(&["--webhook-cluster", "none"]);
        assert_eq!(args.listen, "0.0.0.0:9443".parse().unwrap());
        assert_eq!(args.cert_dir, PathBuf::from("/tmp/k8s-webhook-server/serving-certs"));
        assert_eq!(args.cluster, ClusterMode::None);
        assert_eq!(args.server_options().request_timeout, Duration::from_secs(25));
    }

    #[test]
    fn tls_overrides_are_checked() {
        let args = parse(&["--tls-min-version", "VersionTLS13"]);
        let resolved = args.tls_overrides().unwrap().unwrap();
        assert_eq!(resolved.policy.metrics_tls_version_flag(), "VersionTLS13");
        let args = parse(&["--tls-ciphers", "ECDHE-RSA-AES128-GCM-SHA256,TYPO"]);
        let error = format!("{:#}", args.tls_overrides().unwrap_err());
        assert!(
            error.contains("TYPO") && error.contains("TLS_CIPHERS_OVERRIDE"),
            "{error}"
        );
        assert!(parse(&[]).tls_overrides().unwrap().is_none());
    }

    /// `hpp-operator webhook` exposes its metrics over HTTPS beside the webhook.
    #[tokio::test]
    async fn standalone_serves_webhook_metrics_over_https() {
        use crate::metrics_tls::test_client::{Trust, https_get};
        let _ = rustls::crypto::ring::default_provider().install_default();
        // The metrics port is bound first; learn a free one for it.
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let metrics_addr = probe.local_addr().unwrap();
        drop(probe);
        let dir = tempfile::tempdir().unwrap();
        let mut args = parse(&["--webhook-cluster", "none", "--webhook-listen", "127.0.0.1:0"]);
        args.cert_dir = dir.path().to_path_buf();
        let metrics = MetricsListenArgs {
            addr: metrics_addr,
            cert_file: None,
            key_file: None,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            run_standalone(args, &metrics, async move {
                let _ = stopped.await;
            })
            .await
        });
        // A minute at most: the port was free a moment ago, but another program may take it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let scrape = loop {
            match https_get(metrics_addr, "/metrics", Trust::Any, &[&rustls::version::TLS13]).await {
                Ok(s) => break s,
                Err(_) if !task.is_finished() && std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await
                }
                Err(e) => panic!("metrics listener never came up: {e}"),
            }
        };
        assert!(scrape.response.starts_with("HTTP/1.1 200"), "{}", scrape.response);
        assert!(
            scrape.response.contains("webhook_tls_handshake_failures"),
            "{}",
            scrape.response
        );
        stop.send(()).unwrap();
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn serves_without_cluster_or_certificate_and_stops() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut args = parse(&["--webhook-cluster", "none"]);
        args.cert_dir = dir.path().to_path_buf();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_on(listener, args, WebhookDeps::default(), None, async move {
            let _ = stopped.await;
        }));
        // The port is open even without a certificate (handshakes fail until one appears).
        tokio::net::TcpStream::connect(addr).await.unwrap();
        stop.send(()).unwrap();
        task.await.unwrap().unwrap();
    }
}
