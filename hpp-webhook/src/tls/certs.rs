//! Serving certificate read from PEM files and re-read when they change, so a certificate
//! rotated by cert-manager or OLM is used from the next handshake on, without a restart.
//!
//! Every handshake reads both files (a few KiB) and compares them with the bytes last parsed;
//! only a change is parsed again. Content comparison, unlike modification times, also catches
//! Kubernetes' atomic `..data` symlink swaps and writes within one timestamp tick. A broken
//! rotation (half-written file, key not matching) keeps the previous certificate in use.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tracing::{info, warn};

/// Why the serving certificate could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The certificate file holds no valid PEM certificate.
    #[error("{path} holds no PEM certificate{}", .detail.as_ref().map(|d| format!(": {d}")).unwrap_or_default())]
    NoCertificate {
        /// The file.
        path: PathBuf,
        /// The parser's complaint, if any.
        detail: Option<String>,
    },
    /// The key file holds no usable private key.
    #[error("{path} holds no usable PEM private key: {detail}")]
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

struct Loaded {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    key: Arc<CertifiedKey>,
}

/// A certificate and key pair on disk, reloaded on change; usable directly as a rustls
/// certificate resolver.
pub struct CertStore {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    loaded: Mutex<Option<Loaded>>,
}

impl std::fmt::Debug for CertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertStore")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, CertError> {
    std::fs::read(path).map_err(|source| CertError::Read {
        path: path.to_path_buf(),
        source,
    })
}

impl CertStore {
    /// A store for `cert_path` and `key_path`; nothing is read until [`CertStore::current`].
    pub fn new(cert_path: impl Into<PathBuf>, key_path: impl Into<PathBuf>) -> Self {
        Self {
            cert_path: cert_path.into(),
            key_path: key_path.into(),
            provider: Arc::new(rustls::crypto::ring::default_provider()),
            loaded: Mutex::new(None),
        }
    }

    /// `tls.crt` and `tls.key` inside `dir`, the layout cert-manager and OLM produce.
    pub fn in_dir(dir: &Path) -> Self {
        Self::new(dir.join(crate::names::CERT_FILE), dir.join(crate::names::KEY_FILE))
    }

    /// Certificate file path.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// Whether a certificate has been loaded at least once.
    pub fn is_loaded(&self) -> bool {
        self.lock().is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Loaded>> {
        match self.loaded.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn parse(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, CertError> {
        let no_cert = |detail: Option<String>| CertError::NoCertificate {
            path: self.cert_path.clone(),
            detail,
        };
        let chain = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| no_cert(Some(e.to_string())))?;
        if chain.is_empty() {
            return Err(no_cert(None));
        }
        let key_error = |detail: String| CertError::Key {
            path: self.key_path.clone(),
            detail,
        };
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| key_error(e.to_string()))?;
        CertifiedKey::from_der(chain, key, &self.provider).map_err(|e| key_error(e.to_string()))
    }

    /// The current certificate, re-read if the files changed. When the files are unreadable or
    /// broken but an earlier certificate loaded, that one is returned and the problem logged.
    pub fn current(&self) -> Result<Arc<CertifiedKey>, CertError> {
        let files = read(&self.cert_path).and_then(|c| Ok((c, read(&self.key_path)?)));
        let mut loaded = self.lock();
        let (cert_pem, key_pem) = match files {
            Ok(f) => f,
            Err(e) => return Self::keep_previous(&loaded, e),
        };
        if let Some(l) = loaded.as_ref()
            && l.cert_pem == cert_pem
            && l.key_pem == key_pem
        {
            return Ok(l.key.clone());
        }
        match self.parse(&cert_pem, &key_pem) {
            Ok(key) => {
                let key = Arc::new(key);
                info!(cert = %self.cert_path.display(), reloaded = loaded.is_some(), "serving certificate loaded");
                *loaded = Some(Loaded {
                    cert_pem,
                    key_pem,
                    key: key.clone(),
                });
                Ok(key)
            }
            Err(e) => Self::keep_previous(&loaded, e),
        }
    }

    fn keep_previous(loaded: &Option<Loaded>, error: CertError) -> Result<Arc<CertifiedKey>, CertError> {
        match loaded {
            Some(l) => {
                warn!(error = %error, "serving certificate not reloaded; keeping the previous one");
                Ok(l.key.clone())
            }
            None => Err(error),
        }
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        match self.current() {
            Ok(key) => Some(key),
            Err(e) => {
                warn!(error = %e, "no serving certificate: refusing the TLS handshake");
                None
            }
        }
    }
}
