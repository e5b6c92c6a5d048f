//! Shared helpers: a throw-away CA, a webhook on 127.0.0.1:0 over real TLS, and a client.
#![allow(dead_code)] // each test file uses a different subset

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hpp_webhook::cluster::ClusterState;
use hpp_webhook::metrics::Metrics;
use hpp_webhook::tls::{AcceptorSource, CertStore, TlsPolicy};
use hpp_webhook::{ServerOptions, Webhook};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore, SupportedProtocolVersion};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A CA that signs serving certificates for `localhost`.
pub struct Pki {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate in PEM.
    pub ca_pem: String,
}

impl Pki {
    pub fn new(common_name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Self {
            ca_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A fresh serving certificate (PEM chain, PEM key) for `localhost` with this CN.
    pub fn issue(&self, common_name: &str) -> (String, String) {
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, common_name);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Writes `tls.crt` and `tls.key` atomically (temp file + rename), as a rotation would.
pub fn write_pair(dir: &Path, cert_pem: &str, key_pem: &str) {
    for (name, content) in [("tls.key", key_pem), ("tls.crt", cert_pem)] {
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, content).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
    }
}

/// A running webhook.
pub struct Server {
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub pki: Pki,
    pub policy: watch::Sender<TlsPolicy>,
    pub metrics: Metrics,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

pub struct ServerBuilder {
    cluster: Option<Arc<dyn ClusterState>>,
    policy: TlsPolicy,
    options: ServerOptions,
    write_cert: bool,
}

impl Default for ServerBuilder {
    fn default() -> Self {
        Self {
            cluster: None,
            policy: TlsPolicy::default(),
            options: ServerOptions::default(),
            write_cert: true,
        }
    }
}

impl ServerBuilder {
    pub fn cluster(mut self, cluster: Arc<dyn ClusterState>) -> Self {
        self.cluster = Some(cluster);
        self
    }
    pub fn policy(mut self, policy: TlsPolicy) -> Self {
        self.policy = policy;
        self
    }
    pub fn options(mut self, options: ServerOptions) -> Self {
        self.options = options;
        self
    }
    pub fn without_cert(mut self) -> Self {
        self.write_cert = false;
        self
    }

    pub async fn start(self) -> Server {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new("hpp test CA");
        if self.write_cert {
            let (cert, key) = pki.issue("first");
            write_pair(dir.path(), &cert, &key);
        }
        let (policy_tx, policy_rx) = watch::channel(self.policy);
        let certs = Arc::new(CertStore::in_dir(dir.path()));
        let metrics = Metrics::default();
        let webhook = Webhook {
            cluster: self.cluster,
            tls: Arc::new(AcceptorSource::new(policy_rx, certs)),
            options: self.options,
            metrics: metrics.clone(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(webhook.serve(listener, async move {
            let _ = stopped.await;
        }));
        Server {
            addr,
            dir,
            pki,
            policy: policy_tx,
            metrics,
            stop: Some(stop),
            task: Some(task),
        }
    }
}

impl Server {
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    pub fn cert_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// A client trusting this server's CA, with every version and the ring suites.
    pub fn client(&self) -> ClientConfig {
        client_config(&self.pki.ca_pem, rustls::DEFAULT_VERSIONS, None)
    }

    pub async fn post(&self, path: &str, body: impl Into<Bytes>) -> (u16, Value) {
        post(self.addr, self.client(), path, body.into()).await.unwrap()
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let mut sender = connect_http(self.addr, self.client()).await.unwrap();
        let req = http::Request::get(path)
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Stops the server and waits for it to drain.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

pub fn client_config(
    ca_pem: &str,
    versions: &[&'static SupportedProtocolVersion],
    suites: Option<Vec<rustls::SupportedCipherSuite>>,
) -> ClientConfig {
    use rustls::pki_types::pem::PemObject;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut provider = rustls::crypto::ring::default_provider();
    if let Some(suites) = suites {
        provider.cipher_suites = suites;
    }
    let mut config = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

/// Completes a TLS handshake and returns the stream.
pub async fn handshake(addr: SocketAddr, config: ClientConfig) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").unwrap();
    TlsConnector::from(Arc::new(config)).connect(name, tcp).await
}

/// The leaf certificate the server presented.
pub async fn served_cert(addr: SocketAddr, config: ClientConfig) -> std::io::Result<CertificateDer<'static>> {
    let stream = handshake(addr, config).await?;
    let (_, conn) = stream.get_ref();
    Ok(conn.peer_certificates().unwrap()[0].clone().into_owned())
}

/// The first certificate of a PEM chain, as DER.
pub fn leaf_der(cert_pem: &str) -> CertificateDer<'static> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap()
}

pub type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

pub async fn connect_http(addr: SocketAddr, config: ClientConfig) -> std::io::Result<Sender> {
    let stream = handshake(addr, config).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

pub async fn post(addr: SocketAddr, config: ClientConfig, path: &str, body: Bytes) -> std::io::Result<(u16, Value)> {
    let mut sender = connect_http(addr, config).await?;
    let req = http::Request::post(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap();
    let resp = sender.send_request(req).await.map_err(std::io::Error::other)?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("response is not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
    Ok((status, value))
}
