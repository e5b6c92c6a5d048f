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

/// FNV-1a 64-bit hash fed piece by piece, equal to [`fnv1a64`] of the pieces joined: a value
/// can be hashed as it is written out, without building the whole text first.
#[derive(Clone, Copy, Debug)]
pub struct Fnv1a64(u64);

impl Default for Fnv1a64 {
    fn default() -> Self {
        Fnv1a64(OFFSET_64)
    }
}

impl Fnv1a64 {
    /// Feeds `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0 = bytes
            .iter()
            .fold(self.0, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME_64));
    }

    /// The hash of everything fed so far.
    pub fn finish(&self) -> u64 {
        self.0
    }

    /// [`finish`](Self::finish) as 16 lowercase hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}

impl std::io::Write for Fnv1a64 {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
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
    fn fed_in_pieces_it_hashes_as_the_whole() {
        let mut h = Fnv1a64::default();
        for piece in ["hostpath", "-", "", "provisioner"] {
            h.update(piece.as_bytes());
        }
        assert_eq!(h.finish(), fnv1a64(b"hostpath-provisioner"));
        assert_eq!(h.hex(), fnv1a64_hex("hostpath-provisioner"));
        assert_eq!(Fnv1a64::default().finish(), fnv1a64(b""));
    }

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
