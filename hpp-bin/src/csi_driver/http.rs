//! The metrics and health listener: `GET /metrics` (OpenMetrics), `GET /livez` (200 while the
//! driver answers its CSI Probe, ready or not), `GET /healthz` (200 `ok` when every pool is
//! usable, 503 `not ok` otherwise or when the pools do not answer within 5 s; the reasons, which
//! name pool paths, go to the log only) and, with `--volume-report-token-file`, `GET /volumes`
//! (the node's volumes, for the operator's orphan report; bearer token required). HTTPS as in KubeVirt: the
//! `--metrics-cert-file`/`--metrics-key-file` certificate (re-read when it changes), else a
//! self-signed one; minimum version from `--metrics-tls-version`. Plain HTTP only in the
//! zero-config `--datadir-root` mode without certificate files, or with `--metrics-insecure-http`.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::RawQuery;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use hpp_csi::csi::{self, identity_client::IdentityClient};
use hpp_csi::{Driver, Endpoint};
use hpp_webhook::tls;
use prometheus_client::registry::Registry;
use tokio::sync::Semaphore;

use super::ServeArgs;
use crate::metrics_tls::{self, MetricsTls, SelfSignedNames};

/// Where the CSI server listens, known once it is bound (after the metrics listener starts).
pub type CsiEndpoint = Arc<OnceLock<Endpoint>>;

/// How long `/livez` waits for the driver's own Probe answer.
const LIVENESS_PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// How long `/healthz` waits for its pool report. A pool on a filesystem that stopped answering
/// (a dead NFS server) never finishes one; that is a "not ok".
const HEALTHZ_TIMEOUT: Duration = Duration::from_secs(5);

/// Health and metrics routes.
///
/// `/livez` is the liveness check: it calls the driver's CSI Probe over its own endpoint and
/// answers 200 whenever the driver answers. The driver answers ready even while a pool is
/// unusable (that pool takes only itself out); `ready: false` would still mean "initialising, do
/// not restart", so it passes too. Only an error or no answer (a wedged server, a removed socket)
/// fails `/livez`. `/healthz` is the pools view: 503 while any pool is unusable.
///
/// `GET /volumes` (the node's volume report, see [`volumes`]) exists when `report_token` names
/// the file holding the bearer token its callers must present.
pub fn router(
    registry: Arc<Registry>,
    driver: Driver,
    csi_endpoint: CsiEndpoint,
    report_token: Option<PathBuf>,
) -> Router {
    let reports = Arc::new(Semaphore::new(1));
    let base = match report_token {
        Some(token_file) => {
            let (driver, inventories) = (driver.clone(), Arc::new(Semaphore::new(1)));
            crate::admin::metrics_router(registry).route(
                "/volumes",
                get(move |headers: HeaderMap, query: RawQuery| {
                    let (driver, inventories, token_file) = (driver.clone(), inventories.clone(), token_file.clone());
                    async move { volumes(driver, inventories, &token_file, &headers, query.0.as_deref()).await }
                }),
            )
        }
        None => crate::admin::metrics_router(registry),
    };
    base.route(
        "/livez",
        get(move || {
            let endpoint = csi_endpoint.get().cloned();
            async move { liveness(endpoint).await }
        }),
    )
    .route(
        "/healthz",
        get(move || {
            let (driver, reports) = (driver.clone(), reports.clone());
            async move {
                let report = move || driver.pools_report().all_usable();
                match pools_usable(reports, HEALTHZ_TIMEOUT, report).await {
                    Some(true) => (StatusCode::OK, "ok"),
                    // Unauthenticated: ok / not ok only. Which pool and why (paths) is in the
                    // driver's log and the pool metrics, not here.
                    _ => (StatusCode::SERVICE_UNAVAILABLE, "not ok"),
                }
            }
        }),
    )
}

/// Runs `report` (blocking: statvfs and the mount table) for `/healthz`, one at a time, each
/// awaited at most `timeout`; `None` when it did not finish in time. A report stuck on a hung
/// filesystem keeps its permit and its one blocking thread, so later requests wait for the
/// permit and time out instead of each leaving another thread stuck: the endpoint is
/// unauthenticated and polled, and stuck threads would drain the blocking pool the CSI calls
/// run on.
pub async fn pools_usable(
    reports: Arc<Semaphore>,
    timeout: Duration,
    report: impl FnOnce() -> bool + Send + 'static,
) -> Option<bool> {
    let run = async move {
        let permit = reports.acquire_owned().await.ok()?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            report()
        })
        .await
        .ok()
    };
    tokio::time::timeout(timeout, run).await.ok().flatten()
}

/// How long `/volumes` waits for its report.
const VOLUMES_TIMEOUT: Duration = Duration::from_secs(60);

/// `GET /volumes[?usage=id,id]`: the node's volumes, pool by pool
/// ([`hpp_csi::inventory::Inventory`], JSON), with the usage of the ids asked for. Only for a
/// caller presenting `Authorization: Bearer <the token in token_file>` (read at every request,
/// so a rotated Secret takes effect): volume ids and sizes are not for every pod that can reach
/// the port. One report at a time.
pub async fn volumes(
    driver: Driver,
    inventories: Arc<Semaphore>,
    token_file: &Path,
    headers: &HeaderMap,
    query: Option<&str>,
) -> (StatusCode, [(axum::http::HeaderName, &'static str); 1], String) {
    let text = [(axum::http::header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    let json = [(axum::http::header::CONTENT_TYPE, "application/json")];
    let expected = match std::fs::read_to_string(token_file) {
        Ok(t) if !t.trim().is_empty() => t.trim().to_owned(),
        _ => {
            tracing::warn!(file = %token_file.display(), "the volume report token cannot be read; refusing /volumes");
            return (StatusCode::SERVICE_UNAVAILABLE, text, "no report token".to_owned());
        }
    };
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if !same_secret(given.trim().as_bytes(), expected.as_bytes()) {
        return (StatusCode::UNAUTHORIZED, text, "unauthorized".to_owned());
    }
    let usage_of: std::collections::BTreeSet<String> = query
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.strip_prefix("usage="))
        .flat_map(|ids| ids.split(','))
        .filter(|id| !id.is_empty())
        .take(hpp_csi::inventory::MAX_USAGE_IDS)
        .map(str::to_owned)
        .collect();
    let run = async move {
        let permit = inventories.acquire_owned().await.ok()?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            hpp_csi::inventory::report(driver.state(), &usage_of)
        })
        .await
        .ok()
    };
    match tokio::time::timeout(VOLUMES_TIMEOUT, run).await.ok().flatten() {
        Some(report) => match serde_json::to_string(&report) {
            Ok(body) => (StatusCode::OK, json, body),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, text, e.to_string()),
        },
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            text,
            "the report did not finish in time".to_owned(),
        ),
    }
}

/// Compares two secrets in time that depends only on their lengths.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len() && given.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

async fn liveness(endpoint: Option<Endpoint>) -> (StatusCode, String) {
    let Some(endpoint) = endpoint else {
        return (StatusCode::SERVICE_UNAVAILABLE, "CSI server not started yet".to_owned());
    };
    let probe = async {
        let channel = hpp_csi::client::connect(&endpoint).await.map_err(|e| e.to_string())?;
        IdentityClient::new(channel)
            .probe(csi::ProbeRequest {})
            .await
            .map(|r| r.into_inner().ready.unwrap_or(true))
            .map_err(|s| s.to_string())
    };
    match tokio::time::timeout(LIVENESS_PROBE_TIMEOUT, probe).await {
        Ok(Ok(true)) => (StatusCode::OK, "ok".to_owned()),
        Ok(Ok(false)) => (
            StatusCode::OK,
            "alive, waiting for storage pools (see /healthz)".to_owned(),
        ),
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("CSI Probe failed: {e}")),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "CSI Probe timed out".to_owned()),
    }
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

/// The flag the metrics TLS policy comes from, named in logs.
pub const METRICS_TLS_FLAG: &str = "--metrics-tls-version";

/// The policy for `--metrics-tls-version`. As in KubeVirt, a value it does not know is logged and
/// TLS 1.3 is used, so a DaemonSet that worked there still starts. The policy's source is the
/// flag: the driver reads no TLS environment variable, so its logs must not claim one.
pub fn metrics_tls_policy(flag: &str) -> tls::Resolved {
    let source = tls::PolicySource::Flag(METRICS_TLS_FLAG.to_owned());
    let mut warnings = Vec::new();
    let policy = match tls::policy::parse_min_version(flag, &mut warnings) {
        Ok(tls::TlsVersion::Tls12) => tls::TlsPolicy::intermediate(source),
        Ok(tls::TlsVersion::Tls13) => tls::TlsPolicy::modern(source),
        Err(_) => {
            tracing::warn!(value = flag, "unknown {METRICS_TLS_FLAG}, using VersionTLS13");
            tls::TlsPolicy::modern(source)
        }
    };
    tls::Resolved { policy, warnings }
}

/// A fixed policy for the metrics listener, logged once with where it came from.
fn fixed_policy(resolved: tls::Resolved) -> tls::PolicyWatch {
    for w in &resolved.warnings {
        tracing::warn!(warning = %w, "{METRICS_TLS_FLAG}");
    }
    tracing::info!(policy = %resolved.policy, "metrics TLS policy");
    let (tx, rx) = tokio::sync::watch::channel(resolved.policy);
    // Keep the sender until every receiver is gone, so receivers wait instead of failing.
    tokio::spawn(async move { tx.closed().await });
    rx
}

/// Binds `addr` and serves in the background; returns the base URL.
pub async fn start(
    args: &ServeArgs,
    addr: SocketAddr,
    registry: Arc<Registry>,
    driver: Driver,
    csi_endpoint: CsiEndpoint,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<String> {
    // Checked before binding: a bad TLS flag or certificate fails start-up, not the first scrape.
    let tls = match scheme(args) {
        Scheme::Https => Some(Arc::new(MetricsTls::new(
            fixed_policy(metrics_tls_policy(&args.metrics_tls_version)),
            args.metrics_cert_file.clone(),
            args.metrics_key_file.clone(),
            &SelfSignedNames::from_env(),
        )?)),
        Scheme::Http => None,
    };
    let app = router(registry, driver, csi_endpoint, args.volume_report_token_file.clone());
    let https = tls.is_some();
    // A taken port (KubeVirt's [::]:8443 default, two drivers with hostNetwork) is logged and
    // retried, never fatal: volumes keep being served.
    let local = crate::admin::bind_or_retry(addr, "metrics", move |listener| async move {
        let served = match tls {
            Some(tls) => metrics_tls::serve(listener, app, tls, shutdown).await,
            None => crate::admin::serve(listener, app, shutdown).await,
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "metrics server failed");
        }
    })
    .await
    .unwrap_or(addr);
    Ok(if https {
        format!("https://{local}")
    } else {
        format!("http://{local}")
    })
}
