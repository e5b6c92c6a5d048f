//! The conversion webhook over real TLS: v1alpha1 ⇄ v1beta1 in a ConversionReview.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use common::Server;
use hpp_api::constants::ANNOTATION_CONVERSION_DATA;
use hpp_webhook::names::CONVERT_PATH;
use serde_json::{Value, json};

const ALPHA: &str = "hostpathprovisioner.kubevirt.io/v1alpha1";
const BETA: &str = "hostpathprovisioner.kubevirt.io/v1beta1";

fn conversion_review(review_version: &str, desired: &str, objects: Vec<Value>) -> Value {
    json!({
        "apiVersion": review_version,
        "kind": "ConversionReview",
        "request": {"uid": "0a1b2c3d-4e5f", "desiredAPIVersion": desired, "objects": objects},
    })
}

async fn convert(server: &Server, body: &Value) -> Value {
    let (status, reply) = server.post(CONVERT_PATH, serde_json::to_vec(body).unwrap()).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["apiVersion"], body["apiVersion"]);
    assert_eq!(reply["kind"], "ConversionReview");
    assert_eq!(reply["response"]["uid"], "0a1b2c3d-4e5f");
    reply["response"].clone()
}

fn beta_with_pools() -> Value {
    json!({
        "apiVersion": BETA,
        "kind": "HostPathProvisioner",
        "metadata": {"name": "hostpath-provisioner", "resourceVersion": "42"},
        "spec": {
            "imagePullPolicy": "IfNotPresent",
            "storagePools": [{"name": "local", "path": "/var/hpvolumes", "snapshotProvider": "reflink"}],
            "featureGates": ["Snapshotting"],
        },
        "status": {"observedVersion": "v1", "storagePoolStatuses": [{"name": "local", "phase": "Ready"}]},
    })
}

fn alpha_legacy() -> Value {
    json!({
        "apiVersion": ALPHA,
        "kind": "HostPathProvisioner",
        "metadata": {"name": "hostpath-provisioner"},
        "spec": {"pathConfig": {"path": "/var/hpvolumes", "useNamingPrefix": "True"}},
    })
}

#[tokio::test]
async fn converts_both_ways_losslessly() {
    let server = Server::builder().start().await;
    for review_version in ["apiextensions.k8s.io/v1", "apiextensions.k8s.io/v1beta1"] {
        // v1beta1 → v1alpha1: fields v1alpha1 lacks travel in the annotation.
        let response = convert(
            &server,
            &conversion_review(review_version, ALPHA, vec![beta_with_pools()]),
        )
        .await;
        assert_eq!(response["result"]["status"], "Success", "{response}");
        let alpha = response["convertedObjects"][0].clone();
        assert_eq!(alpha["apiVersion"], ALPHA);
        assert_eq!(alpha["metadata"]["resourceVersion"], "42");
        assert!(
            alpha["metadata"]["annotations"][ANNOTATION_CONVERSION_DATA].is_string(),
            "{alpha}"
        );
        // ... and back, byte for byte.
        let response = convert(&server, &conversion_review(review_version, BETA, vec![alpha])).await;
        assert_eq!(response["convertedObjects"][0], beta_with_pools());

        // v1alpha1 → v1beta1: the string flag becomes a bool, its spelling is kept for the way back.
        let response = convert(&server, &conversion_review(review_version, BETA, vec![alpha_legacy()])).await;
        let beta = response["convertedObjects"][0].clone();
        assert_eq!(beta["apiVersion"], BETA);
        assert_eq!(beta["spec"]["pathConfig"]["useNamingPrefix"], true);
        let response = convert(&server, &conversion_review(review_version, ALPHA, vec![beta])).await;
        assert_eq!(response["convertedObjects"][0], alpha_legacy());
    }
    // Several objects in several versions, order kept; objects already at the target are untouched.
    let response = convert(
        &server,
        &conversion_review("apiextensions.k8s.io/v1", BETA, vec![alpha_legacy(), beta_with_pools()]),
    )
    .await;
    let objects = response["convertedObjects"].as_array().unwrap();
    assert_eq!(objects.len(), 2);
    assert_eq!(objects[0]["spec"]["pathConfig"]["path"], "/var/hpvolumes");
    assert_eq!(objects[1], beta_with_pools());
    assert_eq!(server.metrics.request_count("convert", "converted"), 9);
    server.stop().await;
}

#[tokio::test]
async fn failures_name_the_object() {
    let server = Server::builder().start().await;
    let response = convert(
        &server,
        &conversion_review(
            "apiextensions.k8s.io/v1",
            "hostpathprovisioner.kubevirt.io/v2",
            vec![alpha_legacy()],
        ),
    )
    .await;
    assert_eq!(response["result"]["status"], "Failure");
    let message = response["result"]["message"].as_str().unwrap();
    assert!(
        message.contains("objects[0]") && message.contains("hostpath-provisioner"),
        "{message}"
    );
    assert!(message.contains("v2"), "{message}");
    assert!(response["convertedObjects"].as_array().is_none_or(Vec::is_empty));

    let mut broken = alpha_legacy();
    broken["spec"]["pathConfig"] = json!("not an object");
    let response = convert(
        &server,
        &conversion_review("apiextensions.k8s.io/v1", BETA, vec![broken]),
    )
    .await;
    assert_eq!(response["result"]["status"], "Failure");
    assert!(response["result"]["message"].as_str().unwrap().contains("v1alpha1"));

    let (status, body) = server.post(CONVERT_PATH, "[]").await;
    assert_eq!(status, 400);
    assert!(body["message"].as_str().unwrap().contains("ConversionReview"), "{body}");
    let (status, body) = server.post(CONVERT_PATH, "\u{0}\u{1}binary").await;
    assert_eq!(status, 400);
    assert!(body["message"].as_str().unwrap().contains("not JSON"), "{body}");
    let (status, body) = server
        .post(
            CONVERT_PATH,
            r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview"}"#,
        )
        .await;
    assert_eq!(status, 400);
    assert!(body["message"].as_str().unwrap().contains("request"), "{body}");
    assert_eq!(server.metrics.request_count("convert", "failed"), 2);
    assert_eq!(server.metrics.request_count("convert", "rejected"), 3);
    server.stop().await;
}

#[tokio::test]
async fn reviews_close_their_connection() {
    // The API server's client does not resend a POST on a connection the server closed under
    // it, so the server never keeps one open for a later review.
    let server = Server::builder().start().await;
    let mut sender = common::connect_http(server.addr, server.client()).await.unwrap();
    let body = conversion_review("apiextensions.k8s.io/v1", BETA, vec![alpha_legacy()]);
    let req = http::Request::post(CONVERT_PATH)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(axum::body::Bytes::from(
            serde_json::to_vec(&body).unwrap(),
        )))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["connection"], "close");
    drop(resp);
    // hyper's client sees the close and refuses to reuse the connection.
    tokio::time::timeout(std::time::Duration::from_secs(10), sender.ready())
        .await
        .unwrap()
        .unwrap_err();
    server.stop().await;
}
