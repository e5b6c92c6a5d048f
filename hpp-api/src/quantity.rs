//! Byte counts from Kubernetes quantities (`10Gi`, `500M`, `1e9`), rounded up. Shared by the CR
//! validation, the operator (which renders byte counts into the driver's `--datadir`) and the
//! legacy provisioner.

/// Parses a storage quantity into bytes, rounding fractions up; `None` if malformed or huge.
pub fn parse_bytes(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let (multiplier, divisor): (u128, u128) = match suffix {
        "" => (1, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        s if s.starts_with(['e', 'E']) => {
            let exp: u32 = s[1..].parse().ok()?;
            (10u128.checked_pow(exp)?, 1)
        }
        _ => return None,
    };
    let number = number.strip_prefix('+').unwrap_or(number);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) || frac.len() > 18 {
        return None;
    }
    let scale = 10u128.pow(u32::try_from(frac.len()).ok()?);
    let mantissa: u128 = format!("{int}{frac}").parse().ok()?;
    let denom = scale.checked_mul(divisor)?;
    let bytes = mantissa.checked_mul(multiplier)?.div_ceil(denom);
    u64::try_from(bytes).ok()
}

/// Formats a byte count as a quantity: the largest binary suffix that divides it exactly
/// (`1536Mi`, `15Gi`), else plain bytes.
pub fn format_bytes(bytes: u64) -> String {
    const SUFFIXES: [(&str, u32); 6] = [("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)];
    if bytes == 0 {
        return "0".to_owned();
    }
    for (suffix, shift) in SUFFIXES {
        let unit = 1u64 << shift;
        if bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::parse_bytes;

    #[test]
    fn units() {
        assert_eq!(parse_bytes("1Gi"), Some(1 << 30));
        assert_eq!(parse_bytes("10G"), Some(10_000_000_000));
        assert_eq!(parse_bytes("1.5Ki"), Some(1536));
        assert_eq!(parse_bytes("0.1"), Some(1));
        assert_eq!(parse_bytes("1500m"), Some(2));
        assert_eq!(parse_bytes("1e3"), Some(1000));
        assert_eq!(parse_bytes("123"), Some(123));
        assert_eq!(parse_bytes("+5Mi"), Some(5 << 20));
    }

    #[test]
    fn formats_with_the_largest_exact_binary_suffix_and_round_trips() {
        use super::format_bytes;
        for (bytes, text) in [
            (0, "0"),
            (1536 << 20, "1536Mi"),
            (15 << 30, "15Gi"),
            (1000, "1000"),
            (3 << 10, "3Ki"),
        ] {
            assert_eq!(format_bytes(bytes), text);
            assert_eq!(parse_bytes(text), Some(bytes));
        }
    }

    #[test]
    fn garbage() {
        for q in ["", "Gi", "1Xi", "-1Gi", "1..2", "99999999999Ei", "1e99"] {
            assert_eq!(parse_bytes(q), None, "{q}");
        }
    }
}
