//! Test kit: deletion with finalizers, kube-runtime's finalizer helper and owner-reference GC.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hpp_api::v1beta1::{HostPathProvisioner, HostPathProvisionerSpec};
use hpp_testkit::FakeApiServer;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use kube::{Resource, ResourceExt};
use serde_json::json;

const FINALIZER: &str = "finalizer.delete.hostpath-provisioner";

fn cm(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.metadata.namespace = Some("ns".into());
    cm
}

fn owned_by<K: Resource<DynamicType = ()>>(mut child: ConfigMap, owners: &[&K]) -> ConfigMap {
    child.metadata.owner_references = Some(owners.iter().map(|o| o.controller_owner_ref(&()).unwrap()).collect());
    child
}

#[tokio::test]
async fn delete_without_finalizers_removes_at_once() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let out = api.delete("a", &DeleteParams::default()).await.unwrap();
    assert!(out.is_right(), "a Status is returned for an immediate deletion");
    assert!(api.get_opt("a").await.unwrap().is_none());
    let err = api.delete("a", &DeleteParams::default()).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 404));
}

#[tokio::test]
async fn delete_with_finalizers_sets_deletion_timestamp_until_they_are_removed() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let mut obj = cm("a");
    obj.metadata.finalizers = Some(vec!["example.com/one".into(), "example.com/two".into()]);
    api.create(&PostParams::default(), &obj).await.unwrap();

    let pending = api.delete("a", &DeleteParams::default()).await.unwrap().left().unwrap();
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert_eq!(pending.metadata.deletion_grace_period_seconds, Some(0));

    // No new finalizers while deleting.
    let add = json!({"metadata": {"finalizers": ["example.com/one", "example.com/two", "example.com/three"]}});
    let err = api
        .patch("a", &PatchParams::default(), &Patch::Merge(&add))
        .await
        .unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 422));

    let one = json!({"metadata": {"finalizers": ["example.com/two"]}});
    api.patch("a", &PatchParams::default(), &Patch::Merge(&one))
        .await
        .unwrap();
    assert!(api.get_opt("a").await.unwrap().is_some());
    let none = json!({"metadata": {"finalizers": null}});
    api.patch("a", &PatchParams::default(), &Patch::Merge(&none))
        .await
        .unwrap();
    assert!(
        api.get_opt("a").await.unwrap().is_none(),
        "gone once the last finalizer is removed"
    );
}

#[tokio::test]
async fn remove_helper_honours_finalizers() {
    let fake = FakeApiServer::new();
    let mut obj = cm("a");
    obj.metadata.finalizers = Some(vec!["example.com/f".into()]);
    fake.seed(&obj);
    assert!(fake.remove::<ConfigMap>(Some("ns"), "a"));
    let held = fake.get::<ConfigMap>(Some("ns"), "a").unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let mut current = api.get("a").await.unwrap();
    current.metadata.finalizers = None;
    api.replace("a", &PostParams::default(), &current).await.unwrap();
    assert!(fake.get::<ConfigMap>(Some("ns"), "a").is_none());
    assert!(!fake.remove::<ConfigMap>(Some("ns"), "a"));
}

#[derive(Debug, thiserror::Error)]
#[error("cleanup failed")]
struct CleanupError;

#[tokio::test]
async fn kube_runtime_finalizer_adds_runs_cleanup_and_removes() {
    let fake = FakeApiServer::new();
    fake.register::<HostPathProvisioner>(false, true);
    let api: Api<HostPathProvisioner> = Api::all(fake.client());
    api.create(
        &PostParams::default(),
        &HostPathProvisioner::new("hpp", HostPathProvisionerSpec::default()),
    )
    .await
    .unwrap();
    let cleanups = Arc::new(AtomicUsize::new(0));
    let run = |obj: HostPathProvisioner| {
        let api = api.clone();
        let cleanups = cleanups.clone();
        async move {
            finalizer(&api, FINALIZER, Arc::new(obj), |event| async move {
                match event {
                    Event::Apply(_) => Ok::<_, CleanupError>(Action::await_change()),
                    Event::Cleanup(_) => {
                        cleanups.fetch_add(1, Ordering::SeqCst);
                        Ok(Action::await_change())
                    }
                }
            })
            .await
        }
    };

    // First pass adds the finalizer with a JSON patch (test + add).
    run(api.get("hpp").await.unwrap()).await.unwrap();
    let with_finalizer = api.get("hpp").await.unwrap();
    assert_eq!(with_finalizer.finalizers(), [FINALIZER]);
    let patch = fake.write_requests().into_iter().last().unwrap();
    assert_eq!(patch.content_type.as_deref(), Some("application/json-patch+json"));
    assert_eq!(patch.body[0]["op"], "test");

    // Second pass applies; nothing is written.
    fake.clear_requests();
    run(with_finalizer).await.unwrap();
    assert!(fake.write_requests().is_empty());

    // Deletion: held by the finalizer, cleanup runs, the finalizer goes, the object goes.
    api.delete("hpp", &DeleteParams::default()).await.unwrap();
    let deleting = api.get("hpp").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    run(deleting).await.unwrap();
    assert_eq!(cleanups.load(Ordering::SeqCst), 1);
    assert!(api.get_opt("hpp").await.unwrap().is_none());
}

#[tokio::test]
async fn kube_runtime_finalizer_keeps_other_finalizers() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let mut obj = cm("a");
    obj.metadata.finalizers = Some(vec!["someone.else/f".into()]);
    api.create(&PostParams::default(), &obj).await.unwrap();
    let current = api.get("a").await.unwrap();
    finalizer(&api, FINALIZER, Arc::new(current), |_| async {
        Ok::<_, CleanupError>(Action::await_change())
    })
    .await
    .unwrap();
    assert_eq!(api.get("a").await.unwrap().finalizers(), ["someone.else/f", FINALIZER]);
}

#[tokio::test]
async fn deleting_an_owner_garbage_collects_dependents() {
    let fake = FakeApiServer::new();
    fake.register::<HostPathProvisioner>(false, true);
    let owner = fake.seed(&HostPathProvisioner::new("hpp", HostPathProvisionerSpec::default()));
    let other_owner = fake.seed(&HostPathProvisioner::new("other", HostPathProvisionerSpec::default()));
    fake.seed(&owned_by(cm("only-child"), &[&owner]));
    fake.seed(&owned_by(cm("shared-child"), &[&owner, &other_owner]));
    let mut held = owned_by(cm("held-child"), &[&owner]);
    held.metadata.finalizers = Some(vec!["example.com/f".into()]);
    fake.seed(&held);
    let grandchild = {
        let child: ConfigMap = fake.get(Some("ns"), "only-child").unwrap();
        let mut sa = ServiceAccount::default();
        sa.metadata.name = Some("grandchild".into());
        sa.metadata.namespace = Some("ns".into());
        sa.metadata.owner_references = Some(vec![child.controller_owner_ref(&()).unwrap()]);
        sa
    };
    fake.seed(&grandchild);

    let api: Api<HostPathProvisioner> = Api::all(fake.client());
    api.delete("hpp", &DeleteParams::background()).await.unwrap();

    assert!(fake.get::<ConfigMap>(Some("ns"), "only-child").is_none());
    assert!(
        fake.get::<ServiceAccount>(Some("ns"), "grandchild").is_none(),
        "GC is recursive"
    );
    assert!(
        fake.get::<ConfigMap>(Some("ns"), "shared-child").is_some(),
        "another owner still exists"
    );
    let held = fake.get::<ConfigMap>(Some("ns"), "held-child").unwrap();
    assert!(
        held.metadata.deletion_timestamp.is_some(),
        "finalizers hold dependents too"
    );
}

#[tokio::test]
async fn a_dependent_that_dropped_its_owner_reference_is_not_collected() {
    let fake = FakeApiServer::new();
    fake.register::<HostPathProvisioner>(false, true);
    let owner = fake.seed(&HostPathProvisioner::new("hpp", HostPathProvisionerSpec::default()));
    fake.seed(&owned_by(cm("freed"), &[&owner]));
    fake.seed(&owned_by(cm("kept"), &[&owner]));
    let cms: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let mut freed = cms.get("freed").await.unwrap();
    freed.metadata.owner_references = None;
    freed.metadata.managed_fields = None;
    cms.replace("freed", &Default::default(), &freed).await.unwrap();

    let api: Api<HostPathProvisioner> = Api::all(fake.client());
    api.delete("hpp", &DeleteParams::background()).await.unwrap();

    assert!(
        fake.get::<ConfigMap>(Some("ns"), "kept").is_none(),
        "still owned: collected"
    );
    assert!(
        fake.get::<ConfigMap>(Some("ns"), "freed").is_some(),
        "its owner reference was removed by a write: left alone"
    );
}

#[tokio::test]
async fn orphan_propagation_strips_the_owner_reference() {
    let fake = FakeApiServer::new();
    let mut ds = DaemonSet::default();
    ds.metadata.name = Some("ds".into());
    ds.metadata.namespace = Some("ns".into());
    let ds = fake.seed(&ds);
    let mut other = OwnerReference {
        uid: "unrelated".into(),
        name: "x".into(),
        kind: "Pod".into(),
        api_version: "v1".into(),
        ..Default::default()
    };
    other.controller = Some(false);
    let mut child = owned_by(cm("child"), &[&ds]);
    child.metadata.owner_references.as_mut().unwrap().push(other);
    fake.seed(&child);
    let api: Api<DaemonSet> = Api::namespaced(fake.client(), "ns");
    api.delete("ds", &DeleteParams::orphan()).await.unwrap();
    let child = fake.get::<ConfigMap>(Some("ns"), "child").unwrap();
    let refs = child.metadata.owner_references.unwrap();
    assert_eq!(refs.len(), 1);
    assert_eq!(refs[0].uid, "unrelated");
}

#[tokio::test]
async fn finalizer_held_owner_collects_dependents_when_released() {
    let fake = FakeApiServer::new();
    let mut ds = DaemonSet::default();
    ds.metadata.name = Some("ds".into());
    ds.metadata.namespace = Some("ns".into());
    ds.metadata.finalizers = Some(vec!["example.com/f".into()]);
    let ds = fake.seed(&ds);
    fake.seed(&owned_by(cm("child"), &[&ds]));
    let api: Api<DaemonSet> = Api::namespaced(fake.client(), "ns");
    api.delete("ds", &DeleteParams::default()).await.unwrap();
    assert!(
        fake.get::<ConfigMap>(Some("ns"), "child").is_some(),
        "owner still exists"
    );
    api.patch(
        "ds",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": []}})),
    )
    .await
    .unwrap();
    assert!(fake.get::<DaemonSet>(Some("ns"), "ds").is_none());
    assert!(fake.get::<ConfigMap>(Some("ns"), "child").is_none());
}

#[tokio::test]
async fn delete_collection_deletes_matching_objects() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    for (name, app) in [("a", "hpp"), ("b", "hpp"), ("c", "x")] {
        let mut obj = cm(name);
        obj.metadata.labels = Some([("app".to_string(), app.to_string())].into());
        api.create(&PostParams::default(), &obj).await.unwrap();
    }
    api.delete_collection(&DeleteParams::default(), &ListParams::default().labels("app=hpp"))
        .await
        .unwrap();
    let left: Vec<_> = fake.list::<ConfigMap>().iter().map(|c| c.name_any()).collect();
    assert_eq!(left, ["c"]);
}

#[tokio::test]
async fn delete_preconditions_are_checked() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("wrong".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let err = api.delete("a", &dp).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 409));
    assert!(fake.get::<ConfigMap>(Some("ns"), "a").is_some());
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_contents() {
    use k8s_openapi::api::core::v1::Namespace;
    let fake = FakeApiServer::new();
    let mut ns = Namespace::default();
    ns.metadata.name = Some("ns".into());
    fake.seed(&ns);
    fake.seed(&cm("a"));
    let mut elsewhere = cm("b");
    elsewhere.metadata.namespace = Some("other".into());
    fake.seed(&elsewhere);
    let api: Api<Namespace> = Api::all(fake.client());
    api.delete("ns", &DeleteParams::default()).await.unwrap();
    assert!(fake.get::<ConfigMap>(Some("ns"), "a").is_none());
    assert!(fake.get::<ConfigMap>(Some("other"), "b").is_some());
}

#[tokio::test]
async fn foreground_deletion_waits_for_blocking_dependents() {
    let fake = FakeApiServer::new();
    let mut ds = DaemonSet::default();
    ds.metadata.name = Some("ds".into());
    ds.metadata.namespace = Some("ns".into());
    let ds = fake.seed(&ds);
    let mut held = owned_by(cm("held"), &[&ds]);
    held.metadata.owner_references.as_mut().unwrap()[0].block_owner_deletion = Some(true);
    held.metadata.finalizers = Some(vec!["example.com/f".into()]);
    fake.seed(&held);
    // Not blocking: deleted first, but the owner would not wait for it.
    fake.seed(&owned_by(cm("free"), &[&ds]));

    let api: Api<DaemonSet> = Api::namespaced(fake.client(), "ns");
    let pending = api
        .delete("ds", &DeleteParams::foreground())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert!(pending.finalizers().contains(&"foregroundDeletion".to_string()));
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert!(
        fake.get::<ConfigMap>(Some("ns"), "free").is_none(),
        "dependents go first"
    );
    assert!(
        fake.get::<ConfigMap>(Some("ns"), "held")
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );

    // Releasing the blocking dependent lets the owner go.
    let cms: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(fake.get::<ConfigMap>(Some("ns"), "held").is_none());
    assert!(fake.get::<DaemonSet>(Some("ns"), "ds").is_none());

    // Without dependents, foreground deletion is immediate.
    let mut lone = DaemonSet::default();
    lone.metadata.name = Some("lone".into());
    lone.metadata.namespace = Some("ns".into());
    fake.seed(&lone);
    assert!(
        api.delete("lone", &DeleteParams::foreground())
            .await
            .unwrap()
            .is_right()
    );
}
