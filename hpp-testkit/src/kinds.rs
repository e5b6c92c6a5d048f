//! The kinds the fake serves: built-in Kubernetes kinds plus whatever tests register.

use std::collections::BTreeMap;

use k8s_openapi::api::{apps, batch, coordination, core, events, rbac, storage};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiextensions;
use kube::Resource;
use kube::core::ApiResource;

/// What the fake knows about one served kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KindInfo {
    /// Group, version, kind and plural.
    pub ar: ApiResource,
    /// Namespaced (true) or cluster-scoped (false).
    pub namespaced: bool,
    /// Whether `/status` is a separate subresource for this kind.
    pub status: bool,
    /// A custom resource (registered by a test): strategic merge patch is refused with 415,
    /// as the real server does for CRDs.
    pub custom: bool,
}

/// Served kinds keyed by (group, version, plural).
#[derive(Debug, Default)]
pub(crate) struct Kinds {
    by_gvp: BTreeMap<(String, String, String), KindInfo>,
}

impl Kinds {
    /// The built-in kinds the operator and provisioners use, with their real scope and
    /// status-subresource setting.
    pub(crate) fn builtin() -> Self {
        let mut kinds = Self::default();
        macro_rules! add {
            ($($ty:ty => $ns:expr, $status:expr;)*) => {
                $(kinds.insert(KindInfo { ar: ApiResource::erase::<$ty>(&()), namespaced: $ns, status: $status, custom: false });)*
            };
        }
        add! {
            core::v1::Pod => true, true;
            core::v1::Node => false, true;
            core::v1::Namespace => false, true;
            core::v1::Service => true, true;
            core::v1::ServiceAccount => true, false;
            core::v1::ConfigMap => true, false;
            core::v1::Secret => true, false;
            core::v1::Event => true, false;
            core::v1::PersistentVolume => false, true;
            core::v1::PersistentVolumeClaim => true, true;
            core::v1::Endpoints => true, false;
            apps::v1::DaemonSet => true, true;
            apps::v1::Deployment => true, true;
            apps::v1::ReplicaSet => true, true;
            apps::v1::StatefulSet => true, true;
            rbac::v1::ClusterRole => false, false;
            rbac::v1::ClusterRoleBinding => false, false;
            rbac::v1::Role => true, false;
            rbac::v1::RoleBinding => true, false;
            storage::v1::StorageClass => false, false;
            storage::v1::CSIDriver => false, false;
            storage::v1::CSINode => false, false;
            storage::v1::CSIStorageCapacity => true, false;
            storage::v1::VolumeAttachment => false, true;
            batch::v1::Job => true, true;
            coordination::v1::Lease => true, false;
            events::v1::Event => true, false;
            apiextensions::CustomResourceDefinition => false, true;
        }
        kinds
    }

    /// Adds or replaces a kind.
    pub(crate) fn insert(&mut self, info: KindInfo) {
        let key = (info.ar.group.clone(), info.ar.version.clone(), info.ar.plural.clone());
        self.by_gvp.insert(key, info);
    }

    /// Stops serving (group, version, plural).
    pub(crate) fn remove(&mut self, group: &str, version: &str, plural: &str) {
        self.by_gvp
            .remove(&(group.to_string(), version.to_string(), plural.to_string()));
    }

    /// The kind served at (group, version, plural).
    pub(crate) fn get(&self, group: &str, version: &str, plural: &str) -> Option<&KindInfo> {
        self.by_gvp
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
    }

    /// The kind for a typed resource, registered or not.
    pub(crate) fn for_type<K: Resource<DynamicType = ()>>(&self) -> Option<&KindInfo> {
        self.get(&K::group(&()), &K::version(&()), &K::plural(&()))
    }

    /// Any served version of (group, plural): objects are stored per group and plural, so a
    /// GC or typed lookup does not depend on the version it was written with.
    pub(crate) fn any_version(&self, group: &str, plural: &str) -> Option<&KindInfo> {
        self.by_gvp
            .values()
            .find(|k| k.ar.group == group && k.ar.plural == plural)
    }

    /// Every served kind, sorted by group, version, plural.
    pub(crate) fn all(&self) -> impl Iterator<Item = &KindInfo> {
        self.by_gvp.values()
    }
}
