//! The `hpp-csi-driver` executable: a thin main over [`hpp_bin::csi_driver`].

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if hpp_bin::csi_driver::is_kubevirt_legacy_start(&argv, |k| std::env::var_os(k)) {
        return hpp_bin::exit_code("hpp-csi-driver", Err(hpp_bin::csi_driver::exec_legacy_provisioner()));
    }
    let args = hpp_bin::csi_driver::Args::parse_from(argv);
    let result =
        hpp_bin::run_with(hpp_bin::DRIVER_WORKERS, hpp_bin::csi_driver::main(args)).unwrap_or_else(|e| Err(e.into()));
    hpp_bin::exit_code("hpp-csi-driver", result)
}
