//! The `hpp-operator` executable's command line and its subcommands: `run` (default), `render`,
//! `crd`, `webhook`, `adopt`; plus the pool `mounter` used by the `hpp-mounter` executable.

pub mod adopt;
pub mod allocator;
pub mod leader;
pub mod mounter;
pub mod rbac;
pub mod render;
pub mod run;

use clap::{Parser, Subcommand};

/// The hpp operator: deploys and manages the hostpath provisioner for a HostPathProvisioner CR.
#[derive(Parser, Debug)]
#[command(
    name = "hpp-operator",
    version,
    about = "The hpp operator: deploys and manages the hostpath provisioner for a HostPathProvisioner CR",
    args_conflicts_with_subcommands = true
)]
pub struct Args {
    /// What to do (default: run).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Options of `run` when no subcommand is given.
    #[command(flatten)]
    pub run: run::RunArgs,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the operator: leader election, the controller, health and metrics endpoints.
    Run(run::RunArgs),
    /// Print, offline, every object the operator would own for a CR, in apply order (YAML or
    /// JSON); with `--rbac`, the operator's own RBAC instead.
    Render(render::RenderArgs),
    /// Print the HostPathProvisioner CustomResourceDefinition (both versions, v1beta1 stored).
    Crd,
    /// Serve only the admission webhook (no controller).
    Webhook(WebhookCommand),
    /// Adopt volumes of other hostPath provisioners into hpp's CSI driver, in place (nothing is
    /// copied): `--dry-run` lists each Bound claim, what it would become, or why not.
    Adopt(adopt::AdoptArgs),
}

/// Arguments of `webhook`.
#[derive(clap::Args, Debug, Clone)]
pub struct WebhookCommand {
    /// Log line format.
    #[arg(long, env = "HPP_LOG_FORMAT", value_enum, default_value_t = crate::telemetry::LogFormat::Text)]
    pub log_format: crate::telemetry::LogFormat,
    /// Webhook flags.
    #[command(flatten)]
    pub webhook: crate::webhook_cmd::WebhookArgs,
    /// The HTTPS listener for the webhook's metrics.
    #[command(flatten)]
    pub metrics: crate::metrics_tls::MetricsListenArgs,
}

/// Writes to stdout; a closed pipe (`| head`) is a normal end, not an error.
pub fn print_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// Dispatches the parsed command line.
pub async fn main(args: Args) -> anyhow::Result<()> {
    match args.command {
        None => run::run(args.run).await,
        Some(Command::Run(a)) => run::run(a).await,
        Some(Command::Render(a)) => render::main(&a),
        Some(Command::Crd) => print_stdout(&hpp_api::crd::crd_yaml()?),
        Some(Command::Adopt(a)) => adopt::main(a).await,
        Some(Command::Webhook(w)) => {
            let _telemetry = crate::telemetry::init("hpp-operator-webhook", w.log_format)?;
            let _ = rustls::crypto::ring::default_provider().install_default();
            crate::webhook_cmd::run_standalone(w.webhook, &w.metrics, crate::admin::shutdown_signal()).await
        }
    }
}
