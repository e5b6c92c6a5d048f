//! Mutable per-volume settings (Kubernetes VolumeAttributesClass `parameters`, sent as CSI
//! `mutable_parameters`), parsed once here so every component reads them the same way. Which
//! keys a pool accepts depends on its backend ([`super::QuotaBackend::parameters`]).

use std::collections::HashMap;

/// Hard inode limit of the volume (a whole number, 0 = none): project-quota backends.
pub const INODE_LIMIT_KEY: &str = "inodeLimit";
/// Transparent compression of new writes (`none`, `zlib`, `lzo`, `zstd`): btrfs.
pub const COMPRESSION_KEY: &str = "compression";
/// Every key hpp knows, whatever the backend.
pub const KNOWN_KEYS: &[&str] = &[INODE_LIMIT_KEY, COMPRESSION_KEY];

/// Compression algorithms btrfs offers per file or directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// No compression.
    None,
    /// zlib.
    Zlib,
    /// LZO.
    Lzo,
    /// Zstandard.
    Zstd,
}

impl Compression {
    /// The name as written in a parameter (and in btrfs's `btrfs.compression` property).
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Zlib => "zlib",
            Compression::Lzo => "lzo",
            Compression::Zstd => "zstd",
        }
    }
}

/// Settings to apply to one volume; `None` = leave as is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tuning {
    /// [`INODE_LIMIT_KEY`].
    pub inode_limit: Option<u64>,
    /// [`COMPRESSION_KEY`].
    pub compression: Option<Compression>,
}

/// Why mutable parameters were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TuningError {
    /// A key hpp does not know.
    #[error("unknown mutable parameter {key:?} (known: {known})", known = KNOWN_KEYS.join(", "))]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// A known key with a value it cannot take.
    #[error("mutable parameter {key}={value:?}: {reason}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// The value given.
        value: String,
        /// What is expected.
        reason: &'static str,
    },
}

impl Tuning {
    /// Parses `params`. Every key must be known and every value valid; whether the pool's
    /// backend supports a key is checked separately.
    pub fn parse(params: &HashMap<String, String>) -> Result<Tuning, TuningError> {
        let mut t = Tuning::default();
        for (key, value) in params {
            match key.as_str() {
                INODE_LIMIT_KEY => {
                    t.inode_limit = Some(value.parse().map_err(|_| TuningError::BadValue {
                        key: INODE_LIMIT_KEY,
                        value: value.clone(),
                        reason: "a whole number of inodes (0 = no limit)",
                    })?);
                }
                COMPRESSION_KEY => {
                    t.compression = Some(match value.as_str() {
                        "none" => Compression::None,
                        "zlib" => Compression::Zlib,
                        "lzo" => Compression::Lzo,
                        "zstd" => Compression::Zstd,
                        _ => {
                            return Err(TuningError::BadValue {
                                key: COMPRESSION_KEY,
                                value: value.clone(),
                                reason: "one of none, zlib, lzo, zstd",
                            });
                        }
                    });
                }
                _ => return Err(TuningError::UnknownKey { key: key.clone() }),
            }
        }
        Ok(t)
    }

    /// The keys this tuning sets, in [`KNOWN_KEYS`] order.
    pub fn keys(&self) -> Vec<&'static str> {
        let mut keys = Vec::new();
        if self.inode_limit.is_some() {
            keys.push(INODE_LIMIT_KEY);
        }
        if self.compression.is_some() {
            keys.push(COMPRESSION_KEY);
        }
        keys
    }

    /// Each key to change with its value as written in a parameter, in [`Self::keys`] order
    /// (what [`super::QuotaBackend::set_parameter`] takes).
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(n) = self.inode_limit {
            out.push((INODE_LIMIT_KEY, n.to_string()));
        }
        if let Some(c) = self.compression {
            out.push((COMPRESSION_KEY, c.as_str().to_owned()));
        }
        out
    }

    /// Whether nothing is to be changed.
    pub fn is_empty(&self) -> bool {
        self.keys().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn known_keys_parse_and_unknown_ones_are_refused() {
        let t = Tuning::parse(&params(&[("inodeLimit", "1000"), ("compression", "zstd")]));
        assert_eq!(
            t,
            Ok(Tuning {
                inode_limit: Some(1000),
                compression: Some(Compression::Zstd),
            })
        );
        assert_eq!(t.map(|t| t.keys()), Ok(vec![INODE_LIMIT_KEY, COMPRESSION_KEY]));
        assert!(Tuning::parse(&params(&[])).is_ok_and(|t| t.is_empty()));
        let unknown = Tuning::parse(&params(&[("iops", "5")]));
        assert!(matches!(&unknown, Err(TuningError::UnknownKey { key }) if key == "iops"));
        assert!(unknown.is_err_and(|e| e.to_string().contains("inodeLimit")));
        assert!(matches!(
            Tuning::parse(&params(&[("inodeLimit", "-1")])),
            Err(TuningError::BadValue { .. })
        ));
        assert!(matches!(
            Tuning::parse(&params(&[("compression", "brotli")])),
            Err(TuningError::BadValue { .. })
        ));
    }
}
