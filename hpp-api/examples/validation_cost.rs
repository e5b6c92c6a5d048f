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

use hpp_api::validation::{ValidateCreate, ValidateUpdate};
use hpp_api::{HostPathProvisionerSpec, StoragePool};

/// Peak resident memory of this process in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn spec(pools: Vec<StoragePool>) -> HostPathProvisionerSpec {
    HostPathProvisionerSpec {
        storage_pools: Some(pools),
        feature_gates: Some(vec!["Snapshotting".into()]),
        ..Default::default()
    }
}

fn identical(n: usize) -> HostPathProvisionerSpec {
    spec(
        (0..n)
            .map(|_| StoragePool {
                name: "local".into(),
                path: "/var/hpvolumes".into(),
                ..Default::default()
            })
            .collect(),
    )
}

/// 64 distinct pools with 50-character names and 255-character paths, siblings under one
/// parent so every nesting comparison walks the long common prefix.
fn largest() -> HostPathProvisionerSpec {
    spec(
        (0..64)
            .map(|i| {
                let name = format!("{i:02}{}", "a".repeat(48));
                let dir = format!("/{}", "d".repeat(200));
                let leaf = format!("{i:02}{}", "p".repeat(255 - dir.len() - 3));
                StoragePool {
                    name,
                    path: format!("{dir}/{leaf}"),
                    snapshot_provider: Some("reflink".into()),
                    ..Default::default()
                }
            })
            .collect(),
    )
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
