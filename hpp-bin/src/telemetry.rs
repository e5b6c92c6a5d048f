//! Logging and tracing set-up shared by every hpp executable: a filter from `RUST_LOG` in
//! `EnvFilter` syntax (default `info`), text or JSON lines on stderr, and OpenTelemetry trace
//! export over OTLP/gRPC when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (the standard OTEL_*
//! variables configure it further).

use std::io::IsTerminal as _;

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer, fmt};

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
    let provider = otlp_endpoint().map(|_| tracer_provider(service)).transpose()?;
    let otel = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer(service)));
    let ansi = colours_wanted(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR"));
    tracing_subscriber::registry()
        .with(filter())
        .with(lines(format, std::io::stderr, ansi))
        .with(otel)
        .try_init()
        .context("installing the tracing subscriber")?;
    if let Some(endpoint) = otlp_endpoint() {
        tracing::info!(%endpoint, "exporting traces over OTLP");
    }
    Ok(TelemetryGuard { provider })
}

/// The subscriber [`init`] installs, without trace export and writing its lines to `writer`
/// (without colour): for measuring what the logging costs a request (`cargo xtask bench`) under
/// exactly the shipped filter and format.
pub fn local_subscriber<W>(format: LogFormat, writer: W) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::registry()
        .with(filter())
        .with(lines(format, writer, false))
}

/// The filter `RUST_LOG` gives: `info` when unset or unparsable.
fn filter<S>() -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    filter_for(std::env::var("RUST_LOG").ok().as_deref())
}

/// The filter for a `RUST_LOG` of `spec` (`EnvFilter` syntax). Levels and targets only (`info`,
/// `hpp_csi=debug,warn`: the usual case) make a [`Targets`] filter, which decides once per
/// callsite; span and field directives need an [`EnvFilter`], which also tracks every span
/// that may match them (a lock and a map lookup when each span is made, entered and left: a
/// measurable share of a cheap RPC).
fn filter_for<S>(spec: Option<&str>) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    let Some(spec) = spec else {
        return Targets::new().with_default(LevelFilter::INFO).boxed();
    };
    let plain = !spec.trim().is_empty() && !spec.contains(['[', '{']);
    match spec.parse::<Targets>() {
        Ok(targets) if plain => targets.boxed(),
        _ => EnvFilter::try_new(spec)
            .unwrap_or_else(|_| EnvFilter::new("info"))
            .boxed(),
    }
}

/// The log-line layer: text (with colour escapes when `ansi`) or JSON, written to `writer`.
fn lines<S, W>(format: LogFormat, writer: W, ansi: bool) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    match format {
        LogFormat::Text => fmt::layer().with_ansi(ansi).with_writer(writer).boxed(),
        LogFormat::Json => fmt::layer().json().with_writer(writer).boxed(),
    }
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
    use super::{colours_wanted, filter_for};
    use tracing::Level;
    use tracing_subscriber::layer::SubscriberExt as _;

    /// Which of `levels` an event of target `target` gets through with `RUST_LOG=spec`.
    fn passes(spec: Option<&str>, target_is_hpp: bool) -> Vec<Level> {
        let subscriber = tracing_subscriber::registry().with(filter_for(spec));
        tracing::subscriber::with_default(subscriber, || {
            let mut out = Vec::new();
            macro_rules! probe {
                ($level:expr) => {{
                    let on = if target_is_hpp {
                        tracing::enabled!(target: "hpp_csi::controller", $level)
                    } else {
                        tracing::enabled!(target: "h2::proto", $level)
                    };
                    if on {
                        out.push($level);
                    }
                }};
            }
            probe!(Level::ERROR);
            probe!(Level::WARN);
            probe!(Level::INFO);
            probe!(Level::DEBUG);
            probe!(Level::TRACE);
            out
        })
    }

    /// The cheaper filter keeps `EnvFilter`'s meaning for the directives it takes, and the rest
    /// still go to `EnvFilter`.
    #[test]
    fn rust_log_means_what_envfilter_makes_of_it() {
        use Level as L;
        assert_eq!(passes(None, true), [L::ERROR, L::WARN, L::INFO]);
        assert_eq!(passes(None, false), [L::ERROR, L::WARN, L::INFO]);
        assert_eq!(passes(Some("warn"), true), [L::ERROR, L::WARN]);
        assert_eq!(
            passes(Some("hpp_csi=debug,warn"), true),
            [L::ERROR, L::WARN, L::INFO, L::DEBUG]
        );
        assert_eq!(passes(Some("hpp_csi=debug,warn"), false), [L::ERROR, L::WARN]);
        assert_eq!(passes(Some("hpp_csi=trace"), false), Vec::<Level>::new());
        assert_eq!(passes(Some("off"), true), Vec::<Level>::new());
        assert_eq!(
            passes(Some("not a level=="), true),
            [L::ERROR, L::WARN, L::INFO],
            "unparsable: info"
        );
        // Span directives are EnvFilter's: its events outside such a span follow the rest.
        assert_eq!(passes(Some("[csi_rpc]=debug,warn"), true), [L::ERROR, L::WARN]);
    }

    #[test]
    fn colour_escapes_only_reach_a_terminal_without_no_color() {
        assert!(colours_wanted(true, None));
        assert!(colours_wanted(true, Some("".into())));
        assert!(!colours_wanted(true, Some("1".into())));
        assert!(!colours_wanted(false, None));
    }
}
