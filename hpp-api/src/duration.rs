//! Durations in settings: `72h`, `1h30m`, `5m`, `10s`, `1d` (humantime's syntax, which covers
//! Go's `time.ParseDuration` forms Kubernetes users write, plus days). One parser for the CR,
//! StorageClass parameters, the driver's `--datadir` and the legacy provisioner's flags, so a
//! value accepted in one place is accepted everywhere with the same meaning.

use std::time::Duration;

/// The longest duration accepted: ten years. Longer values are almost certainly a unit typo,
/// and keeping them bounded keeps every `now + duration` in range.
pub const MAX: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

/// Why a duration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not a duration at all.
    #[error("{value:?} is not a duration ({reason}); write a number with a unit, e.g. 30s, 5m, 72h, 1h30m, 7d")]
    Malformed {
        /// The value given.
        value: String,
        /// The parser's reason.
        reason: String,
    },
    /// Longer than [`MAX`].
    #[error("{0:?} is longer than the maximum of 10 years")]
    TooLong(String),
}

/// Parses a duration such as `72h` or `1h30m`; `0` (with or without a unit) is zero.
pub fn parse(value: &str) -> Result<Duration, DurationError> {
    let trimmed = value.trim();
    let d = humantime::parse_duration(trimmed).map_err(|e| DurationError::Malformed {
        value: value.to_owned(),
        reason: e.to_string(),
    })?;
    if d > MAX {
        return Err(DurationError::TooLong(value.to_owned()));
    }
    Ok(d)
}

/// Formats a duration the way [`parse`] reads it back (`1h 30m`), for logs and listings.
pub fn format(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_the_forms_admins_write() {
        for (text, secs) in [
            ("72h", 72 * 3600),
            ("1h30m", 5400),
            ("1h 30m", 5400),
            ("5m", 300),
            ("10s", 10),
            ("7d", 7 * 86400),
            ("0", 0),
            ("0s", 0),
            (" 5s ", 5),
        ] {
            assert_eq!(parse(text).unwrap(), Duration::from_secs(secs), "{text}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_bounded_duration() {
        for bad in ["", "10", "-5m", "5 minutes please", "abc", "5x"] {
            let err = parse(bad).unwrap_err();
            assert!(matches!(err, DurationError::Malformed { .. }), "{bad}: {err}");
            assert!(err.to_string().contains("e.g. 30s"), "{err}");
        }
        assert!(matches!(parse("100000h"), Err(DurationError::TooLong(_))));
        assert!(parse("3650d").is_ok());
    }

    #[test]
    fn formatting_reads_back() {
        let d = Duration::from_secs(5400);
        assert_eq!(parse(&format(d)).unwrap(), d);
    }
}
