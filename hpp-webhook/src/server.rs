//! The HTTPS server: an own accept loop (TLS handshake with the current policy and certificate
//! per connection, HTTP/1.1 only, header-read and handshake timeouts, graceful drain) in front
//! of an axum router (bounded bodies, a per-request timeout).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{StatusCode, header};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::{debug, error, info, warn};

use crate::cluster::ClusterState;
use crate::metrics::Metrics;
use crate::names::{CONVERT_PATH, HEALTHZ_PATH, READYZ_PATH, VALIDATE_PATH};
use crate::reply::Reply;
use crate::tls::AcceptorSource;
use crate::{admission, conversion};

/// Limits and timeouts of the server.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Time a client has to complete the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time a client has to send the request headers (slowloris protection).
    pub header_read_timeout: Duration,
    /// Time to read the body and answer; the API server waits at most 30 s.
    pub request_timeout: Duration,
    /// Largest request body accepted; larger ones get 413.
    pub max_body_bytes: usize,
    /// How long open connections may finish after shutdown starts.
    pub drain_timeout: Duration,
    /// Connections served at once; further clients wait in the listen backlog.
    pub max_connections: usize,
}

/// Default [`ServerOptions::max_body_bytes`]: the API server caps objects at 3 MiB, and a review
/// carries the old and new object.
pub const DEFAULT_MAX_BODY_BYTES: usize = 7 * 1024 * 1024;

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(25),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            drain_timeout: Duration::from_secs(10),
            max_connections: 1024,
        }
    }
}

/// Everything the webhook serves with.
#[derive(Clone)]
pub struct Webhook {
    /// Cluster lookups for the singleton and volume checks; `None` turns them off.
    pub cluster: Option<Arc<dyn ClusterState>>,
    /// TLS policy and certificates.
    pub tls: Arc<AcceptorSource>,
    /// Limits and timeouts.
    pub options: ServerOptions,
    /// Metrics sink.
    pub metrics: Metrics,
}

impl Webhook {
    /// The HTTP routes (without TLS), for serving and for tests that call the router directly.
    pub fn router(&self) -> Router {
        Router::new()
            .route(VALIDATE_PATH, post(validate))
            .route(CONVERT_PATH, post(convert))
            .route(HEALTHZ_PATH, get(|| async { "ok" }))
            .route(READYZ_PATH, get(ready))
            .fallback(not_found)
            .layer(middleware::from_fn_with_state(
                self.options.request_timeout,
                request_timeout,
            ))
            .layer(DefaultBodyLimit::max(self.options.max_body_bytes))
            .with_state(Arc::new(self.clone()))
    }

    /// Accepts TLS connections on `listener` until `shutdown` resolves, then drains open
    /// connections for at most `drain_timeout`.
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        let router = self.router();
        let graceful = GracefulShutdown::new();
        let connections = Arc::new(Semaphore::new(self.options.max_connections.max(1)));
        let mut shutdown = std::pin::pin!(shutdown);
        if let Ok(addr) = listener.local_addr() {
            info!(%addr, policy = %self.tls.policy(), "webhook listening (HTTPS, HTTP/1.1)");
        }
        loop {
            let permit = tokio::select! {
                permit = connections.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
                () = &mut shutdown => break,
            };
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Usually EMFILE; back off instead of spinning.
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let acceptor = match self.tls.acceptor() {
                Ok(a) => a,
                Err(e) => {
                    error!(error = %e, "cannot build the TLS configuration; dropping the connection");
                    continue;
                }
            };
            let watcher = graceful.watcher();
            let service = TowerToHyperService::new(router.clone());
            let options = self.options.clone();
            let metrics = self.metrics.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let stream = match tokio::time::timeout(options.handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        metrics.handshake_failed();
                        debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        metrics.handshake_failed();
                        debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
                let mut builder = http1::Builder::new();
                builder
                    .timer(TokioTimer::new())
                    .header_read_timeout(options.header_read_timeout);
                let conn = builder.serve_connection(TokioIo::new(stream), service);
                if let Err(e) = watcher.watch(conn).await {
                    debug!(%peer, error = %e, "connection ended with an error");
                }
            });
        }
        drop(listener);
        info!("webhook shutting down; draining connections");
        tokio::select! {
            () = graceful.shutdown() => {}
            () = tokio::time::sleep(self.options.drain_timeout) => warn!("connections still open after the drain timeout"),
        }
    }
}

fn respond(reply: Reply) -> Response {
    let body = serde_json::to_vec(&reply.body).unwrap_or_default();
    (reply.status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn body_error(rejection: &BytesRejection) -> Reply {
    Reply::error(
        rejection.status(),
        format!("cannot read the request body: {}", rejection.body_text()),
    )
}

async fn validate(State(app): State<Arc<Webhook>>, body: Result<Bytes, BytesRejection>) -> Response {
    let started = Instant::now();
    let reply = match body {
        Ok(body) => admission::review(&body, app.cluster.as_deref()).await,
        Err(rejection) => body_error(&rejection),
    };
    let result = match reply.body.pointer("/response/allowed").and_then(Value::as_bool) {
        Some(true) => "allowed",
        Some(false) => "denied",
        None => "rejected",
    };
    app.metrics.request("validate", result, started.elapsed().as_secs_f64());
    respond(reply)
}

async fn convert(State(app): State<Arc<Webhook>>, body: Result<Bytes, BytesRejection>) -> Response {
    let started = Instant::now();
    let reply = match body {
        Ok(body) => conversion::review(&body),
        Err(rejection) => body_error(&rejection),
    };
    let result = match reply.body.pointer("/response/result/status").and_then(Value::as_str) {
        Some("Success") => "converted",
        Some(_) => "failed",
        None => "rejected",
    };
    app.metrics.request("convert", result, started.elapsed().as_secs_f64());
    respond(reply)
}

async fn ready(State(app): State<Arc<Webhook>>) -> Response {
    if app.tls.certs().is_loaded() {
        (StatusCode::OK, "ok").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no serving certificate loaded").into_response()
    }
}

async fn not_found(request: Request) -> Response {
    respond(Reply::error(
        StatusCode::NOT_FOUND,
        format!(
            "no webhook at {}; serving {VALIDATE_PATH}, {CONVERT_PATH}, {HEALTHZ_PATH} and {READYZ_PATH}",
            request.uri().path()
        ),
    ))
}

async fn request_timeout(State(limit): State<Duration>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => respond(Reply::error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("request not answered within {limit:?}"),
        )),
    }
}
