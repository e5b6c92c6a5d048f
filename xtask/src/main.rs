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
    Bench(Box<xtask::bench::Args>),
    /// Profile the shipped executables under callgrind and write the linker's function order
    /// (images/link-order.txt).
    LinkOrder(xtask::link_order::Args),
    /// Regenerate the generated blocks of docs/reference.md from the code.
    Docs {
        /// Only report stale blocks and fail, without writing.
        #[arg(long)]
        check: bool,
    },
}

/// Runs like the shipped executables (`hpp_bin::run_with`: same runtime, same allocator
/// settings, the driver's worker count when serving it), so the driver the benchmark serves is
/// measured as it ships.
fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let workers = match &cli.task {
        Task::Bench(args) => args.workers(),
        _ => hpp_bin::Workers::PerCore,
    };
    hpp_bin::run_with(workers, async move {
        match cli.task {
            Task::Bench(args) => xtask::bench::run(*args).await,
            Task::Docs { check } => xtask::docs::run(check),
            Task::LinkOrder(args) => xtask::link_order::run(&args),
        }
    })?
}
