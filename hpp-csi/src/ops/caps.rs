//! Pure checks and builders shared by the Controller and Node services: volume capabilities,
//! volume conditions, and the `Volume` message.

use std::collections::HashMap;

use hpp_api::constants::PARAM_STORAGE_POOL;

use crate::csi::{self, volume_capability::AccessType};
use crate::error::{Error, Result};
use crate::pool::{Pool, PoolHealth, round_capacity};

/// Why a capability is not supported, or `None` when it is: hpp volumes are directories, so
/// only the mount access type works; every access mode does (RWX is a shared directory).
pub fn unsupported(cap: &csi::VolumeCapability) -> Option<String> {
    match cap.access_type {
        Some(AccessType::Mount(_)) => {}
        Some(AccessType::Block(_)) => {
            return Some("block access is not supported: hpp volumes are directories".into());
        }
        None => return Some("volume capability has no access type".into()),
    }
    match cap.access_mode {
        Some(m) if m.mode != 0 => None,
        _ => Some("volume capability has no access mode".into()),
    }
}

/// Requires a non-empty list of supported capabilities.
pub fn check_all(caps: &[csi::VolumeCapability]) -> Result<()> {
    if caps.is_empty() {
        return Err(Error::InvalidArgument("volume_capabilities are required".into()));
    }
    for cap in caps {
        if let Some(why) = unsupported(cap) {
            return Err(Error::InvalidArgument(why));
        }
    }
    Ok(())
}

/// Condition of a volume from its pool's health and whether its directory exists.
pub fn condition(health: &PoolHealth, exists: bool) -> csi::VolumeCondition {
    let abnormal = |message: String| csi::VolumeCondition {
        abnormal: true,
        message,
    };
    if let Some(reason) = &health.reason {
        return abnormal(reason.clone());
    }
    if !exists {
        return abnormal("the volume directory does not exist".into());
    }
    if health.available_bytes == 0 {
        return abnormal("No space left on device".into());
    }
    if health.total_inodes > 0 && health.free_inodes == 0 {
        return abnormal("No free inodes left on device".into());
    }
    csi::VolumeCondition {
        abnormal: false,
        message: "volume is healthy".into(),
    }
}

/// The `Volume` message for volume `id` in `pool`.
pub fn volume(
    id: &str,
    pool: &Pool,
    capacity_bytes: u64,
    mut context: HashMap<String, String>,
    source: Option<csi::VolumeContentSource>,
    topology: &csi::Topology,
) -> csi::Volume {
    context
        .entry(PARAM_STORAGE_POOL.to_owned())
        .or_insert_with(|| pool.name.clone());
    csi::Volume {
        capacity_bytes: i64::try_from(capacity_bytes).unwrap_or(i64::MAX),
        volume_id: id.to_owned(),
        volume_context: context,
        content_source: source,
        accessible_topology: if pool.shared {
            Vec::new()
        } else {
            vec![topology.clone()]
        },
    }
}

/// Capacity reported for an existing volume: KubeVirt's rounded filesystem size.
pub fn listed_capacity(health: &PoolHealth) -> u64 {
    round_capacity(health.total_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::volume_capability::{AccessMode, BlockVolume, MountVolume, access_mode::Mode};

    fn cap(block: bool) -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_type: Some(if block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume::default())
            }),
            access_mode: Some(AccessMode {
                mode: Mode::MultiNodeMultiWriter as i32,
            }),
        }
    }

    #[test]
    fn only_mount_capabilities_are_supported() {
        assert!(check_all(&[cap(false)]).is_ok());
        assert!(check_all(&[]).is_err());
        assert!(check_all(&[cap(false), cap(true)]).is_err());
        let mut no_mode = cap(false);
        no_mode.access_mode = None;
        assert!(unsupported(&no_mode).is_some());
    }

    #[test]
    fn conditions_explain_the_problem() {
        let healthy = PoolHealth {
            usable: true,
            total_bytes: 10,
            available_bytes: 5,
            total_inodes: 10,
            free_inodes: 3,
            ..Default::default()
        };
        assert!(!condition(&healthy, true).abnormal);
        assert!(condition(&healthy, false).abnormal);
        let full = PoolHealth {
            available_bytes: 0,
            ..healthy.clone()
        };
        assert_eq!(condition(&full, true).message, "No space left on device");
        let no_inodes = PoolHealth {
            free_inodes: 0,
            ..healthy.clone()
        };
        assert!(condition(&no_inodes, true).message.contains("inodes"));
        let unmounted = PoolHealth {
            reason: Some("not a mount point".into()),
            ..Default::default()
        };
        assert_eq!(condition(&unmounted, true).message, "not a mount point");
    }
}
