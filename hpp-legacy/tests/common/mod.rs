//! Fixtures shared by the end-to-end tests: objects, a provisioner against the fake API server,
//! the PV controller's binding steps, and tmpfs mounts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)] // test helpers may fail loudly

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use hpp_api::constants::ANNOTATION_STORAGE_PROVISIONER;
use hpp_legacy::metrics::Metrics;
use hpp_legacy::provisioner::Provisioner;
use hpp_legacy::selinux::Labeler;
use hpp_legacy::{Mode, ProvisionerConfig};
use hpp_testkit::FakeApiServer;
use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{Patch, PatchParams};
use prometheus_client::registry::Registry;
use serde_json::json;

pub fn pairs(p: &[(&str, &str)]) -> BTreeMap<String, String> {
    p.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

pub fn storage_class(
    name: &str,
    provisioner: &str,
    wffc: bool,
    reclaim: &str,
    params: &[(&str, &str)],
) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: provisioner.into(),
        reclaim_policy: Some(reclaim.into()),
        volume_binding_mode: Some(if wffc { "WaitForFirstConsumer" } else { "Immediate" }.into()),
        parameters: (!params.is_empty()).then(|| pairs(params)),
        ..Default::default()
    }
}

pub fn node(name: &str, hostname: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(pairs(&[("kubernetes.io/hostname", hostname)])),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A Pending claim as the PV controller leaves it for an external provisioner.
pub fn claim(
    ns: &str,
    name: &str,
    class: &str,
    provisioner: &str,
    size: &str,
    modes: &[&str],
    extra_annotations: &[(&str, &str)],
) -> PersistentVolumeClaim {
    let mut annotations = pairs(extra_annotations);
    annotations.insert(ANNOTATION_STORAGE_PROVISIONER.into(), provisioner.into());
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(modes.iter().map(|m| (*m).to_owned()).collect()),
            storage_class_name: Some(class.into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_owned(), Quantity(size.into()))])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// Seeds a claim and marks it Pending; returns it as stored (with its uid).
pub fn seed_claim(fake: &FakeApiServer, c: &PersistentVolumeClaim) -> PersistentVolumeClaim {
    let stored = fake.seed(c);
    let (ns, name) = (
        stored.metadata.namespace.clone().unwrap(),
        stored.metadata.name.clone().unwrap(),
    );
    fake.set_status::<PersistentVolumeClaim>(Some(&ns), &name, json!({"phase": "Pending"}));
    fake.get::<PersistentVolumeClaim>(Some(&ns), &name).unwrap()
}

pub fn provisioner(fake: &FakeApiServer, cfg: ProvisionerConfig, scratch: &Path) -> Provisioner {
    provisioner_named(fake, cfg, scratch, "test")
}

pub fn provisioner_named(fake: &FakeApiServer, cfg: ProvisionerConfig, scratch: &Path, instance: &str) -> Provisioner {
    provisioner_with_registry(fake, cfg, scratch, instance).0
}

/// A provisioner and the registry its metrics live in.
pub fn provisioner_with_registry(
    fake: &FakeApiServer,
    cfg: ProvisionerConfig,
    scratch: &Path,
    instance: &str,
) -> (Provisioner, Registry) {
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    let p = Provisioner::new(fake.client(), cfg, metrics, Some(instance.into()))
        .with_labeler(Labeler::new(scratch.join("no-selinux-enforce")));
    (p, registry)
}

/// The registry in OpenMetrics text.
pub fn metrics_text(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
    out
}

pub fn config(mode: Mode, node: Option<&str>, pv_dir: Option<&Path>) -> ProvisionerConfig {
    ProvisionerConfig::new(mode, node.map(str::to_owned), pv_dir.map(Path::to_path_buf))
}

/// What the PV controller does once a PV exists for the claim: bind both sides.
pub async fn bind(fake: &FakeApiServer, ns: &str, claim: &str, pv: &str) {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(fake.client(), ns);
    api.patch(
        claim,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"volumeName": pv}})),
    )
    .await
    .unwrap();
    fake.set_status::<PersistentVolumeClaim>(Some(ns), claim, json!({"phase": "Bound"}));
    fake.set_status::<PersistentVolume>(None, pv, json!({"phase": "Bound"}));
}

/// The user deletes the claim; the PV controller marks the PV Released.
pub fn release(fake: &FakeApiServer, ns: &str, claim: &str, pv: &str) {
    assert!(fake.remove::<PersistentVolumeClaim>(Some(ns), claim));
    assert!(fake.set_status::<PersistentVolume>(None, pv, json!({"phase": "Released"})));
}

pub fn pv(fake: &FakeApiServer, name: &str) -> PersistentVolume {
    fake.get::<PersistentVolume>(None, name).expect("PV exists")
}

pub fn pv_name(c: &PersistentVolumeClaim) -> String {
    format!("pvc-{}", c.metadata.uid.as_deref().unwrap())
}

pub fn host_path(pv: &PersistentVolume) -> PathBuf {
    PathBuf::from(&pv.spec.as_ref().unwrap().host_path.as_ref().unwrap().path)
}

/// Events about `name` with `reason`.
pub fn events_for(fake: &FakeApiServer, name: &str, reason: &str) -> Vec<Event> {
    fake.list::<Event>()
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// The `ProvisioningFailed` Events on claim `name` whose note starts with the specific
/// `reason` (e.g. `RequestTooLarge`).
pub fn refusals_for(fake: &FakeApiServer, name: &str, reason: &str) -> Vec<Event> {
    events_for(fake, name, "ProvisioningFailed")
        .into_iter()
        .filter(|e| e.note.as_deref().is_some_and(|n| n.starts_with(&format!("{reason}: "))))
        .collect()
}

/// A tmpfs mounted on a fresh directory, unmounted on drop.
pub struct Tmpfs {
    pub dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn new(size: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(ok.success(), "mounting tmpfs needs root");
        Tmpfs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Already unmounted by the test is fine.
        let _ = Command::new("umount")
            .arg(self.dir.path())
            .stderr(std::process::Stdio::null())
            .status();
    }
}
