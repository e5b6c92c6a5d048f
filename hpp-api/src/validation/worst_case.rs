//! Specs that exercise validation's worst cases, for `cargo xtask bench --validation`, the
//! `validation_cost` example and tests.

use crate::constants::{MAX_STORAGE_POOLS, SNAPSHOT_PROVIDER_REFLINK};
use crate::v1beta1::{HostPathProvisionerSpec, StoragePool};

fn spec(pools: Vec<StoragePool>) -> HostPathProvisionerSpec {
    HostPathProvisionerSpec {
        storage_pools: Some(pools),
        feature_gates: Some(vec![crate::constants::FEATURE_GATE_SNAPSHOTTING.into()]),
        ..Default::default()
    }
}

/// `n` pools with the same name and path (the flood that once produced n² errors).
pub fn identical_pools(n: usize) -> HostPathProvisionerSpec {
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

/// The largest spec the schema admits that is valid: [`MAX_STORAGE_POOLS`] distinct pools with
/// 50-character names and 253-character paths, siblings under one long parent so every nesting
/// comparison walks the common prefix.
pub fn largest_admitted() -> HostPathProvisionerSpec {
    let parent = format!("/{}", "d".repeat(200));
    spec(
        (0..MAX_STORAGE_POOLS)
            .map(|i| StoragePool {
                name: format!("{i:02}{}", "a".repeat(48)),
                path: format!("{parent}/{i:02}{}", "p".repeat(49)),
                snapshot_provider: Some(SNAPSHOT_PROVIDER_REFLINK.into()),
                ..Default::default()
            })
            .collect(),
    )
}
