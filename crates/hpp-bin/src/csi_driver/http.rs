//! The metrics and health listener: `GET /metrics` (OpenMetrics) and `GET /healthz` (200 when
//! every pool is usable, 503 with the reasons otherwise). Plain HTTP by default; HTTPS with
//! `--metrics-cert-file`/`--metrics-key-file`, using the webhook's rustls set-up (certificates
//! re-read when they change, minimum version from `--metrics-tls-version`).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use hpp_csi::Driver;
use hpp_webhook::tls::{self, AcceptorSource, CertStore};
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;

use super::ServeArgs;

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

/// Binds `addr` and serves in the background; returns the base URL.
pub async fn start(
    args: &ServeArgs,
    addr: SocketAddr,
    registry: Arc<Registry>,
    driver: Driver,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<String> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for metrics"))?;
    let local = listener.local_addr()?;
    let app = router(registry, driver);
    match (&args.metrics_cert_file, &args.metrics_key_file) {
        (Some(cert), Some(key)) => {
            let overrides = tls::resolve_overrides(Some(&args.metrics_tls_version), None)?;
            let policy = tls::start_policy(overrides, None);
            let source = Arc::new(AcceptorSource::new(policy, Arc::new(CertStore::new(cert, key))));
            // Fail at start-up, not on the first scrape, when the files are unusable.
            source
                .certs()
                .current()
                .context("loading --metrics-cert-file/--metrics-key-file")?;
            let tls_listener = TlsListener {
                inner: listener,
                source,
            };
            tokio::spawn(async move {
                if let Err(e) = axum::serve(tls_listener, app).with_graceful_shutdown(shutdown).await {
                    tracing::error!(error = %e, "metrics server failed");
                }
            });
            Ok(format!("https://{local}"))
        }
        (None, None) => {
            tokio::spawn(async move {
                if let Err(e) = crate::admin::serve(listener, app, shutdown).await {
                    tracing::error!(error = %e, "metrics server failed");
                }
            });
            Ok(format!("http://{local}"))
        }
        _ => anyhow::bail!("--metrics-cert-file and --metrics-key-file must be given together"),
    }
}

/// TCP listener that completes a TLS handshake before handing the connection to axum.
struct TlsListener {
    inner: TcpListener,
    source: Arc<AcceptorSource>,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (tcp, peer) = match self.inner.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let acceptor = match self.source.acceptor() {
                Ok(a) => a,
                Err(e) => {
                    tracing::error!(error = %e, "metrics TLS configuration unusable");
                    continue;
                }
            };
            match tokio::time::timeout(Duration::from_secs(5), acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => return (stream, peer),
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "metrics TLS handshake timed out"),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}
