//! RBAC enforcement: requests the policy does not allow answer 403 as the API server's
//! authorizer would (verb from method and query, subresources, names, namespaces).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use hpp_testkit::{FakeApiServer, RbacPolicy};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchParams};

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> PolicyRule {
    let v = |x: &[&str]| x.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(v(groups)),
        resources: Some(v(resources)),
        verbs: v(verbs),
        resource_names: (!names.is_empty()).then(|| v(names)),
        non_resource_urls: None,
    }
}

fn cm(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm
}

fn forbidden<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> String {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 => s.message,
        other => panic!("expected 403, got {other:?}"),
    }
}

#[tokio::test]
async fn each_call_is_checked_with_the_verb_the_api_server_derives() {
    let fake = FakeApiServer::new();
    fake.seed(&{
        let mut c = cm("mine");
        c.metadata.namespace = Some("ns".into());
        c
    });
    fake.enforce_rbac(
        RbacPolicy::new()
            .user("system:serviceaccount:ns:op")
            .namespace_rules(
                "ns",
                [
                    rule(&[""], &["configmaps"], &["get", "list", "create"], &[]),
                    rule(&[""], &["configmaps"], &["patch"], &["mine"]),
                ],
            )
            .cluster_rules([rule(&[""], &["nodes"], &["list"], &[])]),
    );
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    api.get("mine").await.unwrap();
    api.list(&ListParams::default()).await.unwrap();
    api.create(&PostParams::default(), &cm("new")).await.unwrap();
    let apply = PatchParams::apply("test").force();
    let body = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "b"}});
    api.patch("mine", &apply, &Patch::Apply(&body)).await.unwrap();
    // Patch of another name, update, delete, watch: not granted.
    let message = forbidden(api.patch("new", &apply, &Patch::Apply(&body)).await);
    assert_eq!(
        message,
        "configmaps \"new\" is forbidden: User \"system:serviceaccount:ns:op\" cannot patch resource \
         \"configmaps\" in API group \"\" in the namespace \"ns\""
    );
    forbidden(
        api.replace("mine", &PostParams::default(), &api.get("mine").await.unwrap())
            .await,
    );
    forbidden(api.delete("mine", &DeleteParams::default()).await);
    forbidden(
        api.delete_collection(&DeleteParams::default(), &ListParams::default())
            .await,
    );
    forbidden(api.watch(&WatchParams::default(), "0").await.map(|_| ()));
    // The Role is bound in ns only; nodes are listed, not read one by one.
    forbidden(
        Api::<ConfigMap>::namespaced(fake.client(), "other")
            .list(&ListParams::default())
            .await,
    );
    let nodes: Api<Node> = Api::all(fake.client());
    nodes.list(&ListParams::default()).await.unwrap();
    assert!(
        forbidden(nodes.get("n1").await)
            .ends_with("cannot get resource \"nodes\" in API group \"\" at the cluster scope")
    );
    // Discovery stays open; the test's own reads are not requests.
    kube::discovery::Discovery::new(fake.client()).run().await.unwrap();
    assert!(fake.get::<ConfigMap>(Some("ns"), "mine").is_some());
    assert_eq!(fake.denied_requests().len(), 7, "{:#?}", fake.denied_requests());
    assert!(
        fake.get::<ConfigMap>(Some("ns"), "mine").is_some(),
        "a denied delete deletes nothing"
    );
    fake.allow_all();
    api.delete("mine", &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn a_status_write_needs_the_subresource() {
    let fake = FakeApiServer::new();
    fake.seed(&{
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n
    });
    fake.enforce_rbac(RbacPolicy::new().cluster_rules([rule(&[""], &["nodes"], &["patch"], &[])]));
    let nodes: Api<Node> = Api::all(fake.client());
    let patch = Patch::Merge(serde_json::json!({"status": {"phase": "Running"}}));
    let message = forbidden(nodes.patch_status("n1", &PatchParams::default(), &patch).await);
    assert!(message.contains("cannot patch resource \"nodes/status\""), "{message}");
    fake.enforce_rbac(RbacPolicy::new().cluster_rules([rule(&[""], &["*/status"], &["patch"], &[])]));
    nodes.patch_status("n1", &PatchParams::default(), &patch).await.unwrap();
}
