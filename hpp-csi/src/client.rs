//! Connecting a tonic client to a driver endpoint, unix socket included (used by tests, the
//! benchmark and the `hpp-csi-driver` client subcommands).

use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Uri};

use crate::endpoint::Endpoint;

/// Failure to connect.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The TCP address does not form a URI.
    #[error("invalid address {0:?}")]
    InvalidAddress(String),
    /// Connecting failed.
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
}

/// Opens a gRPC channel to `endpoint`.
pub async fn connect(endpoint: &Endpoint) -> Result<Channel, ConnectError> {
    match endpoint {
        Endpoint::Unix(path) => {
            let path: PathBuf = path.clone();
            // The URI is required by the API but ignored by the connector.
            let ep = tonic::transport::Endpoint::from_static("http://[::]:50051");
            Ok(ep
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
                }))
                .await?)
        }
        Endpoint::Tcp(addr) => {
            let ep = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .map_err(|_| ConnectError::InvalidAddress(addr.clone()))?;
            Ok(ep.connect().await?)
        }
    }
}
