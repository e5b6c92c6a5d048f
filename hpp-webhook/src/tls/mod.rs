//! TLS for the webhook: the resolved crypto policy, the reloading certificate store and the
//! per-connection acceptor that combines them.

pub mod certs;
pub mod ciphers;
pub mod policy;
pub mod profile;

use std::sync::{Arc, Mutex};

use rustls::ServerConfig;
use rustls::server::ResolvesServerCert;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

pub use certs::{CertError, CertStore};
pub use policy::{PolicySource, Resolved, TlsPolicy, TlsPolicyError, TlsVersion, resolve_overrides};

/// Where the policy comes from at runtime: fixed, or followed from the cluster.
pub type PolicyWatch = watch::Receiver<TlsPolicy>;

/// Keeps `tx` open until every receiver is gone, so receivers' `changed()` waits instead of
/// failing; outside a tokio runtime the sender is simply dropped.
fn keep_open(tx: watch::Sender<TlsPolicy>) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move { tx.closed().await });
    }
}

/// Starts policy resolution. With overrides, those are fixed for the process lifetime; without,
/// and with a client, the OpenShift profile is followed in a background task (which ends once
/// every receiver is dropped); otherwise the default policy is used. Following the profile needs
/// a tokio runtime; without one the default policy stays.
pub fn start_policy(overrides: Option<Resolved>, client: Option<kube::Client>) -> PolicyWatch {
    let initial = match overrides {
        Some(Resolved { policy, warnings }) => {
            for w in &warnings {
                warn!(warning = %w, "TLS override");
            }
            info!(policy = %policy, "TLS policy from TLS_MIN_VERSION_OVERRIDE / TLS_CIPHERS_OVERRIDE");
            let (tx, rx) = watch::channel(policy);
            keep_open(tx);
            return rx;
        }
        None => TlsPolicy::default(),
    };
    let (tx, rx) = watch::channel(initial);
    match (client, tokio::runtime::Handle::try_current()) {
        (Some(client), Ok(runtime)) => {
            runtime.spawn(profile::follow_openshift(client, tx));
        }
        (client, _) => {
            if client.is_some() {
                warn!("no tokio runtime: cannot follow the OpenShift TLS profile");
            }
            info!(policy = %rx.borrow().clone(), "default TLS policy");
            keep_open(tx);
        }
    }
    rx
}

/// The rustls config of a listener, rebuilt only when the TLS policy changes. Shared by the
/// webhook and the metrics listeners so both follow policy changes the same way.
#[derive(Default)]
pub struct ServerConfigCache {
    cached: Mutex<Option<(TlsPolicy, Arc<ServerConfig>)>>,
}

impl ServerConfigCache {
    /// An acceptor for `policy` and `certs`, and whether the config had to be (re)built.
    pub fn acceptor(
        &self,
        policy: TlsPolicy,
        certs: Arc<dyn ResolvesServerCert>,
    ) -> Result<(TlsAcceptor, bool), rustls::Error> {
        let mut cached = match self.cached.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some((p, config)) = cached.as_ref()
            && *p == policy
        {
            return Ok((TlsAcceptor::from(config.clone()), false));
        }
        let config = Arc::new(policy.server_config(certs)?);
        *cached = Some((policy, config.clone()));
        Ok((TlsAcceptor::from(config), true))
    }
}

/// Builds a TLS acceptor per connection from the current policy and the certificate store,
/// rebuilding the rustls config only when the policy changed.
pub struct AcceptorSource {
    policy: PolicyWatch,
    certs: Arc<CertStore>,
    cache: ServerConfigCache,
}

impl AcceptorSource {
    /// Combines a policy source and a certificate store.
    pub fn new(policy: PolicyWatch, certs: Arc<CertStore>) -> Self {
        Self {
            policy,
            certs,
            cache: ServerConfigCache::default(),
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
        let (acceptor, rebuilt) = self.cache.acceptor(policy.clone(), self.certs.clone())?;
        if rebuilt {
            info!(policy = %policy, "TLS server configuration built");
        }
        Ok(acceptor)
    }
}
