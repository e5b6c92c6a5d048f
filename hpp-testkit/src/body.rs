//! The HTTP response body the fake hands to `kube::Client`: either one buffer or a live stream
//! of newline-delimited watch events.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

/// A response body: a complete buffer, or the receiving end of a watch stream.
///
/// A watch body ends when its producer task drops the sender (timeout, server down).
#[derive(Debug)]
pub struct FakeBody {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl FakeBody {
    /// A body holding `data` in one frame.
    pub(crate) fn full(data: Vec<u8>) -> Self {
        let data = if data.is_empty() { None } else { Some(Bytes::from(data)) };
        Self { kind: Kind::Full(data) }
    }

    /// A body fed chunk by chunk through `rx`.
    pub(crate) fn stream(rx: mpsc::Receiver<Bytes>) -> Self {
        Self { kind: Kind::Stream(rx) }
    }
}

impl Body for FakeBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match &mut self.kind {
            Kind::Full(data) => Poll::Ready(data.take().map(|b| Ok(Frame::data(b)))),
            Kind::Stream(rx) => rx.poll_recv(cx).map(|chunk| chunk.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.kind, Kind::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Kind::Full(None) => SizeHint::with_exact(0),
            Kind::Stream(_) => SizeHint::default(),
        }
    }
}
