//! Pool configuration: the `--datadir` JSON list, compatible with the KubeVirt driver, plus the
//! hpp-only keys (`requireMountPoint`, quota, ephemeral limits, trash).

use std::path::PathBuf;
use std::time::Duration;

use hpp_api::constants::KNOWN_SNAPSHOT_PROVIDERS;
use hpp_api::quota::{DEFAULT_OVERCOMMIT_PERCENT, QuotaMode};
use serde::{Deserialize, Serialize};

/// One storage pool as written in the `--datadir` JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolConfig {
    /// Pool name, matched against the `storagePool` StorageClass parameter.
    pub name: String,
    /// Directory that holds the pool's volumes (one subdirectory per volume).
    pub path: PathBuf,
    /// Directory that holds snapshots; snapshots are disabled when absent.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "empty_as_none")]
    pub snapshot_path: Option<PathBuf>,
    /// Snapshot provider; only `reflink` exists.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "empty_as_none")]
    pub snapshot_provider: Option<String>,
    /// The pool is on shared storage reachable from every node: volumes carry no topology.
    #[serde(default)]
    pub shared: bool,
    /// Mount guard: the pool path must be a mount point. While it is not, the driver refuses to
    /// create volumes there and reports zero capacity, so data never lands on the root disk.
    #[serde(default)]
    pub require_mount_point: bool,
    /// Inline ephemeral volumes (`csi.storage.k8s.io/ephemeral`) may use this pool. On by
    /// default, as in KubeVirt; `"ephemeral": false` refuses them (any pod creator could
    /// otherwise fill the pool).
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub ephemeral: bool,
    /// Largest `size` (bytes) an inline ephemeral volume may ask for in its volume attributes;
    /// larger requests are refused with OutOfRange. Absent: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_max_bytes: Option<u64>,
    /// How volume sizes are enforced in this pool (`none` when absent: KubeVirt's behaviour).
    #[serde(default, skip_serializing_if = "QuotaMode::is_none")]
    pub quota: QuotaMode,
    /// How much of the filesystem may be promised to volumes, in percent (default 100). Only
    /// meaningful with a quota backend: the sum of volume limits never exceeds
    /// `filesystem size × overcommitPercent / 100`.
    #[serde(default = "default_overcommit", skip_serializing_if = "is_default_overcommit")]
    pub overcommit_percent: u32,
    /// How long a deleted volume is kept in the pool's trash before it is purged (`None`, or
    /// `"0"` in the JSON: no trash, DeleteVolume removes the directory as KubeVirt's does).
    /// Written as a duration: `"72h"`, `"7d"`, `"1h30m"`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "retention_from_text",
        serialize_with = "retention_to_text"
    )]
    pub trash_retention: Option<Duration>,
    /// Free space (percent of the filesystem) under which the trash is purged early, oldest
    /// first; [`DEFAULT_TRASH_MIN_FREE_PERCENT`] when absent. Only meaningful with a retention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trash_min_free_percent: Option<u32>,
}

/// Free-space floor of a pool's trash when none is configured: under 10 % free, the oldest
/// trashed volumes go first.
pub const DEFAULT_TRASH_MIN_FREE_PERCENT: u32 = 10;

fn retention_from_text<'de, D>(d: D) -> Result<Option<Duration>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let Some(text) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    let retention =
        hpp_api::duration::parse(&text).map_err(|e| serde::de::Error::custom(format!("trashRetention: {e}")))?;
    Ok((!retention.is_zero()).then_some(retention))
}

fn retention_to_text<S>(retention: &Option<Duration>, s: S) -> Result<S::Ok, S::Error>
where
    S: serde::Serializer,
{
    match retention {
        Some(d) => s.serialize_str(&hpp_api::duration::format(*d).replace(' ', "")),
        None => s.serialize_none(),
    }
}

fn default_overcommit() -> u32 {
    DEFAULT_OVERCOMMIT_PERCENT
}

fn is_default_overcommit(p: &u32) -> bool {
    *p == DEFAULT_OVERCOMMIT_PERCENT
}

fn default_true() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

fn empty_as_none<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: From<String>,
{
    let s: Option<String> = Option::deserialize(d)?;
    Ok(s.filter(|s| !s.is_empty()).map(T::from))
}

impl PoolConfig {
    /// A node-local pool with no snapshots and no mount guard.
    pub fn new(name: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        PoolConfig {
            name: name.into(),
            path: path.into(),
            snapshot_path: None,
            snapshot_provider: None,
            shared: false,
            require_mount_point: false,
            ephemeral: true,
            ephemeral_max_bytes: None,
            quota: QuotaMode::None,
            overcommit_percent: DEFAULT_OVERCOMMIT_PERCENT,
            trash_retention: None,
            trash_min_free_percent: None,
        }
    }

    /// Keeps deleted volumes in the pool's trash for `retention` (zero: no trash), purging
    /// early, oldest first, while free space is under `min_free_percent` (default 10).
    pub fn trash(mut self, retention: Duration, min_free_percent: Option<u32>) -> Self {
        self.trash_retention = (!retention.is_zero()).then_some(retention);
        self.trash_min_free_percent = min_free_percent;
        self
    }

    /// Enforces volume sizes with `mode`, promising at most `overcommit_percent` % of the
    /// filesystem.
    pub fn quota(mut self, mode: QuotaMode, overcommit_percent: u32) -> Self {
        self.quota = mode;
        self.overcommit_percent = overcommit_percent;
        self
    }

    /// Allows or refuses inline ephemeral volumes, with an optional size cap in bytes.
    pub fn ephemeral(mut self, allowed: bool, max_bytes: Option<u64>) -> Self {
        self.ephemeral = allowed;
        self.ephemeral_max_bytes = max_bytes;
        self
    }

    /// Enables reflink snapshots stored under `path`.
    pub fn with_snapshots(mut self, path: impl Into<PathBuf>) -> Self {
        self.snapshot_path = Some(path.into());
        self.snapshot_provider = Some(hpp_api::constants::SNAPSHOT_PROVIDER_REFLINK.to_owned());
        self
    }

    /// Marks the pool as shared storage (no topology on its volumes).
    pub fn shared(mut self, shared: bool) -> Self {
        self.shared = shared;
        self
    }

    /// Turns the mount guard on or off.
    pub fn require_mount_point(mut self, required: bool) -> Self {
        self.require_mount_point = required;
        self
    }
}

/// Why a pool configuration was rejected at start-up.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The JSON did not parse (KubeVirt's wording, kept for operators grepping logs).
    #[error("unable to parse storage pool info: {0}")]
    Parse(#[from] serde_json::Error),
    /// No pools at all.
    #[error("at least one storage pool is required")]
    NoPools,
    /// A live driver already answers on the socket. Checked before anything touches the pools:
    /// the start-up sweep would remove that driver's in-flight temporaries.
    #[error("another process is already serving on {0}; not touching its storage pools")]
    EndpointInUse(PathBuf),
    /// Two pools share a name.
    #[error("storage pool name {0:?} is used twice")]
    DuplicateName(String),
    /// A pool name is not usable as an identifier.
    #[error("storage pool name {name:?} is invalid: {reason}")]
    InvalidName {
        /// The name.
        name: String,
        /// Why.
        reason: String,
    },
    /// An unknown snapshot provider.
    #[error("storage pool {pool:?}: unknown snapshot provider {provider:?} (known: reflink)")]
    UnknownSnapshotProvider {
        /// The pool.
        pool: String,
        /// The provider given.
        provider: String,
    },
    /// A snapshot provider without a snapshot path, or the reverse.
    #[error("storage pool {0:?}: snapshotPath and snapshotProvider must be set together")]
    IncompleteSnapshots(String),
    /// A snapshot directory that is a pool's directory or holds one: every entry there would be
    /// taken for a snapshot, and deleting a snapshot could delete a volume or a pool.
    #[error(
        "storage pool {pool:?}: snapshotPath {snapshots} is or contains the directory of storage pool {other:?} ({other_path}); put snapshots in a directory of their own (inside a pool's directory is fine)"
    )]
    SnapshotsOverlapPool {
        /// The pool whose snapshot path is wrong.
        pool: String,
        /// Its snapshot path.
        snapshots: String,
        /// The pool it overlaps.
        other: String,
        /// That pool's path.
        other_path: String,
    },
    /// A trash setting out of range.
    #[error("storage pool {pool:?}: trashMinFreePercent is {value}; it must be between 0 and 99")]
    TrashFloor {
        /// The pool.
        pool: String,
        /// The value given.
        value: u32,
    },
    /// A quota mode this build cannot enforce.
    #[error("storage pool {pool:?}: quota mode {mode} is not available in this build")]
    UnsupportedQuota {
        /// The pool.
        pool: String,
        /// The mode asked for.
        mode: QuotaMode,
    },
    /// The pool's quota backend cannot work on its filesystem.
    #[error("storage pool {pool:?}: quota mode {mode}: {source}")]
    Quota {
        /// The pool.
        pool: String,
        /// The mode asked for.
        mode: QuotaMode,
        /// Why.
        #[source]
        source: hpp_fs::quota::QuotaError,
    },
    /// A backend was supplied for a pool that is not configured.
    #[error("a quota backend was supplied for storage pool {0:?}, which is not configured")]
    UnknownPool(String),
    /// A required setting is missing.
    #[error("{0} is required")]
    Missing(&'static str),
    /// Preparing a pool directory failed.
    #[error("storage pool {pool:?} at {path}: {source}")]
    Io {
        /// The pool.
        pool: String,
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Parses and checks the `--datadir` JSON.
pub fn parse_pools(json: &str) -> Result<Vec<PoolConfig>, ConfigError> {
    let pools: Vec<PoolConfig> = serde_json::from_str(json)?;
    check_pools(&pools)?;
    Ok(pools)
}

/// Checks a pool list: non-empty, unique valid names, known snapshot providers.
pub fn check_pools(pools: &[PoolConfig]) -> Result<(), ConfigError> {
    if pools.is_empty() {
        return Err(ConfigError::NoPools);
    }
    let mut seen = std::collections::HashSet::new();
    for p in pools {
        if let Err(e) = crate::pool::validate::check_pool_name(&p.name) {
            return Err(ConfigError::InvalidName {
                name: p.name.clone(),
                reason: e.to_string(),
            });
        }
        if !seen.insert(p.name.as_str()) {
            return Err(ConfigError::DuplicateName(p.name.clone()));
        }
        if let Some(provider) = &p.snapshot_provider
            && !KNOWN_SNAPSHOT_PROVIDERS.contains(&provider.as_str())
        {
            return Err(ConfigError::UnknownSnapshotProvider {
                pool: p.name.clone(),
                provider: provider.clone(),
            });
        }
        if let Some(value) = p.trash_min_free_percent
            && value > 99
        {
            return Err(ConfigError::TrashFloor {
                pool: p.name.clone(),
                value,
            });
        }
        if p.snapshot_path.is_some() != p.snapshot_provider.is_some() {
            return Err(ConfigError::IncompleteSnapshots(p.name.clone()));
        }
        if let Some(snapshots) = &p.snapshot_path
            && let Some(other) = pools.iter().find(|q| q.path.starts_with(snapshots))
        {
            return Err(ConfigError::SnapshotsOverlapPool {
                pool: p.name.clone(),
                snapshots: snapshots.display().to_string(),
                other: other.name.clone(),
                other_path: other.path.display().to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_snapshot_dir_may_sit_inside_a_pool_but_never_be_or_hold_one() {
        let pools = |snapshots: &str| {
            vec![
                PoolConfig::new("a", "/var/hpp/a").with_snapshots(snapshots),
                PoolConfig::new("b", "/var/hpp/b"),
            ]
        };
        // KubeVirt's layout: `<pool>/snapshots`.
        assert!(check_pools(&pools("/var/hpp/a/snapshots")).is_ok());
        assert!(check_pools(&pools("/var/snapshots")).is_ok());
        for wrong in ["/var/hpp/a", "/var/hpp/b", "/var/hpp", "/"] {
            let err = check_pools(&pools(wrong)).unwrap_err();
            assert!(
                matches!(err, ConfigError::SnapshotsOverlapPool { .. }),
                "{wrong}: {err}"
            );
        }
    }

    #[test]
    fn ephemeral_switch_and_cap_parse_and_default_to_kubevirt_behaviour() {
        let pools = parse_pools(
            r#"[{"name":"a","path":"/a"},{"name":"b","path":"/b","ephemeral":false},{"name":"c","path":"/c","ephemeralMaxBytes":1048576}]"#,
        )
        .unwrap();
        assert!(pools[0].ephemeral && pools[0].ephemeral_max_bytes.is_none());
        assert!(!pools[1].ephemeral);
        assert_eq!(pools[2].ephemeral_max_bytes, Some(1 << 20));
    }

    #[test]
    fn trash_settings_parse_with_zero_meaning_off() {
        let pools = parse_pools(
            r#"[{"name":"a","path":"/a"},{"name":"b","path":"/b","trashRetention":"72h"},
                {"name":"c","path":"/c","trashRetention":"0"},
                {"name":"d","path":"/d","trashRetention":"1h30m","trashMinFreePercent":25}]"#,
        )
        .unwrap();
        assert_eq!(pools[0].trash_retention, None);
        assert_eq!(pools[1].trash_retention, Some(Duration::from_secs(72 * 3600)));
        assert_eq!(pools[1].trash_min_free_percent, None);
        assert_eq!(pools[2].trash_retention, None);
        assert_eq!(pools[3].trash_retention, Some(Duration::from_secs(5400)));
        assert_eq!(pools[3].trash_min_free_percent, Some(25));
        // Written back as read.
        let json = serde_json::to_string(&pools[3]).unwrap();
        assert!(
            json.contains(r#""trashRetention":"1h30m","trashMinFreePercent":25"#),
            "{json}"
        );
        assert_eq!(parse_pools(&format!("[{json}]")).unwrap()[0], pools[3]);

        let err = parse_pools(r#"[{"name":"a","path":"/a","trashRetention":"3 weeks-ish"}]"#).unwrap_err();
        assert!(err.to_string().contains("trashRetention"), "{err}");
        let err =
            parse_pools(r#"[{"name":"a","path":"/a","trashRetention":"1h","trashMinFreePercent":100}]"#).unwrap_err();
        assert!(matches!(err, ConfigError::TrashFloor { value: 100, .. }), "{err}");
    }

    #[test]
    fn parses_the_operator_generated_json() {
        let json = r#"[{"name":"legacy","path":"/csi-data-dir/csi","snapshotPath":"/csi-data-dir/csi/snapshots","snapshotProvider":"reflink"},
                       {"name":"ceph","path":"/ceph-data-dir/csi","shared":true},
                       {"name":"guarded","path":"/mnt/disk/csi","snapshotPath":"","requireMountPoint":true}]"#;
        let pools = parse_pools(json).unwrap();
        assert_eq!(pools.len(), 3);
        assert_eq!(pools[0].snapshot_provider.as_deref(), Some("reflink"));
        assert!(pools[1].shared);
        assert!(pools[2].snapshot_path.is_none());
        assert!(pools[2].require_mount_point);
    }

    #[test]
    fn rejects_bad_configurations() {
        assert!(matches!(parse_pools("{"), Err(ConfigError::Parse(_))));
        assert!(matches!(parse_pools("[]"), Err(ConfigError::NoPools)));
        assert!(matches!(
            parse_pools(r#"[{"name":"a","path":"/a"},{"name":"a","path":"/b"}]"#),
            Err(ConfigError::DuplicateName(_))
        ));
        assert!(matches!(
            parse_pools(r#"[{"name":"a","path":"/a","snapshotPath":"/s","snapshotProvider":"zfs"}]"#),
            Err(ConfigError::UnknownSnapshotProvider { .. })
        ));
        assert!(matches!(
            parse_pools(r#"[{"name":"a/b","path":"/a"}]"#),
            Err(ConfigError::InvalidName { .. })
        ));
        assert!(matches!(
            parse_pools(r#"[{"name":"a","path":"/a","snapshotProvider":"reflink"}]"#),
            Err(ConfigError::IncompleteSnapshots(_))
        ));
        assert!(
            parse_pools("{")
                .unwrap_err()
                .to_string()
                .contains("unable to parse storage pool info")
        );
    }
}
