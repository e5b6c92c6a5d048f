//! Makes gRPC clients other than Go's work over the unix socket.
//!
//! grpc C-core (Python, C++, Ruby), grpc-java, `csc` and `grpcurl` send the socket path (for
//! example `/csi/csi.sock`) as the HTTP/2 `:authority`. That is not a valid URI authority, and
//! the `h2` crate resets every such stream with PROTOCOL_ERROR before tonic ever sees it
//! (hyperium/h2#487). [`AuthorityFix`] sits between the accepted unix stream and h2: it reads
//! the client's HTTP/2 frames, decodes each header block with the client's HPACK state,
//! replaces an `:authority` that is not a valid authority with `localhost`, and re-encodes the
//! block with its own HPACK encoder (so the server's decoder state stays consistent). Every other
//! frame passes through untouched; the server-to-client direction is not touched at all.
//!
//! A gRPC channel sends one authority on every request of a connection, so the first header
//! block decides: when its authority is valid (Go clients, tonic, anything dialling a host name)
//! the block goes through unchanged and the connection becomes a plain byte pipe with no
//! per-request cost; only connections that need it pay for the re-encoding.
//!
//! Only unix connections are wrapped: over TCP the authority is the dialled host and valid.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Authority given to requests that arrived with a socket path as authority.
pub const REPLACEMENT_AUTHORITY: &str = "localhost";

const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Largest frame we emit: the HTTP/2 default SETTINGS_MAX_FRAME_SIZE, which every peer accepts.
const MAX_EMIT_FRAME: usize = 16_384;
/// Largest header block we buffer (h2's own default limit on a header list is 16 MiB).
const MAX_HEADER_BLOCK: usize = 1 << 20;

/// A header block being collected across HEADERS and CONTINUATION frames.
#[derive(Debug)]
struct Pending {
    stream_id: u32,
    end_stream: bool,
    block: BytesMut,
    /// The frames as received, forwarded unchanged when the connection needs no rewriting.
    frames: BytesMut,
}

/// What the adapter does with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Until the first header block: deciding.
    Sniffing,
    /// The first authority was valid: bytes pass through untouched.
    Passthrough,
    /// The first authority was a socket path: every header block is re-encoded.
    Rewriting,
}

/// The client-to-server half of an HTTP/2 connection with `:authority` normalised. Wrap an
/// accepted unix stream in it before handing it to the HTTP/2 server.
pub struct AuthorityFix<S> {
    inner: S,
    /// Raw bytes from the client not yet processed.
    raw: BytesMut,
    /// Processed bytes not yet handed to the reader.
    out: BytesMut,
    preface_done: bool,
    mode: Mode,
    pending: Option<Pending>,
    decoder: fluke_hpack::Decoder<'static>,
    encoder: fluke_hpack::Encoder<'static>,
}

impl<S> std::fmt::Debug for AuthorityFix<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorityFix")
            .field("buffered_in", &self.raw.len())
            .field("buffered_out", &self.out.len())
            .finish_non_exhaustive()
    }
}

impl<S> AuthorityFix<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        AuthorityFix {
            inner,
            raw: BytesMut::new(),
            out: BytesMut::new(),
            preface_done: false,
            mode: Mode::Sniffing,
            pending: None,
            decoder: fluke_hpack::Decoder::new(),
            encoder: fluke_hpack::Encoder::new(),
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Moves every complete frame from `raw` to `out`, rewriting header blocks.
    fn process(&mut self) -> io::Result<()> {
        if !self.preface_done {
            if self.raw.len() < PREFACE_LEN {
                return Ok(());
            }
            self.out.extend_from_slice(&self.raw.split_to(PREFACE_LEN));
            self.preface_done = true;
        }
        while self.raw.len() >= FRAME_HEADER_LEN {
            if self.mode == Mode::Passthrough {
                let rest = self.raw.split();
                self.out.extend_from_slice(&rest);
                return Ok(());
            }
            let len = (usize::from(self.raw[0]) << 16) | (usize::from(self.raw[1]) << 8) | usize::from(self.raw[2]);
            if self.raw.len() < FRAME_HEADER_LEN + len {
                return Ok(());
            }
            let (kind, flags) = (self.raw[3], self.raw[4]);
            let stream_id = u32::from_be_bytes([self.raw[5], self.raw[6], self.raw[7], self.raw[8]]) & 0x7fff_ffff;
            let frame = self.raw.split_to(FRAME_HEADER_LEN + len);
            match kind {
                TYPE_HEADERS => {
                    let mut payload = &frame[FRAME_HEADER_LEN..];
                    let mut pad = 0;
                    if flags & FLAG_PADDED != 0 {
                        pad = usize::from(*payload.first().ok_or_else(|| malformed("empty padded HEADERS"))?);
                        payload = &payload[1..];
                    }
                    if flags & FLAG_PRIORITY != 0 {
                        payload = payload.get(5..).ok_or_else(|| malformed("short HEADERS priority"))?;
                    }
                    let payload = payload
                        .get(
                            ..payload
                                .len()
                                .checked_sub(pad)
                                .ok_or_else(|| malformed("HEADERS padding"))?,
                        )
                        .ok_or_else(|| malformed("HEADERS padding"))?;
                    self.pending = Some(Pending {
                        stream_id,
                        end_stream: flags & FLAG_END_STREAM != 0,
                        block: BytesMut::from(payload),
                        frames: if self.mode == Mode::Sniffing {
                            frame.clone()
                        } else {
                            BytesMut::new()
                        },
                    });
                }
                TYPE_CONTINUATION => {
                    let p = self
                        .pending
                        .as_mut()
                        .filter(|p| p.stream_id == stream_id)
                        .ok_or_else(|| malformed("CONTINUATION without HEADERS"))?;
                    if p.block.len() + len > MAX_HEADER_BLOCK {
                        return Err(malformed("header block too large"));
                    }
                    p.block.extend_from_slice(&frame[FRAME_HEADER_LEN..]);
                    if self.mode == Mode::Sniffing {
                        p.frames.extend_from_slice(&frame);
                    }
                }
                _ => {
                    self.out.extend_from_slice(&frame);
                    continue;
                }
            }
            if flags & FLAG_END_HEADERS != 0
                && let Some(p) = self.pending.take()
            {
                self.emit(p)?;
            }
        }
        Ok(())
    }

    /// Re-encodes one complete header block and appends it as HEADERS (+ CONTINUATION) frames.
    fn emit(&mut self, p: Pending) -> io::Result<()> {
        let headers = self
            .decoder
            .decode(&p.block)
            .map_err(|e| malformed(&format!("HPACK: {e:?}")))?;
        if self.mode == Mode::Sniffing {
            let all_valid = headers
                .iter()
                .all(|(n, v)| n.as_slice() != b":authority" || valid_authority(v));
            if all_valid {
                // The server decodes the original block, so its HPACK state matches the
                // client's from here on without us.
                self.out.extend_from_slice(&p.frames);
                self.mode = Mode::Passthrough;
                return Ok(());
            }
            self.mode = Mode::Rewriting;
        }
        let headers: Vec<(Vec<u8>, Vec<u8>)> = headers
            .into_iter()
            .map(|(name, value)| {
                if name == b":authority" && !valid_authority(&value) {
                    (name, REPLACEMENT_AUTHORITY.as_bytes().to_vec())
                } else {
                    (name, value)
                }
            })
            .collect();
        let mut block = BytesMut::from(
            &self
                .encoder
                .encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))[..],
        );
        let mut first = true;
        loop {
            let chunk = block.split_to(block.len().min(MAX_EMIT_FRAME));
            let last = block.is_empty();
            let (kind, mut flags) = if first {
                (TYPE_HEADERS, if p.end_stream { FLAG_END_STREAM } else { 0 })
            } else {
                (TYPE_CONTINUATION, 0)
            };
            if last {
                flags |= FLAG_END_HEADERS;
            }
            let len = u32::try_from(chunk.len()).map_err(|_| malformed("frame length"))?;
            self.out.put_slice(&len.to_be_bytes()[1..]);
            self.out.put_u8(kind);
            self.out.put_u8(flags);
            self.out.put_u32(p.stream_id);
            self.out.extend_from_slice(&chunk);
            first = false;
            if last {
                return Ok(());
            }
        }
    }
}

fn valid_authority(a: &[u8]) -> bool {
    http::uri::Authority::try_from(a).is_ok()
}

fn malformed(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed HTTP/2 from client: {what}"),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.mode == Mode::Passthrough && this.out.is_empty() && this.raw.is_empty() {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            if !this.out.is_empty() {
                let n = this.out.len().min(buf.remaining());
                buf.put_slice(&this.out[..n]);
                this.out.advance(n);
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 16 * 1024];
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    if rb.filled().is_empty() {
                        // End of stream: hand over whatever partial frame is left as it is.
                        let rest = this.raw.split();
                        if rest.is_empty() {
                            return Poll::Ready(Ok(()));
                        }
                        this.out.extend_from_slice(&rest);
                        continue;
                    }
                    this.raw.extend_from_slice(rb.filled());
                    if this.raw.len() > MAX_HEADER_BLOCK + FRAME_HEADER_LEN + (1 << 24) {
                        return Poll::Ready(Err(malformed("frame too large")));
                    }
                    this.process()?;
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for AuthorityFix<tokio::net::UnixStream> {
    type ConnectInfo = <tokio::net::UnixStream as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
