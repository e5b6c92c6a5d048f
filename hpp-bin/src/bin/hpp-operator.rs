//! The `hpp-operator` executable.

use std::process::ExitCode;

use clap::Parser;

/// jemalloc, not glibc's allocator: the operator keeps thousands of small texts (its watch
/// caches) among every pass's short-lived trees, and glibc could not give back the pages between
/// them. Tuned first thing in `main` ([`hpp_bin::OPERATOR_ALLOCATOR_DECAY`]).
#[global_allocator]
static ALLOCATOR: hpp_sys::malloc::Jemalloc = hpp_sys::malloc::Jemalloc;

fn main() -> ExitCode {
    if let Err(e) = hpp_sys::malloc::tune_jemalloc(hpp_bin::OPERATOR_ALLOCATOR_DECAY) {
        // Logging starts later; the operator works untuned, only with more resident memory.
        eprintln!("warning: could not tune the allocator ({e}); freed memory is returned more slowly");
    }
    let args = hpp_bin::operator::Args::parse();
    let result =
        hpp_bin::run_with(hpp_bin::OPERATOR_WORKERS, hpp_bin::operator::main(args)).unwrap_or_else(|e| Err(e.into()));
    hpp_bin::exit_code("hpp-operator", result)
}
