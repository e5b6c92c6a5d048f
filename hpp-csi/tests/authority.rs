//! gRPC clients other than Go's (C-core, Java, csc, grpcurl) send the unix socket path as the
//! HTTP/2 `:authority`. This test speaks raw HTTP/2 like they do and calls Identity/Probe.

#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use common::*;

/// Sends one Identity/Probe with `authority`, as a C-core client would.
async fn probe_with_authority(socket: &std::path::Path, authority: &str) -> Result<String, String> {
    hpp_testkit::grpc_client::unary_over_unix(socket, authority, "/csi.v1.Identity/Probe", &[])
        .await
        .map(|answer| answer.status)
}

#[tokio::test]
async fn socket_path_as_authority_is_accepted() {
    let h = Harness::start().await;
    let hpp_csi::Endpoint::Unix(socket) = h.endpoint.clone() else {
        panic!("unix endpoint expected");
    };
    // What grpc C-core, grpc-java and grpcurl send over a unix socket.
    let path = socket.to_string_lossy().into_owned();
    assert_eq!(probe_with_authority(&socket, &path).await, Ok("0".to_owned()));
    assert_eq!(
        probe_with_authority(&socket, &format!("unix:{path}")).await,
        Ok("0".to_owned())
    );
    // A normal authority still works.
    assert_eq!(probe_with_authority(&socket, "localhost").await, Ok("0".to_owned()));
    h.stop().await;
}
