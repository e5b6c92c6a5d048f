//! The one name hash of the workspace: FNV-1a, as the KubeVirt operator uses it to shorten
//! object names past 63 characters (32-bit) and as the operator fingerprints desired objects
//! (64-bit). Its outputs name objects in clusters, so they must never change.

const OFFSET_32: u32 = 0x811c_9dc5;
const PRIME_32: u32 = 0x0100_0193;
const OFFSET_64: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME_64: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 32-bit hash of `bytes`.
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes
        .iter()
        .fold(OFFSET_32, |h, b| (h ^ u32::from(*b)).wrapping_mul(PRIME_32))
}

/// FNV-1a 64-bit hash of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(OFFSET_64, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME_64))
}

/// FNV-1a 32-bit hash of `s` as 8 lowercase hex digits (KubeVirt's name hash).
pub fn fnv1a32_hex(s: &str) -> String {
    format!("{:08x}", fnv1a32(s.as_bytes()))
}

/// FNV-1a 64-bit hash of `s` as 16 lowercase hex digits.
pub fn fnv1a64_hex(s: &str) -> String {
    format!("{:016x}", fnv1a64(s.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_vectors() {
        assert_eq!(fnv1a32_hex(""), "811c9dc5");
        assert_eq!(fnv1a32_hex("a"), "e40c292c");
        assert_eq!(fnv1a32_hex("foobar"), "bf9cf968");
        assert_eq!(fnv1a64_hex(""), "cbf29ce484222325");
        assert_eq!(fnv1a64_hex("a"), "af63dc4c8601ec8c");
        assert_eq!(fnv1a64_hex("foobar"), "85944171f73967e8");
    }
}
