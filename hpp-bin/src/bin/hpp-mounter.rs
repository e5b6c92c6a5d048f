//! The `hpp-mounter` executable: keeps a pvcTemplate storage pool mounted on the host.

use clap::Parser;
use hpp_bin::operator::mounter::{self, MounterArgs};

fn main() -> anyhow::Result<()> {
    let args = MounterArgs::parse();
    hpp_bin::run(async move {
        let _telemetry = hpp_bin::telemetry::init("hpp-mounter", hpp_bin::telemetry::LogFormat::Text)?;
        mounter::main(args).await
    })?
}
