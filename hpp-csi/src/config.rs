//! Pool configuration: the `--datadir` JSON list, compatible with the KubeVirt driver, plus the
//! hpp-only keys (`requireMountPoint`, quota, ephemeral limits, trash).

use std::path::PathBuf;
use std::time::Duration;

use hpp_api::quota::{DEFAULT_OVERCOMMIT_PERCENT, QuotaMode};
use hpp_api::rules;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One storage pool as written in the `--datadir` JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolConfig {
    /// Pool name, matched against the `storagePool` StorageClass parameter.
    pub name: String,
    /// Directory that holds the pool's volumes (one subdirectory per volume).
    pub path: PathBuf,
    /// Directory that holds snapshots; snapshots are disabled when absent.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "empty_as_none")]
    pub snapshot_path: Option<PathBuf>,
    /// Snapshot provider: `reflink` or `btrfs` (the pool's quota backend decides how a snapshot
    /// is taken; both values behave the same).
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

/// Keys of a `--datadir` entry: KubeVirt's (`name` to `shared`), then hpp's.
pub const KNOWN_KEYS: [&str; 12] = [
    "name",
    "path",
    "snapshotPath",
    "snapshotProvider",
    "shared",
    "requireMountPoint",
    "ephemeral",
    "ephemeralMaxBytes",
    "quota",
    "overcommitPercent",
    "trashRetention",
    "trashMinFreePercent",
];

/// Why a pool configuration was rejected at start-up.
///
/// Each message states its cause once: a variant that shows an underlying error in its text
/// does not also return it as [`std::error::Error::source`], so a printer that walks the chain
/// (`{:#}` of anyhow) does not repeat it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The JSON did not parse (KubeVirt's wording, kept for operators grepping logs).
    #[error("unable to parse storage pool info: {0}")]
    Parse(String),
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
    /// A key the driver does not know: a typo must not silently turn a setting (a quota, the
    /// mount guard) off.
    #[error(
        "storage pool {pool}: unknown key {key:?} (known: {known}; keys are case-sensitive)",
        known = KNOWN_KEYS.join(", ")
    )]
    UnknownKey {
        /// The pool as messages name it: its name quoted, or its position in the list.
        pool: String,
        /// The key given.
        key: String,
    },
    /// A setting with a wrong type or value; the reason is the CR validation's for the same
    /// field.
    #[error("storage pool {pool}: {key}: {reason}")]
    Field {
        /// The pool as messages name it: its name quoted, or its position in the list.
        pool: String,
        /// The key (`overcommitPercent`).
        key: &'static str,
        /// What is wrong and what is allowed.
        reason: String,
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
    /// A quota mode this build cannot enforce.
    #[error("storage pool {pool:?}: quota mode {mode} is not available in this build")]
    UnsupportedQuota {
        /// The pool.
        pool: String,
        /// The mode asked for.
        mode: QuotaMode,
    },
    /// The pool's quota backend cannot work on its filesystem. The mode is named once: the
    /// backend's own messages often name it already.
    #[error("storage pool {pool:?}: {}", quota_cause(*mode, cause))]
    Quota {
        /// The pool.
        pool: String,
        /// The mode asked for.
        mode: QuotaMode,
        /// Why (shown in the message, so not also a `source`).
        cause: hpp_fs::quota::QuotaError,
    },
    /// A backend was supplied for a pool that is not configured.
    #[error("a quota backend was supplied for storage pool {0:?}, which is not configured")]
    UnknownPool(String),
    /// A required setting is missing.
    #[error("{0} is required")]
    Missing(&'static str),
    /// The pool directory does not exist and is not made: its parent is missing too, so the
    /// path is probably a typo or a disk that is not mounted, and creating it would put the
    /// pool on whatever filesystem holds the nearest existing parent (often the root disk).
    #[error(
        "storage pool {pool:?}: path {} does not exist, nor does its parent {}; create it on the disk meant for the pool, fix the path, or let the driver create it with its parents (--create-pool-parents)",
        path.display(),
        parent.display()
    )]
    PathMissing {
        /// The pool.
        pool: String,
        /// Its path.
        path: PathBuf,
        /// The missing parent.
        parent: PathBuf,
    },
    /// The pool path exists but is not a directory.
    #[error("storage pool {pool:?}: path {} is not a directory", path.display())]
    NotADirectory {
        /// The pool.
        pool: String,
        /// Its path.
        path: PathBuf,
    },
    /// Preparing a pool directory failed.
    #[error("storage pool {pool:?} at {}: {cause}", path.display())]
    Io {
        /// The pool.
        pool: String,
        /// The path.
        path: PathBuf,
        /// The error (shown in the message, so not also a `source`).
        cause: std::io::Error,
    },
}

/// What a quota backend's error says, with the mode named once: the backends' messages often
/// start with it (`quota mode btrfs needs …`).
fn quota_cause(mode: QuotaMode, cause: &hpp_fs::quota::QuotaError) -> String {
    let text = cause.to_string();
    if text.contains(&format!("quota mode {mode}")) {
        text
    } else {
        format!("quota mode {mode}: {text}")
    }
}

impl ConfigError {
    fn field(pool: &str, key: &'static str, reason: impl Into<String>) -> Self {
        ConfigError::Field {
            pool: pool.to_owned(),
            key,
            reason: reason.into(),
        }
    }
}

/// Parses and checks the `--datadir` JSON: a list of objects with the [`KNOWN_KEYS`]. An
/// unknown key, a wrong type or a value the CR would refuse is an error naming the pool and
/// the key; an empty `snapshotPath` or `snapshotProvider` and a `null` count as absent, as in
/// KubeVirt.
pub fn parse_pools(json: &str) -> Result<Vec<PoolConfig>, ConfigError> {
    let entries: Vec<Value> = serde_json::from_str(json).map_err(|e| ConfigError::Parse(e.to_string()))?;
    let pools = entries
        .iter()
        .enumerate()
        .map(|(i, entry)| pool_from_json(i, entry))
        .collect::<Result<Vec<_>, _>>()?;
    check_pools(&pools)?;
    Ok(pools)
}

/// How messages name a pool: its name quoted, or its position when it has no usable name.
fn pool_label(index: usize, entry: &Value) -> String {
    match entry.get("name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => format!("{name:?}"),
        _ => format!("#{} of --datadir", index + 1),
    }
}

/// One `--datadir` entry, its keys and types checked (values are checked by [`check_pools`]).
fn pool_from_json(index: usize, entry: &Value) -> Result<PoolConfig, ConfigError> {
    let label = pool_label(index, entry);
    let Some(map) = entry.as_object() else {
        return Err(ConfigError::Parse(format!(
            "entry #{} is not an object with the keys {}",
            index + 1,
            KNOWN_KEYS.join(", ")
        )));
    };
    if let Some(key) = map.keys().find(|k| !KNOWN_KEYS.contains(&k.as_str())) {
        return Err(ConfigError::UnknownKey {
            pool: label,
            key: key.clone(),
        });
    }
    // `null` is absent, as Go's encoding/json reads it into KubeVirt's struct.
    let get = |key: &'static str| map.get(key).filter(|v| !v.is_null());
    fn typed<T: DeserializeOwned>(label: &str, key: &'static str, v: &Value) -> Result<T, ConfigError> {
        T::deserialize(v).map_err(|e| ConfigError::field(label, key, e.to_string()))
    }
    let text = |key: &'static str| -> Result<Option<String>, ConfigError> {
        get(key).map(|v| typed::<String>(&label, key, v)).transpose()
    };
    let flag = |key: &'static str| -> Result<Option<bool>, ConfigError> {
        get(key).map(|v| typed::<bool>(&label, key, v)).transpose()
    };
    let name = text("name")?.ok_or_else(|| ConfigError::field(&label, "name", "is required"))?;
    let path = text("path")?.filter(|p| !p.is_empty()).ok_or_else(|| {
        ConfigError::field(
            &label,
            "path",
            "is required: the directory that holds the pool's volumes",
        )
    })?;
    let mut pool = PoolConfig::new(name, path);
    pool.snapshot_path = text("snapshotPath")?.filter(|p| !p.is_empty()).map(PathBuf::from);
    pool.snapshot_provider = text("snapshotProvider")?.filter(|p| !p.is_empty());
    pool.shared = flag("shared")?.unwrap_or(false);
    pool.require_mount_point = flag("requireMountPoint")?.unwrap_or(false);
    pool.ephemeral = flag("ephemeral")?.unwrap_or(true);
    pool.ephemeral_max_bytes = get("ephemeralMaxBytes")
        .map(|v| typed::<u64>(&label, "ephemeralMaxBytes", v))
        .transpose()?;
    if let Some(mode) = text("quota")? {
        pool.quota = mode
            .parse()
            .map_err(|e: hpp_api::quota::UnknownQuotaMode| ConfigError::field(&label, "quota", e.to_string()))?;
    }
    if let Some(v) = get("overcommitPercent") {
        pool.overcommit_percent = typed(&label, "overcommitPercent", v)?;
    }
    if let Some(retention) = text("trashRetention")? {
        let d =
            rules::check_trash_retention(&retention).map_err(|e| ConfigError::field(&label, "trashRetention", e))?;
        pool.trash_retention = (!d.is_zero()).then_some(d);
    }
    pool.trash_min_free_percent = get("trashMinFreePercent")
        .map(|v| typed::<u32>(&label, "trashMinFreePercent", v))
        .transpose()?;
    Ok(pool)
}

/// Checks a pool list: non-empty, unique valid names, and every setting by the rules the CR's
/// validation applies to the same field (shared through [`hpp_api::rules`]).
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
        check_settings(p)?;
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

/// The per-field rules of one pool, with the CR's messages.
fn check_settings(p: &PoolConfig) -> Result<(), ConfigError> {
    let label = format!("{:?}", p.name);
    let field = |key, r: Result<(), String>| r.map_err(|reason| ConfigError::field(&label, key, reason));
    if p.path.as_os_str().is_empty() {
        return Err(ConfigError::field(
            &label,
            "path",
            "is required: the directory that holds the pool's volumes",
        ));
    }
    if let Some(provider) = &p.snapshot_provider {
        field("snapshotProvider", rules::check_snapshot_provider(provider))?;
    }
    if let Some(bytes) = p.ephemeral_max_bytes {
        field("ephemeralMaxBytes", rules::check_max_bytes(bytes))?;
    }
    field(
        "overcommitPercent",
        rules::check_overcommit_percent(p.overcommit_percent),
    )?;
    if let Some(retention) = p.trash_retention
        && retention > hpp_api::duration::MAX
    {
        let shown = hpp_api::duration::format(retention);
        field(
            "trashRetention",
            Err(hpp_api::duration::DurationError::TooLong(shown).to_string()),
        )?;
    }
    if let Some(floor) = p.trash_min_free_percent {
        field("trashMinFreePercent", rules::check_trash_min_free_percent(floor))?;
        if p.trash_retention.is_none() {
            tracing::warn!(pool = %p.name, "trashMinFreePercent has no effect without a trashRetention");
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
        assert!(
            matches!(
                err,
                ConfigError::Field {
                    key: "trashMinFreePercent",
                    ..
                }
            ),
            "{err}"
        );
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
            Err(ConfigError::Field {
                key: "snapshotProvider",
                ..
            })
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
    #[test]
    fn an_unknown_key_names_the_key_the_pool_and_the_known_keys() {
        let err = parse_pools(r#"[{"name":"a","path":"/a","Quota":"image"}]"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            "storage pool \"a\": unknown key \"Quota\" (known: name, path, snapshotPath, snapshotProvider, \
             shared, requireMountPoint, ephemeral, ephemeralMaxBytes, quota, overcommitPercent, \
             trashRetention, trashMinFreePercent; keys are case-sensitive)"
        );
        // A pool without a usable name is named by its position.
        let err = parse_pools(r#"[{"name":"a","path":"/a"},{"path":"/b","requireMountpoint":true}]"#).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("storage pool #2 of --datadir: unknown key \"requireMountpoint\""),
            "{err}"
        );
    }

    #[test]
    fn kubevirt_keys_and_spellings_still_parse() {
        // KubeVirt's default, its operator's render, empty strings and nulls as absent.
        for json in [
            r#"[{"name":"legacy","path":"/csi-data-dir","snapshotPath":"/snap-dir","snapshotProvider":"reflink"}]"#,
            r#"[{"name":"local","path":"local-data-dir/csi","shared":false}]"#,
            r#"[{"name":"local","path":"/x","snapshotPath":"","snapshotProvider":"","shared":null}]"#,
        ] {
            let pools = parse_pools(json).unwrap();
            assert_eq!(pools.len(), 1, "{json}");
        }
    }

    #[test]
    fn each_field_is_checked_with_the_crs_rule_and_message() {
        use hpp_api::rules;
        let cases: [(&str, &str, String); 6] = [
            (
                r#""overcommitPercent":0"#,
                "overcommitPercent",
                rules::check_overcommit_percent(0).unwrap_err(),
            ),
            (
                r#""overcommitPercent":1001"#,
                "overcommitPercent",
                rules::check_overcommit_percent(1001).unwrap_err(),
            ),
            (
                r#""ephemeralMaxBytes":0"#,
                "ephemeralMaxBytes",
                rules::check_max_bytes(0).unwrap_err(),
            ),
            (
                r#""snapshotPath":"/s","snapshotProvider":"zfs""#,
                "snapshotProvider",
                rules::check_snapshot_provider("zfs").unwrap_err(),
            ),
            (
                r#""trashRetention":"forever""#,
                "trashRetention",
                rules::check_trash_retention("forever").unwrap_err(),
            ),
            (
                r#""trashRetention":"1h","trashMinFreePercent":100"#,
                "trashMinFreePercent",
                rules::check_trash_min_free_percent(100).unwrap_err(),
            ),
        ];
        for (extra, key, reason) in cases {
            let err = parse_pools(&format!(r#"[{{"name":"a","path":"/a",{extra}}}]"#)).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("storage pool \"a\": {key}: {reason}"),
                "{extra}"
            );
        }
        // The same rules for pools an embedder builds.
        let err = check_pools(&[PoolConfig::new("a", "/a").quota(QuotaMode::Btrfs, 0)]).unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::Field {
                    key: "overcommitPercent",
                    ..
                }
            ),
            "{err}"
        );
        // Types and quota modes name the key too.
        let err = parse_pools(r#"[{"name":"a","path":"/a","quota":"Image"}]"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            "storage pool \"a\": quota: unknown quota mode \"Image\"; allowed: none, btrfs, xfs-project, ext4-project, image, auto"
        );
        let err = parse_pools(r#"[{"name":"a","path":"/a","shared":"yes"}]"#).unwrap_err();
        assert!(
            err.to_string().starts_with("storage pool \"a\": shared: invalid type"),
            "{err}"
        );
        let err = parse_pools(r#"[{"name":"a"}]"#).unwrap_err();
        assert!(
            err.to_string().starts_with("storage pool \"a\": path: is required"),
            "{err}"
        );
        assert!(matches!(parse_pools(r#"[5]"#), Err(ConfigError::Parse(_))));
    }

    #[test]
    fn a_quota_error_names_the_mode_once() {
        let err = ConfigError::Quota {
            pool: "b".into(),
            mode: QuotaMode::Btrfs,
            cause: hpp_fs::quota::QuotaError::Unsupported(
                "quota mode btrfs needs the pool directory on a btrfs filesystem".into(),
            ),
        };
        assert_eq!(
            err.to_string(),
            "storage pool \"b\": quota mode btrfs needs the pool directory on a btrfs filesystem"
        );
        assert!(
            std::error::Error::source(&err).is_none(),
            "stated in the message, not again as a source"
        );
        let err = ConfigError::Quota {
            pool: "b".into(),
            mode: QuotaMode::XfsProject,
            cause: hpp_fs::quota::QuotaError::Unsupported("project quota is not enforced".into()),
        };
        assert_eq!(
            err.to_string(),
            "storage pool \"b\": quota mode xfs-project: project quota is not enforced"
        );
    }

    #[test]
    fn a_parse_error_is_stated_once() {
        let err = parse_pools("[{").unwrap_err();
        assert!(
            err.to_string().starts_with("unable to parse storage pool info: "),
            "{err}"
        );
        assert!(std::error::Error::source(&err).is_none());
    }
}
