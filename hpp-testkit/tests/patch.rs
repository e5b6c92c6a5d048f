//! Test kit: server-side apply, merge, strategic merge and JSON patch against the fake API server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use hpp_api::v1beta1::{HostPathProvisioner, HostPathProvisionerSpec};
use hpp_testkit::FakeApiServer;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

fn api_error(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(s) => (s.code, s.reason),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn apply_cm(labels: serde_json::Value, data: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "labels": labels}, "data": data})
}

#[tokio::test]
async fn server_side_apply_creates_then_updates() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let pp = PatchParams::apply("hpp-operator").force();

    let created = api
        .patch(
            "cfg",
            &pp,
            &Patch::Apply(apply_cm(json!({"a": "1"}), json!({"x": "1"}))),
        )
        .await
        .unwrap();
    assert!(created.uid().is_some());
    assert_eq!(created.labels()["a"], "1");

    // Same config again: a no-op, same resourceVersion.
    let again = api
        .patch(
            "cfg",
            &pp,
            &Patch::Apply(apply_cm(json!({"a": "1"}), json!({"x": "1"}))),
        )
        .await
        .unwrap();
    assert_eq!(again.resource_version(), created.resource_version());

    // Someone else adds a label; the applier's later config keeps it but drops its own old field.
    api.patch(
        "cfg",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"other": "x"}}})),
    )
    .await
    .unwrap();
    let updated = api
        .patch(
            "cfg",
            &pp,
            &Patch::Apply(apply_cm(json!({"b": "2"}), json!({"x": "2"}))),
        )
        .await
        .unwrap();
    let labels = updated.labels();
    assert_eq!(labels.get("b").map(String::as_str), Some("2"));
    assert_eq!(labels.get("other").map(String::as_str), Some("x"));
    assert!(
        !labels.contains_key("a"),
        "a field the manager stopped applying is removed"
    );
    assert_eq!(updated.data.unwrap()["x"], "2");

    let request = fake.write_requests().last().cloned().unwrap();
    assert_eq!(request.content_type.as_deref(), Some("application/apply-patch+yaml"));
    assert_eq!(request.query_param("fieldManager").as_deref(), Some("hpp-operator"));
    assert_eq!(request.query_param("force").as_deref(), Some("true"));
    assert_eq!(request.body["data"]["x"], "2");
}

#[tokio::test]
async fn server_side_apply_conflicts_between_managers_unless_forced() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    api.patch(
        "cfg",
        &PatchParams::apply("one"),
        &Patch::Apply(apply_cm(json!({"a": "1"}), json!({}))),
    )
    .await
    .unwrap();
    let err = api
        .patch(
            "cfg",
            &PatchParams::apply("two"),
            &Patch::Apply(apply_cm(json!({"a": "2"}), json!({}))),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(err), (409, "Conflict".to_string()));
    let forced = api
        .patch(
            "cfg",
            &PatchParams::apply("two").force(),
            &Patch::Apply(apply_cm(json!({"a": "2"}), json!({}))),
        )
        .await
        .unwrap();
    assert_eq!(forced.labels()["a"], "2");
}

#[tokio::test]
async fn server_side_apply_with_a_stale_resource_version_conflicts() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let pp = PatchParams::apply("m").force();
    api.patch("cfg", &pp, &Patch::Apply(apply_cm(json!({}), json!({"x": "1"}))))
        .await
        .unwrap();
    let mut stale = apply_cm(json!({}), json!({"x": "2"}));
    stale["metadata"]["resourceVersion"] = json!("1");
    let err = api.patch("cfg", &pp, &Patch::Apply(stale)).await.unwrap_err();
    assert_eq!(api_error(err).0, 409);
}

#[tokio::test]
async fn status_apply_touches_only_status() {
    let fake = FakeApiServer::new();
    fake.register::<HostPathProvisioner>(false, true);
    let api: Api<HostPathProvisioner> = Api::all(fake.client());
    api.create(
        &PostParams::default(),
        &HostPathProvisioner::new("hpp", HostPathProvisionerSpec::default()),
    )
    .await
    .unwrap();
    let status = json!({
        "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1", "kind": "HostPathProvisioner",
        "metadata": {"name": "hpp", "labels": {"ignored": "yes"}},
        "spec": {"imagePullPolicy": "Never"},
        "status": {"observedVersion": "1.0"}
    });
    let out = api
        .patch_status(
            "hpp",
            &PatchParams::apply("hpp-operator").force(),
            &Patch::Apply(&status),
        )
        .await
        .unwrap();
    assert_eq!(out.status.clone().unwrap().observed_version.as_deref(), Some("1.0"));
    assert_eq!(out.spec.image_pull_policy, None);
    assert!(out.labels().is_empty());
    assert_eq!(
        fake.write_requests()[1].path,
        "/apis/hostpathprovisioner.kubevirt.io/v1beta1/hostpathprovisioners/hpp/status"
    );

    // Status apply on a missing object is NotFound (it does not create).
    let mut missing = status.clone();
    missing["metadata"]["name"] = json!("nope");
    let err = api
        .patch_status(
            "nope",
            &PatchParams::apply("hpp-operator").force(),
            &Patch::Apply(&missing),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(err).0, 404);
}

#[tokio::test]
async fn merge_patch_merges_maps_and_deletes_nulls() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    api.patch(
        "cfg",
        &PatchParams::apply("m"),
        &Patch::Apply(apply_cm(json!({"a": "1", "b": "2"}), json!({"x": "1"}))),
    )
    .await
    .unwrap();
    let out = api
        .patch(
            "cfg",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": null, "c": "3"}}})),
        )
        .await
        .unwrap();
    let labels = out.labels();
    assert_eq!(labels.keys().cloned().collect::<Vec<_>>(), ["b", "c"]);
    let err = api
        .patch("missing", &PatchParams::default(), &Patch::Merge(json!({})))
        .await
        .unwrap_err();
    assert_eq!(api_error(err).0, 404);
}

#[tokio::test]
async fn strategic_merge_patch_merges_containers_by_name() {
    let fake = FakeApiServer::new();
    let api: Api<DaemonSet> = Api::namespaced(fake.client(), "ns");
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "ds"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"spec": {"containers": [
            {"name": "driver", "image": "driver:1"}, {"name": "registrar", "image": "reg:1"}
        ]}}}
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &ds).await.unwrap();
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "driver", "image": "driver:2"}]}}}});
    let out = api
        .patch("ds", &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap();
    let containers = out.spec.unwrap().template.spec.unwrap().containers;
    let images: Vec<_> = containers.iter().map(|c| c.image.clone().unwrap()).collect();
    assert_eq!(images, ["driver:2", "reg:1"]);
    assert_eq!(out.metadata.generation, Some(created.metadata.generation.unwrap() + 1));

    // Custom resources refuse strategic merge patch, as the real server does.
    fake.register::<HostPathProvisioner>(false, true);
    let hpps: Api<HostPathProvisioner> = Api::all(fake.client());
    hpps.create(
        &PostParams::default(),
        &HostPathProvisioner::new("hpp", HostPathProvisionerSpec::default()),
    )
    .await
    .unwrap();
    let err = hpps
        .patch("hpp", &PatchParams::default(), &Patch::Strategic(json!({"spec": {}})))
        .await
        .unwrap_err();
    assert_eq!(api_error(err).0, 415);
}

#[tokio::test]
async fn json_patch_applies_atomically_and_a_failed_test_is_rejected() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    api.patch(
        "cfg",
        &PatchParams::apply("m"),
        &Patch::Apply(apply_cm(json!({}), json!({"x": "1"}))),
    )
    .await
    .unwrap();
    let ok: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/data/x", "value": "1"},
        {"op": "replace", "path": "/data/x", "value": "2"}
    ]))
    .unwrap();
    let out = api
        .patch("cfg", &PatchParams::default(), &Patch::Json::<()>(ok))
        .await
        .unwrap();
    assert_eq!(out.data.unwrap()["x"], "2");

    let failing: json_patch::Patch = serde_json::from_value(json!([
        {"op": "replace", "path": "/data/x", "value": "3"},
        {"op": "test", "path": "/data/x", "value": "nope"}
    ]))
    .unwrap();
    let err = api
        .patch("cfg", &PatchParams::default(), &Patch::Json::<()>(failing))
        .await
        .unwrap_err();
    assert_eq!(api_error(err), (422, "Invalid".to_string()));
    assert_eq!(
        api.get("cfg").await.unwrap().data.unwrap()["x"],
        "2",
        "nothing was applied"
    );
}

fn lease_apply(holder: &str) -> serde_json::Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "lock"},
           "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}})
}

/// The pattern kube-lease-manager relies on: a non-forced apply of another manager's field
/// conflicts while that manager still owns it, and succeeds once it was released.
#[tokio::test]
async fn competing_appliers_conflict_until_the_owner_releases() {
    use k8s_openapi::api::coordination::v1::Lease;
    let fake = FakeApiServer::new();
    let api: Api<Lease> = Api::namespaced(fake.client(), "ns");
    let pp = |m: &str| PatchParams {
        field_manager: Some(m.into()),
        ..Default::default()
    };
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "lock"}, "spec": {}})).unwrap(),
    )
    .await
    .unwrap();
    api.patch("lock", &pp("a"), &Patch::Apply(lease_apply("a")))
        .await
        .unwrap();
    let err = api
        .patch("lock", &pp("b"), &Patch::Apply(lease_apply("b")))
        .await
        .unwrap_err();
    assert_eq!(api_error(err), (409, "Conflict".to_string()));
    assert_eq!(
        api.get("lock").await.unwrap().spec.unwrap().holder_identity.as_deref(),
        Some("a")
    );

    // The holder releases with a strategic merge patch of nulls; the next applier wins.
    let release = json!({"spec": {"holderIdentity": null, "leaseDurationSeconds": null}});
    api.patch("lock", &pp("a"), &Patch::Strategic(release)).await.unwrap();
    api.patch("lock", &pp("b"), &Patch::Apply(lease_apply("b")))
        .await
        .unwrap();
    assert_eq!(
        api.get("lock").await.unwrap().spec.unwrap().holder_identity.as_deref(),
        Some("b")
    );
}

#[tokio::test]
async fn immutable_fields_are_refused_like_the_real_server() {
    use k8s_openapi::api::rbac::v1::RoleBinding;
    let fake = FakeApiServer::new();
    let api: Api<RoleBinding> = Api::namespaced(fake.client(), "ns");
    let binding = |role: &str| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "rb"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role}, "subjects": []})
    };
    let pp = PatchParams::apply("hpp-operator").force();
    api.patch("rb", &pp, &Patch::Apply(binding("a"))).await.unwrap();
    let err = api.patch("rb", &pp, &Patch::Apply(binding("b"))).await.unwrap_err();
    assert_eq!(api_error(err), (422, "Invalid".to_string()));
    assert_eq!(api.get("rb").await.unwrap().role_ref.name, "a");

    // A DaemonSet's selector cannot change either; its template can.
    let dsapi: Api<DaemonSet> = Api::namespaced(fake.client(), "ns");
    let ds = |app: &str, image: &str| {
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "ds"}, "spec": {
            "selector": {"matchLabels": {"app": app}},
            "template": {"metadata": {"labels": {"app": app}}, "spec": {"containers": [{"name": "c", "image": image}]}}}})
    };
    dsapi.patch("ds", &pp, &Patch::Apply(ds("a", "i:1"))).await.unwrap();
    dsapi.patch("ds", &pp, &Patch::Apply(ds("a", "i:2"))).await.unwrap();
    let err = dsapi.patch("ds", &pp, &Patch::Apply(ds("b", "i:2"))).await.unwrap_err();
    assert_eq!(api_error(err).0, 422);
}

/// Built-in kinds merge associative lists item by item under server-side apply: an item another
/// writer added survives, an item the manager stops applying goes.
#[tokio::test]
async fn server_side_apply_merges_container_lists_by_name() {
    let fake = FakeApiServer::new();
    let api: Api<DaemonSet> = Api::namespaced(fake.client(), "ns");
    let pp = PatchParams::apply("hpp-operator").force();
    let ds = |containers: serde_json::Value| {
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "ds"}, "spec": {
            "selector": {"matchLabels": {"app": "a"}},
            "template": {"metadata": {"labels": {"app": "a"}}, "spec": {"containers": containers}}}})
    };
    api.patch(
        "ds",
        &pp,
        &Patch::Apply(ds(
            json!([{"name": "driver", "image": "d:1"}, {"name": "snapshotter", "image": "s:1"}]),
        )),
    )
    .await
    .unwrap();
    // Someone else injects a sidecar and an env var.
    let injected = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "driver", "env": [{"name": "INJECTED", "value": "1"}]},
        {"name": "mesh-proxy", "image": "proxy:1"}
    ]}}}});
    api.patch("ds", &PatchParams::default(), &Patch::Strategic(injected))
        .await
        .unwrap();

    // The operator drops the snapshotter and bumps the driver image.
    let out = api
        .patch(
            "ds",
            &pp,
            &Patch::Apply(ds(json!([{"name": "driver", "image": "d:2"}]))),
        )
        .await
        .unwrap();
    let containers = out.spec.unwrap().template.spec.unwrap().containers;
    let names: Vec<_> = containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["driver", "mesh-proxy"]);
    assert_eq!(containers[0].image.as_deref(), Some("d:2"));
    assert_eq!(containers[0].env.as_ref().unwrap()[0].name, "INJECTED");
}

/// With managed fields tracked, every writer gets its entry (the applier's `Apply`, a status
/// writer's `Update` on `/status`), and a write that changes nothing keeps the object as it is.
#[tokio::test]
async fn tracked_managed_fields_name_each_writer_and_no_op_writes_change_nothing() {
    let fake = FakeApiServer::new();
    fake.track_managed_fields();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let pp = PatchParams::apply("hpp-operator").force();
    let config = apply_cm(json!({"a": "1"}), json!({"x": "1"}));
    let created = api.patch("cfg", &pp, &Patch::Apply(&config)).await.unwrap();
    let entries = created.metadata.managed_fields.clone().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].manager.as_deref(), Some("hpp-operator"));
    assert_eq!(entries[0].operation.as_deref(), Some("Apply"));
    let fields = serde_json::to_value(&entries[0].fields_v1).unwrap();
    assert!(fields.pointer("/f:data/f:x").is_some(), "{fields}");
    assert!(fields.pointer("/f:metadata/f:labels/f:a").is_some(), "{fields}");
    let again = api.patch("cfg", &pp, &Patch::Apply(&config)).await.unwrap();
    assert_eq!(again.resource_version(), created.resource_version(), "a no-op apply");
    let mut edited = again.clone();
    edited.data = Some([("x".to_owned(), "2".to_owned())].into());
    edited.metadata.managed_fields = None;
    let updated = api
        .replace(
            "cfg",
            &PostParams {
                field_manager: Some("kubectl".into()),
                ..Default::default()
            },
            &edited,
        )
        .await
        .unwrap();
    let managers: Vec<_> = updated
        .metadata
        .managed_fields
        .unwrap()
        .iter()
        .map(|e| (e.manager.clone().unwrap(), e.operation.clone().unwrap()))
        .collect();
    assert_eq!(
        managers,
        [
            ("hpp-operator".to_owned(), "Apply".to_owned()),
            ("kubectl".to_owned(), "Update".to_owned())
        ]
    );
}
