//! The `hpp-csi-driver` executable: a thin main over [`hpp_bin::csi_driver`].

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    hpp_bin::exit_code(
        "hpp-csi-driver",
        hpp_bin::csi_driver::main(hpp_bin::csi_driver::Args::parse()).await,
    )
}
