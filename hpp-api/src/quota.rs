//! Per-pool size enforcement: which quota backend a storage pool uses. Shared by the CR
//! (`storagePools[].quota`) and the driver's `--datadir` JSON (`"quota"`), so the two spell
//! every value the same way.

use serde::{Deserialize, Serialize};

/// How a pool enforces the size of its volumes. Absent means `none`: KubeVirt's behaviour, a
/// size is recorded but not enforced.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "crd", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum QuotaMode {
    /// No enforcement (default, KubeVirt-compatible).
    #[default]
    None,
    /// Each volume is a btrfs subvolume with a qgroup limit.
    Btrfs,
    /// XFS project quota: one project id per volume with a hard block limit.
    XfsProject,
    /// ext4 project quota: one project id per volume with a hard block limit.
    Ext4Project,
    /// A sparse image file per volume, formatted and loop-mounted at publish.
    Image,
    /// btrfs on btrfs, project quota where the pool is mounted with prjquota, else none.
    Auto,
}

impl QuotaMode {
    /// Every mode, in the order the docs list them.
    pub const ALL: [QuotaMode; 6] = [
        QuotaMode::None,
        QuotaMode::Btrfs,
        QuotaMode::XfsProject,
        QuotaMode::Ext4Project,
        QuotaMode::Image,
        QuotaMode::Auto,
    ];

    /// The spelling used in the CR and `--datadir`.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaMode::None => "none",
            QuotaMode::Btrfs => "btrfs",
            QuotaMode::XfsProject => "xfs-project",
            QuotaMode::Ext4Project => "ext4-project",
            QuotaMode::Image => "image",
            QuotaMode::Auto => "auto",
        }
    }

    /// Whether this is the default (so it is left out when serialising).
    pub fn is_none(&self) -> bool {
        *self == QuotaMode::None
    }
}

/// A quota mode that is not one of [`QuotaMode::ALL`]; the message lists the allowed ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown quota mode {0:?}; allowed: {modes}", modes = allowed_modes())]
pub struct UnknownQuotaMode(pub String);

fn allowed_modes() -> String {
    QuotaMode::ALL.map(QuotaMode::as_str).join(", ")
}

impl std::str::FromStr for QuotaMode {
    type Err = UnknownQuotaMode;

    /// Reads the spelling of the CR and `--datadir` (case-sensitive, as the CRD's enum is).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        QuotaMode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| UnknownQuotaMode(s.to_owned()))
    }
}

impl std::fmt::Display for QuotaMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Default overcommit of a quota pool, in percent of the filesystem size: the sum of the
/// limits handed out never exceeds the filesystem.
pub const DEFAULT_OVERCOMMIT_PERCENT: u32 = 100;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_mode_round_trips_with_its_documented_spelling() {
        for mode in QuotaMode::ALL {
            let json = serde_json::to_string(&mode).unwrap();
            assert_eq!(json, format!("\"{}\"", mode.as_str()));
            assert_eq!(serde_json::from_str::<QuotaMode>(&json).unwrap(), mode);
        }
        assert!(serde_json::from_str::<QuotaMode>("\"zfs\"").is_err());
    }

    #[test]
    fn parsing_takes_exactly_the_documented_spellings() {
        for mode in QuotaMode::ALL {
            assert_eq!(mode.as_str().parse::<QuotaMode>(), Ok(mode));
        }
        let err = "Image".parse::<QuotaMode>().unwrap_err().to_string();
        assert_eq!(
            err,
            "unknown quota mode \"Image\"; allowed: none, btrfs, xfs-project, ext4-project, image, auto"
        );
    }
}
