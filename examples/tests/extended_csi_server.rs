//! Runs the extended-server example and calls it as a gRPC C-core client does (the socket
//! path as `:authority`): both its own health service and the CSI services answer; stopping
//! it removes the socket.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

#[path = "../extended_csi_server.rs"]
mod example;

use hpp_testkit::grpc_client::unary_over_unix;

#[tokio::test]
async fn an_extended_server_answers_c_core_clients_on_every_service() {
    let dir = tempfile::tempdir().unwrap();
    let running = example::start(dir.path()).await.unwrap();
    let socket = running.socket.clone();
    let authority = socket.to_string_lossy().into_owned();

    // grpc.health.v1.Health/Check{service: "hostpath"}, encoded by hand: field 1, 8 bytes.
    let mut check = vec![0x0a, 0x08];
    check.extend_from_slice(b"hostpath");
    let health = unary_over_unix(&socket, &authority, "/grpc.health.v1.Health/Check", &check)
        .await
        .unwrap();
    assert_eq!(health.status, "0");
    // HealthCheckResponse{status: SERVING (1)}.
    assert_eq!(health.message, [0x08, 0x01]);

    for authority in [authority.clone(), format!("unix:{authority}"), "localhost".to_owned()] {
        let probe = unary_over_unix(&socket, &authority, "/csi.v1.Identity/Probe", &[])
            .await
            .unwrap();
        assert_eq!(probe.status, "0", "{authority}");
    }

    running.stop().await.unwrap();
    assert!(!socket.exists(), "the socket is removed on stop");
}
