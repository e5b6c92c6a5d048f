//! Test kit: fault injection, outages and discovery of the fake API server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::time::Duration;

use futures::StreamExt;
use hpp_api::v1beta1::HostPathProvisioner;
use hpp_testkit::{FailureRule, FakeApiServer};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::{Discovery, Scope};

const GUARD: Duration = Duration::from_secs(30);

fn cm(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm
}

fn code(err: kube::Error) -> u16 {
    match err {
        kube::Error::Api(s) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn injected_failures_match_method_and_path_and_expire() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    fake.fail_requests(
        FailureRule::new(503)
            .method(http::Method::POST)
            .path_contains("/configmaps")
            .times(2),
    );
    assert_eq!(
        code(api.create(&PostParams::default(), &cm("a")).await.unwrap_err()),
        503
    );
    // GETs do not match the rule.
    assert_eq!(code(api.get("a").await.unwrap_err()), 404);
    assert_eq!(
        code(api.create(&PostParams::default(), &cm("a")).await.unwrap_err()),
        503
    );
    api.create(&PostParams::default(), &cm("a")).await.unwrap();

    fake.fail_requests(FailureRule::new(403));
    let err = api.get("a").await.unwrap_err();
    assert!(matches!(&err, kube::Error::Api(s) if s.code == 403 && s.reason == "Forbidden"));
    fake.clear_failures();
    api.get("a").await.unwrap();
    let statuses: Vec<u16> = fake.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [503, 404, 503, 201, 403, 200]);
}

#[tokio::test]
async fn an_unavailable_server_fails_requests_and_ends_watches() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let rv = fake.resource_version();
    let mut stream = api.watch(&WatchParams::default(), &rv).await.unwrap().boxed();

    fake.set_unavailable(true);
    let ended = tokio::time::timeout(GUARD, stream.next()).await.expect("watch ended");
    assert!(ended.is_none(), "the open watch ends");
    let err = api.get("a").await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Service(_)),
        "connection-level error, got {err:?}"
    );
    assert_eq!(fake.requests().last().unwrap().status, 0);

    fake.set_unavailable(false);
    assert!(api.get("a").await.is_ok(), "objects survive the outage");
}

#[tokio::test]
async fn discovery_lists_registered_kinds_only() {
    let fake = FakeApiServer::new();
    fake.register::<HostPathProvisioner>(false, true);
    let scc = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("security.openshift.io", "v1", "SecurityContextConstraints"),
        "securitycontextconstraints",
    );
    let client = fake.client();

    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let hpp_gvk = GroupVersionKind::gvk("hostpathprovisioner.kubevirt.io", "v1beta1", "HostPathProvisioner");
    let (ar, caps) = discovery.resolve_gvk(&hpp_gvk).expect("the CRD is discoverable");
    assert_eq!(ar.plural, "hostpathprovisioners");
    assert_eq!(caps.scope, Scope::Cluster);
    assert!(
        caps.subresources
            .iter()
            .any(|(sub, _)| sub.plural == "hostpathprovisioners/status" || sub.plural == "status")
    );
    assert!(!discovery.has_group("security.openshift.io"));
    assert!(!discovery.has_group("monitoring.coreos.com"));
    let ds = discovery
        .resolve_gvk(&GroupVersionKind::gvk("apps", "v1", "DaemonSet"))
        .expect("built-ins are discoverable");
    assert_eq!(ds.1.scope, Scope::Namespaced);
    let nodes = discovery.resolve_gvk(&GroupVersionKind::gvk("", "v1", "Node")).unwrap();
    assert_eq!(nodes.1.scope, Scope::Cluster);

    fake.register_api(scc.clone(), false, false);
    let aggregated = Discovery::new(client.clone()).run_aggregated().await.unwrap();
    assert!(aggregated.has_group("security.openshift.io"));
    assert!(aggregated.has_group("hostpathprovisioner.kubevirt.io"));
    assert!(
        aggregated
            .resolve_gvk(&GroupVersionKind::gvk("", "v1", "Pod"))
            .is_some()
    );

    // Group-version probes: 404 for an API that is not served.
    assert!(
        client
            .list_api_group_resources("security.openshift.io/v1")
            .await
            .is_ok()
    );
    let err = client
        .list_api_group_resources("monitoring.coreos.com/v1")
        .await
        .unwrap_err();
    assert_eq!(code(err), 404);
    fake.unregister_api(&scc);
    assert_eq!(
        code(
            client
                .list_api_group_resources("security.openshift.io/v1")
                .await
                .unwrap_err()
        ),
        404
    );

    let version = client.apiserver_version().await.unwrap();
    assert_eq!((version.major.as_str(), version.minor.as_str()), ("1", "33"));
}

#[tokio::test]
async fn dynamic_kinds_work_through_dynamic_objects() {
    let fake = FakeApiServer::new();
    let rule = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "PrometheusRule"),
        "prometheusrules",
    );
    fake.register_api(rule.clone(), true, false);
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(fake.client(), "ns", &rule);
    let obj = kube::api::DynamicObject::new("rules", &rule).data(serde_json::json!({"spec": {"groups": []}}));
    api.create(&PostParams::default(), &obj).await.unwrap();
    let stored = fake.get_dynamic(&rule, Some("ns"), "rules").unwrap();
    assert_eq!(stored["kind"], "PrometheusRule");
    assert_eq!(fake.list_dynamic(&rule).len(), 1);
    let seeded = fake
        .seed_dynamic(
            &rule,
            serde_json::json!({"metadata": {"name": "seeded", "namespace": "ns"}, "spec": {}}),
        )
        .unwrap();
    assert!(seeded["metadata"]["uid"].is_string());

    // Unregistered kinds are 404 like a missing CRD.
    let missing = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("example.com", "v1", "Thing"), "things");
    let things: Api<kube::api::DynamicObject> = Api::all_with(fake.client(), &missing);
    assert_eq!(code(things.list(&Default::default()).await.unwrap_err()), 404);
}

#[tokio::test]
async fn creating_a_crd_serves_its_kinds_and_deleting_it_stops_them() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let fake = FakeApiServer::new();
    let client = fake.client();
    let hpps: Api<HostPathProvisioner> = Api::all(client.clone());
    assert_eq!(code(hpps.list(&Default::default()).await.unwrap_err()), 404);

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &hpp_api::crd::crd().unwrap())
        .await
        .unwrap();
    assert!(hpps.list(&Default::default()).await.unwrap().items.is_empty());
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let (_, caps) = discovery
        .resolve_gvk(&GroupVersionKind::gvk(
            "hostpathprovisioner.kubevirt.io",
            "v1beta1",
            "HostPathProvisioner",
        ))
        .unwrap();
    assert_eq!(caps.scope, Scope::Cluster);
    // The plain CRD lists v1alpha1 unserved (only the conversion CRD serves it).
    assert!(
        discovery
            .resolve_gvk(&GroupVersionKind::gvk(
                "hostpathprovisioner.kubevirt.io",
                "v1alpha1",
                "HostPathProvisioner"
            ))
            .is_none()
    );

    crds.delete(
        "hostpathprovisioners.hostpathprovisioner.kubevirt.io",
        &Default::default(),
    )
    .await
    .unwrap();
    assert_eq!(code(hpps.list(&Default::default()).await.unwrap_err()), 404);
}

#[tokio::test]
async fn a_disconnect_rule_fails_at_the_connection_level_and_dump_lists_objects() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    fake.fail_requests(FailureRule::disconnect().path_contains("/configmaps").times(1));
    let err = api.create(&PostParams::default(), &cm("a")).await.unwrap_err();
    assert!(matches!(err, kube::Error::Service(_)), "got {err:?}");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    assert_eq!(fake.requests().iter().map(|r| r.status).collect::<Vec<_>>(), [0, 201]);
    let dump = fake.dump();
    assert!(dump.starts_with("configmaps ns/a rv="), "{dump}");
}
