//! Logging and tracing set-up shared by every hpp executable: an `EnvFilter` from `RUST_LOG`
//! (default `info`), text or JSON lines on stderr, and OpenTelemetry trace export over OTLP/gRPC
//! when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (the standard OTEL_* variables configure it further).

use std::io::IsTerminal as _;

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _, fmt};

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Keeps the trace exporter alive; dropping it flushes spans that are still buffered.
#[must_use = "dropping the guard stops trace export"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Whether spans are exported over OTLP.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: flushing traces failed: {e}");
        }
    }
}

/// Installs the global subscriber. Call once, first thing in `main`, inside the tokio runtime
/// (the OTLP exporter needs it).
pub fn init(service: &'static str, format: LogFormat) -> anyhow::Result<TelemetryGuard> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let provider = otlp_endpoint().map(|_| tracer_provider(service)).transpose()?;
    let otel = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer(service)));
    let lines = match format {
        LogFormat::Text => fmt::layer()
            .with_ansi(colours_wanted(
                std::io::stderr().is_terminal(),
                std::env::var_os("NO_COLOR"),
            ))
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => fmt::layer().json().with_writer(std::io::stderr).boxed(),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(lines)
        .with(otel)
        .try_init()
        .context("installing the tracing subscriber")?;
    if let Some(endpoint) = otlp_endpoint() {
        tracing::info!(%endpoint, "exporting traces over OTLP");
    }
    Ok(TelemetryGuard { provider })
}

/// Colour escapes only on a terminal: `kubectl logs` and log collectors read stderr from a
/// pipe or file, where they are noise. `NO_COLOR` (any non-empty value) turns them off there too.
fn colours_wanted(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

fn otlp_endpoint() -> Option<String> {
    std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .ok()
        .filter(|v| !v.trim().is_empty())
}

fn tracer_provider(service: &'static str) -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .context("building the OTLP span exporter")?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service).build())
        .build())
}

#[cfg(test)]
mod tests {
    use super::colours_wanted;

    #[test]
    fn colour_escapes_only_reach_a_terminal_without_no_color() {
        assert!(colours_wanted(true, None));
        assert!(colours_wanted(true, Some("".into())));
        assert!(!colours_wanted(true, Some("1".into())));
        assert!(!colours_wanted(false, None));
    }
}
