//! The `hpp-operator` executable.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    hpp_bin::exit_code(
        "hpp-operator",
        hpp_bin::operator::main(hpp_bin::operator::Args::parse()).await,
    )
}
