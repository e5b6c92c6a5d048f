//! The CSI Identity service.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::csi::{self, plugin_capability};
use crate::error::Error;
use crate::service::state::DriverState;

/// Identity service: plugin name and version, capabilities, readiness.
#[derive(Debug, Clone)]
pub struct IdentityService {
    state: Arc<DriverState>,
}

impl IdentityService {
    /// Wraps shared driver state.
    pub fn new(state: Arc<DriverState>) -> Self {
        IdentityService { state }
    }
}

fn service_cap(t: plugin_capability::service::Type) -> csi::PluginCapability {
    csi::PluginCapability {
        r#type: Some(plugin_capability::Type::Service(plugin_capability::Service {
            r#type: t as i32,
        })),
    }
}

#[tonic::async_trait]
impl csi::identity_server::Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _req: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        if self.state.name.is_empty() || self.state.version.is_empty() {
            return Err(Error::Unavailable("driver name or version is not configured".into()).into());
        }
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.state.name.clone(),
            vendor_version: self.state.version.clone(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _req: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use plugin_capability::service::Type;
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: vec![
                service_cap(Type::ControllerService),
                service_cap(Type::VolumeAccessibilityConstraints),
                // Volumes grow while published; see expand.rs.
                csi::PluginCapability {
                    r#type: Some(plugin_capability::Type::VolumeExpansion(
                        plugin_capability::VolumeExpansion {
                            r#type: plugin_capability::volume_expansion::Type::Online as i32,
                        },
                    )),
                },
            ],
        }))
    }

    /// Ready whenever the driver serves. A pool that cannot serve (a guarded pool with nothing
    /// mounted) takes only itself out: zero capacity, a clear CreateVolume error, an abnormal
    /// volume condition and `hpp_pool_usable{pool} 0`. Answering not ready would stop the node's
    /// csi-provisioner, and with it every healthy pool on the node.
    ///
    /// Nothing is measured here: pool health is kept current in the background
    /// ([`crate::service::health::watch`]). Should nothing run it (an embedder composing its own server),
    /// a stale Probe starts a measurement without waiting for it.
    async fn probe(&self, _req: Request<csi::ProbeRequest>) -> Result<Response<csi::ProbeResponse>, Status> {
        crate::service::health::refresh_if_stale(&self.state, self.state.health_interval.saturating_mul(2));
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}
