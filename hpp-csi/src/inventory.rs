//! What a node holds (the wire types live in [`hpp_api::inventory`], shared with the
//! operator): every volume of every pool, with when it was made, whether it is
//! published and its recorded capacity. The operator compares it with the PersistentVolumes of
//! the driver to report orphans (a directory no PV refers to) and missing volumes (a PV whose
//! directory is gone); the driver itself never judges, since it cannot see PVs.
//!
//! Building a report reads each pool directory once and the mount table once; usage (a tree
//! walk, or the backend's own accounting) is measured only for the ids asked for, at most
//! [`MAX_USAGE_IDS`] per report, so a report of 100,000 volumes costs a directory listing, not
//! 100,000 walks.

use std::collections::BTreeSet;
use std::os::fd::AsFd;

use crate::pool::Pool;
use crate::service::state::DriverState;

pub use hpp_api::inventory::{Inventory, MAX_USAGE_IDS, PoolInventory, VolumeEntry};

/// Builds the node's report (blocking: directory listings, the mount table, and the usage of
/// at most [`MAX_USAGE_IDS`] of the ids in `usage_of`).
pub fn report(state: &DriverState, usage_of: &BTreeSet<String>) -> Inventory {
    let mounts = state.mount_table().ok();
    let mut budget = MAX_USAGE_IDS;
    let pools = state
        .pools
        .iter()
        .map(|pool| pool_report(pool, mounts.as_deref(), usage_of, &mut budget))
        .collect();
    Inventory {
        node: state.node_id.clone(),
        pools,
    }
}

fn pool_report(
    pool: &Pool,
    mounts: Option<&crate::mountinfo::MountTable>,
    usage_of: &BTreeSet<String>,
    budget: &mut usize,
) -> PoolInventory {
    let unusable = |reason: String| PoolInventory {
        name: pool.name.clone(),
        shared: pool.shared,
        usable: false,
        reason: Some(reason),
        volumes: Vec::new(),
    };
    let (dir, mut ids) = match pool.open().and_then(|dir| pool.list_volumes().map(|ids| (dir, ids))) {
        Ok(v) => v,
        Err(e) => return unusable(e.to_string()),
    };
    ids.sort();
    let volumes = ids
        .into_iter()
        .map(|id| {
            let created_at = created_at(dir.as_fd(), &id);
            let published = mounts.is_some_and(|m| {
                let path = pool.volume_path(&id);
                !m.bind_mounts_of(&path).is_empty() || !m.mounts_below(&path).is_empty()
            });
            let capacity_bytes = crate::ops::volumes::recorded_capacity(dir.as_fd(), &id).ok().flatten();
            let used_bytes = match usage_of.contains(&id) && *budget > 0 {
                true => {
                    *budget -= 1;
                    crate::ops::volumes::used_bytes(pool, dir.as_fd(), &id)
                }
                false => None,
            };
            VolumeEntry {
                id,
                created_at,
                published,
                capacity_bytes,
                used_bytes,
            }
        })
        .collect();
    PoolInventory {
        name: pool.name.clone(),
        shared: pool.shared,
        usable: true,
        reason: None,
        volumes,
    }
}

fn created_at(dir: std::os::fd::BorrowedFd<'_>, id: &str) -> Option<i64> {
    use rustix::fs::{AtFlags, StatxFlags};
    let st = rustix::fs::statx(
        dir,
        id,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BTIME | StatxFlags::CTIME,
    )
    .ok()?;
    let mask = StatxFlags::from_bits_retain(st.stx_mask);
    if mask.contains(StatxFlags::BTIME) {
        Some(st.stx_btime.tv_sec)
    } else {
        mask.contains(StatxFlags::CTIME).then_some(st.stx_ctime.tv_sec)
    }
}
