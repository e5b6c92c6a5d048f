//! Taking over a running KubeVirt install by changing images only: the CRD is KubeVirt's (no
//! status subresource: `deploy/operator.yaml` of kubevirt/hostpath-provisioner-operator), the CR
//! carries KubeVirt's status (`observedVersion: v0.25.2`), and the operator runs with KubeVirt's
//! Deployment environment (no `OPERATOR_VERSION`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use hpp_api::HostPathProvisioner;
use hpp_reconcile::metrics::Metrics;
use hpp_reconcile::operator::{Context, REASON_STATUS_SUBRESOURCE_MISSING, REASON_STATUS_SUBRESOURCE_PRESENT};
use hpp_reconcile::status::{
    CONDITION_STATUS_SUBRESOURCE, REASON_CRD_WITHOUT_STATUS_SUBRESOURCE, REASON_STATUS_SUBRESOURCE_PRESENT as PRESENT,
};
use hpp_reconcile::{OperatorConfig, Pipeline};
use hpp_testkit::FakeApiServer;
use serde_json::json;
use support::{CR, Env, NS, example, node};

/// KubeVirt's status after a healthy v0.25.2 deployment.
fn kubevirt_status() -> serde_json::Value {
    let condition = |ty: &str, status: &str| {
        json!({ "type": ty, "status": status, "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                "lastTransitionTime": "2026-01-01T00:00:00Z" })
    };
    let mut available = condition("Available", "True");
    available["reason"] = json!("Complete");
    available["message"] = json!("Application Available");
    json!({
        "conditions": [available, condition("Progressing", "False"), condition("Degraded", "False")],
        "observedVersion": "v0.25.2", "operatorVersion": "v0.25.2", "targetVersion": "v0.25.2",
    })
}

/// A cluster as KubeVirt left it: its CRD (status is part of the object), one Ready node, the
/// example CR with KubeVirt's status; the operator configured as KubeVirt's Deployment runs it.
fn kubevirt_cluster() -> Env {
    let fake = FakeApiServer::new();
    fake.register::<HostPathProvisioner>(false, false);
    fake.seed(&node("node01", true));
    let mut cr = example("hostpathprovisioner_cr");
    cr.metadata.finalizers = Some(vec![hpp_api::constants::FINALIZER.into()]);
    cr.status = Some(serde_json::from_value(kubevirt_status()).unwrap());
    fake.seed(&cr);
    assert!(fake.get::<HostPathProvisioner>(None, CR).unwrap().status.is_some());
    let config = OperatorConfig::from_env([("POD_NAMESPACE", NS)]);
    let ctx = Context::new(fake.client(), config, Pipeline::standard(), Metrics::default())
        .with_backoff(Duration::from_millis(20), Duration::from_millis(200));
    Env {
        fake,
        ctx: Arc::new(ctx),
    }
}

fn events(env: &Env, reason: &str) -> Vec<(String, String)> {
    let core = env
        .fake
        .list::<k8s_openapi::api::core::v1::Event>()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| (e.type_.unwrap_or_default(), e.message.unwrap_or_default()));
    let new = env
        .fake
        .list::<k8s_openapi::api::events::v1::Event>()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| (e.type_.unwrap_or_default(), e.note.unwrap_or_default()));
    core.chain(new).collect()
}

/// `PATCH …/hostpathprovisioners/<cr>/status` requests and how they were answered.
fn status_patches(env: &Env) -> Vec<u16> {
    env.fake
        .requests()
        .into_iter()
        .filter(|r| r.method == http::Method::PATCH && r.path.ends_with(&format!("hostpathprovisioners/{CR}/status")))
        .map(|r| r.status)
        .collect()
}

#[tokio::test]
async fn kubevirts_crd_and_status_are_taken_over_with_one_404_said_in_an_event_and_a_condition() {
    let env = kubevirt_cluster();
    let version = OperatorConfig::from_env([("POD_NAMESPACE", NS)]).version;
    assert!(version.starts_with("hpp-v"), "{version}");

    // KubeVirt's v0.25.2 is not a downgrade for hpp: the first pass rolls hpp's objects out and
    // reports the upgrade, written through the whole object after one 404 from /status.
    env.pass().await.unwrap();
    let status = env.hpp().status.unwrap();
    assert_eq!(status.operator_version.as_deref(), Some(version.as_str()));
    assert_eq!(
        status.observed_version.as_deref(),
        Some("v0.25.2"),
        "not yet rolled out"
    );
    let (degraded, reason, message) = env.condition("Degraded");
    assert_eq!((degraded.as_str(), reason.as_deref()), ("True", Some("UpgradeStarted")));
    assert_eq!(message.unwrap(), format!("Started upgrade to version {version}"));
    let (value, reason, message) = env.condition(CONDITION_STATUS_SUBRESOURCE);
    assert_eq!(
        (value.as_str(), reason.as_deref()),
        ("False", Some(REASON_CRD_WITHOUT_STATUS_SUBRESOURCE))
    );
    assert!(message.unwrap().contains("no status subresource"));
    assert!(env.ctx.status_path.via_main());
    let warned = events(&env, REASON_STATUS_SUBRESOURCE_MISSING);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(warned[0].0, "Warning");
    assert!(warned[0].1.contains("kubectl apply -f deploy/crds/"), "{}", warned[0].1);

    // The DaemonSet rolls out: hpp's version becomes the observed one, still through the whole
    // object, and /status is never asked again.
    env.daemonset_ready("hostpath-provisioner-csi", 1);
    env.converge().await;
    let status = env.hpp().status.unwrap();
    assert_eq!(status.observed_version.as_deref(), Some(version.as_str()));
    assert_eq!(env.condition("Available").0, "True");
    assert_eq!(status_patches(&env), Vec::<u16>::new(), "no second try of /status");
    assert_eq!(events(&env, REASON_STATUS_SUBRESOURCE_MISSING).len(), 1);
    // The spec was not touched by the status writes.
    assert_eq!(env.hpp().spec, example("hostpathprovisioner_cr").spec);
}

#[tokio::test]
async fn the_status_subresource_applied_later_is_used_from_the_next_pass() {
    let env = kubevirt_cluster();
    env.pass().await.unwrap();
    assert!(env.ctx.status_path.via_main());
    assert_eq!(status_patches(&env), [404]);

    // The admin applies hpp's CRD: the same objects, now with the status subresource.
    env.fake.register::<HostPathProvisioner>(false, true);
    env.fake.clear_requests();
    env.daemonset_ready("hostpath-provisioner-csi", 1);
    env.pass().await.unwrap();
    assert!(!env.ctx.status_path.via_main());
    let (value, reason, _) = env.condition(CONDITION_STATUS_SUBRESOURCE);
    assert_eq!((value.as_str(), reason.as_deref()), ("True", Some(PRESENT)));
    assert_eq!(status_patches(&env), [200], "written through /status");
    env.converge().await;
    assert_eq!(env.condition("Available").0, "True");
    let said = events(&env, REASON_STATUS_SUBRESOURCE_PRESENT);
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(said[0].0, "Normal");
}

#[tokio::test]
async fn a_crd_with_the_status_subresource_gets_no_new_condition() {
    let env = Env::new("hostpathprovisioner_cr", &["node01"]);
    env.converge().await;
    env.daemonset_ready("hostpath-provisioner-csi", 1);
    env.converge().await;
    let status = env.hpp().status.unwrap();
    assert!(
        status
            .conditions
            .iter()
            .all(|c| c.type_ != CONDITION_STATUS_SUBRESOURCE),
        "{:?}",
        status.conditions
    );
    assert!(events(&env, REASON_STATUS_SUBRESOURCE_MISSING).is_empty());
}

/// A CR that is deleted between the read and the status write answers 404 on /status too: that
/// is not taken for a missing subresource, and nothing is written to a CR that is gone.
#[tokio::test]
async fn a_404_for_a_cr_that_is_gone_is_an_error_not_a_switch() {
    use hpp_reconcile::status_write::{StatusPath, write};
    for subresource in [true, false] {
        let fake = FakeApiServer::new();
        fake.register::<HostPathProvisioner>(false, subresource);
        let api: kube::Api<HostPathProvisioner> = kube::Api::all(fake.client());
        let path = StatusPath::default();
        let err = write(&api, "gone", &Default::default(), false, &path)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("patch status"), "{err}");
        assert!(!path.via_main(), "subresource {subresource}: {err}");
    }
}

/// The API server's refusal when a subject grants permissions it does not hold itself, as it
/// answers hpp's operator running with KubeVirt's operator ClusterRole (no
/// `persistentvolumeclaims/status`, no `volumeattributesclasses`) and Role (no `leases` patch).
fn forbid_granting(env: &Env, resource: &str) {
    // Applied (PATCH), updated (PUT) or created (POST): the escalation check refuses them all.
    for method in [http::Method::PATCH, http::Method::PUT] {
        env.fake.fail_requests(
            hpp_testkit::FailureRule::new(403)
                .method(method)
                .path_contains(format!("/{resource}/hostpath-provisioner-admin-csi")),
        );
    }
    env.fake.fail_requests(
        hpp_testkit::FailureRule::new(403)
            .method(http::Method::POST)
            .path_contains(format!("/{resource}")),
    );
}

/// An image-only swap keeps KubeVirt's operator RBAC, which may not grant everything hpp's CSI
/// roles list: the roles KubeVirt's operator made are kept (a Warning Event on each says why and
/// how to grant the rest), and the pass goes on to roll the DaemonSet out and report Available.
#[tokio::test]
async fn roles_the_operator_may_not_update_are_kept_and_the_swap_goes_on() {
    use hpp_reconcile::apply::REASON_APPLY_FORBIDDEN;
    let env = kubevirt_cluster();
    // KubeVirt's operator created the CSI roles.
    for (kind, namespace) in [("ClusterRole", None), ("Role", Some(NS))] {
        let mut role = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
            "metadata": { "name": "hostpath-provisioner-admin-csi",
                          "labels": { "k8s-app": "hostpath-provisioner" } },
            "rules": [{ "apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get"] }],
        });
        if let Some(ns) = namespace {
            role["metadata"]["namespace"] = json!(ns);
        }
        let ar = kube::core::ApiResource {
            group: "rbac.authorization.k8s.io".into(),
            version: "v1".into(),
            api_version: "rbac.authorization.k8s.io/v1".into(),
            kind: kind.into(),
            plural: format!("{}s", kind.to_lowercase()),
        };
        env.fake.seed_dynamic(&ar, role);
    }
    forbid_granting(&env, "clusterroles");
    forbid_granting(&env, "roles");
    env.pass().await.unwrap();
    env.daemonset_ready("hostpath-provisioner-csi", 1);
    // Every pass asks again (the refusal is a 403 each time, logged), so there is no pass
    // without a write to wait for: a few passes.
    for _ in 0..4 {
        env.pass().await.unwrap();
    }
    assert_eq!(env.condition("Available").0, "True");
    let warned = events(&env, REASON_APPLY_FORBIDDEN);
    assert_eq!(warned.len(), 2, "one per role, once: {warned:?}");
    assert!(
        warned
            .iter()
            .all(|(ty, note)| ty == "Warning" && note.contains("kubectl apply -f deploy/operator/rbac.yaml"))
    );
    // Without a role to keep, a refusal is still an error: the sidecars would have no rights.
    let fresh = Env::new("hostpathprovisioner_cr", &["node01"]);
    forbid_granting(&fresh, "clusterroles");
    let mut failed = false;
    for _ in 0..3 {
        failed |= fresh.pass().await.is_err();
    }
    assert!(failed, "creating a role the operator may not grant fails the pass");
}

/// KubeVirt's operator RBAC, which an image-only swap keeps, grants create and update on what
/// the operator owns, but not patch: refuse every PATCH except on the CR (its `*` rule) and
/// core Events.
fn kubevirts_rbac_refuses_patch(env: &Env) {
    for kind in [
        "daemonsets",
        "deployments",
        "serviceaccounts",
        "services",
        "clusterroles",
        "clusterrolebindings",
        "roles",
        "rolebindings",
        "csidrivers",
        "storageclasses",
        "leases",
        "jobs",
        "persistentvolumeclaims",
    ] {
        env.fake.fail_requests(
            hpp_testkit::FailureRule::new(403)
                .method(http::Method::PATCH)
                .path_contains(format!("/{kind}/")),
        );
    }
}

/// Under KubeVirt's RBAC every owned object is written the way KubeVirt's operator writes it
/// (create, update), the swap reaches Available, and drift is still repaired, keeping what
/// others added.
#[tokio::test]
async fn without_patch_permission_objects_are_created_and_updated() {
    use k8s_openapi::api::apps::v1::DaemonSet;
    let env = kubevirt_cluster();
    kubevirts_rbac_refuses_patch(&env);
    env.pass().await.unwrap();
    env.daemonset_ready("hostpath-provisioner-csi", 1);
    env.converge().await;
    assert_eq!(env.condition("Available").0, "True");
    let ds = env.fake.get::<DaemonSet>(Some(NS), "hostpath-provisioner-csi").unwrap();
    let image = |ds: &DaemonSet| {
        ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0]
            .image
            .clone()
    };
    let rendered = image(&ds);
    // Someone changes the driver image and adds a label: the image is put back, the label stays.
    let mut drifted = ds.clone();
    drifted
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .containers[0]
        .image = Some("quay.io/x:1".into());
    drifted
        .metadata
        .labels
        .get_or_insert_default()
        .insert("example.com/team".into(), "storage".into());
    env.fake.seed(&drifted);
    env.pass().await.unwrap();
    let repaired = env.fake.get::<DaemonSet>(Some(NS), "hostpath-provisioner-csi").unwrap();
    assert_eq!(image(&repaired), rendered);
    assert_eq!(
        repaired
            .metadata
            .labels
            .unwrap()
            .get("example.com/team")
            .map(String::as_str),
        Some("storage")
    );
    let put = env.fake.requests().iter().any(|r| {
        r.method == http::Method::PUT && r.path.ends_with("/daemonsets/hostpath-provisioner-csi") && r.status == 200
    });
    assert!(put, "repaired with an update");
}
