//! TLS for the webhook: the resolved crypto policy, the reloading certificate store and the
//! per-connection acceptor that combines them.

pub mod certs;
pub mod ciphers;
pub mod policy;
pub mod profile;

use std::sync::{Arc, Mutex};

use rustls::ServerConfig;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

pub use certs::{CertError, CertStore};
pub use policy::{PolicySource, Resolved, TlsPolicy, TlsPolicyError, TlsVersion, resolve_overrides};

/// Where the policy comes from at runtime: fixed, or followed from the cluster.
pub type PolicyWatch = watch::Receiver<TlsPolicy>;

/// Starts policy resolution. With overrides, those are fixed for the process lifetime; without,
/// and with a client, the OpenShift profile is followed in a background task (which ends once
/// every receiver is dropped); otherwise the default policy is used.
pub fn start_policy(overrides: Option<Resolved>, client: Option<kube::Client>) -> PolicyWatch {
    let initial = match overrides {
        Some(Resolved { policy, warnings }) => {
            for w in &warnings {
                warn!(warning = %w, "TLS override");
            }
            info!(policy = %policy, "TLS policy from TLS_MIN_VERSION_OVERRIDE / TLS_CIPHERS_OVERRIDE");
            let (tx, rx) = watch::channel(policy);
            // Keep the sender alive for as long as receivers exist, so `changed()` never errors.
            tokio::spawn(async move { tx.closed().await });
            return rx;
        }
        None => TlsPolicy::default(),
    };
    let (tx, rx) = watch::channel(initial);
    match client {
        Some(client) => {
            tokio::spawn(profile::follow_openshift(client, tx));
        }
        None => {
            info!(policy = %rx.borrow().clone(), "no cluster: default TLS policy");
            tokio::spawn(async move { tx.closed().await });
        }
    }
    rx
}

/// Builds a TLS acceptor per connection from the current policy and the certificate store,
/// rebuilding the rustls config only when the policy changed.
pub struct AcceptorSource {
    policy: PolicyWatch,
    certs: Arc<CertStore>,
    cached: Mutex<Option<(TlsPolicy, Arc<ServerConfig>)>>,
}

impl AcceptorSource {
    /// Combines a policy source and a certificate store.
    pub fn new(policy: PolicyWatch, certs: Arc<CertStore>) -> Self {
        Self {
            policy,
            certs,
            cached: Mutex::new(None),
        }
    }

    /// The certificate store (for readiness).
    pub fn certs(&self) -> &Arc<CertStore> {
        &self.certs
    }

    /// The policy in force now.
    pub fn policy(&self) -> TlsPolicy {
        self.policy.borrow().clone()
    }

    /// An acceptor for the next connection.
    pub fn acceptor(&self) -> Result<TlsAcceptor, rustls::Error> {
        let policy = self.policy();
        let mut cached = match self.cached.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some((p, config)) = cached.as_ref()
            && *p == policy
        {
            return Ok(TlsAcceptor::from(config.clone()));
        }
        let config = Arc::new(policy.server_config(self.certs.clone())?);
        info!(policy = %policy, "TLS server configuration built");
        *cached = Some((policy, config.clone()));
        Ok(TlsAcceptor::from(config))
    }
}
