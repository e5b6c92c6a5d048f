//! The `hpp-operator` executable.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = hpp_bin::operator::Args::parse();
    let result =
        hpp_bin::run_with(hpp_bin::OPERATOR_WORKERS, hpp_bin::operator::main(args)).unwrap_or_else(|e| Err(e.into()));
    hpp_bin::exit_code("hpp-operator", result)
}
