//! The small HTTP server every hpp executable runs beside its main job: Prometheus `/metrics`
//! plus whatever health routes the caller adds, and the shutdown signal they all share.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// Content type of the OpenMetrics text exposition format.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A router serving `GET /metrics` from `registry`.
pub fn metrics_router(registry: Arc<Registry>) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let registry = Arc::clone(&registry);
            async move { encode(&registry) }
        }),
    )
}

fn encode(registry: &Registry) -> axum::response::Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], body).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics failed: {e}"),
        )
            .into_response(),
    }
}

/// Limits of the metrics, health and admin listeners: these serve a scraper and the kubelet's
/// probes, so 64 connections are plenty; idle clients are dropped after 30 s.
pub fn limits() -> hpp_serve::Limits {
    hpp_serve::Limits {
        max_connections: 64,
        handshake_timeout: std::time::Duration::from_secs(5),
        header_read_timeout: std::time::Duration::from_secs(10),
        idle_timeout: std::time::Duration::from_secs(30),
        drain_timeout: std::time::Duration::from_secs(5),
    }
}

/// Serves `router` over plain HTTP on `listener` until `shutdown` resolves, then drains, through
/// the shared accept loop (`hpp-serve`: connection cap, header and idle timeouts).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    hpp_serve::Server::new("admin", limits())
        .serve(listener, router, shutdown)
        .await;
    Ok(())
}

/// Pause between attempts to bind a taken listener port.
pub const BIND_RETRY: std::time::Duration = std::time::Duration::from_secs(10);

/// Binds `addr` for the listener called `what`. A taken port (two instances on one host with
/// hostNetwork, or a test) is not fatal: the error is logged and the bind retried every
/// [`BIND_RETRY`] in the background, and `serve` runs once it succeeds. Returns the bound
/// address when the first attempt succeeded.
pub async fn bind_or_retry<F, Fut>(
    addr: std::net::SocketAddr,
    what: &'static str,
    serve: F,
) -> Option<std::net::SocketAddr>
where
    F: FnOnce(TcpListener) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    bind_or_retry_every(addr, what, BIND_RETRY, serve).await
}

async fn bind_or_retry_every<F, Fut>(
    addr: std::net::SocketAddr,
    what: &'static str,
    retry: std::time::Duration,
    serve: F,
) -> Option<std::net::SocketAddr>
where
    F: FnOnce(TcpListener) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    match TcpListener::bind(addr).await {
        Ok(listener) => {
            let local = listener.local_addr().ok();
            tokio::spawn(serve(listener));
            local
        }
        Err(e) => {
            tracing::error!(%addr, listener = what, error = %e, retry_seconds = retry.as_secs_f64(),
                "cannot listen; the rest of the process keeps working and the bind is retried");
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(retry).await;
                    match TcpListener::bind(addr).await {
                        Ok(listener) => {
                            tracing::info!(%addr, listener = what, "listening after retry");
                            serve(listener).await;
                            return;
                        }
                        Err(e) => tracing::warn!(%addr, listener = what, error = %e, "still cannot listen; retrying"),
                    }
                }
            });
            None
        }
    }
}

/// Resolves on SIGTERM (how the kubelet stops a pod) or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops this process");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = terminate => tracing::info!("SIGTERM received, shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupt received, shutting down"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn serves_metrics_and_stops_on_shutdown() {
        let mut registry = Registry::with_prefix("hpp");
        let counter: Counter = Counter::default();
        registry.register("test_events", "Events seen by the test", counter.clone());
        counter.inc_by(3);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, metrics_router(Arc::new(registry)), async {
            let _ = stopped.await;
        }));

        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        conn.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.contains("application/openmetrics-text"), "{response}");
        assert!(response.contains("hpp_test_events_total 3"), "{response}");

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_taken_port_is_retried_instead_of_fatal() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let (served_tx, served_rx) = tokio::sync::oneshot::channel::<std::net::SocketAddr>();
        let retry = std::time::Duration::from_millis(50);
        let bound = bind_or_retry_every(addr, "test", retry, move |l: TcpListener| async move {
            let _ = served_tx.send(l.local_addr().unwrap());
        })
        .await;
        assert_eq!(bound, None, "the port is taken");
        drop(taken);
        // A later attempt binds the freed port and serves.
        let served = tokio::time::timeout(std::time::Duration::from_secs(60), served_rx).await;
        assert_eq!(served.expect("the freed port is bound within a minute").unwrap(), addr);
    }
}
