//! Watch streams: newline-delimited `{"type": ..., "object": ...}` events after a given
//! resourceVersion, filtered by namespace and selectors, open until `timeoutSeconds`, the
//! client hanging up, or the server going down.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};

use super::body::FakeBody;
use super::error::ApiError;
use super::handler::as_metadata;
use super::kinds::KindInfo;
use super::ops::present;
use super::selectors::{FieldSelector, LabelSelector};
use super::store::{EventType, State, StoredEvent, meta_str};

/// Which events one watch wants.
#[derive(Debug, Clone)]
pub(crate) struct WatchFilter {
    pub kind: KindInfo,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// Send `PartialObjectMetadata` objects (a metadata watch).
    pub metadata_only: bool,
}

impl WatchFilter {
    /// Whether `obj` is in the watched set.
    pub(crate) fn selects(&self, obj: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| meta_str(obj, "namespace") == Some(ns))
            && self.labels.matches(obj)
            && self.fields.matches(obj)
    }

    /// The wire event for `ev`, if this watch sees it. An object that starts or stops matching
    /// the selectors appears as ADDED or DELETED, as with the real watch cache.
    fn render(&self, ev: &StoredEvent) -> Option<Value> {
        if ev.key.group != self.kind.ar.group || ev.key.plural != self.kind.ar.plural {
            return None;
        }
        let now = self.selects(&ev.object);
        let before = ev.old.as_ref().is_some_and(|o| self.selects(o));
        let kind = match (ev.kind, before, now) {
            (EventType::Added, _, true) => "ADDED",
            (EventType::Deleted, _, true) => "DELETED",
            (EventType::Modified, true, true) => "MODIFIED",
            (EventType::Modified, false, true) => "ADDED",
            (EventType::Modified, true, false) => "DELETED",
            _ => return None,
        };
        Some(json!({"type": kind, "object": self.shape(&ev.object)}))
    }

    /// The object as this watch sends it.
    fn shape(&self, obj: &Value) -> Value {
        if self.metadata_only {
            as_metadata(obj)
        } else {
            present(&self.kind, obj)
        }
    }
}

/// What a watch request asked for.
#[derive(Debug, Clone)]
pub(crate) struct WatchRequest {
    pub filter: WatchFilter,
    /// `None` for "" / "0": start with synthetic ADDED events for the current state.
    pub resource_version: Option<u64>,
    pub timeout: Duration,
    /// `sendInitialEvents=true`: initial ADDED events, then a BOOKMARK marking their end.
    pub send_initial_events: bool,
    /// `allowWatchBookmarks=true`: a BOOKMARK every [`BOOKMARK_INTERVAL`] with the latest
    /// resourceVersion, so the client resumes from a recent version.
    pub bookmarks: bool,
}

/// How often a watch that allows bookmarks gets one (the API server sends them about once
/// a minute).
pub(crate) const BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);

/// How long before a watch's timeout it gets one more bookmark, as the API server's watch
/// cache sends one 2 s before the deadline: a client resuming after the timeout then resumes
/// from a version seconds old, not from up to a minute back.
pub(crate) const PRE_TIMEOUT_BOOKMARK: Duration = Duration::from_secs(2);

/// One event's line. `type` goes first, as a real API server writes it: serde_json's maps are
/// sorted, which would put `object` first and make a client's adjacently tagged `WatchEvent`
/// buffer the whole object before reading it (a cost a real watch does not have).
fn line(v: &Value) -> Bytes {
    let text = match (v.get("type"), v.get("object")) {
        (Some(kind), Some(object)) => format!("{{\"type\":{kind},\"object\":{object}}}\n"),
        _ => format!("{v}\n"),
    };
    Bytes::from(text)
}

/// Starts a watch against `state` (which the caller has locked) and returns its body.
pub(crate) fn start(state: &State, req: WatchRequest) -> FakeBody {
    let (tx, rx) = mpsc::channel(64);
    let down = state.down_tx.subscribe();
    let initial_state = req.send_initial_events || req.resource_version.is_none();
    let from = if initial_state {
        state.rv
    } else {
        req.resource_version.unwrap_or(state.rv)
    };
    let mut first: Vec<Value> = Vec::new();
    if initial_state {
        let kind = &req.filter.kind;
        first.extend(
            state
                .objects_of(&kind.ar.group, &kind.ar.plural, req.filter.namespace.as_deref())
                .filter(|(_, o)| req.filter.selects(o))
                .map(|(_, o)| json!({"type": "ADDED", "object": req.filter.shape(o)})),
        );
    }
    if req.send_initial_events {
        let mut end = bookmark(&req.filter, state.rv);
        end["object"]["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        first.push(end);
    }
    match state.subscribe_from(from) {
        Ok((backlog, live)) => {
            first.extend(backlog.iter().filter_map(|ev| req.filter.render(ev)));
            let bookmarks = req.bookmarks.then_some(state.rv);
            tokio::spawn(pump(tx, first, live, req.filter, req.timeout, bookmarks, down));
        }
        Err(floor) => {
            let gone = ApiError::from_code(410, format!("too old resource version: {from} ({floor})"));
            let _ = tx.try_send(line(&json!({"type": "ERROR", "object": gone.to_status()})));
        }
    }
    FakeBody::stream(rx)
}

/// A BOOKMARK event: every event up to `rv` has been sent.
fn bookmark(filter: &WatchFilter, rv: u64) -> Value {
    let (api_version, kind) = match filter.metadata_only {
        true => ("meta.k8s.io/v1", "PartialObjectMetadata"),
        false => (filter.kind.ar.api_version.as_str(), filter.kind.ar.kind.as_str()),
    };
    json!({"type": "BOOKMARK", "object": {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"resourceVersion": rv.to_string()}
    }})
}

/// Sends `first`, then the live events `filter` selects, until `timeout` (and, with
/// `bookmarks` = the version the history was read at, a bookmark every minute and one
/// [`PRE_TIMEOUT_BOOKMARK`] before the timeout).
async fn pump(
    tx: mpsc::Sender<Bytes>,
    first: Vec<Value>,
    mut live: broadcast::Receiver<Arc<StoredEvent>>,
    filter: WatchFilter,
    timeout: Duration,
    bookmarks: Option<u64>,
    mut down: watch::Receiver<u64>,
) {
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let last_bookmark = tokio::time::sleep(timeout.saturating_sub(PRE_TIMEOUT_BOOKMARK));
    tokio::pin!(last_bookmark);
    let mut last_bookmark_due = bookmarks.is_some() && timeout > PRE_TIMEOUT_BOOKMARK;
    let mut every_minute = tokio::time::interval_at(tokio::time::Instant::now() + BOOKMARK_INTERVAL, BOOKMARK_INTERVAL);
    // The version every event up to which was sent (events of every kind pass by here).
    let mut sent_up_to = bookmarks.unwrap_or(0);
    for ev in first {
        if tx.send(line(&ev)).await.is_err() {
            return;
        }
    }
    loop {
        tokio::select! {
            _ = &mut deadline => return,
            _ = down.changed() => return,
            () = tx.closed() => return,
            _ = every_minute.tick(), if bookmarks.is_some() => {
                if tx.send(line(&bookmark(&filter, sent_up_to))).await.is_err() {
                    return;
                }
            }
            () = &mut last_bookmark, if last_bookmark_due => {
                last_bookmark_due = false;
                if tx.send(line(&bookmark(&filter, sent_up_to))).await.is_err() {
                    return;
                }
            }
            ev = live.recv() => match ev {
                Ok(ev) => {
                    sent_up_to = sent_up_to.max(ev.rv);
                    if let Some(wire) = filter.render(&ev)
                        && tx.send(line(&wire)).await.is_err()
                    {
                        return;
                    }
                }
                // Lagged or closed: end the stream; the client re-watches from its last rv.
                Err(_) => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_event_line_names_its_type_before_its_object() {
        let text = line(&json!({"type": "MODIFIED", "object": {"kind": "Node", "apiVersion": "v1"}}));
        assert_eq!(
            std::str::from_utf8(&text).unwrap(),
            "{\"type\":\"MODIFIED\",\"object\":{\"apiVersion\":\"v1\",\"kind\":\"Node\"}}\n"
        );
    }
}
