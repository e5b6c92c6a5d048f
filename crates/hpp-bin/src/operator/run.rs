//! `hpp-operator run`: telemetry, the admin server (/livez /readyz /metrics), leader election,
//! then the controller until SIGTERM or lost leadership.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use axum::routing::get;
use futures::FutureExt;
use hpp_reconcile::metrics::Metrics;
use hpp_reconcile::operator::Context;
use hpp_reconcile::{OperatorConfig, Pipeline};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::{info, warn};

use super::leader;
use crate::admin;
use crate::telemetry::{self, LogFormat};
use crate::webhook_cmd::{self, WebhookArgs, WebhookDeps};

/// Where the service-account namespace is mounted in a pod.
const SA_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Arguments of `run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Address of the admin server (/livez, /readyz, /metrics).
    #[arg(long, env = "HPP_ADMIN_ADDR", default_value = "0.0.0.0:6060")]
    pub admin_addr: SocketAddr,
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
    /// Webhook flags (served in-process unless `--disable-webhook`).
    #[command(flatten)]
    pub webhook: WebhookArgs,
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

/// Admin routes: metrics plus liveness/readiness pings. Readiness does not wait for the lease,
/// so a rolling upgrade never deadlocks on a standby replica (KubeVirt PR #171).
pub fn admin_router(registry: Arc<Registry>) -> Router {
    admin::metrics_router(registry)
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
}

/// Runs the operator until SIGTERM/SIGINT or lost leadership.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let _telemetry = telemetry::init("hpp-operator", args.log_format)?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API")?;
    let mut env: Vec<(String, String)> = std::env::vars().collect();
    env.push(("POD_NAMESPACE".into(), namespace(&args)));
    let config = OperatorConfig::from_env(env);
    info!(namespace = %config.namespace, version = %config.version, "starting hpp-operator");

    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    // One TLS policy (overrides, else the OpenShift profile) for the webhook and the CSI
    // DaemonSet's --metrics-tls-version.
    let policy = webhook_cmd::start_tls_policy(&args.webhook, Some(client.clone()))?;
    let webhook_task = if args.disable_webhook {
        None
    } else {
        let deps = WebhookDeps {
            client: Some(client.clone()),
            policy: Some(policy.clone()),
            metrics: Some(hpp_webhook::metrics::Metrics::register(&mut registry)),
        };
        let shutdown = admin::shutdown_signal();
        let webhook = webhook_cmd::run_with(args.webhook.clone(), deps, shutdown);
        Some(tokio::spawn(async move {
            if let Err(e) = webhook.await {
                tracing::error!(error = format!("{e:#}"), "admission webhook stopped");
            }
        }))
    };
    let listener = TcpListener::bind(args.admin_addr)
        .await
        .with_context(|| format!("binding {}", args.admin_addr))?;
    info!(addr = %listener.local_addr()?, "admin server listening");
    let shutdown = admin::shutdown_signal().shared();
    let admin_task = tokio::spawn(admin::serve(
        listener,
        admin_router(Arc::new(registry)),
        shutdown.clone(),
    ));

    let stop: futures::future::BoxFuture<'static, ()> = if args.no_leader_election {
        shutdown.clone().boxed()
    } else {
        let identity = args
            .identity
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| format!("hpp-operator-{}", std::process::id()));
        let mut rx = leader::elect(client.clone(), &config.namespace, &identity).await?;
        tokio::select! {
            r = leader::until_leader(&mut rx) => r?,
            () = shutdown.clone() => return Ok(()),
        }
        info!("acquired leadership");
        let lost = leader::lost(rx).map(|()| warn!("lost leadership, stopping"));
        futures::future::select(shutdown.clone().boxed(), lost.boxed())
            .map(|_| ())
            .boxed()
    };
    let tls_source = policy.clone();
    let ctx =
        Context::new(client, config, Pipeline::standard(), metrics).with_metrics_tls_version(Arc::new(move || {
            tls_source.borrow().metrics_tls_version_flag().to_owned()
        }));
    let ctx = Arc::new(ctx);
    hpp_reconcile::controller::run(ctx, stop.shared()).await;
    info!("controller stopped");
    admin_task.abort();
    if let Some(task) = webhook_task {
        task.abort();
    }
    Ok(())
}

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

    #[tokio::test]
    async fn admin_router_serves_health_and_operator_metrics() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.observe(0.1, Some("conflict"));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(admin::serve(listener, admin_router(Arc::new(registry)), async move {
            let _ = rx.await;
        }));
        assert!(get(addr, "/livez").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        let body = get(addr, "/metrics").await;
        assert!(body.contains("kubevirt_hpp_cr_ready -1"), "{body}");
        assert!(
            body.contains("hpp_operator_reconcile_errors_total{category=\"conflict\"} 1"),
            "{body}"
        );
        let _ = tx.send(());
        server.await.unwrap().unwrap();
    }

    #[test]
    fn run_is_the_default_and_flags_have_env_names() {
        use clap::Parser;
        let args =
            crate::operator::Args::parse_from(["hpp-operator", "--admin-addr", "127.0.0.1:0", "--disable-webhook"]);
        assert!(args.command.is_none());
        assert!(args.run.disable_webhook);
        assert_eq!(args.run.admin_addr.port(), 0);
    }
}
