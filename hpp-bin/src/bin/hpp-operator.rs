//! The `hpp-operator` executable.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    hpp_bin::operator::main(hpp_bin::operator::Args::parse()).await
}
