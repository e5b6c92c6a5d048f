//! Asking the drivers for their reports: `GET /volumes` over HTTPS with the bearer token, one
//! connection per request, a bounded number at once, each within a timeout. The server's
//! certificate is not verified (the driver's is self-signed, as Prometheus' scrape of the same
//! port accepts it); the handshake's signatures still are, and what travels is the token, which
//! only opens this report.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hpp_api::inventory::Inventory;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_util::task::AbortOnDropHandle;

/// Largest report body read (a node with 100,000 volumes sends about 10 MB).
pub const MAX_REPORT_BYTES: usize = 64 * 1024 * 1024;

/// Why a node's report could not be had; the text is what status and the condition show.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No TCP connection.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// Where.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The TLS handshake failed.
    #[error("TLS handshake with {addr} failed: {source}")]
    Tls {
        /// Where.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error("HTTP request to {addr} failed: {source}")]
    Http {
        /// Where.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: hyper::Error,
    },
    /// The driver answered with an error status.
    #[error("{addr} answered HTTP {status}{hint}")]
    Status {
        /// Where.
        addr: SocketAddr,
        /// The status.
        status: http::StatusCode,
        /// What it usually means.
        hint: &'static str,
    },
    /// The body is not a report.
    #[error("{addr} sent a body that is not a volume report: {detail}")]
    Body {
        /// Where.
        addr: SocketAddr,
        /// Why.
        detail: String,
    },
    /// No answer in time.
    #[error("{addr} did not answer within {}s", .timeout.as_secs())]
    Timeout {
        /// Where.
        addr: SocketAddr,
        /// The limit.
        timeout: Duration,
    },
    /// The request could not be built (a bad token).
    #[error("cannot build the request: {0}")]
    Request(String),
}

/// Accepts the server's certificate without checking who signed it (the drivers' certificates
/// are self-signed), but still checks the handshake's signatures with the provider's algorithms.
#[derive(Debug)]
struct AnyServerCertificate(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for AnyServerCertificate {
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
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// The ring provider, the one compiled into the workspace.
pub(crate) fn provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// A client for the drivers' reports.
#[derive(Clone)]
pub struct ReportClient {
    tls: TlsConnector,
    authorization: http::HeaderValue,
    timeout: Duration,
}

impl std::fmt::Debug for ReportClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReportClient").field("timeout", &self.timeout).finish()
    }
}

impl ReportClient {
    /// A client presenting `token`, giving each request `timeout` (connect, handshake, answer
    /// and body together).
    pub fn new(token: &str, timeout: Duration) -> Result<Self, FetchError> {
        let provider = provider();
        let algorithms = provider.signature_verification_algorithms;
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| FetchError::Request(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServerCertificate(algorithms)))
            .with_no_client_auth();
        let authorization = http::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| FetchError::Request("the token is not a valid header value".into()))?;
        Ok(ReportClient {
            tls: TlsConnector::from(Arc::new(config)),
            authorization,
            timeout,
        })
    }

    /// `GET target` (a path and query such as `/volumes?usage=a,b`) from `addr`.
    pub async fn get(&self, addr: SocketAddr, target: &str) -> Result<Inventory, FetchError> {
        tokio::time::timeout(self.timeout, self.exchange(addr, target))
            .await
            .unwrap_or(Err(FetchError::Timeout {
                addr,
                timeout: self.timeout,
            }))
    }

    async fn exchange(&self, addr: SocketAddr, target: &str) -> Result<Inventory, FetchError> {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|source| FetchError::Connect { addr, source })?;
        let tls = self
            .tls
            .connect(ServerName::IpAddress(addr.ip().into()), tcp)
            .await
            .map_err(|source| FetchError::Tls { addr, source })?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|source| FetchError::Http { addr, source })?;
        // Drives the connection until the answer is read. Aborted when this future is
        // dropped too (the caller's timeout): a peer that never answers nor closes would
        // otherwise keep the task and its socket for good.
        let _driver = AbortOnDropHandle::new(tokio::spawn(connection));
        let request = http::Request::get(target)
            .header(http::header::HOST, addr.to_string())
            .header(http::header::AUTHORIZATION, self.authorization.clone())
            .header(http::header::ACCEPT, "application/json")
            .body(Empty::<Bytes>::new())
            .map_err(|e| FetchError::Request(e.to_string()))?;
        async {
            let response = sender
                .send_request(request)
                .await
                .map_err(|source| FetchError::Http { addr, source })?;
            let status = response.status();
            if !status.is_success() {
                return Err(FetchError::Status {
                    addr,
                    status,
                    hint: status_hint(status),
                });
            }
            let body = Limited::new(response.into_body(), MAX_REPORT_BYTES)
                .collect()
                .await
                .map_err(|e| FetchError::Body {
                    addr,
                    detail: e.to_string(),
                })?
                .to_bytes();
            serde_json::from_slice(&body).map_err(|e| FetchError::Body {
                addr,
                detail: e.to_string(),
            })
        }
        .await
    }
}

/// What an error status of the report usually means.
fn status_hint(status: http::StatusCode) -> &'static str {
    match status.as_u16() {
        401 => " (the driver holds another token: its Secret changed and kubelet has not refreshed the file yet)",
        404 => " (the driver runs without --volume-report-token-file)",
        503 => " (the driver cannot read its token file, or its report did not finish in time)",
        _ => "",
    }
}

/// Asks every `(node, address, target)` at most `concurrency` at a time; the answers come back
/// in the order given.
pub async fn fetch_all(
    client: &ReportClient,
    requests: Vec<(String, SocketAddr, String)>,
    concurrency: usize,
) -> Vec<(String, Result<Inventory, FetchError>)> {
    futures::stream::iter(requests)
        .map(|(node, addr, target)| async move {
            let answer = client.get(addr, &target).await;
            (node, answer)
        })
        .buffered(concurrency.max(1))
        .collect()
        .await
}

/// The address of a driver's report listener.
pub fn address(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}
