//! Test kit: claim in-use protection (the pvc-protection finalizer and its controller) and the
//! immutable volume source of a PersistentVolume.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use hpp_testkit::FakeApiServer;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const PROTECTION: &str = "kubernetes.io/pvc-protection";

fn claim(name: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap()
}

fn pod(name: &str, volumes: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"containers": [{"name": "c", "image": "i"}], "volumes": volumes},
    }))
    .unwrap()
}

fn uses(claim: &str) -> serde_json::Value {
    json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}])
}

#[tokio::test]
async fn without_the_switch_claims_get_no_finalizer() {
    let fake = FakeApiServer::new();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(fake.client(), "ns");
    let made = api.create(&PostParams::default(), &claim("a")).await.unwrap();
    assert!(made.metadata.finalizers.is_none());
    api.create(&PostParams::default(), &claim("b")).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(fake.client(), "ns");
    pods.create(&PostParams::default(), &pod("p", uses("b"))).await.unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();
    assert!(api.get_opt("b").await.unwrap().is_none(), "no protection: gone at once");
}

#[tokio::test]
async fn an_unused_claim_is_deleted_at_once_and_a_used_one_waits_for_its_last_pod() {
    let fake = FakeApiServer::new();
    fake.protect_claims_in_use();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(fake.client(), "ns");
    let made = api.create(&PostParams::default(), &claim("free")).await.unwrap();
    assert_eq!(made.metadata.finalizers, Some(vec![PROTECTION.to_owned()]));
    api.delete("free", &DeleteParams::default()).await.unwrap();
    assert!(api.get_opt("free").await.unwrap().is_none());

    api.create(&PostParams::default(), &claim("used")).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(fake.client(), "ns");
    pods.create(&PostParams::default(), &pod("one", uses("used")))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("two", uses("used")))
        .await
        .unwrap();
    // A pod of another namespace naming the same claim name does not hold it.
    let mut elsewhere = pod("three", uses("used"));
    elsewhere.metadata.namespace = Some("other".into());
    Api::<Pod>::namespaced(fake.client(), "other")
        .create(&PostParams::default(), &elsewhere)
        .await
        .unwrap();
    api.delete("used", &DeleteParams::default()).await.unwrap();
    let held = api.get("used").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(held.metadata.finalizers, Some(vec![PROTECTION.to_owned()]));

    pods.delete("one", &DeleteParams::default()).await.unwrap();
    assert!(api.get_opt("used").await.unwrap().is_some(), "pod two still uses it");
    pods.delete("two", &DeleteParams::default()).await.unwrap();
    assert!(
        api.get_opt("used").await.unwrap().is_none(),
        "no pod left: the claim goes"
    );
}

#[tokio::test]
async fn finished_pods_and_ephemeral_claims_follow_the_controllers_rules() {
    let fake = FakeApiServer::new();
    fake.protect_claims_in_use();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(fake.client(), "ns");
    let pods: Api<Pod> = Api::namespaced(fake.client(), "ns");
    // A generic ephemeral volume's claim is `<pod>-<volume>`.
    api.create(&PostParams::default(), &claim("web-0-scratch"))
        .await
        .unwrap();
    let ephemeral = json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]);
    pods.create(&PostParams::default(), &pod("web-0", ephemeral))
        .await
        .unwrap();
    api.delete("web-0-scratch", &DeleteParams::default()).await.unwrap();
    assert!(api.get_opt("web-0-scratch").await.unwrap().is_some());
    // The pod finishing (Succeeded) releases it, as the kubelet's status write would.
    assert!(fake.set_status::<Pod>(Some("ns"), "web-0", json!({"phase": "Succeeded"})));
    assert!(api.get_opt("web-0-scratch").await.unwrap().is_none());

    // A seeded claim is protected too, and the fake's own removal follows the same rule.
    fake.seed(&claim("seeded"));
    fake.seed(&pod("job", uses("seeded")));
    assert!(fake.remove::<PersistentVolumeClaim>(Some("ns"), "seeded"));
    assert!(fake.get::<PersistentVolumeClaim>(Some("ns"), "seeded").is_some());
    assert!(fake.remove::<Pod>(Some("ns"), "job"));
    assert!(fake.get::<PersistentVolumeClaim>(Some("ns"), "seeded").is_none());
}

#[tokio::test]
async fn a_persistent_volumes_source_is_immutable() {
    let fake = FakeApiServer::new();
    let api: Api<PersistentVolume> = Api::all(fake.client());
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pv"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "hostPath": {"path": "/var/hpvolumes/pv"}, "persistentVolumeReclaimPolicy": "Delete"},
    }))
    .unwrap();
    api.create(&PostParams::default(), &pv).await.unwrap();
    let err = api
        .patch(
            "pv",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hostPath": {"path": "/elsewhere"}}})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 422 && s.message.contains("spec.hostPath")),
        "{err}"
    );
    // The reclaim policy is not part of the source.
    api.patch(
        "pv",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}})),
    )
    .await
    .unwrap();
}
