//! What the webhook needs to know about the cluster: whether a HostPathProvisioner already exists
//! and how many PersistentVolumes hpp provisioned. Behind a trait so that tests (and a webhook
//! started without a cluster) do not need an API server.

use std::sync::Mutex;

use async_trait::async_trait;
use hpp_api::constants::{ANNOTATION_PROVISIONED_BY, DRIVER_NAME, LEGACY_PROVISIONER_NAME};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, ListParams};

/// A cluster lookup failed; the webhook denies rather than guessing.
#[derive(Debug, thiserror::Error)]
#[error("cluster lookup failed: {0}")]
pub struct ClusterError(pub String);

/// Read-only view of the cluster state the admission rules depend on.
#[async_trait]
pub trait ClusterState: Send + Sync {
    /// Names of every HostPathProvisioner currently stored.
    async fn hostpath_provisioners(&self) -> Result<Vec<String>, ClusterError>;
    /// Number of PersistentVolumes provisioned by hpp (see [`is_hpp_volume`]).
    async fn hpp_volume_count(&self) -> Result<usize, ClusterError>;
}

/// Whether hpp provisioned this volume: the CSI driver owns it, or the CSI driver or the legacy
/// provisioner wrote the `pv.kubernetes.io/provisioned-by` annotation.
pub fn is_hpp_volume(pv: &PersistentVolume) -> bool {
    let by_driver = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .is_some_and(|csi| csi.driver == DRIVER_NAME);
    let by_annotation = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_PROVISIONED_BY))
        .is_some_and(|p| p == DRIVER_NAME || p == LEGACY_PROVISIONER_NAME);
    by_driver || by_annotation
}

/// [`ClusterState`] backed by the API server.
#[derive(Clone)]
pub struct KubeClusterState {
    client: kube::Client,
}

impl KubeClusterState {
    /// Reads through `client` on every call (admission requests for the CR are rare).
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

/// Page size for PV listings, so huge clusters are read in bounded chunks.
const PAGE_SIZE: u32 = 500;

#[async_trait]
impl ClusterState for KubeClusterState {
    async fn hostpath_provisioners(&self) -> Result<Vec<String>, ClusterError> {
        let api: Api<hpp_api::HostPathProvisioner> = Api::all(self.client.clone());
        let list = api
            .list_metadata(&ListParams::default())
            .await
            .map_err(|e| ClusterError(format!("listing HostPathProvisioners: {e}")))?;
        Ok(list.items.into_iter().filter_map(|o| o.metadata.name).collect())
    }

    async fn hpp_volume_count(&self) -> Result<usize, ClusterError> {
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let mut params = ListParams::default().limit(PAGE_SIZE);
        let mut count = 0;
        loop {
            let page = api
                .list(&params)
                .await
                .map_err(|e| ClusterError(format!("listing PersistentVolumes: {e}")))?;
            count += page.items.iter().filter(|pv| is_hpp_volume(pv)).count();
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => return Ok(count),
            }
        }
    }
}

/// [`ClusterState`] held in memory, for tests and embedding.
#[derive(Default)]
pub struct InMemoryClusterState {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    provisioners: Vec<String>,
    volumes: Vec<PersistentVolume>,
    failure: Option<String>,
}

impl InMemoryClusterState {
    /// An empty cluster.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        let mut guard = match self.inner.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut guard)
    }

    /// Records a stored HostPathProvisioner.
    pub fn add_provisioner(&self, name: &str) {
        self.with(|i| i.provisioners.push(name.to_string()));
    }

    /// Forgets every stored HostPathProvisioner.
    pub fn clear_provisioners(&self) {
        self.with(|i| i.provisioners.clear());
    }

    /// Records a PersistentVolume (hpp's or anyone else's).
    pub fn add_volume(&self, pv: PersistentVolume) {
        self.with(|i| i.volumes.push(pv));
    }

    /// Forgets every PersistentVolume.
    pub fn clear_volumes(&self) {
        self.with(|i| i.volumes.clear());
    }

    /// Makes every lookup fail with `message` (None heals it), to test fail-closed behaviour.
    pub fn set_failure(&self, message: Option<&str>) {
        self.with(|i| i.failure = message.map(str::to_string));
    }
}

#[async_trait]
impl ClusterState for InMemoryClusterState {
    async fn hostpath_provisioners(&self) -> Result<Vec<String>, ClusterError> {
        self.with(|i| match &i.failure {
            Some(f) => Err(ClusterError(f.clone())),
            None => Ok(i.provisioners.clone()),
        })
    }

    async fn hpp_volume_count(&self) -> Result<usize, ClusterError> {
        self.with(|i| match &i.failure {
            Some(f) => Err(ClusterError(f.clone())),
            None => Ok(i.volumes.iter().filter(|pv| is_hpp_volume(pv)).count()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec};
    use kube::api::ObjectMeta;

    fn pv(driver: Option<&str>, provisioned_by: Option<&str>) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                annotations: provisioned_by.map(|p| [(ANNOTATION_PROVISIONED_BY.to_string(), p.to_string())].into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                csi: driver.map(|d| CSIPersistentVolumeSource {
                    driver: d.to_string(),
                    volume_handle: "v".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn recognises_hpp_volumes() {
        assert!(is_hpp_volume(&pv(Some(DRIVER_NAME), None)));
        assert!(is_hpp_volume(&pv(None, Some(LEGACY_PROVISIONER_NAME))));
        assert!(is_hpp_volume(&pv(None, Some(DRIVER_NAME))));
        assert!(!is_hpp_volume(&pv(Some("ebs.csi.aws.com"), Some("ebs.csi.aws.com"))));
        assert!(!is_hpp_volume(&pv(None, None)));
    }

    #[tokio::test]
    async fn in_memory_counts_and_fails() {
        let state = InMemoryClusterState::new();
        state.add_volume(pv(Some(DRIVER_NAME), None));
        state.add_volume(pv(Some("other"), None));
        state.add_provisioner("hpp");
        assert_eq!(state.hpp_volume_count().await.unwrap(), 1);
        assert_eq!(state.hostpath_provisioners().await.unwrap(), ["hpp"]);
        state.set_failure(Some("boom"));
        assert!(state.hpp_volume_count().await.is_err());
    }
}
