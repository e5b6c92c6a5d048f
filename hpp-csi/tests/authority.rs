//! gRPC clients other than Go's (C-core, Java, csc, grpcurl) send the unix socket path as the
//! HTTP/2 `:authority`. This test speaks raw HTTP/2 like they do and calls Identity/Probe.

#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Sends one unary call with `authority` and returns the trailers' grpc-status (or the reset).
async fn probe_with_authority(socket: &std::path::Path, authority: &str) -> Result<String, String> {
    let mut s = tokio::net::UnixStream::connect(socket).await.unwrap();
    let mut enc = fluke_hpack::Encoder::new();
    let block = enc.encode([
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", b"/csi.v1.Identity/Probe"),
        (b":authority", authority.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]);
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    out.extend(frame(0x1, 0x4, 1, &block)); // HEADERS, END_HEADERS
    out.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0])); // DATA: empty ProbeRequest, END_STREAM
    s.write_all(&out).await.unwrap();
    let mut dec = fluke_hpack::Decoder::new();
    loop {
        let mut head = [0u8; 9];
        if s.read_exact(&mut head).await.is_err() {
            return Err("connection closed".into());
        }
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).await.unwrap();
        match kind {
            0x4 if flags & 0x1 == 0 => s.write_all(&frame(0x4, 0x1, 0, &[])).await.unwrap(), // ACK
            0x3 if stream == 1 => return Err(format!("stream reset, code {:?}", &payload)),
            0x7 => return Err(format!("GOAWAY {:?}", &payload)),
            0x1 if stream == 1 => {
                let headers = dec.decode(&payload).unwrap();
                if let Some((_, v)) = headers.iter().find(|(n, _)| n == b"grpc-status") {
                    return Ok(String::from_utf8_lossy(v).into_owned());
                }
            }
            _ => {}
        }
    }
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
