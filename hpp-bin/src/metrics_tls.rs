//! HTTPS for the Prometheus metrics listeners of the CSI driver, the operator and the standalone
//! webhook. The ServiceMonitor scrapes `https` with `insecureSkipVerify`, as KubeVirt's does, so
//! without certificate files a self-signed certificate made at start-up is served (KubeVirt's
//! SANs: localhost, 127.0.0.1, the pod IP and DNS name, the metrics Service names). Given files are
//! re-read when they change (the webhook's [`CertStore`]); the minimum TLS version and suites come
//! from the shared `TlsPolicy`.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use hpp_webhook::tls::{self, CertStore, PolicyWatch};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

/// Flags of an HTTPS metrics listener (`hpp-operator run` and `hpp-operator webhook`); flatten
/// them into a command.
#[derive(Clone, Debug, clap::Args)]
pub struct MetricsListenArgs {
    /// Address of the HTTPS /metrics listener Prometheus scrapes (the `metrics` port).
    #[arg(long = "metrics-addr", env = "HPP_METRICS_ADDR", default_value = "0.0.0.0:8443")]
    pub addr: SocketAddr,
    /// PEM certificate of the metrics listener, re-read when it changes [default: a self-signed
    /// certificate made at start-up; also when only one of the two files is given].
    #[arg(long = "metrics-cert-file", env = "HPP_METRICS_CERT_FILE")]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of the metrics listener.
    #[arg(long = "metrics-key-file", env = "HPP_METRICS_KEY_FILE")]
    pub key_file: Option<PathBuf>,
}

/// Names the self-signed certificate is valid for; KubeVirt reads them from the pod's env.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SelfSignedNames {
    /// `POD_IP`.
    pub pod_ip: Option<String>,
    /// `POD_NAMESPACE`.
    pub namespace: Option<String>,
    /// `SERVICE_NAME`, the metrics Service.
    pub service: Option<String>,
}

impl SelfSignedNames {
    /// From `POD_IP`, `POD_NAMESPACE` and `SERVICE_NAME`.
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().map(|v| v.trim().to_owned());
        Self {
            pod_ip: var("POD_IP"),
            namespace: var("POD_NAMESPACE"),
            service: var("SERVICE_NAME"),
        }
    }

    /// The subject alternative names, KubeVirt's order, without duplicates.
    pub fn sans(&self) -> Vec<String> {
        let non_empty = |v: &Option<String>| v.as_deref().filter(|s| !s.is_empty()).map(str::to_owned);
        let ns = non_empty(&self.namespace);
        let mut out = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        if let Some(ip) = non_empty(&self.pod_ip).and_then(|s| s.parse::<IpAddr>().ok()) {
            out.push(ip.to_string());
            if let Some(ns) = &ns {
                out.push(format!(
                    "{}.{ns}.pod.cluster.local",
                    ip.to_string().replace(['.', ':'], "-")
                ));
            }
        }
        if let Some(svc) = non_empty(&self.service) {
            out.push(svc.clone());
            if let Some(ns) = &ns {
                out.push(format!("{svc}.{ns}"));
                out.push(format!("{svc}.{ns}.svc"));
                out.push(format!("{svc}.{ns}.svc.cluster.local"));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        out.retain(|n| seen.insert(n.clone()));
        out
    }
}

/// A certificate fixed for the process lifetime (the self-signed one).
#[derive(Debug)]
struct FixedCert(Arc<CertifiedKey>);

impl ResolvesServerCert for FixedCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// The TLS side of a metrics listener: certificate source plus policy, with the rustls config
/// rebuilt only when the policy changes.
pub struct MetricsTls {
    policy: PolicyWatch,
    certs: Arc<dyn ResolvesServerCert>,
    self_signed: Option<CertificateDer<'static>>,
    cache: tls::ServerConfigCache,
}

impl MetricsTls {
    /// Certificate files when both are given (checked now, so a bad file fails start-up, then
    /// re-read on change); otherwise a self-signed certificate for `names`, as KubeVirt does.
    pub fn new(
        policy: PolicyWatch,
        cert_file: Option<PathBuf>,
        key_file: Option<PathBuf>,
        names: &SelfSignedNames,
    ) -> anyhow::Result<Self> {
        let (certs, self_signed): (Arc<dyn ResolvesServerCert>, _) = match (cert_file, key_file) {
            (Some(cert), Some(key)) => {
                let store = CertStore::new(&cert, &key);
                store.current().with_context(|| {
                    format!("loading metrics certificate {} / key {}", cert.display(), key.display())
                })?;
                info!(cert = %cert.display(), "metrics served over HTTPS with the given certificate");
                (Arc::new(store), None)
            }
            (cert, key) => {
                if cert.is_some() || key.is_some() {
                    warn!("only one of the metrics certificate and key files given: using a self-signed certificate");
                }
                let (key, der) = self_signed(&names.sans())?;
                info!(sans = ?names.sans(), "metrics served over HTTPS with a self-signed certificate");
                (Arc::new(FixedCert(Arc::new(key))), Some(der))
            }
        };
        let tls = Self {
            policy,
            certs,
            self_signed,
            cache: tls::ServerConfigCache::default(),
        };
        // A policy that cannot build a config fails now rather than on every scrape.
        tls.acceptor().context("building the metrics TLS configuration")?;
        Ok(tls)
    }

    /// The generated certificate, when self-signed (clients that want to verify can trust it).
    pub fn self_signed_cert(&self) -> Option<&CertificateDer<'static>> {
        self.self_signed.as_ref()
    }

    /// An acceptor for the next connection, from the policy in force now.
    pub fn acceptor(&self) -> Result<TlsAcceptor, rustls::Error> {
        let policy = self.policy.borrow().clone();
        let (acceptor, rebuilt) = self.cache.acceptor(policy.clone(), self.certs.clone())?;
        if rebuilt {
            debug!(policy = %policy, "metrics TLS configuration built");
        }
        Ok(acceptor)
    }
}

/// A fresh key pair and a self-signed certificate for `sans` (rcgen, ring).
fn self_signed(sans: &[String]) -> anyhow::Result<(CertifiedKey, CertificateDer<'static>)> {
    let generated = rcgen::generate_simple_self_signed(sans.to_vec()).context("generating the metrics certificate")?;
    let der = generated.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(generated.signing_key.serialize_der()));
    let provider = rustls::crypto::ring::default_provider();
    let certified = CertifiedKey::from_der(vec![der.clone()], key, &provider)
        .context("loading the self-signed metrics certificate")?;
    Ok((certified, der))
}

/// Serves `router` over HTTPS on `listener` until `shutdown` resolves, then drains, through the
/// shared accept loop (`hpp-serve`: connection cap, handshake, header and idle timeouts).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Arc<MetricsTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    hpp_serve::Server::new("metrics", crate::admin::limits())
        .with_tls(Arc::new(move || {
            tls.acceptor().map_err(|e| {
                warn!(error = %e, "metrics TLS configuration unusable");
                e.to_string()
            })
        }))
        .serve(listener, router, shutdown)
        .await;
    Ok(())
}

/// Binds `args.addr` and serves `GET /metrics` from `registry` over HTTPS in the background;
/// returns the bound address. For the operator and the standalone webhook.
pub async fn start_metrics_listener(
    args: &MetricsListenArgs,
    policy: PolicyWatch,
    names: &SelfSignedNames,
    registry: Arc<prometheus_client::registry::Registry>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<SocketAddr> {
    let tls = Arc::new(MetricsTls::new(
        policy,
        args.cert_file.clone(),
        args.key_file.clone(),
        names,
    )?);
    let listener = TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("cannot listen on {} for metrics", args.addr))?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = serve(listener, crate::admin::metrics_router(registry), tls, shutdown).await {
            tracing::error!(error = %e, "metrics server failed");
        }
    });
    info!(addr = %local, "HTTPS metrics listening");
    Ok(local)
}

/// An HTTPS client for tests: what Prometheus does with `insecureSkipVerify`, or a verifying
/// client that trusts one certificate.
#[cfg(test)]
pub(crate) mod test_client {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::net::SocketAddr;
    use std::sync::Arc;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Accepts whatever certificate is presented, like `insecureSkipVerify: true`; signatures
    /// are still checked, so the server must hold the key.
    #[derive(Debug)]
    struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

    impl ServerCertVerifier for AcceptAny {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp_response: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    /// How the client checks the server.
    pub(crate) enum Trust<'a> {
        /// Prometheus' `insecureSkipVerify: true`.
        Any,
        /// Verify against this certificate for this name.
        Cert(&'a CertificateDer<'static>, &'a str),
    }

    /// What a scrape saw.
    pub(crate) struct Scrape {
        /// Status line, headers and body.
        pub response: String,
        /// The negotiated TLS version.
        pub version: rustls::ProtocolVersion,
        /// The certificate the server presented.
        pub peer_cert: CertificateDer<'static>,
    }

    /// `GET path` over TLS; `versions` limits what the client offers (e.g. TLS 1.3 only, as the
    /// ServiceMonitor's `minVersion: TLS13`).
    pub(crate) async fn https_get(
        addr: SocketAddr,
        path: &str,
        trust: Trust<'_>,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Result<Scrape, std::io::Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .unwrap();
        let (config, name) = match trust {
            Trust::Any => (
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
                    .with_no_client_auth(),
                "metrics.invalid".to_owned(),
            ),
            Trust::Cert(cert, name) => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(cert.clone()).unwrap();
                (
                    builder.with_root_certificates(roots).with_no_client_auth(),
                    name.to_owned(),
                )
            }
        };
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let mut tls = connector.connect(ServerName::try_from(name).unwrap(), tcp).await?;
        let (_, conn) = tls.get_ref();
        let version = conn.protocol_version().unwrap();
        let peer_cert = conn.peer_certificates().unwrap()[0].clone().into_owned();
        tls.write_all(format!("GET {path} HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n").as_bytes())
            .await?;
        let mut response = String::new();
        // Servers may close without close_notify; what was read is what counts.
        let _ = tls.read_to_string(&mut response).await;
        Ok(Scrape {
            response,
            version,
            peer_cert,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::test_client::{Trust, https_get};
    use super::*;
    use hpp_webhook::tls::{resolve_overrides, start_policy};
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::registry::Registry;

    fn names() -> SelfSignedNames {
        SelfSignedNames {
            pod_ip: Some("10.128.0.7".into()),
            namespace: Some("hpp-ns".into()),
            service: Some("hpp-prometheus-metrics".into()),
        }
    }

    #[test]
    fn sans_are_kubevirts() {
        assert_eq!(
            names().sans(),
            [
                "localhost",
                "127.0.0.1",
                "10.128.0.7",
                "10-128-0-7.hpp-ns.pod.cluster.local",
                "hpp-prometheus-metrics",
                "hpp-prometheus-metrics.hpp-ns",
                "hpp-prometheus-metrics.hpp-ns.svc",
                "hpp-prometheus-metrics.hpp-ns.svc.cluster.local",
            ]
        );
        let v6 = SelfSignedNames {
            pod_ip: Some("fd00::5".into()),
            namespace: Some("n".into()),
            service: None,
        };
        assert_eq!(v6.sans()[3], "fd00--5.n.pod.cluster.local");
        // Missing or unusable values are left out, never an invalid name.
        let bare = SelfSignedNames {
            pod_ip: Some("not-an-ip".into()),
            namespace: None,
            service: Some(String::new()),
        };
        assert_eq!(bare.sans(), ["localhost", "127.0.0.1"]);
    }

    fn policy(min: &str) -> PolicyWatch {
        start_policy(resolve_overrides(Some(min), None).unwrap(), None)
    }

    async fn start(tls: MetricsTls) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let mut registry = Registry::default();
        let counter: Counter = Counter::default();
        registry.register("scrapes_seen", "Test counter", counter.clone());
        counter.inc();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let router = crate::admin::metrics_router(Arc::new(registry));
        tokio::spawn(serve(listener, router, Arc::new(tls), async move {
            let _ = rx.await;
        }));
        (addr, tx)
    }

    #[tokio::test]
    async fn self_signed_is_served_and_valid_for_the_service_names() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let tls = MetricsTls::new(policy("VersionTLS12"), None, None, &names()).unwrap();
        let cert = tls.self_signed_cert().unwrap().clone();
        let (addr, _stop) = start(tls).await;
        // Prometheus' way: insecureSkipVerify, TLS 1.3 only (the ServiceMonitor's minVersion).
        let scrape = https_get(addr, "/metrics", Trust::Any, &[&rustls::version::TLS13])
            .await
            .unwrap();
        assert!(scrape.response.starts_with("HTTP/1.1 200"), "{}", scrape.response);
        assert!(scrape.response.contains("scrapes_seen_total 1"), "{}", scrape.response);
        assert_eq!(scrape.peer_cert, cert);
        // A verifying client trusting the generated certificate accepts every Service name.
        for name in ["hpp-prometheus-metrics.hpp-ns.svc", "localhost", "10.128.0.7"] {
            let s = https_get(addr, "/metrics", Trust::Cert(&cert, name), &[&rustls::version::TLS13])
                .await
                .unwrap();
            assert!(s.response.starts_with("HTTP/1.1 200"), "{name}: {}", s.response);
        }
        assert!(
            https_get(
                addr,
                "/metrics",
                Trust::Cert(&cert, "elsewhere.example"),
                &[&rustls::version::TLS13]
            )
            .await
            .is_err()
        );
        // The policy allows TLS 1.2 too.
        let s = https_get(addr, "/metrics", Trust::Any, &[&rustls::version::TLS12])
            .await
            .unwrap();
        assert_eq!(s.version, rustls::ProtocolVersion::TLSv1_2);
    }

    #[tokio::test]
    async fn tls13_policy_refuses_tls12_clients() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let tls = MetricsTls::new(policy("VersionTLS13"), None, None, &SelfSignedNames::default()).unwrap();
        let (addr, _stop) = start(tls).await;
        assert!(
            https_get(addr, "/metrics", Trust::Any, &[&rustls::version::TLS12])
                .await
                .is_err()
        );
        let s = https_get(addr, "/metrics", Trust::Any, &[&rustls::version::TLS13])
            .await
            .unwrap();
        assert_eq!(s.version, rustls::ProtocolVersion::TLSv1_3);
    }

    #[tokio::test]
    async fn certificate_files_are_served_and_reloaded() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let write = |name: &str| {
            let ck = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
            std::fs::write(&cert_path, ck.cert.pem()).unwrap();
            std::fs::write(&key_path, ck.signing_key.serialize_pem()).unwrap();
            ck.cert.der().clone()
        };
        let first = write("first.example");
        let tls = MetricsTls::new(
            policy("VersionTLS13"),
            Some(cert_path.clone()),
            Some(key_path.clone()),
            &names(),
        )
        .unwrap();
        assert!(tls.self_signed_cert().is_none());
        let (addr, _stop) = start(tls).await;
        let s = https_get(
            addr,
            "/metrics",
            Trust::Cert(&first, "first.example"),
            &[&rustls::version::TLS13],
        )
        .await
        .unwrap();
        assert!(s.response.starts_with("HTTP/1.1 200"), "{}", s.response);
        let second = write("second.example");
        let s = https_get(addr, "/metrics", Trust::Any, &[&rustls::version::TLS13])
            .await
            .unwrap();
        assert_eq!(s.peer_cert, second, "rotated certificate served without a restart");
        // Unreadable files fail start-up.
        let missing = MetricsTls::new(
            policy("VersionTLS13"),
            Some(dir.path().join("nope.crt")),
            Some(key_path),
            &names(),
        );
        assert!(missing.is_err());
    }

    #[tokio::test]
    async fn only_one_file_falls_back_to_self_signed() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let tls = MetricsTls::new(policy("VersionTLS13"), Some("/nonexistent.crt".into()), None, &names()).unwrap();
        assert!(tls.self_signed_cert().is_some());
    }
}
