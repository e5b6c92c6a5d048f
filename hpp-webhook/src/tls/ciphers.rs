//! Cipher suite names as cluster admins write them (IANA, OpenSSL and Go spellings) mapped to
//! the suites rustls implements with ring.
//!
//! Three outcomes for a name: a suite rustls serves; a real suite rustls deliberately does not
//! implement (CBC, 3DES, RSA key exchange, DHE; named in OpenShift's Old profile); or a name no
//! table knows, which is almost always a typo.

use rustls::SupportedCipherSuite;
use rustls::crypto::ring::cipher_suite as ring;

/// One suite rustls serves, with the names it is known by.
struct Entry {
    suite: SupportedCipherSuite,
    iana: &'static str,
    aliases: &'static [&'static str],
}

/// Every suite of the ring provider, strongest first within each version.
const SUPPORTED: &[Entry] = &[
    Entry {
        suite: ring::TLS13_AES_128_GCM_SHA256,
        iana: "TLS_AES_128_GCM_SHA256",
        aliases: &["TLS13_AES_128_GCM_SHA256"],
    },
    Entry {
        suite: ring::TLS13_AES_256_GCM_SHA384,
        iana: "TLS_AES_256_GCM_SHA384",
        aliases: &["TLS13_AES_256_GCM_SHA384"],
    },
    Entry {
        suite: ring::TLS13_CHACHA20_POLY1305_SHA256,
        iana: "TLS_CHACHA20_POLY1305_SHA256",
        aliases: &["TLS13_CHACHA20_POLY1305_SHA256"],
    },
    Entry {
        suite: ring::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        iana: "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        aliases: &["ECDHE-ECDSA-AES128-GCM-SHA256"],
    },
    Entry {
        suite: ring::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        iana: "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        aliases: &["ECDHE-RSA-AES128-GCM-SHA256"],
    },
    Entry {
        suite: ring::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        iana: "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        aliases: &["ECDHE-ECDSA-AES256-GCM-SHA384"],
    },
    Entry {
        suite: ring::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        iana: "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        aliases: &["ECDHE-RSA-AES256-GCM-SHA384"],
    },
    Entry {
        suite: ring::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        iana: "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        aliases: &[
            "ECDHE-ECDSA-CHACHA20-POLY1305",
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        ],
    },
    Entry {
        suite: ring::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        iana: "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        aliases: &["ECDHE-RSA-CHACHA20-POLY1305", "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305"],
    },
];

/// Real suites (OpenSSL spelling, then IANA) that rustls does not implement on purpose.
const NOT_IMPLEMENTED: &[(&str, &str)] = &[
    ("DHE-RSA-AES128-GCM-SHA256", "TLS_DHE_RSA_WITH_AES_128_GCM_SHA256"),
    ("DHE-RSA-AES256-GCM-SHA384", "TLS_DHE_RSA_WITH_AES_256_GCM_SHA384"),
    ("DHE-RSA-CHACHA20-POLY1305", "TLS_DHE_RSA_WITH_CHACHA20_POLY1305_SHA256"),
    ("ECDHE-ECDSA-AES128-SHA256", "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256"),
    ("ECDHE-RSA-AES128-SHA256", "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256"),
    ("ECDHE-ECDSA-AES128-SHA", "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA"),
    ("ECDHE-RSA-AES128-SHA", "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"),
    ("ECDHE-ECDSA-AES256-SHA384", "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA384"),
    ("ECDHE-RSA-AES256-SHA384", "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA384"),
    ("ECDHE-ECDSA-AES256-SHA", "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA"),
    ("ECDHE-RSA-AES256-SHA", "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA"),
    ("DHE-RSA-AES128-SHA256", "TLS_DHE_RSA_WITH_AES_128_CBC_SHA256"),
    ("DHE-RSA-AES256-SHA256", "TLS_DHE_RSA_WITH_AES_256_CBC_SHA256"),
    ("AES128-GCM-SHA256", "TLS_RSA_WITH_AES_128_GCM_SHA256"),
    ("AES256-GCM-SHA384", "TLS_RSA_WITH_AES_256_GCM_SHA384"),
    ("AES128-SHA256", "TLS_RSA_WITH_AES_128_CBC_SHA256"),
    ("AES256-SHA256", "TLS_RSA_WITH_AES_256_CBC_SHA256"),
    ("AES128-SHA", "TLS_RSA_WITH_AES_128_CBC_SHA"),
    ("AES256-SHA", "TLS_RSA_WITH_AES_256_CBC_SHA"),
    ("DES-CBC3-SHA", "TLS_RSA_WITH_3DES_EDE_CBC_SHA"),
    ("ECDHE-RSA-DES-CBC3-SHA", "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA"),
    ("ECDHE-ECDSA-RC4-SHA", "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA"),
    ("ECDHE-RSA-RC4-SHA", "TLS_ECDHE_RSA_WITH_RC4_128_SHA"),
    ("RC4-SHA", "TLS_RSA_WITH_RC4_128_SHA"),
    ("TLS_AES_128_CCM_SHA256", "TLS_AES_128_CCM_SHA256"),
    ("TLS_AES_128_CCM_8_SHA256", "TLS_AES_128_CCM_8_SHA256"),
];

/// What a cipher suite name refers to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CipherLookup {
    /// A suite rustls serves.
    Supported(SupportedCipherSuite),
    /// A real suite rustls does not implement (legacy CBC, 3DES, RC4, DHE, static RSA, CCM).
    NotImplemented,
    /// No known suite has this name.
    Unknown,
}

/// Looks a name up in every spelling; case-insensitive, surrounding whitespace ignored.
pub fn lookup(name: &str) -> CipherLookup {
    let name = name.trim();
    let matches = |candidate: &str| candidate.eq_ignore_ascii_case(name);
    if let Some(e) = SUPPORTED
        .iter()
        .find(|e| matches(e.iana) || e.aliases.iter().any(|a| matches(a)))
    {
        return CipherLookup::Supported(e.suite);
    }
    if NOT_IMPLEMENTED
        .iter()
        .any(|(openssl, iana)| matches(openssl) || matches(iana))
    {
        return CipherLookup::NotImplemented;
    }
    CipherLookup::Unknown
}

/// The IANA name of a suite, as logs and the `--tls-cipher-suites` flags of other components use.
pub fn iana_name(suite: SupportedCipherSuite) -> &'static str {
    SUPPORTED
        .iter()
        .find(|e| e.suite.suite() == suite.suite())
        .map_or("unknown", |e| e.iana)
}

/// Every name [`lookup`] maps to a served suite, for error messages.
pub fn supported_names() -> Vec<&'static str> {
    SUPPORTED
        .iter()
        .flat_map(|e| std::iter::once(e.iana).chain(e.aliases.iter().copied()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ring_suite_has_a_name() {
        for suite in rustls::crypto::ring::ALL_CIPHER_SUITES {
            assert_ne!(iana_name(*suite), "unknown", "{:?}", suite.suite());
        }
    }

    #[test]
    fn spellings() {
        let openssl = lookup("ECDHE-RSA-AES128-GCM-SHA256");
        assert_eq!(openssl, lookup("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"));
        assert_eq!(openssl, lookup(" tls_ecdhe_rsa_with_aes_128_gcm_sha256 "));
        assert!(matches!(openssl, CipherLookup::Supported(_)));
        assert_eq!(
            lookup("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305"),
            lookup("ECDHE-RSA-CHACHA20-POLY1305")
        );
        assert_eq!(lookup("DES-CBC3-SHA"), CipherLookup::NotImplemented);
        assert_eq!(lookup("TLS_RSA_WITH_AES_128_CBC_SHA"), CipherLookup::NotImplemented);
        assert_eq!(lookup("ECDHE-RSA-AES128-GCM-SHA257"), CipherLookup::Unknown);
    }
}
