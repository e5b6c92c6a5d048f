//! The validating and conversion admission webhook for `HostPathProvisioner`, served over rustls.
//!
//! - [`admission`]: AdmissionReview v1/v1beta1 → `hpp-api` validation, the singleton rule and
//!   the delete guard (via [`cluster::ClusterState`]).
//! - [`conversion`]: ConversionReview → `hpp-api` lossless v1alpha1 ⇄ v1beta1 conversion.
//! - [`tls`]: crypto policy (env overrides, OpenShift `tlsSecurityProfile`, Intermediate default),
//!   certificate reloading and per-connection acceptors.
//! - [`server`]: the accept loop and routes.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use hpp_webhook::{Webhook, ServerOptions, metrics::Metrics, tls};
//!
//! let policy = tls::start_policy(tls::resolve_overrides(None, None)?, None);
//! let certs = Arc::new(tls::CertStore::in_dir("/tmp/k8s-webhook-server/serving-certs".as_ref()));
//! let webhook = Webhook {
//!     cluster: None,
//!     tls: Arc::new(tls::AcceptorSource::new(policy, certs)),
//!     options: ServerOptions::default(),
//!     metrics: Metrics::default(),
//! };
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:9443").await?;
//! webhook.serve(listener, std::future::pending()).await;
//! # Ok(()) }
//! ```

pub mod admission;
pub mod cluster;
pub mod conversion;
pub mod manifests;
pub mod metrics;
pub mod names;
pub mod reply;
pub mod server;
pub mod tls;

pub use server::{ServerOptions, Webhook};
