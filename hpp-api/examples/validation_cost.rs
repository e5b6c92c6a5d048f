//! Time and peak memory of `hpp-api` validation on adversarial and on the largest admitted
//! HostPathProvisioner specs. One case per process, so the peak RSS (VmHWM) is the case's own:
//!
//! ```sh
//! cargo run -p hpp-api --example validation_cost -- largest          # 64 pools, longest names and paths
//! cargo run -p hpp-api --example validation_cost -- identical 3000   # CREATE, N identical pools
//! cargo run -p hpp-api --example validation_cost -- update 300       # UPDATE, N identical pools on both sides
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a measuring tool

use std::time::Instant;

use hpp_api::HostPathProvisionerSpec;
use hpp_api::validation::{ValidateCreate, ValidateUpdate, worst_case};

/// Peak resident memory of this process in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn identical(n: usize) -> HostPathProvisionerSpec {
    worst_case::identical_pools(n)
}

fn largest() -> HostPathProvisionerSpec {
    worst_case::largest_admitted()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let case = args.first().map_or("largest", String::as_str);
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3000);
    let base = peak_rss_kib();
    let start = Instant::now();
    let (what, errors, message_bytes) = match case {
        "largest" => {
            let s = largest();
            let create = s.validate_create();
            let update = s.validate_update(&s);
            assert!(create.is_ok() && update.is_ok(), "{create:?} {update:?}");
            ("CREATE+UPDATE of the largest admitted spec (64 pools)".to_owned(), 0, 0)
        }
        "identical" => {
            let e = identical(n).validate_create().unwrap_err();
            (
                format!("CREATE with {n} identical pools"),
                e.errors().len(),
                e.to_string().len(),
            )
        }
        "update" => {
            let s = identical(n);
            let e = s.validate_update(&s).err();
            (
                format!("UPDATE with {n} identical pools"),
                e.as_ref().map_or(0, |e| e.errors().len()),
                e.map_or(0, |e| e.to_string().len()),
            )
        }
        other => panic!("unknown case {other:?}: largest | identical N | update N"),
    };
    let elapsed = start.elapsed();
    println!(
        "{what}: {elapsed:?}, {errors} errors, message {message_bytes} bytes, peak RSS {} KiB (+{} KiB over start)",
        peak_rss_kib(),
        peak_rss_kib().saturating_sub(base)
    );
}
