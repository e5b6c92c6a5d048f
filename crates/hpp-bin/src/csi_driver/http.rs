//! The metrics and health listener: `GET /metrics` (OpenMetrics) and `GET /healthz` (200 when
//! every pool is usable, 503 with the reasons otherwise). HTTPS as in KubeVirt: the
//! `--metrics-cert-file`/`--metrics-key-file` certificate (re-read when it changes), else a
//! self-signed one; minimum version from `--metrics-tls-version`. Plain HTTP only in the
//! zero-config `--datadir-root` mode without certificate files, or with `--metrics-insecure-http`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use hpp_csi::Driver;
use hpp_webhook::tls;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use super::ServeArgs;
use crate::metrics_tls::{self, MetricsTls, SelfSignedNames};

/// Health and metrics routes.
pub fn router(registry: Arc<Registry>, driver: Driver) -> Router {
    crate::admin::metrics_router(registry).route(
        "/healthz",
        get(move || {
            let driver = driver.clone();
            async move {
                match tokio::task::spawn_blocking(move || driver.pools_report()).await {
                    Ok(report) if report.all_usable() => (StatusCode::OK, "ok".to_owned()),
                    Ok(report) => {
                        let reasons: Vec<String> = report
                            .pools
                            .iter()
                            .filter_map(|(n, h, _)| h.reason.as_ref().map(|r| format!("{n}: {r}")))
                            .collect();
                        (StatusCode::SERVICE_UNAVAILABLE, reasons.join("\n"))
                    }
                    Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
                }
            }
        }),
    )
}

/// How the metrics listener speaks: KubeVirt's HTTPS (given or self-signed certificate), or
/// plain HTTP for the zero-config mode and `--metrics-insecure-http`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// HTTPS, what the ServiceMonitor scrapes.
    Https,
    /// Plain HTTP.
    Http,
}

/// The scheme the flags ask for. Pure, for tests.
pub fn scheme(args: &ServeArgs) -> Scheme {
    // Any certificate flag asks for TLS; with only one file it is self-signed, as in KubeVirt.
    let any_file = args.metrics_cert_file.is_some() || args.metrics_key_file.is_some();
    if args.metrics_insecure_http || (args.datadir_root.is_some() && !any_file) {
        Scheme::Http
    } else {
        Scheme::Https
    }
}

/// The policy for `--metrics-tls-version`. As in KubeVirt, a value it does not know is logged and
/// TLS 1.3 is used, so a DaemonSet that worked there still starts.
pub fn metrics_tls_policy(flag: &str) -> tls::Resolved {
    match tls::resolve_overrides(Some(flag), None) {
        Ok(Some(resolved)) => resolved,
        Ok(None) | Err(_) => {
            tracing::warn!(value = flag, "unknown --metrics-tls-version, using VersionTLS13");
            tls::Resolved {
                policy: tls::TlsPolicy::modern(tls::PolicySource::Override),
                warnings: Vec::new(),
            }
        }
    }
}

/// Binds `addr` and serves in the background; returns the base URL.
pub async fn start(
    args: &ServeArgs,
    addr: SocketAddr,
    registry: Arc<Registry>,
    driver: Driver,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<String> {
    // Checked before binding: a bad TLS flag or certificate fails start-up, not the first scrape.
    let tls = match scheme(args) {
        Scheme::Https => Some(Arc::new(MetricsTls::new(
            tls::start_policy(Some(metrics_tls_policy(&args.metrics_tls_version)), None),
            args.metrics_cert_file.clone(),
            args.metrics_key_file.clone(),
            &SelfSignedNames::from_env(),
        )?)),
        Scheme::Http => None,
    };
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for metrics"))?;
    let local = listener.local_addr()?;
    let app = router(registry, driver);
    let url = match &tls {
        Some(_) => format!("https://{local}"),
        None => format!("http://{local}"),
    };
    tokio::spawn(async move {
        let served = match tls {
            Some(tls) => metrics_tls::serve(listener, app, tls, shutdown).await,
            None => crate::admin::serve(listener, app, shutdown).await,
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "metrics server failed");
        }
    });
    Ok(url)
}
