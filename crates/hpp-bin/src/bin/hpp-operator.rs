//! The `hpp-operator` executable.

use clap::{Parser, Subcommand};

/// The hpp operator: deploys and manages the hostpath provisioner for a HostPathProvisioner CR.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the HostPathProvisioner CustomResourceDefinition (both versions, v1beta1 stored).
    Crd,
}

fn main() -> anyhow::Result<()> {
    match Args::parse().command {
        Command::Crd => print_stdout(&hpp_api::crd::crd_yaml()?),
    }
}

/// Writes to stdout; a closed pipe (`| head`) is a normal end, not an error.
fn print_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
