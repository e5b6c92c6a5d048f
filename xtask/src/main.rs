//! `cargo xtask`: see the library documentation for the tasks.

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "Developer tasks of the hpp workspace")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Benchmark the hpp CSI driver against bare syscalls (formerly `hpp-bench`).
    Bench(xtask::bench::Args),
    /// Regenerate the generated blocks of docs/reference.md from the code.
    Docs {
        /// Only report stale blocks and fail, without writing.
        #[arg(long)]
        check: bool,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Bench(args) => xtask::bench::run(args).await,
        Task::Docs { check } => xtask::docs::run(check),
    }
}
