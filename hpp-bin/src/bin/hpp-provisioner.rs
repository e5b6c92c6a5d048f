//! The `hpp-provisioner` executable: the non-CSI hostPath provisioner (KubeVirt legacy,
//! single-node and shared-filesystem modes).

use hpp_bin::provisioner::{Args, main_with};

fn main() -> anyhow::Result<()> {
    // Go-style `-name=…` flags of the replaced provisioners are accepted too.
    let args = Args::parse_compat(std::env::args_os()).unwrap_or_else(|e| e.exit());
    hpp_bin::run(main_with(args))?
}
