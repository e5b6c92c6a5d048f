//! TLS behaviour over real sockets: certificate rotation, versions, cipher overrides, ALPN,
//! timeouts and body limits.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::{Server, client_config, connect_http, handshake, leaf_der, served_cert, write_pair};
use hpp_webhook::ServerOptions;
use hpp_webhook::cluster::{ClusterError, ClusterState};
use hpp_webhook::names::{CONVERT_PATH, VALIDATE_PATH};
use hpp_webhook::tls::{TlsPolicy, resolve_overrides};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use rustls::crypto::ring::cipher_suite;
use rustls::version::{TLS12, TLS13};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn override_policy(min: Option<&str>, ciphers: Option<&str>) -> TlsPolicy {
    resolve_overrides(min, ciphers).unwrap().unwrap().policy
}

#[tokio::test]
async fn rotated_certificate_is_served_to_new_connections() {
    let server = Server::builder().start().await;
    let first = served_cert(server.addr, server.client()).await.unwrap();
    assert_eq!(
        first,
        leaf_der(&std::fs::read_to_string(server.cert_dir().join("tls.crt")).unwrap())
    );

    // A client that keeps connecting during the rotation: every request must succeed.
    let stop = Arc::new(AtomicBool::new(false));
    let (addr, config) = (server.addr, server.client());
    let background = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut served = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let cert = served_cert(addr, config.clone())
                    .await
                    .expect("handshake during rotation");
                if served.last() != Some(&cert) {
                    served.push(cert);
                }
                tokio::task::yield_now().await;
            }
            served
        })
    };
    // A connection opened before the rotation keeps working after it.
    let mut kept = connect_http(server.addr, server.client()).await.unwrap();

    let (cert2, key2) = server.pki.issue("second");
    write_pair(&server.cert_dir(), &cert2, &key2);
    // Every connection from now on sees the new certificate.
    for _ in 0..3 {
        assert_eq!(
            served_cert(server.addr, server.client()).await.unwrap(),
            leaf_der(&cert2)
        );
    }
    let resp = kept
        .send_request(
            http::Request::get("/healthz")
                .header("host", "localhost")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    // A broken rotation (garbage, or a key that does not match) keeps the last good certificate.
    std::fs::write(server.cert_dir().join("tls.crt"), "-----BEGIN CERTIFICATE-----\nnope\n").unwrap();
    assert_eq!(
        served_cert(server.addr, server.client()).await.unwrap(),
        leaf_der(&cert2)
    );
    let (cert3, _) = server.pki.issue("third");
    let (_, other_key) = server.pki.issue("fourth");
    write_pair(&server.cert_dir(), &cert3, &other_key);
    assert_eq!(
        served_cert(server.addr, server.client()).await.unwrap(),
        leaf_der(&cert2)
    );
    // A good one after that is picked up.
    let (cert5, key5) = server.pki.issue("fifth");
    write_pair(&server.cert_dir(), &cert5, &key5);
    assert_eq!(
        served_cert(server.addr, server.client()).await.unwrap(),
        leaf_der(&cert5)
    );

    stop.store(true, Ordering::SeqCst);
    let served = background.await.unwrap();
    assert_eq!(
        served.first(),
        Some(&first),
        "the background client started on the first certificate"
    );
    assert!(
        served
            .iter()
            .all(|c| [&first, &leaf_der(&cert2), &leaf_der(&cert5)].contains(&c))
    );
    server.stop().await;
}

#[tokio::test]
async fn no_certificate_means_no_handshake_until_one_appears() {
    let server = Server::builder().without_cert().start().await;
    assert!(handshake(server.addr, server.client()).await.is_err());
    assert_eq!(server.metrics.handshake_failure_count(), 1);
    let (cert, key) = server.pki.issue("late");
    write_pair(&server.cert_dir(), &cert, &key);
    assert_eq!(
        served_cert(server.addr, server.client()).await.unwrap(),
        leaf_der(&cert)
    );
    assert_eq!(server.get("/readyz").await, (200, "ok".to_string()));
    server.stop().await;
}

#[tokio::test]
async fn untrusted_clients_fail_the_handshake() {
    let server = Server::builder().start().await;
    let other_ca = common::Pki::new("someone else");
    let config = client_config(&other_ca.ca_pem, rustls::DEFAULT_VERSIONS, None);
    assert!(handshake(server.addr, config).await.is_err());
    server.stop().await;
}

#[tokio::test]
async fn default_policy_serves_tls12_and_tls13() {
    let server = Server::builder().start().await;
    for version in [&TLS12, &TLS13] {
        let stream = handshake(server.addr, client_config(&server.pki.ca_pem, &[version], None))
            .await
            .unwrap();
        assert_eq!(stream.get_ref().1.protocol_version(), Some(version.version));
        assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    }
    server.stop().await;
}

#[tokio::test]
async fn min_version_override_is_honoured() {
    // TLS_MIN_VERSION_OVERRIDE=VersionTLS13: a TLS 1.2-only client is refused.
    let server = Server::builder()
        .policy(override_policy(Some("VersionTLS13"), None))
        .start()
        .await;
    assert!(
        handshake(server.addr, client_config(&server.pki.ca_pem, &[&TLS12], None))
            .await
            .is_err()
    );
    handshake(server.addr, client_config(&server.pki.ca_pem, &[&TLS13], None))
        .await
        .unwrap();
    server.stop().await;

    // TLS_MIN_VERSION_OVERRIDE=VersionTLS12 with only TLS 1.2 suites named still serves TLS 1.3
    // (the list governs TLS 1.2, as in Go), and a client offering other TLS 1.2 suites is refused.
    let server = Server::builder()
        .policy(override_policy(
            Some("VersionTLS12"),
            Some("ECDHE-ECDSA-AES256-GCM-SHA384"),
        ))
        .start()
        .await;
    handshake(server.addr, client_config(&server.pki.ca_pem, &[&TLS13], None))
        .await
        .unwrap();
    let wrong_suite = client_config(
        &server.pki.ca_pem,
        &[&TLS12],
        Some(vec![cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]),
    );
    assert!(handshake(server.addr, wrong_suite).await.is_err());
    let stream = handshake(server.addr, client_config(&server.pki.ca_pem, &[&TLS12], None))
        .await
        .unwrap();
    assert_eq!(
        stream.get_ref().1.negotiated_cipher_suite().unwrap().suite(),
        cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384.suite()
    );
    server.stop().await;
}

#[tokio::test]
async fn tls13_cipher_override_restricts_tls13() {
    let server = Server::builder()
        .policy(override_policy(
            Some("VersionTLS13"),
            Some("TLS_CHACHA20_POLY1305_SHA256"),
        ))
        .start()
        .await;
    let aes_only = client_config(
        &server.pki.ca_pem,
        &[&TLS13],
        Some(vec![
            cipher_suite::TLS13_AES_128_GCM_SHA256,
            cipher_suite::TLS13_AES_256_GCM_SHA384,
        ]),
    );
    assert!(handshake(server.addr, aes_only).await.is_err());
    let stream = handshake(server.addr, server.client()).await.unwrap();
    assert_eq!(
        stream.get_ref().1.negotiated_cipher_suite().unwrap().suite(),
        cipher_suite::TLS13_CHACHA20_POLY1305_SHA256.suite()
    );
    server.stop().await;
}

#[tokio::test]
async fn policy_changes_apply_to_new_connections() {
    // What following the OpenShift profile does: the policy source changes while serving.
    let server = Server::builder().start().await;
    let tls12_only = || client_config(&server.pki.ca_pem, &[&TLS12], None);
    handshake(server.addr, tls12_only()).await.unwrap();
    server
        .policy
        .send(hpp_webhook::tls::profile::policy_from_profile(Some(&json!({"type": "Modern"}))).policy)
        .unwrap();
    assert!(handshake(server.addr, tls12_only()).await.is_err());
    server
        .policy
        .send(hpp_webhook::tls::profile::policy_from_profile(Some(&json!({"type": "Intermediate"}))).policy)
        .unwrap();
    handshake(server.addr, tls12_only()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn only_http11_is_negotiated() {
    let server = Server::builder().start().await;
    let mut h2_only = server.client();
    h2_only.alpn_protocols = vec![b"h2".to_vec()];
    assert!(handshake(server.addr, h2_only).await.is_err());
    let mut both = server.client();
    both.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let stream = handshake(server.addr, both).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    server.stop().await;
}

/// Runs `openssl s_client` with extra arguments: whether a session was established, and the
/// output. None when openssl is not installed.
fn openssl_connect(port: u16, args: &[&str]) -> Option<(bool, String)> {
    let output = std::process::Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-servername",
            "localhost",
        ])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
    Some((output.status.success() && !text.contains("Cipher is (NONE)"), text))
}

#[tokio::test]
async fn tls10_and_tls11_clients_are_refused() {
    // rustls cannot speak TLS 1.0/1.1 at all; prove it with a client that can, when installed.
    let server = Server::builder().start().await;
    let port = server.addr.port();
    let result = tokio::task::spawn_blocking(move || {
        let modern = openssl_connect(port, &["-tls1_2"])?;
        // SECLEVEL=0 lets OpenSSL 3 offer TLS 1.0/1.1 at all, so a refusal comes from the server.
        let old: Vec<(bool, String)> = ["-tls1_1", "-tls1"]
            .iter()
            .filter_map(|v| openssl_connect(port, &[v, "-cipher", "DEFAULT@SECLEVEL=0"]))
            .collect();
        Some((modern, old))
    })
    .await
    .unwrap();
    match result {
        None => eprintln!("openssl not installed: TLS 1.0/1.1 refusal checked only through the rustls configuration"),
        Some(((modern, text), old)) => {
            assert!(
                modern,
                "openssl could not connect with TLS 1.2, so the checks below prove nothing: {text}"
            );
            assert_eq!(old.len(), 2);
            for (connected, text) in old {
                assert!(!connected, "a TLS 1.0/1.1 session was established: {text}");
                assert!(
                    text.contains("alert"),
                    "the server did not answer with an alert: {text}"
                );
            }
        }
    }
    // Also with the policy in which KubeVirt's Old profile asks for TLS 1.0: still TLS 1.2+.
    let old = hpp_webhook::tls::profile::policy_from_profile(Some(&json!({"type": "Old"}))).policy;
    assert_eq!(old.metrics_tls_version_flag(), "VersionTLS12");
    assert!(old.protocol_versions().iter().all(|v| [&TLS12, &TLS13].contains(v)));
    server.stop().await;
}

#[tokio::test]
async fn oversized_bodies_are_refused() {
    let options = ServerOptions {
        max_body_bytes: 4096,
        ..ServerOptions::default()
    };
    let server = Server::builder().options(options).start().await;
    let big = vec![b' '; 5000];
    for path in [VALIDATE_PATH, CONVERT_PATH] {
        let (status, body) = server.post(path, big.clone()).await;
        assert_eq!(status, 413, "{body}");
        assert_eq!(body["reason"], "RequestEntityTooLarge");
        assert_eq!(body["code"], 413);
    }
    // Just under the limit is read (and then rejected for what it is, not for its size).
    let (status, body) = server.post(VALIDATE_PATH, vec![b' '; 4000]).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["message"].as_str().unwrap().contains("not JSON"));
    server.stop().await;
}

#[tokio::test]
async fn chunked_oversized_bodies_are_refused() {
    let options = ServerOptions {
        max_body_bytes: 4096,
        ..ServerOptions::default()
    };
    let server = Server::builder().options(options).start().await;
    let mut stream = handshake(server.addr, server.client()).await.unwrap();
    let mut request = format!(
        "POST {VALIDATE_PATH} HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    for _ in 0..3 {
        request.extend_from_slice(format!("{:x}\r\n{}\r\n", 2000, " ".repeat(2000)).as_bytes());
    }
    request.extend_from_slice(b"0\r\n\r\n");
    stream.write_all(&request).await.unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    server.stop().await;
}

#[tokio::test]
async fn slow_headers_are_cut_off() {
    let options = ServerOptions {
        header_read_timeout: Duration::from_millis(200),
        ..ServerOptions::default()
    };
    let server = Server::builder().options(options).start().await;
    let mut stream = handshake(server.addr, server.client()).await.unwrap();
    stream
        .write_all(b"POST /convert HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    // The server closes the connection instead of waiting for the rest forever.
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    assert!(text.is_empty() || text.starts_with("HTTP/1.1 408"), "{text}");
    server.stop().await;
}

/// A cluster that never answers.
struct Hanging(AtomicUsize);

#[async_trait]
impl ClusterState for Hanging {
    async fn hostpath_provisioners(&self) -> Result<Vec<String>, ClusterError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
    async fn hpp_volume_count(&self) -> Result<usize, ClusterError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
}

#[tokio::test]
async fn requests_that_take_too_long_are_answered_with_an_error() {
    let options = ServerOptions {
        request_timeout: Duration::from_secs(2),
        ..ServerOptions::default()
    };
    let hanging = Arc::new(Hanging(AtomicUsize::new(0)));
    let server = Server::builder()
        .cluster(hanging.clone())
        .options(options)
        .start()
        .await;
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u", "operation": "DELETE", "name": "hpp",
            "kind": {"group": "hostpathprovisioner.kubevirt.io", "version": "v1beta1", "kind": "HostPathProvisioner"},
            "resource": {"group": "hostpathprovisioner.kubevirt.io", "version": "v1beta1", "resource": "hostpathprovisioners"},
            "userInfo": {}, "oldObject": null, "object": null,
        }
    });
    let (status, body) = server.post(VALIDATE_PATH, serde_json::to_vec(&review).unwrap()).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("not answered within"),
        "{body}"
    );
    assert_eq!(hanging.0.load(Ordering::SeqCst), 1);
    server.stop().await;
}

#[tokio::test]
async fn shutdown_drains_and_stops_accepting() {
    let server = Server::builder().start().await;
    let addr = server.addr;
    let mut sender = connect_http(addr, server.client()).await.unwrap();
    let config = server.client();
    server.stop().await;
    assert!(handshake(addr, config).await.is_err());
    // The open connection was closed by the drain.
    let result = sender
        .send_request(
            http::Request::get("/healthz")
                .header("host", "localhost")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
    match result {
        Err(_) => {}
        Ok(resp) => assert!(resp.into_body().collect().await.is_err()),
    }
}

#[tokio::test]
async fn connections_beyond_the_limit_wait_for_a_free_slot() {
    let options = ServerOptions {
        max_connections: 1,
        ..ServerOptions::default()
    };
    let server = Server::builder().options(options).start().await;
    let first = connect_http(server.addr, server.client()).await.unwrap();
    // The second client is accepted by the kernel but not served while the first is open.
    let (addr, config) = (server.addr, server.client());
    let second = tokio::spawn(async move { served_cert(addr, config).await });
    // Give it a chance to be (wrongly) served; a slow machine can only make this pass vacuously.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !second.is_finished(),
        "a second connection was served beyond max_connections"
    );
    drop(first);
    second.await.unwrap().unwrap();
    server.stop().await;
}
