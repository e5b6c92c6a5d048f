//! Test kit: create/get/list/update semantics of the fake API server through a typed kube::Api.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use hpp_api::v1beta1::{HostPathProvisioner, HostPathProvisionerSpec};
use hpp_testkit::FakeApiServer;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

fn cm(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    cm.data = Some([("k".to_string(), "v".to_string())].into());
    cm
}

fn api_error(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(s) => (s.code, s.reason),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn create_assigns_identity_and_get_returns_it() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns1");
    let created = api.create(&PostParams::default(), &cm("a", &[])).await.unwrap();
    assert!(created.uid().is_some());
    assert!(created.resource_version().is_some());
    assert!(created.creation_timestamp().is_some());
    assert_eq!(created.namespace().as_deref(), Some("ns1"));
    assert_eq!(created.meta().generation, Some(1));

    let got = api.get("a").await.unwrap();
    assert_eq!(got, created);
    assert_eq!(fake.get::<ConfigMap>(Some("ns1"), "a"), Some(created));
    assert!(fake.get::<ConfigMap>(Some("other"), "a").is_none());
}

#[tokio::test]
async fn create_twice_is_already_exists_and_missing_get_is_not_found() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns1");
    api.create(&PostParams::default(), &cm("a", &[])).await.unwrap();
    let err = api.create(&PostParams::default(), &cm("a", &[])).await.unwrap_err();
    assert_eq!(api_error(err), (409, "AlreadyExists".to_string()));

    let err = api.get("missing").await.unwrap_err();
    assert_eq!(api_error(err), (404, "NotFound".to_string()));
    assert_eq!(api.get_opt("missing").await.unwrap(), None);
}

#[tokio::test]
async fn generate_name_creates_distinct_objects() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns1");
    let mut template = cm("", &[]);
    template.metadata.name = None;
    template.metadata.generate_name = Some("gen-".into());
    let a = api.create(&PostParams::default(), &template).await.unwrap();
    let b = api.create(&PostParams::default(), &template).await.unwrap();
    assert!(a.name_any().starts_with("gen-"));
    assert_ne!(a.name_any(), b.name_any());
}

#[tokio::test]
async fn replace_with_stale_resource_version_conflicts() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns1");
    let first = api.create(&PostParams::default(), &cm("a", &[])).await.unwrap();

    let mut newer = first.clone();
    newer.data = Some([("k".to_string(), "v2".to_string())].into());
    let updated = api.replace("a", &PostParams::default(), &newer).await.unwrap();
    assert_ne!(updated.resource_version(), first.resource_version());
    assert_eq!(updated.uid(), first.uid());

    let mut stale = first.clone();
    stale.data = Some([("k".to_string(), "v3".to_string())].into());
    let err = api.replace("a", &PostParams::default(), &stale).await.unwrap_err();
    assert_eq!(api_error(err), (409, "Conflict".to_string()));
    assert_eq!(api.get("a").await.unwrap().data.unwrap()["k"], "v2");

    let err = api
        .replace("missing", &PostParams::default(), &cm("missing", &[]))
        .await
        .unwrap_err();
    assert_eq!(api_error(err).0, 404);
}

#[tokio::test]
async fn a_no_op_update_keeps_the_resource_version() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns1");
    let first = api.create(&PostParams::default(), &cm("a", &[])).await.unwrap();
    let same = api.replace("a", &PostParams::default(), &first).await.unwrap();
    assert_eq!(same.resource_version(), first.resource_version());
}

#[tokio::test]
async fn list_filters_by_label_selector_and_namespace() {
    let fake = FakeApiServer::new();
    let client = fake.client();
    let ns1: Api<ConfigMap> = Api::namespaced(client.clone(), "ns1");
    let ns2: Api<ConfigMap> = Api::namespaced(client.clone(), "ns2");
    ns1.create(&PostParams::default(), &cm("a", &[("app", "hpp"), ("tier", "csi")]))
        .await
        .unwrap();
    ns1.create(&PostParams::default(), &cm("b", &[("app", "hpp"), ("tier", "legacy")]))
        .await
        .unwrap();
    ns1.create(&PostParams::default(), &cm("c", &[("app", "other")]))
        .await
        .unwrap();
    ns2.create(&PostParams::default(), &cm("d", &[("app", "hpp")]))
        .await
        .unwrap();

    let names = |l: kube::core::ObjectList<ConfigMap>| l.items.iter().map(|c| c.name_any()).collect::<Vec<_>>();
    let lp = |s: &str| ListParams::default().labels(s);
    assert_eq!(names(ns1.list(&lp("app=hpp")).await.unwrap()), ["a", "b"]);
    assert_eq!(names(ns1.list(&lp("app==hpp,tier!=csi")).await.unwrap()), ["b"]);
    assert_eq!(names(ns1.list(&lp("tier in (csi,x)")).await.unwrap()), ["a"]);
    assert_eq!(names(ns1.list(&lp("tier notin (csi)")).await.unwrap()), ["b", "c"]);
    assert_eq!(names(ns1.list(&lp("tier")).await.unwrap()), ["a", "b"]);
    assert_eq!(names(ns1.list(&lp("!tier")).await.unwrap()), ["c"]);

    let all: Api<ConfigMap> = Api::all(client);
    let everything = all.list(&lp("app=hpp")).await.unwrap();
    assert_eq!(names(everything.clone()), ["a", "b", "d"]);
    assert_eq!(everything.metadata.resource_version, Some(fake.resource_version()));
    assert_eq!(fake.list::<ConfigMap>().len(), 4);
}

#[tokio::test]
async fn list_supports_field_selectors_and_pagination() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns1");
    for name in ["a", "b", "c", "d", "e"] {
        api.create(&PostParams::default(), &cm(name, &[])).await.unwrap();
    }
    let by_name = api
        .list(&ListParams::default().fields("metadata.name=c"))
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1);
    let not_c = api
        .list(&ListParams::default().fields("metadata.name!=c,metadata.namespace=ns1"))
        .await
        .unwrap();
    assert_eq!(not_c.items.len(), 4);

    let mut seen = Vec::new();
    let mut lp = ListParams::default().limit(2);
    loop {
        let page = api.list(&lp).await.unwrap();
        assert!(page.items.len() <= 2);
        seen.extend(page.items.iter().map(|c| c.name_any()));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => lp = lp.continue_token(&token),
            _ => break,
        }
    }
    assert_eq!(seen, ["a", "b", "c", "d", "e"]);

    let pods: Api<Pod> = Api::all(fake.client());
    let mut pod = Pod::default();
    pod.metadata.name = Some("p".into());
    pod.metadata.namespace = Some("ns1".into());
    pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
        node_name: Some("n1".into()),
        ..Default::default()
    });
    fake.seed(&pod);
    assert_eq!(
        pods.list(&ListParams::default().fields("spec.nodeName=n1"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        pods.list(&ListParams::default().fields("spec.nodeName=n2"))
            .await
            .unwrap()
            .items
            .len(),
        0
    );
}

#[tokio::test]
async fn cluster_scoped_kinds_live_outside_namespaces() {
    let fake = FakeApiServer::new();
    let nodes: Api<Node> = Api::all(fake.client());
    let mut node = Node::default();
    node.metadata.name = Some("n1".into());
    let created = nodes.create(&PostParams::default(), &node).await.unwrap();
    assert_eq!(created.namespace(), None);
    assert!(fake.get::<Node>(None, "n1").is_some());
    let requests = fake.requests();
    assert_eq!(requests[0].path, "/api/v1/nodes");
    assert_eq!(requests[0].status, 201);

    let in_ns: Api<ConfigMap> = Api::default_namespaced(fake.client_in("hpp-ns"));
    in_ns.create(&PostParams::default(), &cm("c", &[])).await.unwrap();
    assert!(fake.get::<ConfigMap>(Some("hpp-ns"), "c").is_some());
}

fn hpp(name: &str) -> HostPathProvisioner {
    let mut cr = HostPathProvisioner::new(name, HostPathProvisionerSpec::default());
    cr.spec.image_pull_policy = Some("IfNotPresent".into());
    cr
}

#[tokio::test]
async fn status_subresource_splits_spec_and_status_writes() {
    let fake = FakeApiServer::new();
    fake.register::<HostPathProvisioner>(false, true);
    let api: Api<HostPathProvisioner> = Api::all(fake.client());
    let mut cr = hpp("hpp");
    cr.status = Some(Default::default());
    cr.status.as_mut().unwrap().observed_version = Some("ignored".into());
    let created = api.create(&PostParams::default(), &cr).await.unwrap();
    assert_eq!(created.status, None, "status is dropped on create");
    assert_eq!(created.meta().generation, Some(1));

    // A status write changes only the status, and not the generation.
    let status = json!({"status": {"observedVersion": "v1"}, "spec": {"imagePullPolicy": "Never"}});
    let after_status = api
        .patch_status(
            "hpp",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&status),
        )
        .await
        .unwrap();
    assert_eq!(
        after_status.status.as_ref().unwrap().observed_version.as_deref(),
        Some("v1")
    );
    assert_eq!(after_status.spec.image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(after_status.meta().generation, Some(1));

    // A main-resource write ignores status but bumps the generation for a spec change.
    let main = json!({"status": {"observedVersion": "v2"}, "spec": {"imagePullPolicy": "Always"}});
    let after_main = api
        .patch(
            "hpp",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&main),
        )
        .await
        .unwrap();
    assert_eq!(
        after_main.status.as_ref().unwrap().observed_version.as_deref(),
        Some("v1")
    );
    assert_eq!(after_main.spec.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(after_main.meta().generation, Some(2));

    // A metadata-only change does not bump the generation.
    let labels = json!({"metadata": {"labels": {"x": "y"}}});
    let after_labels = api
        .patch(
            "hpp",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&labels),
        )
        .await
        .unwrap();
    assert_eq!(after_labels.meta().generation, Some(2));

    // replace_status with the current object works; the test-kit helper sets status directly.
    let mut current = api.get("hpp").await.unwrap();
    current.status.as_mut().unwrap().observed_version = Some("v3".into());
    let replaced = api
        .replace_status("hpp", &PostParams::default(), &current)
        .await
        .unwrap();
    assert_eq!(replaced.status.unwrap().observed_version.as_deref(), Some("v3"));
    assert!(fake.set_status::<HostPathProvisioner>(None, "hpp", json!({"observedVersion": "v4"})));
    assert_eq!(
        fake.get::<HostPathProvisioner>(None, "hpp")
            .unwrap()
            .status
            .unwrap()
            .observed_version
            .as_deref(),
        Some("v4")
    );
}

#[tokio::test]
async fn kinds_without_status_subresource_take_status_on_main_writes() {
    let fake = FakeApiServer::new();
    let api: Api<DaemonSet> = Api::namespaced(fake.client(), "ns");
    let mut ds = DaemonSet::default();
    ds.metadata.name = Some("ds".into());
    api.create(&PostParams::default(), &ds).await.unwrap();
    // DaemonSet has a status subresource, so /status on it works and the main resource ignores status.
    assert!(fake.set_status::<DaemonSet>(
        Some("ns"),
        "ds",
        json!({"numberReady": 2, "desiredNumberScheduled": 2, "currentNumberScheduled": 2, "numberMisscheduled": 0})
    ));
    assert_eq!(api.get("ds").await.unwrap().status.unwrap().number_ready, 2);
    // ConfigMaps have no status subresource: /status is 404.
    let cms: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    cms.create(&PostParams::default(), &cm("a", &[])).await.unwrap();
    let err = cms.get_status("a").await.unwrap_err();
    assert_eq!(api_error(err).0, 404);
}

#[tokio::test]
async fn dry_run_create_stores_nothing() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns1");
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let out = api.create(&pp, &cm("a", &[])).await.unwrap();
    assert_eq!(out.name_any(), "a");
    assert!(fake.get::<ConfigMap>(Some("ns1"), "a").is_none());
}

#[tokio::test]
async fn seed_upserts_and_keeps_identity() {
    let fake = FakeApiServer::new();
    let first = fake.seed(&{
        let mut c = cm("a", &[]);
        c.metadata.namespace = Some("ns".into());
        c
    });
    let mut changed = first.clone();
    changed.data = Some([("k".to_string(), "other".to_string())].into());
    let second = fake.seed(&changed);
    assert_eq!(second.uid(), first.uid());
    assert_ne!(second.resource_version(), first.resource_version());
    assert_eq!(fake.list::<ConfigMap>().len(), 1);
}

#[tokio::test]
async fn every_registered_version_serves_the_same_objects() {
    let fake = FakeApiServer::new();
    fake.register::<hpp_api::v1alpha1::HostPathProvisioner>(false, true);
    fake.register::<HostPathProvisioner>(false, true);
    let api: Api<HostPathProvisioner> = Api::all(fake.client());
    api.create(&PostParams::default(), &hpp("hpp")).await.unwrap();
    let alpha = kube::core::ApiResource::erase::<hpp_api::v1alpha1::HostPathProvisioner>(&());
    let old = fake.get_dynamic(&alpha, None, "hpp").unwrap();
    assert_eq!(old["apiVersion"], "hostpathprovisioner.kubevirt.io/v1alpha1");
    let alpha_api: Api<kube::api::DynamicObject> = Api::all_with(fake.client(), &alpha);
    assert_eq!(alpha_api.list(&ListParams::default()).await.unwrap().items.len(), 1);
}

#[tokio::test]
async fn metadata_only_requests_get_partial_object_metadata() {
    use futures::StreamExt;
    use kube::core::PartialObjectMeta;
    use kube::runtime::{WatchStreamExt, watcher};
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns1");
    api.create(&PostParams::default(), &cm("a", &[("app", "hpp")]))
        .await
        .unwrap();
    let meta = api.get_metadata("a").await.unwrap();
    assert_eq!(meta.metadata.labels.unwrap()["app"], "hpp");
    let list = api
        .list_metadata(&ListParams::default().labels("app=hpp"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    let meta_api: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(fake.client(), "ns1");
    let mut stream = watcher(meta_api, watcher::Config::default()).applied_objects().boxed();
    let first = tokio::time::timeout(std::time::Duration::from_secs(30), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.metadata.name.as_deref(), Some("a"));
    assert_eq!(
        first.types.unwrap().kind,
        "PartialObjectMetadata",
        "served as metadata only"
    );
}

#[tokio::test]
async fn seed_can_backdate_and_start_objects_out_deleting() {
    let fake = FakeApiServer::new();
    let mut obj = cm("old", &[]);
    obj.metadata.namespace = Some("ns".into());
    obj.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2020-01-01T00:00:00Z".parse().unwrap(),
    ));
    obj.metadata.deletion_timestamp = obj.metadata.creation_timestamp.clone();
    obj.metadata.finalizers = Some(vec!["example.com/f".into()]);
    let seeded = fake.seed(&obj);
    assert_eq!(seeded.metadata.creation_timestamp, obj.metadata.creation_timestamp);
    assert!(seeded.metadata.deletion_timestamp.is_some());
    // The API cannot do either.
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let mut posted = obj.clone();
    posted.metadata.name = Some("new".into());
    let created = api.create(&PostParams::default(), &posted).await.unwrap();
    assert_ne!(created.metadata.creation_timestamp, obj.metadata.creation_timestamp);
    assert!(created.metadata.deletion_timestamp.is_none());
}
