//! The resolved TLS policy (minimum version + cipher suites) shared by the webhook, the metrics
//! endpoint and the CSI DaemonSet's `--metrics-tls-version` flag.
//!
//! Resolution order, as in KubeVirt's `cryptopolicy`: the `TLS_MIN_VERSION_OVERRIDE` /
//! `TLS_CIPHERS_OVERRIDE` variables, else the OpenShift APIServer `tlsSecurityProfile`
//! ([`super::profile`]), else TLS 1.2+ with the Intermediate cipher set. Two deliberate
//! differences: rustls has no TLS 1.0/1.1, so a lower minimum is raised to 1.2 with a warning, and
//! unknown names are reported instead of dropped silently.

use std::fmt;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::ResolvesServerCert;
use rustls::{ProtocolVersion, ServerConfig, SupportedCipherSuite, SupportedProtocolVersion};

use super::ciphers::{self, CipherLookup};

/// The only application protocol served: HTTP/2 stays off (CVE-2023-44487 "rapid reset").
pub const ALPN_HTTP11: &[u8] = b"http/1.1";

/// Lowest TLS version a server accepts. rustls implements only these two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TlsVersion {
    /// TLS 1.2 and newer.
    Tls12,
    /// TLS 1.3 only.
    Tls13,
}

impl TlsVersion {
    /// The Go `crypto/tls` constant name other components take as a flag value.
    pub fn go_name(self) -> &'static str {
        match self {
            Self::Tls12 => "VersionTLS12",
            Self::Tls13 => "VersionTLS13",
        }
    }
}

impl fmt::Display for TlsVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.go_name())
    }
}

/// Where a policy came from, for logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicySource {
    /// No override and no cluster profile: Intermediate.
    Default,
    /// `TLS_MIN_VERSION_OVERRIDE` / `TLS_CIPHERS_OVERRIDE`.
    Override,
    /// A command-line flag of this name (e.g. the CSI driver's `--metrics-tls-version`).
    Flag(String),
    /// The OpenShift APIServer `tlsSecurityProfile` of this type (Old, Intermediate, Modern, Custom).
    OpenShift(String),
}

impl fmt::Display for PolicySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default => f.write_str("default (Intermediate)"),
            Self::Override => f.write_str("environment override"),
            Self::Flag(name) => write!(f, "flag {name}"),
            Self::OpenShift(t) => write!(f, "OpenShift APIServer tlsSecurityProfile {t}"),
        }
    }
}

/// A TLS configuration input that cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsPolicyError {
    /// The minimum version is not one of the Go constant names.
    #[error(
        "unknown minimum TLS version {0:?}: use VersionTLS12 or VersionTLS13 (VersionTLS10/VersionTLS11 are raised to VersionTLS12)"
    )]
    UnknownMinVersion(String),
    /// Cipher names no table knows (usually typos).
    #[error("unknown cipher suite names {names:?}; supported names: {}", supported.join(", "))]
    UnknownCiphers {
        /// The names not recognised.
        names: Vec<String>,
        /// Every name that would be accepted.
        supported: Vec<&'static str>,
    },
    /// The list names no suite rustls implements for the allowed versions.
    #[error("none of the cipher suites {0:?} is implemented by rustls for the allowed TLS versions")]
    NoUsableCiphers(Vec<String>),
}

/// Minimum version and cipher suites, validated: it always builds a working `ServerConfig`.
#[derive(Clone, Debug, PartialEq)]
pub struct TlsPolicy {
    min_version: TlsVersion,
    tls12: Vec<SupportedCipherSuite>,
    tls13: Vec<SupportedCipherSuite>,
    source: PolicySource,
}

/// A policy plus the problems found while resolving it, to be logged at startup or on change.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    /// The policy to serve with.
    pub policy: TlsPolicy,
    /// Things an admin should know (ignored names, raised minimum version).
    pub warnings: Vec<String>,
}

fn all_suites(version: &SupportedProtocolVersion) -> Vec<SupportedCipherSuite> {
    rustls::crypto::ring::ALL_CIPHER_SUITES
        .iter()
        .copied()
        .filter(|s| s.version() == version)
        .collect()
}

/// OpenShift/Mozilla Intermediate TLS 1.2 suites, in the profile's order.
const INTERMEDIATE_TLS12: &[&str] = &[
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
];

impl Default for TlsPolicy {
    fn default() -> Self {
        Self::intermediate(PolicySource::Default)
    }
}

impl TlsPolicy {
    /// Mozilla/OpenShift Intermediate: TLS 1.2+, AEAD suites with forward secrecy.
    pub fn intermediate(source: PolicySource) -> Self {
        let tls12 = INTERMEDIATE_TLS12
            .iter()
            .filter_map(|n| match ciphers::lookup(n) {
                CipherLookup::Supported(s) => Some(s),
                _ => None,
            })
            .collect();
        Self {
            min_version: TlsVersion::Tls12,
            tls12,
            tls13: all_suites(&rustls::version::TLS13),
            source,
        }
    }

    /// Mozilla/OpenShift Modern: TLS 1.3 only.
    pub fn modern(source: PolicySource) -> Self {
        Self {
            min_version: TlsVersion::Tls13,
            tls12: Vec::new(),
            tls13: all_suites(&rustls::version::TLS13),
            source,
        }
    }

    /// Old, as far as rustls goes: everything rustls implements, TLS 1.2+.
    pub fn old(source: PolicySource) -> Self {
        Self {
            min_version: TlsVersion::Tls12,
            tls12: all_suites(&rustls::version::TLS12),
            tls13: all_suites(&rustls::version::TLS13),
            source,
        }
    }

    /// Builds a policy from a minimum version and a cipher list. As in Go, a list that names no
    /// TLS 1.3 suite leaves every TLS 1.3 suite on (the list governs TLS 1.2); naming some TLS 1.3
    /// suites restricts TLS 1.3 to them.
    pub fn from_parts(
        min_version: TlsVersion,
        suites: &[SupportedCipherSuite],
        source: PolicySource,
        warnings: &mut Vec<String>,
    ) -> Result<Self, TlsPolicyError> {
        let of = |v: ProtocolVersion| -> Vec<SupportedCipherSuite> {
            let mut out: Vec<SupportedCipherSuite> = Vec::new();
            for s in suites.iter().filter(|s| s.version().version == v) {
                if !out.iter().any(|o| o.suite() == s.suite()) {
                    out.push(*s);
                }
            }
            out
        };
        let mut tls12 = of(ProtocolVersion::TLSv1_2);
        let mut tls13 = of(ProtocolVersion::TLSv1_3);
        if tls13.is_empty() {
            tls13 = all_suites(&rustls::version::TLS13);
        }
        if min_version == TlsVersion::Tls13 && !tls12.is_empty() {
            warnings.push(format!(
                "TLS 1.2 cipher suites {:?} are unused because the minimum version is TLS 1.3",
                tls12.iter().map(|s| ciphers::iana_name(*s)).collect::<Vec<_>>()
            ));
            tls12.clear();
        }
        if min_version == TlsVersion::Tls12 && tls12.is_empty() && !suites.is_empty() {
            warnings.push("no TLS 1.2 cipher suite is enabled: only TLS 1.3 clients can connect".to_string());
        }
        Ok(Self {
            min_version,
            tls12,
            tls13,
            source,
        })
    }

    /// Lowest version served.
    pub fn min_version(&self) -> TlsVersion {
        self.min_version
    }

    /// Where the policy came from.
    pub fn source(&self) -> &PolicySource {
        &self.source
    }

    /// The value for the CSI driver's `--metrics-tls-version` flag (`VersionTLS12`/`VersionTLS13`).
    pub fn metrics_tls_version_flag(&self) -> &'static str {
        self.min_version.go_name()
    }

    /// Enabled suites, TLS 1.3 first, in preference order.
    pub fn cipher_suites(&self) -> Vec<SupportedCipherSuite> {
        self.tls13.iter().chain(&self.tls12).copied().collect()
    }

    /// IANA names of the enabled suites, for logs and other components' flags.
    pub fn cipher_names(&self) -> Vec<&'static str> {
        self.cipher_suites().into_iter().map(ciphers::iana_name).collect()
    }

    /// Protocol versions actually served.
    pub fn protocol_versions(&self) -> Vec<&'static SupportedProtocolVersion> {
        if self.min_version == TlsVersion::Tls13 || self.tls12.is_empty() {
            vec![&rustls::version::TLS13]
        } else {
            vec![&rustls::version::TLS13, &rustls::version::TLS12]
        }
    }

    /// The ring provider restricted to this policy's suites.
    pub fn crypto_provider(&self) -> CryptoProvider {
        CryptoProvider {
            cipher_suites: self.cipher_suites(),
            ..rustls::crypto::ring::default_provider()
        }
    }

    /// A server config for this policy, HTTP/1.1 only, with certificates from `certs`.
    pub fn server_config(&self, certs: Arc<dyn ResolvesServerCert>) -> Result<ServerConfig, rustls::Error> {
        let mut config = ServerConfig::builder_with_provider(Arc::new(self.crypto_provider()))
            .with_protocol_versions(&self.protocol_versions())?
            .with_no_client_auth()
            .with_cert_resolver(certs);
        config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
        Ok(config)
    }
}

impl fmt::Display for TlsPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "min {} ciphers [{}] from {}",
            self.min_version,
            self.cipher_names().join(","),
            self.source
        )
    }
}

/// Parses a Go `tls.VersionTLS1x` name. 1.0 and 1.1 are raised to 1.2 with a warning.
pub fn parse_min_version(value: &str, warnings: &mut Vec<String>) -> Result<TlsVersion, TlsPolicyError> {
    match value.trim() {
        "VersionTLS12" => Ok(TlsVersion::Tls12),
        "VersionTLS13" => Ok(TlsVersion::Tls13),
        v @ ("VersionTLS10" | "VersionTLS11") => {
            warnings.push(format!(
                "minimum TLS version {v} cannot be served: rustls implements only TLS 1.2 and 1.3, so TLS 1.0/1.1 clients are refused and the minimum is VersionTLS12"
            ));
            Ok(TlsVersion::Tls12)
        }
        other => Err(TlsPolicyError::UnknownMinVersion(other.to_string())),
    }
}

/// Names sorted by what they refer to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CipherList {
    /// Suites rustls serves, in the order given.
    pub supported: Vec<SupportedCipherSuite>,
    /// Real suites rustls does not implement.
    pub not_implemented: Vec<String>,
    /// Names no table knows.
    pub unknown: Vec<String>,
}

/// Splits a list of cipher names (empty entries ignored).
pub fn parse_cipher_names<'a>(names: impl IntoIterator<Item = &'a str>) -> CipherList {
    let mut list = CipherList::default();
    for name in names.into_iter().map(str::trim).filter(|n| !n.is_empty()) {
        match ciphers::lookup(name) {
            CipherLookup::Supported(s) => list.supported.push(s),
            CipherLookup::NotImplemented => list.not_implemented.push(name.to_string()),
            CipherLookup::Unknown => list.unknown.push(name.to_string()),
        }
    }
    list
}

/// Resolves `TLS_MIN_VERSION_OVERRIDE` / `TLS_CIPHERS_OVERRIDE` values (pass the variables'
/// values; empty counts as unset). `None` when neither is set. Unknown cipher names and an unknown
/// version are errors, so a typo is caught at startup; suites rustls does not implement are
/// warnings.
pub fn resolve_overrides(min_version: Option<&str>, ciphers: Option<&str>) -> Result<Option<Resolved>, TlsPolicyError> {
    let min_version = min_version.filter(|v| !v.trim().is_empty());
    let ciphers = ciphers.filter(|v| !v.trim().is_empty());
    if min_version.is_none() && ciphers.is_none() {
        return Ok(None);
    }
    let mut warnings = Vec::new();
    let min = match min_version {
        Some(v) => parse_min_version(v, &mut warnings)?,
        None => TlsVersion::Tls12,
    };
    let policy = match ciphers {
        None if min == TlsVersion::Tls13 => TlsPolicy::modern(PolicySource::Override),
        None => TlsPolicy::intermediate(PolicySource::Override),
        Some(list) => {
            let parsed = parse_cipher_names(list.split(','));
            if !parsed.unknown.is_empty() {
                return Err(TlsPolicyError::UnknownCiphers {
                    names: parsed.unknown,
                    supported: ciphers::supported_names(),
                });
            }
            if !parsed.not_implemented.is_empty() {
                warnings.push(format!(
                    "cipher suites {:?} are not implemented by rustls (legacy CBC/3DES/RC4/DHE/RSA key exchange) and are not offered",
                    parsed.not_implemented
                ));
            }
            if parsed.supported.is_empty() {
                return Err(TlsPolicyError::NoUsableCiphers(parsed.not_implemented));
            }
            TlsPolicy::from_parts(min, &parsed.supported, PolicySource::Override, &mut warnings)?
        }
    };
    Ok(Some(Resolved { policy, warnings }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(p: &TlsPolicy) -> Vec<&'static str> {
        p.cipher_names()
    }

    #[test]
    fn default_is_intermediate_tls12() {
        let p = TlsPolicy::default();
        assert_eq!(p.min_version(), TlsVersion::Tls12);
        assert_eq!(p.metrics_tls_version_flag(), "VersionTLS12");
        assert_eq!(p.protocol_versions().len(), 2);
        assert_eq!(names(&p).len(), 9);
        assert!(names(&p).contains(&"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"));
    }

    #[test]
    fn no_override_gives_none() {
        assert_eq!(resolve_overrides(None, None).unwrap(), None);
        assert_eq!(resolve_overrides(Some(""), Some(" ")).unwrap(), None);
    }

    #[test]
    fn min_version_override() {
        let r = resolve_overrides(Some("VersionTLS13"), None).unwrap().unwrap();
        assert_eq!(r.policy.min_version(), TlsVersion::Tls13);
        assert_eq!(r.policy.metrics_tls_version_flag(), "VersionTLS13");
        assert_eq!(r.policy.protocol_versions(), vec![&rustls::version::TLS13]);
        assert_eq!(r.policy.source(), &PolicySource::Override);

        let r = resolve_overrides(Some("VersionTLS10"), None).unwrap().unwrap();
        assert_eq!(r.policy.min_version(), TlsVersion::Tls12);
        assert!(
            r.warnings[0].contains("rustls implements only TLS 1.2 and 1.3"),
            "{:?}",
            r.warnings
        );

        let err = resolve_overrides(Some("tls12"), None).unwrap_err();
        assert_eq!(err, TlsPolicyError::UnknownMinVersion("tls12".into()));
    }

    #[test]
    fn cipher_override() {
        let r = resolve_overrides(
            None,
            Some("ECDHE-RSA-AES256-GCM-SHA384, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"),
        )
        .unwrap()
        .unwrap();
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        assert_eq!(
            names(&r.policy),
            [
                "TLS_AES_256_GCM_SHA384",
                "TLS_AES_128_GCM_SHA256",
                "TLS_CHACHA20_POLY1305_SHA256",
                "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"
            ]
        );

        let r = resolve_overrides(None, Some("TLS_AES_128_GCM_SHA256,ECDHE-RSA-AES128-GCM-SHA256"))
            .unwrap()
            .unwrap();
        assert_eq!(
            names(&r.policy),
            ["TLS_AES_128_GCM_SHA256", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]
        );
    }

    #[test]
    fn cipher_override_problems_are_reported() {
        let err = resolve_overrides(None, Some("ECDHE-RSA-AES128-GCM-SHA256,NOT-A-CIPHER")).unwrap_err();
        match &err {
            TlsPolicyError::UnknownCiphers { names, supported } => {
                assert_eq!(names, &["NOT-A-CIPHER"]);
                assert!(supported.contains(&"ECDHE-RSA-AES128-GCM-SHA256"));
            }
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().contains("NOT-A-CIPHER"));

        let r = resolve_overrides(None, Some("ECDHE-RSA-AES128-GCM-SHA256,AES128-SHA"))
            .unwrap()
            .unwrap();
        assert!(r.warnings[0].contains("AES128-SHA"), "{:?}", r.warnings);

        assert_eq!(
            resolve_overrides(None, Some("AES128-SHA")).unwrap_err(),
            TlsPolicyError::NoUsableCiphers(vec!["AES128-SHA".into()])
        );
    }

    #[test]
    fn tls13_minimum_drops_tls12_suites() {
        let r = resolve_overrides(Some("VersionTLS13"), Some("ECDHE-RSA-AES128-GCM-SHA256"))
            .unwrap()
            .unwrap();
        assert_eq!(r.policy.protocol_versions(), vec![&rustls::version::TLS13]);
        assert_eq!(names(&r.policy).len(), 3);
        assert!(r.warnings[0].contains("unused"), "{:?}", r.warnings);
    }

    #[test]
    fn server_config_builds_for_every_named_policy() {
        #[derive(Debug)]
        struct NoCert;
        impl ResolvesServerCert for NoCert {
            fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<rustls::sign::CertifiedKey>> {
                None
            }
        }
        for p in [
            TlsPolicy::default(),
            TlsPolicy::modern(PolicySource::Default),
            TlsPolicy::old(PolicySource::Default),
        ] {
            let config = p.server_config(Arc::new(NoCert)).unwrap();
            assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
        }
    }
}
