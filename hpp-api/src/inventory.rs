//! The node volume report on the wire: what the CSI driver serves at `GET /volumes` (the
//! `--volume-report-token-file` listener) and what the operator's volume audit reads. One
//! definition for both sides, serde only, so the operator does not depend on the driver.
//!
//! A report lists every volume of every configured pool of one node: the audit compares it
//! with the PersistentVolumes of the driver to find orphans (a directory no PV refers to) and
//! missing volumes (a PV whose directory is gone). The driver itself never judges: it cannot
//! see PVs.

use serde::{Deserialize, Serialize};

/// Most volumes whose usage one report measures (`?usage=id,id,...`); further ids are ignored.
pub const MAX_USAGE_IDS: usize = 64;

/// The path of the report on the driver's metrics listener.
pub const PATH: &str = "/volumes";

/// The query parameter naming the volumes whose used bytes the report measures.
pub const USAGE_PARAM: &str = "usage";

/// A node's volumes, pool by pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    /// The node id.
    pub node: String,
    /// Every configured pool, in configuration order.
    pub pools: Vec<PoolInventory>,
}

/// One pool's volumes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolInventory {
    /// Pool name.
    pub name: String,
    /// A shared pool: the same volumes are seen from every node.
    pub shared: bool,
    /// Whether the pool could be read; an unreadable pool lists no volumes and must not be
    /// taken for an empty one (every PV of it would look missing).
    pub usable: bool,
    /// Why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its volumes, sorted by id.
    pub volumes: Vec<VolumeEntry>,
}

/// One volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeEntry {
    /// Volume id.
    pub id: String,
    /// When the directory was made (birth time, else change time), unix seconds: a volume made
    /// a moment ago may not have its PV yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<i64>,
    /// Mounted somewhere (published to a pod, or an inline ephemeral volume in use).
    pub published: bool,
    /// Recorded capacity, when the volume has a record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// Bytes used, for the ids asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
}

/// The request target of a report measuring the usage of `ids`: at most [`MAX_USAGE_IDS`], and
/// only ids of `[A-Za-z0-9._-]` (the external provisioner's `pvc-<uid>` names), which need no
/// escaping; the driver does not decode the query, so the usage of any other id is not asked.
pub fn usage_target<'a>(ids: impl IntoIterator<Item = &'a str>) -> String {
    let ids: Vec<&str> = ids
        .into_iter()
        .filter(|id| {
            !id.is_empty()
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        })
        .take(MAX_USAGE_IDS)
        .collect();
    if ids.is_empty() {
        PATH.to_owned()
    } else {
        format!("{PATH}?{USAGE_PARAM}={}", ids.join(","))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_the_drivers_json() {
        let json = r#"{"node":"node01","pools":[{"name":"local","shared":false,"usable":true,
            "volumes":[{"id":"pvc-1","createdAt":1700000000,"published":true,"capacityBytes":1024},
                       {"id":"pvc-2","published":false,"usedBytes":7}]},
            {"name":"nfs","shared":true,"usable":false,"reason":"not mounted","volumes":[]}]}"#;
        let inv: Inventory = serde_json::from_str(json).unwrap();
        assert_eq!(inv.pools[0].volumes[0].created_at, Some(1_700_000_000));
        assert_eq!(inv.pools[0].volumes[1].used_bytes, Some(7));
        assert!(!inv.pools[1].usable);
        let back: Inventory = serde_json::from_str(&serde_json::to_string(&inv).unwrap()).unwrap();
        assert_eq!(back, inv);
    }

    #[test]
    fn usage_targets_are_bounded_and_never_need_escaping() {
        assert_eq!(usage_target([]), "/volumes");
        assert_eq!(usage_target(["pvc-1", "pvc-2"]), "/volumes?usage=pvc-1,pvc-2");
        assert_eq!(usage_target(["a&b", "x/y", "", "ok"]), "/volumes?usage=ok");
        let many: Vec<String> = (0..100).map(|i| format!("v{i}")).collect();
        let target = usage_target(many.iter().map(String::as_str));
        assert_eq!(target.matches(',').count(), MAX_USAGE_IDS - 1);
    }
}
