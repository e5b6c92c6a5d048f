//! The `hpp-csi-driver` executable: a thin main over [`hpp_bin::csi_driver`].

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    hpp_bin::csi_driver::main(hpp_bin::csi_driver::Args::parse()).await
}
