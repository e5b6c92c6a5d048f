//! Tower layer around every CSI RPC (and hpp's admin service; other services an embedder
//! serves next to them pass through untouched): one tracing span per call (with `volume_id`,
//! `snapshot_id` and `pool` fields the handlers fill in), a log line with the outcome, and the
//! RPC count and latency metrics by method and gRPC code.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tonic::Code;
use tower::{Layer, Service};
use tracing::Instrument;

use crate::metrics::DriverMetrics;

/// Every RPC the CSI v1 services (and hpp's admin service, `Trash`) define, as its (service,
/// method) labels, in the order [`rpc_index`] numbers them. Any other path is labelled
/// `unknown`, so a client cannot blow up metric cardinality with made-up paths.
pub const RPCS: [(&str, &str); 29] = [
    ("Identity", "GetPluginInfo"),
    ("Identity", "GetPluginCapabilities"),
    ("Identity", "Probe"),
    ("Controller", "CreateVolume"),
    ("Controller", "DeleteVolume"),
    ("Controller", "ControllerPublishVolume"),
    ("Controller", "ControllerUnpublishVolume"),
    ("Controller", "ValidateVolumeCapabilities"),
    ("Controller", "ListVolumes"),
    ("Controller", "GetCapacity"),
    ("Controller", "ControllerGetCapabilities"),
    ("Controller", "CreateSnapshot"),
    ("Controller", "DeleteSnapshot"),
    ("Controller", "ListSnapshots"),
    ("Controller", "ControllerExpandVolume"),
    ("Controller", "ControllerGetVolume"),
    ("Controller", "ControllerModifyVolume"),
    ("Node", "NodeStageVolume"),
    ("Node", "NodeUnstageVolume"),
    ("Node", "NodePublishVolume"),
    ("Node", "NodeUnpublishVolume"),
    ("Node", "NodeGetVolumeStats"),
    ("Node", "NodeExpandVolume"),
    ("Node", "NodeGetCapabilities"),
    ("Node", "NodeGetInfo"),
    ("Trash", "ListTrash"),
    ("Trash", "RestoreTrash"),
    ("Trash", "PurgeTrash"),
    ("Trash", "TrashVolume"),
];

/// Where `method` is in [`RPCS`] (method names are unique across the services). One `match`
/// on the name: this runs for every call, twice (labels and metrics).
pub fn rpc_index(method: &str) -> Option<usize> {
    Some(match method {
        "GetPluginInfo" => 0,
        "GetPluginCapabilities" => 1,
        "Probe" => 2,
        "CreateVolume" => 3,
        "DeleteVolume" => 4,
        "ControllerPublishVolume" => 5,
        "ControllerUnpublishVolume" => 6,
        "ValidateVolumeCapabilities" => 7,
        "ListVolumes" => 8,
        "GetCapacity" => 9,
        "ControllerGetCapabilities" => 10,
        "CreateSnapshot" => 11,
        "DeleteSnapshot" => 12,
        "ListSnapshots" => 13,
        "ControllerExpandVolume" => 14,
        "ControllerGetVolume" => 15,
        "ControllerModifyVolume" => 16,
        "NodeStageVolume" => 17,
        "NodeUnstageVolume" => 18,
        "NodePublishVolume" => 19,
        "NodeUnpublishVolume" => 20,
        "NodeGetVolumeStats" => 21,
        "NodeExpandVolume" => 22,
        "NodeGetCapabilities" => 23,
        "NodeGetInfo" => 24,
        "ListTrash" => 25,
        "RestoreTrash" => 26,
        "PurgeTrash" => 27,
        "TrashVolume" => 28,
        _ => return None,
    })
}

/// Where the RPC `method` of `service` is in [`RPCS`]; `None` for a method the service does not
/// define.
pub fn known_rpc(service: &str, method: &str) -> Option<usize> {
    rpc_index(method).filter(|&i| RPCS.get(i).is_some_and(|(s, _)| *s == service))
}

/// Splits `/csi.v1.Controller/CreateVolume` into bounded (service, method) labels.
pub fn rpc_labels(path: &str) -> (&'static str, &'static str) {
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let service = match parts.next() {
        Some("csi.v1.Identity") => "Identity",
        Some("csi.v1.Controller") => "Controller",
        Some("csi.v1.Node") => "Node",
        Some("hpp.admin.v1.Trash") => "Trash",
        _ => return ("unknown", "unknown"),
    };
    let method = parts
        .next()
        .and_then(|m| known_rpc(service, m))
        .and_then(|i| RPCS.get(i))
        .map_or("unknown", |(_, m)| *m);
    (service, method)
}

/// The layer; add it with `tonic::transport::Server::builder().layer(..)`.
#[derive(Debug, Clone, Default)]
pub struct RpcLayer {
    metrics: Option<Arc<DriverMetrics>>,
}

impl RpcLayer {
    /// A layer that records into `metrics` when given.
    pub fn new(metrics: Option<Arc<DriverMetrics>>) -> Self {
        RpcLayer { metrics }
    }
}

impl<S> Layer<S> for RpcLayer {
    type Service = RpcService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// Service produced by [`RpcLayer`].
#[derive(Debug, Clone)]
pub struct RpcService<S> {
    inner: S,
    metrics: Option<Arc<DriverMetrics>>,
}

impl<S, B, RB> Service<tonic::codegen::http::Request<B>> for RpcService<S>
where
    S: Service<tonic::codegen::http::Request<B>, Response = tonic::codegen::http::Response<RB>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: tonic::codegen::http::Request<B>) -> Self::Future {
        let (service, method) = rpc_labels(req.uri().path());
        // Services an embedder added next to the driver's are theirs to observe: no span, log
        // line or metric series here (a made-up path could not add series either way).
        if service == "unknown" {
            return Box::pin(self.inner.call(req));
        }
        let span = tracing::info_span!(
            "csi_rpc",
            // Display, not Debug: the text format escapes a Debug string character by character.
            rpc.service = %service,
            rpc.method = %method,
            volume_id = tracing::field::Empty,
            snapshot_id = tracing::field::Empty,
            pool = tracing::field::Empty,
        );
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let metrics = self.metrics.clone();
        let fut = {
            let _enter = span.enter();
            inner.call(req)
        };
        Box::pin(
            async move {
                let start = Instant::now();
                let res = fut.await;
                let seconds = start.elapsed().as_secs_f64();
                let (code, message) = match &res {
                    Ok(resp) => status_of(resp.headers()),
                    Err(_) => (Code::Internal, String::new()),
                };
                match code {
                    Code::Ok => tracing::debug!(seconds, "rpc ok"),
                    Code::Aborted | Code::NotFound | Code::AlreadyExists => {
                        tracing::info!(code = ?code, %message, seconds, "rpc failed")
                    }
                    _ => tracing::warn!(code = ?code, %message, seconds, "rpc failed"),
                }
                if let Some(m) = metrics {
                    m.observe_rpc(service, method, code, seconds);
                }
                res
            }
            .instrument(span),
        )
    }
}

/// Code and message of a unary response: errors travel in the headers ("trailers-only").
/// gRPC percent-encodes `grpc-message` on the wire; tonic's own decoder makes it the text the
/// handler wrote again, so log lines read as the error did. Only the two headers are handed to
/// it (tonic would also decode `grpc-status-details-bin`, which these logs do not need).
fn status_of(headers: &tonic::codegen::http::HeaderMap) -> (Code, String) {
    use tonic::codegen::http::HeaderMap;
    let Some(code) = headers.get("grpc-status") else {
        return (Code::Ok, String::new());
    };
    let mut status = HeaderMap::with_capacity(2);
    status.insert("grpc-status", code.clone());
    if let Some(message) = headers.get("grpc-message") {
        status.insert("grpc-message", message.clone());
    }
    match tonic::Status::from_header_map(&status) {
        Some(s) => (s.code(), s.message().to_owned()),
        None => (Code::Ok, String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logged_message_is_the_handlers_text_not_its_percent_encoding() {
        let text = "growing ext4 online needs CAP_SYS_RESOURCE: 100% \"done\", naïve";
        let mut headers = tonic::codegen::http::HeaderMap::new();
        tonic::Status::failed_precondition(text).add_header(&mut headers).ok();
        let wire = headers
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert_ne!(wire, text, "the wire form is encoded: {wire}");
        assert_eq!(status_of(&headers), (Code::FailedPrecondition, text.to_owned()));
        assert_eq!(status_of(&Default::default()), (Code::Ok, String::new()));
    }

    #[test]
    fn labels_are_bounded() {
        assert_eq!(
            rpc_labels("/csi.v1.Controller/CreateVolume"),
            ("Controller", "CreateVolume")
        );
        assert_eq!(rpc_labels("/csi.v1.Node/NodeGetInfo"), ("Node", "NodeGetInfo"));
        assert_eq!(rpc_labels("/evil/AAAAAAAA"), ("unknown", "unknown"));
        assert_eq!(rpc_labels("/csi.v1.Identity/Made-Up"), ("Identity", "unknown"));
        assert_eq!(
            rpc_labels("/csi.v1.Node/CreateVolume"),
            ("Node", "unknown"),
            "method of another service"
        );
        assert_eq!(rpc_labels("/csi.v1.Identity"), ("Identity", "unknown"));
    }

    #[test]
    fn every_rpc_is_numbered_where_the_table_has_it() {
        for (i, (service, method)) in RPCS.iter().enumerate() {
            assert_eq!(rpc_index(method), Some(i), "{method}");
            let package = match *service {
                "Trash" => "hpp.admin.v1",
                _ => "csi.v1",
            };
            assert_eq!(
                rpc_labels(&format!("/{package}.{service}/{method}")),
                (*service, *method)
            );
        }
        assert_eq!(rpc_index("unknown"), None);
    }
}
