//! What size a volume gets from a CSI `capacity_range`, for pools whose backend enforces sizes.
//! Pure arithmetic, so every edge (rounding past `limit_bytes`, an empty range, overflow) is
//! tested without a filesystem. Pools without enforcement keep KubeVirt-compatible answers and
//! never come through here.

use hpp_fs::quota::round_up;

use crate::csi;
use crate::error::{Error, Result};

/// Size an enforcing pool gives a volume requested with neither `required_bytes` nor
/// `limit_bytes` (rounded up to the backend's granularity): 1 GiB. Small enough to fit any
/// realistic pool, big enough to be useful; a CO always sends a size for a PVC anyway.
pub const DEFAULT_ENFORCED_BYTES: u64 = 1 << 30;

/// A validated capacity range in bytes (0 = not set).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Range {
    /// `required_bytes`.
    pub required: u64,
    /// `limit_bytes`.
    pub limit: u64,
}

impl Range {
    /// Validates a request's range: no negative numbers, and a limit, when set, not below the
    /// requirement. `None` is the empty range.
    pub fn parse(range: Option<&csi::CapacityRange>) -> Result<Range> {
        let Some(r) = range else {
            return Ok(Range::default());
        };
        let (required, limit) = (r.required_bytes, r.limit_bytes);
        match (u64::try_from(required), u64::try_from(limit)) {
            (Ok(required), Ok(limit)) if limit == 0 || limit >= required => Ok(Range { required, limit }),
            _ => Err(Error::InvalidArgument(format!(
                "invalid capacity range: required {required}, limit {limit}"
            ))),
        }
    }
}

/// The size a new volume gets in a pool that enforces limits in multiples of `granularity`:
/// `required_bytes` rounded up (or [`DEFAULT_ENFORCED_BYTES`] when nothing is required, capped
/// by `limit_bytes`). OutOfRange when rounding pushes it past `limit_bytes` and no multiple of
/// the granularity fits the range.
pub fn create_size(range: Range, granularity: u64) -> Result<u64> {
    let want = match (range.required, range.limit) {
        (0, 0) => DEFAULT_ENFORCED_BYTES,
        (0, limit) => DEFAULT_ENFORCED_BYTES.min(limit),
        (required, _) => required,
    };
    fit(range, round_up(want, granularity), granularity)
}

/// The size a volume made from a source (a clone, a restore) of `source_bytes` gets in a pool
/// that enforces limits: the requested size when it holds the source, the source's own size
/// when nothing was asked. A range that cannot hold the source is OutOfRange (the CSI spec: a
/// volume cannot be smaller than its content source). A source of unknown size (0) sizes like
/// a new volume.
pub fn copy_size(range: Range, source_bytes: u64, granularity: u64) -> Result<u64> {
    if source_bytes == 0 {
        return create_size(range, granularity);
    }
    let too_small = |what: &str, bytes: u64| {
        Error::OutOfRange(format!(
            "capacity_range.{what} is {bytes} bytes, smaller than the {source_bytes} bytes of the volume content source"
        ))
    };
    if range.limit != 0 && range.limit < source_bytes {
        return Err(too_small("limit_bytes", range.limit));
    }
    if range.required != 0 && range.required < source_bytes {
        return Err(too_small("required_bytes", range.required));
    }
    let want = if range.required == 0 {
        source_bytes
    } else {
        range.required
    };
    fit(range, round_up(want, granularity), granularity)
}

/// The size an expansion asks for: `required_bytes` rounded up to the granularity, never
/// above `limit_bytes` (OutOfRange). An expansion must say how big (InvalidArgument
/// otherwise).
pub fn expand_size(range: Range, granularity: u64) -> Result<u64> {
    if range.required == 0 && range.limit == 0 {
        return Err(Error::InvalidArgument(
            "capacity_range must set required_bytes or limit_bytes".into(),
        ));
    }
    let want = if range.required == 0 {
        range.limit
    } else {
        range.required
    };
    fit(range, round_up(want, granularity), granularity)
}

/// `rounded` when it fits the range; else the largest multiple of `granularity` that still
/// does, or OutOfRange.
fn fit(range: Range, rounded: u64, granularity: u64) -> Result<u64> {
    if range.limit == 0 || rounded <= range.limit {
        return Ok(rounded);
    }
    let floor = range.limit - range.limit % granularity.max(1);
    if floor > 0 && floor >= range.required {
        return Ok(floor);
    }
    Err(Error::OutOfRange(format!(
        "no size in the requested range (required {}, limit {}) is a multiple of the pool's \
         {granularity}-byte granularity",
        range.required, range.limit
    )))
}

/// `bytes` rounded down to a multiple of `granularity`.
pub fn round_down(bytes: u64, granularity: u64) -> u64 {
    bytes - bytes % granularity.max(1)
}

#[cfg(test)]
mod copy_tests {
    use super::*;

    fn range(required: u64, limit: u64) -> Range {
        Range { required, limit }
    }

    #[test]
    fn a_copy_is_never_smaller_than_its_source() {
        const G: u64 = 4096;
        // Nothing asked: the source's size.
        assert_eq!(copy_size(range(0, 0), 64 << 20, G).unwrap(), 64 << 20);
        // The same size, or bigger: as asked (rounded).
        assert_eq!(copy_size(range(64 << 20, 0), 64 << 20, G).unwrap(), 64 << 20);
        assert_eq!(
            copy_size(range((100 << 20) + 1, 0), 64 << 20, G).unwrap(),
            (100 << 20) + G
        );
        // Smaller, by required or limit: OutOfRange, naming both sizes.
        for r in [range(16 << 20, 0), range(0, 16 << 20), range(16 << 20, 32 << 20)] {
            let err = copy_size(r, 64 << 20, G).unwrap_err();
            assert!(matches!(&err, Error::OutOfRange(m) if m.contains("67108864")), "{err}");
        }
        // A source of unknown size: like a new volume.
        assert_eq!(
            copy_size(range(0, 0), 0, G).unwrap(),
            create_size(range(0, 0), G).unwrap()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(required: u64, limit: u64) -> Range {
        Range { required, limit }
    }

    #[test]
    fn ranges_are_validated() {
        assert_eq!(Range::parse(None).ok(), Some(Range::default()));
        let bad = csi::CapacityRange {
            required_bytes: 10,
            limit_bytes: 5,
        };
        assert!(matches!(Range::parse(Some(&bad)), Err(Error::InvalidArgument(_))));
        let negative = csi::CapacityRange {
            required_bytes: -1,
            limit_bytes: 0,
        };
        assert!(matches!(Range::parse(Some(&negative)), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn creation_rounds_up_and_respects_the_limit() {
        assert_eq!(create_size(r(1, 0), 4096).ok(), Some(4096));
        assert_eq!(create_size(r(4096, 4096), 4096).ok(), Some(4096));
        assert_eq!(create_size(r(0, 0), 4096).ok(), Some(DEFAULT_ENFORCED_BYTES));
        assert_eq!(create_size(r(0, 10_000), 4096).ok(), Some(8192));
        // Rounding up passes the limit, but a smaller multiple still covers the requirement.
        assert_eq!(create_size(r(5000, 10_000), 4096).ok(), Some(8192));
        assert!(matches!(create_size(r(5000, 6000), 4096), Err(Error::OutOfRange(_))));
        assert!(matches!(create_size(r(0, 100), 4096), Err(Error::OutOfRange(_))));
        assert_eq!(create_size(r(u64::MAX, 0), 4096).ok().map(|b| b % 4096), Some(0));
    }

    #[test]
    fn expansion_needs_a_size() {
        assert!(matches!(expand_size(r(0, 0), 1), Err(Error::InvalidArgument(_))));
        assert_eq!(expand_size(r(0, 8192), 4096).ok(), Some(8192));
        assert_eq!(expand_size(r(5000, 0), 4096).ok(), Some(8192));
        assert!(matches!(expand_size(r(5000, 6000), 4096), Err(Error::OutOfRange(_))));
        assert_eq!(round_down(8191, 4096), 4096);
    }
}
