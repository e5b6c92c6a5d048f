//! The `hpp-provisioner` executable: the non-CSI hostPath provisioner (KubeVirt legacy,
//! single-node and shared-filesystem modes).

use clap::Parser;
use hpp_bin::provisioner::{Args, main_with};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    main_with(Args::parse()).await
}
