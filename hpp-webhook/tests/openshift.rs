//! Following the OpenShift APIServer `tlsSecurityProfile` through a kube client talking to a small
//! in-process fake of the API (discovery, list, watch).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use futures::stream;
use hpp_webhook::tls::profile::follow_openshift;
use hpp_webhook::tls::{PolicySource, TlsPolicy, TlsVersion};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use serde_json::{Value, json};
use tokio::sync::watch;

type Body = BoxBody<Bytes, Infallible>;
type Events = mpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>;

fn apiserver(profile: Value, resource_version: &str) -> Value {
    json!({
        "apiVersion": "config.openshift.io/v1",
        "kind": "APIServer",
        "metadata": {"name": "cluster", "resourceVersion": resource_version},
        "spec": {"tlsSecurityProfile": profile},
    })
}

fn json_response(code: u16, value: &Value) -> http::Response<Body> {
    http::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(value).unwrap())).boxed())
        .unwrap()
}

/// A fake API server. `openshift` decides whether config.openshift.io exists; the first watch
/// streams whatever the returned sender sends.
fn fake_api(openshift: bool, listed: Value) -> (kube::Client, Events) {
    let (events, receiver) = mpsc::unbounded();
    let receiver = Arc::new(Mutex::new(Some(receiver)));
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let receiver = receiver.clone();
        let listed = listed.clone();
        async move {
            let path = req.uri().path().to_string();
            let query = req.uri().query().unwrap_or_default().to_string();
            let not_found = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "the server could not find the requested resource"});
            let response = match path.as_str() {
                _ if !openshift => json_response(404, &not_found),
                "/apis/config.openshift.io/v1" => json_response(
                    200,
                    &json!({
                        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "config.openshift.io/v1",
                        "resources": [{"name": "apiservers", "singularName": "apiserver", "namespaced": false,
                                       "kind": "APIServer", "verbs": ["get", "list", "watch"]}],
                    }),
                ),
                "/apis/config.openshift.io/v1/apiservers" if query.contains("watch=true") => {
                    assert!(query.contains("fieldSelector=metadata.name%3Dcluster"), "{query}");
                    let body = match receiver.lock().unwrap().take() {
                        Some(rx) => BodyExt::boxed(StreamBody::new(rx)),
                        None => BodyExt::boxed(StreamBody::new(stream::pending())),
                    };
                    http::Response::builder().status(200).body(body).unwrap()
                }
                "/apis/config.openshift.io/v1/apiservers" => {
                    assert!(query.contains("fieldSelector=metadata.name%3Dcluster"), "{query}");
                    json_response(
                        200,
                        &json!({"apiVersion": "config.openshift.io/v1", "kind": "APIServerList",
                                "metadata": {"resourceVersion": "1"}, "items": [listed]}),
                    )
                }
                _ => json_response(404, &not_found),
            };
            Ok::<_, Infallible>(response)
        }
    });
    (kube::Client::new(service, "default"), events)
}

fn send_event(events: &Events, kind: &str, object: Value) {
    let line = format!("{}\n", json!({"type": kind, "object": object}));
    events.unbounded_send(Ok(Frame::data(Bytes::from(line)))).unwrap();
}

#[tokio::test]
async fn follows_the_cluster_profile_as_it_changes() {
    let (client, events) = fake_api(true, apiserver(json!({"type": "Modern", "modern": {}}), "1"));
    let (tx, mut rx) = watch::channel(TlsPolicy::default());
    let task = tokio::spawn(follow_openshift(client, tx));

    rx.changed().await.unwrap();
    assert_eq!(rx.borrow_and_update().min_version(), TlsVersion::Tls13);

    let custom = json!({"type": "Custom", "custom": {"minTLSVersion": "VersionTLS12",
                        "ciphers": ["ECDHE-ECDSA-AES128-GCM-SHA256", "DHE-RSA-AES128-GCM-SHA256"]}});
    send_event(&events, "MODIFIED", apiserver(custom, "2"));
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

    send_event(&events, "DELETED", apiserver(json!(null), "3"));
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
    let (client, _events) = fake_api(false, json!(null));
    let (tx, mut rx) = watch::channel(TlsPolicy::default());
    follow_openshift(client, tx).await;
    assert!(rx.changed().await.is_err(), "no policy is published");
    assert_eq!(*rx.borrow(), TlsPolicy::default());
}

#[tokio::test]
async fn start_policy_prefers_overrides() {
    let (client, _events) = fake_api(true, apiserver(json!({"type": "Modern"}), "1"));
    let overrides = hpp_webhook::tls::resolve_overrides(Some("VersionTLS12"), None).unwrap();
    let rx = hpp_webhook::tls::start_policy(overrides, Some(client));
    // The override is in force at once and the cluster profile is not consulted.
    assert_eq!(rx.borrow().source(), &PolicySource::Override);
    assert_eq!(rx.borrow().metrics_tls_version_flag(), "VersionTLS12");
    let mut rx2 = rx.clone();
    tokio::task::yield_now().await;
    assert!(!rx2.has_changed().unwrap());
    assert_eq!(rx2.borrow_and_update().source(), &PolicySource::Override);
}
