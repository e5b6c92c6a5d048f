//! What the driver's RPC layer ([`hpp_csi::RpcLayer`]: a span per call, the
//! outcome's log decision, the request count and latency metrics) costs a call, measured in
//! process: the same constant service called bare, behind the layer without metrics, and behind
//! the layer with a registered [`DriverMetrics`], under the shipped subscriber
//! ([`hpp_bin::telemetry::local_subscriber`]: the `RUST_LOG` filter, `info` by default, and
//! text lines, here written to nowhere). Also one `info` line inside the call's span, as
//! CreateVolume and DeleteVolume log one per volume.
//!
//! Why in process: the empty-call servers' turns over a socket carry the machine's noise (a
//! turn of 200 calls at c=16 lasts about 10 ms), which on a small VM is larger than the layer;
//! here the difference is the layer's own work, repeatable to a few percent.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hpp_bin::telemetry::{LogFormat, local_subscriber};
use hpp_csi::DriverMetrics;
use hpp_csi::RpcLayer;

use crate::bench_stats::{median, per_call};
use tower::{Layer as _, Service, ServiceExt as _};

/// Rounds per variant, alternating; each variant's figure is its median round.
const ROUNDS: usize = 5;

/// Per-call times, each the median of five rounds.
#[derive(Debug, Clone, Copy, Default)]
pub struct LayerCost {
    /// The constant service alone.
    pub bare: Duration,
    /// Behind the layer without metrics: the span and the log decision.
    pub span: Duration,
    /// Behind the layer with metrics, as the driver serves.
    pub layered: Duration,
    /// One `info` event inside a call's span, formatted (its write to stderr not included).
    pub info_line: Duration,
}

impl LayerCost {
    /// What the layer adds to a call.
    pub fn added(&self) -> Duration {
        self.layered.saturating_sub(self.bare)
    }
}

/// A unary gRPC service that answers OK at once.
#[derive(Debug, Clone, Copy)]
struct Constant;

impl Service<http::Request<()>> for Constant {
    type Response = http::Response<()>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: http::Request<()>) -> Self::Future {
        let mut response = http::Response::new(());
        response
            .headers_mut()
            .insert("grpc-status", http::HeaderValue::from_static("0"));
        ready(Ok(response))
    }
}

fn probe_request() -> http::Request<()> {
    let mut req = http::Request::new(());
    *req.uri_mut() = http::Uri::from_static("/csi.v1.Identity/Probe");
    req
}

/// Mean time per call of `n` calls to `svc`.
async fn time_calls<S>(svc: &mut S, n: usize) -> Duration
where
    S: Service<http::Request<()>, Response = http::Response<()>, Error = Infallible>,
{
    let start = Instant::now();
    for _ in 0..n {
        let Ok(ready) = svc.ready().await;
        let Ok(response) = ready.call(probe_request()).await;
        std::hint::black_box(response);
    }
    per_call(start.elapsed(), n)
}

/// Mean time of `n` info events inside a span like the RPC layer's, its fields recorded as a
/// CreateVolume's are.
fn time_info_lines(n: usize) -> Duration {
    let span = tracing::info_span!(
        "csi_rpc",
        rpc.service = "Controller",
        rpc.method = "CreateVolume",
        volume_id = tracing::field::Empty,
        snapshot_id = tracing::field::Empty,
        pool = tracing::field::Empty,
    );
    span.record("volume_id", "pvc-0123456789abcdef");
    span.record("pool", "local");
    let _entered = span.enter();
    let start = Instant::now();
    for _ in 0..n {
        tracing::info!(
            volume_id = "pvc-0123456789abcdef",
            pool = "local",
            files = 0u64,
            reflinked = 0u64,
            "volume created"
        );
    }
    per_call(start.elapsed(), n)
}

/// Measures [`LayerCost`] with `n` calls per round. Blocks: call it from a blocking thread.
pub fn measure(n: usize) -> anyhow::Result<LayerCost> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let subscriber = local_subscriber(LogFormat::Text, std::io::sink);
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(DriverMetrics::register(&mut registry));
    let cost = tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            let mut bare = Constant;
            let mut span = RpcLayer::new(None).layer(Constant);
            let mut layered = RpcLayer::new(Some(metrics)).layer(Constant);
            let (mut b, mut s, mut l, mut i) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                b.push(time_calls(&mut bare, n).await);
                s.push(time_calls(&mut span, n).await);
                l.push(time_calls(&mut layered, n).await);
                i.push(time_info_lines(n));
            }
            LayerCost {
                bare: median(b),
                span: median(s),
                layered: median(l),
                info_line: median(i),
            }
        })
    });
    Ok(cost)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_layer_answers_the_constant_service_and_its_cost_is_measured() {
        let cost = measure(200).unwrap();
        assert!(cost.bare > Duration::ZERO && cost.layered > Duration::ZERO && cost.info_line > Duration::ZERO);
        assert_eq!(cost.added(), cost.layered.saturating_sub(cost.bare));
    }
}
