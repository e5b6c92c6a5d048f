//! The `hpp-csi-driver` executable: a thin main over [`hpp_bin::csi_driver`].

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = hpp_bin::csi_driver::Args::parse();
    let result =
        hpp_bin::run_with(hpp_bin::DRIVER_WORKERS, hpp_bin::csi_driver::main(args)).unwrap_or_else(|e| Err(e.into()));
    hpp_bin::exit_code("hpp-csi-driver", result)
}
