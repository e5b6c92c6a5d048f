//! The HTTPS server: `hpp-serve`'s accept loop (TLS handshake with the current policy and
//! certificate per connection, HTTP/1.1 only, connection cap, handshake, header-read and idle
//! timeouts, graceful drain) in front of an axum router (bounded bodies, a per-request timeout).

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
use serde_json::Value;
use tokio::net::TcpListener;
use tracing::{error, info};

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
    /// A connection with no traffic for this long is closed (longer than `request_timeout`).
    pub idle_timeout: Duration,
}

impl ServerOptions {
    /// The accept-loop limits of these options.
    pub fn limits(&self) -> hpp_serve::Limits {
        hpp_serve::Limits {
            max_connections: self.max_connections,
            handshake_timeout: self.handshake_timeout,
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            drain_timeout: self.drain_timeout,
        }
    }
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
            idle_timeout: Duration::from_secs(60),
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
    /// connections for at most `drain_timeout`. The accept loop is `hpp-serve`'s, shared by
    /// every hpp listener.
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        let router = self.router();
        let tls = self.tls.clone();
        let metrics = self.metrics.clone();
        info!(policy = %self.tls.policy(), "webhook serving HTTPS (HTTP/1.1)");
        hpp_serve::Server::new("webhook", self.options.limits())
            .with_tls(Arc::new(move || {
                tls.acceptor().map_err(|e| {
                    error!(error = %e, "cannot build the TLS configuration");
                    e.to_string()
                })
            }))
            .on_handshake_failed(Arc::new(move || metrics.handshake_failed()))
            .serve(listener, router, shutdown)
            .await;
    }
}

/// A review's answer, closing the connection after it. Reviews are rare (HostPathProvisioner
/// writes and v1alpha1 conversions), and a kept-alive connection eventually times out on this
/// side: if the API server sends its next review just as the server closes it, Go's client
/// does not resend the POST and the review fails with EOF, which `failurePolicy: Fail` turns
/// into a refused write. A new connection per review costs one TLS handshake and has no such
/// race.
fn respond(reply: Reply) -> Response {
    let body = serde_json::to_vec(&reply.body).unwrap_or_default();
    let headers = [
        (header::CONTENT_TYPE, "application/json"),
        (header::CONNECTION, "close"),
    ];
    (reply.status, headers, body).into_response()
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
