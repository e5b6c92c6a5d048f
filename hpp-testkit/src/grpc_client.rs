//! A gRPC client that speaks the way gRPC C-core (Python, Ruby, C++, PHP), grpc-java, csc and
//! grpcurl do over a unix socket: raw HTTP/2 with the socket path as `:authority`, which Go's
//! client never sends. hpp's own client cannot catch a server that resets those streams; this
//! one does. One unary call per connection; enough for tests.

use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the server answered to one unary call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnaryAnswer {
    /// `grpc-status` of the trailers (`"0"` is OK).
    pub status: String,
    /// The response message (protobuf bytes, without the gRPC frame header), when one came.
    pub message: Vec<u8>,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap_or(0).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Calls `path` (`/package.Service/Method`) on the server at unix socket `socket` with
/// `:authority` set to `authority` (C-core sends the socket path, or `unix:<path>`) and the
/// protobuf-encoded `request`. `Err` says how the call failed on the wire: a stream reset, a
/// GOAWAY, the connection closing.
pub async fn unary_over_unix(
    socket: &Path,
    authority: &str,
    path: &str,
    request: &[u8],
) -> Result<UnaryAnswer, String> {
    let mut s = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| format!("connect {}: {e}", socket.display()))?;
    let mut enc = fluke_hpack::Encoder::new();
    let block = enc.encode([
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", path.as_bytes()),
        (b":authority", authority.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]);
    let mut body = vec![0u8];
    body.extend_from_slice(&u32::try_from(request.len()).unwrap_or(0).to_be_bytes());
    body.extend_from_slice(request);
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    out.extend(frame(0x1, 0x4, 1, &block)); // HEADERS, END_HEADERS
    out.extend(frame(0x0, 0x1, 1, &body)); // DATA, END_STREAM
    s.write_all(&out).await.map_err(|e| e.to_string())?;
    let mut dec = fluke_hpack::Decoder::new();
    let mut message = Vec::new();
    loop {
        let mut head = [0u8; 9];
        if s.read_exact(&mut head).await.is_err() {
            return Err("connection closed".into());
        }
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).await.map_err(|e| e.to_string())?;
        match kind {
            0x4 if flags & 0x1 == 0 => s.write_all(&frame(0x4, 0x1, 0, &[])).await.map_err(|e| e.to_string())?,
            0x3 if stream == 1 => return Err(format!("stream reset, code {:?}", &payload)),
            0x7 => return Err(format!("GOAWAY {:?}", &payload)),
            0x0 if stream == 1 => message.extend_from_slice(payload.get(5..).unwrap_or_default()),
            0x1 if stream == 1 => {
                let headers = dec.decode(&payload).map_err(|e| format!("{e:?}"))?;
                if let Some((_, v)) = headers.iter().find(|(n, _)| n == b"grpc-status") {
                    return Ok(UnaryAnswer {
                        status: String::from_utf8_lossy(v).into_owned(),
                        message,
                    });
                }
            }
            _ => {}
        }
    }
}
