//! Runs the own-tonic-server example: hpp's client and a gRPC C-core-style client (the socket
//! path as `:authority`, which fails without the driver's `AuthorityFix`) both get answers,
//! the metrics land in the example's registry, and stopping removes the socket.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

#[path = "../own_tonic_server.rs"]
mod example;

#[tokio::test]
async fn the_services_serve_from_our_own_server_and_record_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let running = example::start(dir.path()).await.unwrap();
    let outcome = running.use_it().await.unwrap();
    assert_eq!(outcome.driver_name, hpp_api::constants::DRIVER_NAME);
    assert_eq!(outcome.volume_id, "demo");
    assert!(dir.path().join("pool/demo").is_dir());

    let socket = running.socket.clone();
    let authority = socket.to_string_lossy().into_owned();
    let probe = hpp_testkit::grpc_client::unary_over_unix(&socket, &authority, "/csi.v1.Identity/Probe", &[])
        .await
        .unwrap();
    assert_eq!(probe.status, "0");

    let metrics = running.metrics().unwrap();
    for rpc in [
        r#"hpp_csi_rpc_requests_total{service="Controller",method="CreateVolume",code="Ok"} 1"#,
        r#"hpp_csi_rpc_requests_total{service="Identity",method="GetPluginInfo",code="Ok"} 1"#,
        r#"hpp_csi_rpc_requests_total{service="Identity",method="Probe",code="Ok"} 1"#,
    ] {
        assert!(metrics.contains(rpc), "{rpc}\n{metrics}");
    }
    running.stop().await.unwrap();
    assert!(!socket.exists(), "the socket is removed on stop");
}
