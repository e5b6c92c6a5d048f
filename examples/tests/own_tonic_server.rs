//! Runs the own-tonic-server example and checks the volume and the metrics it recorded.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

#[path = "../own_tonic_server.rs"]
mod example;

#[tokio::test]
async fn the_services_serve_from_our_own_server_and_record_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let outcome = example::run(dir.path()).await.unwrap();
    assert_eq!(outcome.driver_name, hpp_api::constants::DRIVER_NAME);
    assert_eq!(outcome.volume_id, "demo");
    assert!(dir.path().join("pool/demo").is_dir());
    assert!(
        outcome
            .metrics
            .contains(r#"hpp_csi_rpc_requests_total{service="Controller",method="CreateVolume",code="Ok"} 1"#),
        "{}",
        outcome.metrics
    );
    assert!(
        outcome
            .metrics
            .contains(r#"hpp_csi_rpc_requests_total{service="Identity",method="GetPluginInfo",code="Ok"} 1"#),
        "{}",
        outcome.metrics
    );
}
