//! Following the OpenShift APIServer `tlsSecurityProfile` through a kube client talking to the
//! hpp-testkit fake API server (discovery, list, watch).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use hpp_testkit::FakeApiServer;
use hpp_webhook::tls::profile::follow_openshift;
use hpp_webhook::tls::{PolicySource, TlsPolicy, TlsVersion};
use kube::api::{Api, DeleteParams, DynamicObject};
use kube::core::ApiResource;
use serde_json::{Value, json};
use tokio::sync::watch;

fn apiserver_resource() -> ApiResource {
    ApiResource {
        group: "config.openshift.io".into(),
        version: "v1".into(),
        api_version: "config.openshift.io/v1".into(),
        kind: "APIServer".into(),
        plural: "apiservers".into(),
    }
}

fn apiserver(profile: Value) -> Value {
    json!({
        "apiVersion": "config.openshift.io/v1",
        "kind": "APIServer",
        "metadata": {"name": "cluster"},
        "spec": {"tlsSecurityProfile": profile},
    })
}

/// A fake API server; with `openshift` it serves config.openshift.io/v1 APIServers and holds
/// the `cluster` object with `profile`.
fn fake_api(openshift: bool, profile: Value) -> FakeApiServer {
    let fake = FakeApiServer::new();
    if openshift {
        fake.register_api(apiserver_resource(), false, false);
        fake.seed_dynamic(&apiserver_resource(), apiserver(profile)).unwrap();
    }
    fake
}

#[tokio::test]
async fn follows_the_cluster_profile_as_it_changes() {
    let fake = fake_api(true, json!({"type": "Modern", "modern": {}}));
    let (tx, mut rx) = watch::channel(TlsPolicy::default());
    let task = tokio::spawn(follow_openshift(fake.client(), tx));

    rx.changed().await.unwrap();
    assert_eq!(rx.borrow_and_update().min_version(), TlsVersion::Tls13);

    let custom = json!({"type": "Custom", "custom": {"minTLSVersion": "VersionTLS12",
                        "ciphers": ["ECDHE-ECDSA-AES128-GCM-SHA256", "DHE-RSA-AES128-GCM-SHA256"]}});
    fake.seed_dynamic(&apiserver_resource(), apiserver(custom)).unwrap();
    rx.changed().await.unwrap();
    {
        let policy = rx.borrow_and_update();
        assert_eq!(policy.min_version(), TlsVersion::Tls12);
        assert_eq!(policy.source(), &PolicySource::OpenShift("Custom".into()));
        assert!(
            policy
                .cipher_names()
                .contains(&"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256")
        );
        assert!(!policy.cipher_names().contains(&"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"));
    }

    let api: Api<DynamicObject> = Api::all_with(fake.client(), &apiserver_resource());
    api.delete("cluster", &DeleteParams::default()).await.unwrap();
    rx.changed().await.unwrap();
    assert_eq!(
        *rx.borrow_and_update(),
        TlsPolicy::intermediate(PolicySource::OpenShift("Intermediate".into()))
    );

    // Nobody listens any more: the follower stops.
    drop(rx);
    task.await.unwrap();
}

#[tokio::test]
async fn without_openshift_the_default_stays() {
    let fake = fake_api(false, json!(null));
    let (tx, mut rx) = watch::channel(TlsPolicy::default());
    follow_openshift(fake.client(), tx).await;
    assert!(rx.changed().await.is_err(), "no policy is published");
    assert_eq!(*rx.borrow(), TlsPolicy::default());
}

#[tokio::test]
async fn start_policy_prefers_overrides() {
    let fake = fake_api(true, json!({"type": "Modern"}));
    let overrides = hpp_webhook::tls::resolve_overrides(Some("VersionTLS12"), None).unwrap();
    let rx = hpp_webhook::tls::start_policy(overrides, Some(fake.client()));
    // The override is in force at once and the cluster profile is not consulted.
    assert_eq!(rx.borrow().source(), &PolicySource::Override);
    assert_eq!(rx.borrow().metrics_tls_version_flag(), "VersionTLS12");
    let mut rx2 = rx.clone();
    // A follower of the cluster profile would have asked the API server by now.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(fake.requests().is_empty(), "{:?}", fake.requests());
    assert!(!rx2.has_changed().unwrap());
    assert_eq!(rx2.borrow_and_update().source(), &PolicySource::Override);
}
