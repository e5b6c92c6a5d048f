//! The HTTP layer: turns a `kube::Client` request into a store operation and a response with
//! the real server's status codes and bodies.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};

use super::body::FakeBody;
use super::discovery;
use super::error::ApiError;
use super::faults;
use super::kinds::KindInfo;
use super::ops::{Deleted, Part, PatchBody, present};
use super::path::{ObjectPath, Route, parse_query, route};
use super::record::RecordedRequest;
use super::selectors::{FieldSelector, LabelSelector};
use super::store::{Propagation, State};
use super::watch::{self, WatchFilter, WatchRequest};

/// The error type the fake's tower service returns for connection-level failures.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Default watch timeout when a client sends none (the real server picks 30-60 minutes).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// Locks the state, recovering from a poisoned mutex (a panicking test thread).
pub(crate) fn lock(inner: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    inner.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Serves one request.
pub(crate) async fn handle(
    inner: Arc<Mutex<State>>,
    req: Request<kube::client::Body>,
) -> Result<Response<FakeBody>, BoxError> {
    let (parts, body) = req.into_parts();
    let bytes = body.collect_bytes().await?;
    let mut unresponsive = lock(&inner).unresponsive.subscribe();
    // Held (not answered, not failed) until the server answers again.
    let _ = unresponsive.wait_for(|silent| !*silent).await;
    respond(&inner, &parts, &bytes)
}

fn header(parts: &http::request::Parts, name: http::header::HeaderName) -> Option<String> {
    parts
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// JSON, or YAML for apply patches, or `Null` when empty.
fn parse_body(bytes: &[u8]) -> Result<Value, String> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(bytes).or_else(|json_err| {
        let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
        serde_saphyr::from_str::<Value>(text).map_err(|yaml_err| format!("{json_err}; as YAML: {yaml_err}"))
    })
}

fn respond(inner: &Mutex<State>, parts: &http::request::Parts, bytes: &[u8]) -> Result<Response<FakeBody>, BoxError> {
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or_default().to_string();
    let content_type = header(parts, http::header::CONTENT_TYPE);
    let accept = header(parts, http::header::ACCEPT).unwrap_or_default();
    let body = parse_body(bytes);
    let mut state = lock(inner);
    let mut record = RecordedRequest {
        method: parts.method.clone(),
        path: path.clone(),
        query: query.clone(),
        content_type: content_type.clone(),
        body: body
            .clone()
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned())),
        status: 0,
    };
    if state.down {
        state.requests.push(record);
        return Err(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "fake API server is unavailable",
        )));
    }
    let result = match faults::injected(&mut state.failures, &parts.method, &path, &query) {
        Some(err) if err.code == 0 => {
            state.requests.push(record);
            return Err(Box::new(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "injected connection failure",
            )));
        }
        Some(err) => Err(err),
        None => match denied(&state, &parts.method, &path, &query) {
            Some(denied) => Err(denied),
            None => body.map_err(ApiError::bad_request).and_then(|body| {
                let req = Incoming {
                    method: &parts.method,
                    query: parse_query(&query),
                    content_type,
                    accept,
                    body,
                };
                state.writer = writer(&req, &path);
                let result = dispatch(&mut state, &path, req);
                state.writer = super::managed::Writer::default();
                result
            }),
        },
    };
    let response = result.unwrap_or_else(|e| json_response(e.code, &e.to_status()));
    record.status = response.status().as_u16();
    tracing::debug!(method = %record.method, path = %record.path, query = %record.query, status = record.status, "fake API request");
    state.requests.push(record);
    Ok(response)
}

/// The 403 answer when RBAC is enforced and does not allow the request.
fn denied(state: &State, method: &Method, path: &str, query: &str) -> Option<ApiError> {
    let policy = state.rbac.as_ref()?;
    let kinds = &state.kinds;
    let access = crate::rbac::access_of(method, path, query, |g, v, p| {
        kinds.get(g, v, p).is_some_and(|k| k.namespaced)
    })?;
    (!policy.allows(&access)).then(|| policy.forbidden(&access))
}

/// Who a write comes from, for `managedFields`: its field manager (`unknown` without one, where
/// a real server takes the user agent), `Apply` for an apply patch, and whether it goes through
/// `/status`.
fn writer(req: &Incoming<'_>, path: &str) -> super::managed::Writer {
    let apply = req
        .content_type
        .as_deref()
        .is_some_and(|c| c.starts_with("application/apply-patch"));
    super::managed::Writer {
        manager: req
            .query
            .get("fieldManager")
            .filter(|m| !m.is_empty())
            .cloned()
            .unwrap_or_else(|| "unknown".into()),
        operation: if apply { "Apply" } else { "Update" },
        status: path.ends_with("/status"),
    }
}

/// The parts of a request the dispatcher needs.
struct Incoming<'a> {
    method: &'a Method,
    query: BTreeMap<String, String>,
    content_type: Option<String>,
    accept: String,
    body: Value,
}

fn json_response(code: u16, body: &Value) -> Response<FakeBody> {
    let mut response = Response::new(FakeBody::full(body.to_string().into_bytes()));
    *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn ok(body: &Value) -> Result<Response<FakeBody>, ApiError> {
    Ok(json_response(200, body))
}

/// The `PartialObjectMetadata` form of an object (for `Accept: ...;as=PartialObjectMetadata`,
/// as `Api::get_metadata`, `list_metadata`, `watch_metadata` and `metadata_watcher` send).
pub(crate) fn as_metadata(obj: &Value) -> Value {
    json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// Reduces an object or a list response to metadata when the client asked for it.
fn shape(body: Value, metadata_only: bool) -> Value {
    if !metadata_only {
        return body;
    }
    match body.get("items").and_then(Value::as_array) {
        Some(items) => json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadataList",
            "metadata": body.get("metadata").cloned().unwrap_or_else(|| json!({})),
            "items": items.iter().map(as_metadata).collect::<Vec<_>>(),
        }),
        None => as_metadata(&body),
    }
}

fn dispatch(state: &mut State, path: &str, req: Incoming<'_>) -> Result<Response<FakeBody>, ApiError> {
    let kinds = &state.kinds;
    let route = route(path, |g, v, p| kinds.get(g, v, p).is_some_and(|k| k.namespaced));
    let aggregated = req.accept.contains("as=APIGroupDiscoveryList");
    let get = req.method == Method::GET;
    match route {
        Route::Version if get => ok(&discovery::version()),
        Route::CoreVersions if get && aggregated => ok(&discovery::aggregated(&state.kinds, true)),
        Route::CoreVersions if get => ok(&discovery::core_versions()),
        Route::Groups if get && aggregated => ok(&discovery::aggregated(&state.kinds, false)),
        Route::Groups if get => ok(&discovery::groups(&state.kinds)),
        Route::Group(g) if get => {
            discovery::group(&state.kinds, &g).map_or_else(|| Err(ApiError::no_route()), |d| ok(&d))
        }
        Route::Resources { group, version } if get => {
            discovery::resources(&state.kinds, &group, &version).map_or_else(|| Err(ApiError::no_route()), |d| ok(&d))
        }
        Route::Object(p) => object_request(state, p, req),
        Route::Unknown => Err(ApiError::no_route()),
        _ => Err(ApiError::from_code(
            405,
            format!("{} is not allowed on {path}", req.method),
        )),
    }
}

fn object_request(state: &mut State, p: ObjectPath, req: Incoming<'_>) -> Result<Response<FakeBody>, ApiError> {
    let kind = state
        .kinds
        .get(&p.group, &p.version, &p.plural)
        .cloned()
        .ok_or_else(ApiError::no_route)?;
    let part = match p.subresource.as_deref() {
        None => Part::Main,
        Some("status") if kind.status => Part::Status,
        Some(_) => return Err(ApiError::no_route()),
    };
    if kind.namespaced && p.name.is_some() && p.namespace.is_none() {
        return Err(ApiError::no_route());
    }
    let ns = p.namespace.as_deref();
    let dry_run = req.query.get("dryRun").is_some_and(|d| d == "All");
    let meta = req.accept.contains("as=PartialObjectMetadata");
    let method = req.method.clone();
    match (method, p.name.as_deref(), part) {
        (Method::GET, None, Part::Main) => {
            if req.query.get("watch").is_some_and(|w| w == "true" || w == "1") {
                watch_request(state, kind, ns, &req.query, meta)
            } else {
                list(state, &kind, ns, &req.query)
                    .map(|l| shape(l, meta))
                    .and_then(|l| ok(&l))
            }
        }
        (Method::GET, Some(name), _) => ok(&shape(state.get(&kind, ns, name)?, meta)),
        (Method::POST, None, Part::Main) => {
            let created = state.create(&kind, ns, req.body, Part::Main, dry_run)?;
            Ok(json_response(201, &present(&kind, &created)))
        }
        (Method::PUT, Some(name), part) => {
            let body = req.body;
            if !body.is_object() {
                return Err(ApiError::bad_request("the request body must be a JSON object"));
            }
            let updated = state.update(&kind, ns, name, part, dry_run, |o| {
                *o = body;
                Ok(())
            })?;
            ok(&shape(updated, meta))
        }
        (Method::PATCH, Some(name), part) => {
            let body = patch_body(&kind, &req)?;
            ok(&shape(state.patch(&kind, ns, name, part, body, dry_run)?, meta))
        }
        (Method::DELETE, Some(name), Part::Main) => {
            let (policy, preconditions, body_dry_run) = delete_options(&req)?;
            match state.delete(&kind, ns, name, policy, preconditions, dry_run || body_dry_run)? {
                Deleted::Pending(obj) => ok(&obj),
                Deleted::Gone(obj) => ok(&json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {
                        "name": name, "group": kind.ar.group, "kind": kind.ar.plural,
                        "uid": obj.pointer("/metadata/uid").cloned().unwrap_or(Value::Null)
                    }
                })),
            }
        }
        (Method::DELETE, None, Part::Main) => delete_collection(state, &kind, ns, &req, dry_run),
        (method, ..) => Err(ApiError::from_code(405, format!("{method} is not supported here"))),
    }
}

fn selectors(query: &BTreeMap<String, String>) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
    let fields = FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(format!("invalid field selector: {e}")))?;
    Ok((labels, fields))
}

fn list(state: &State, kind: &KindInfo, ns: Option<&str>, query: &BTreeMap<String, String>) -> Result<Value, ApiError> {
    let (labels, fields) = selectors(query)?;
    let after = query
        .get("continue")
        .filter(|c| !c.is_empty())
        .map(|c| match c.split_once('/') {
            Some((ns, name)) => (ns.to_string(), name.to_string()),
            None => (String::new(), c.clone()),
        });
    // Only the page's objects are copied: a paged list of 10,000 objects copied every
    // object after each page too (quadratic in the list).
    let mut items = state
        .objects_of(&kind.ar.group, &kind.ar.plural, ns)
        .filter(|(k, _)| {
            after
                .as_ref()
                .is_none_or(|(ns, name)| (k.namespace.as_str(), k.name.as_str()) > (ns.as_str(), name.as_str()))
        })
        .filter(|(_, o)| labels.matches(o) && fields.matches(o));
    let limit = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let mut page: Vec<_> = match limit {
        Some(limit) => items
            .by_ref()
            .take(limit)
            .map(|(k, o)| (k.clone(), present(kind, o)))
            .collect(),
        None => items.by_ref().map(|(k, o)| (k.clone(), present(kind, o))).collect(),
    };
    let remaining = items.count();
    let mut metadata = json!({"resourceVersion": state.rv.to_string()});
    if remaining > 0
        && let Some((last, _)) = page.last()
    {
        metadata["continue"] = json!(format!("{}/{}", last.namespace, last.name));
        metadata["remainingItemCount"] = json!(remaining);
    }
    let items: Vec<Value> = page.drain(..).map(|(_, o)| o).collect();
    Ok(json!({
        "apiVersion": kind.ar.api_version,
        "kind": format!("{}List", kind.ar.kind),
        "metadata": metadata,
        "items": items,
    }))
}

fn watch_request(
    state: &State,
    kind: KindInfo,
    ns: Option<&str>,
    query: &BTreeMap<String, String>,
    metadata_only: bool,
) -> Result<Response<FakeBody>, ApiError> {
    let (labels, fields) = selectors(query)?;
    let resource_version = match query.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv:?}")))?,
        ),
    };
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);
    let req = WatchRequest {
        filter: WatchFilter {
            kind,
            namespace: ns.map(str::to_string),
            labels,
            fields,
            metadata_only,
        },
        resource_version,
        timeout,
        send_initial_events: query.get("sendInitialEvents").is_some_and(|s| s == "true"),
        bookmarks: query.get("allowWatchBookmarks").is_some_and(|s| s == "true"),
    };
    let mut response = Response::new(watch::start(state, req));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

fn patch_body(kind: &KindInfo, req: &Incoming<'_>) -> Result<PatchBody, ApiError> {
    let content_type = req.content_type.as_deref().unwrap_or_default();
    let media = content_type.split(';').next().unwrap_or_default().trim();
    let body = req.body.clone();
    match media {
        "application/apply-patch+yaml" => {
            let manager = req.query.get("fieldManager").filter(|m| !m.is_empty()).cloned().ok_or_else(|| {
                ApiError::from_code(422, "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch")
            })?;
            if !body.is_object() {
                return Err(ApiError::bad_request("apply patch body must be an object"));
            }
            let force = req.query.get("force").is_some_and(|f| f == "true");
            Ok(PatchBody::Apply {
                config: body,
                manager,
                force,
            })
        }
        "application/merge-patch+json" => Ok(PatchBody::Merge(body)),
        "application/strategic-merge-patch+json" if kind.custom => Err(ApiError::from_code(
            415,
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (strategic merge patch is not supported for {})",
                kind.ar.kind
            ),
        )),
        "application/strategic-merge-patch+json" => Ok(PatchBody::Strategic(body)),
        "application/json-patch+json" => serde_json::from_value(body)
            .map(PatchBody::Json)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}"))),
        other => Err(ApiError::from_code(
            415,
            format!("unsupported patch content type {other:?}"),
        )),
    }
}

type Preconditions = (Option<String>, Option<String>);

fn delete_options(req: &Incoming<'_>) -> Result<(Propagation, Preconditions, bool), ApiError> {
    let body = &req.body;
    let policy_name = body
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| req.query.get("propagationPolicy").cloned());
    let orphan_flag = body.get("orphanDependents").and_then(Value::as_bool) == Some(true);
    let policy = match policy_name.as_deref() {
        Some("Foreground") => Propagation::Foreground,
        Some("Orphan") => Propagation::Orphan,
        Some("Background") => Propagation::Background,
        None if orphan_flag => Propagation::Orphan,
        None => Propagation::Background,
        Some(other) => return Err(ApiError::bad_request(format!("unknown propagationPolicy {other:?}"))),
    };
    let pre = |f: &str| {
        body.pointer(&format!("/preconditions/{f}"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let dry_run = body
        .get("dryRun")
        .and_then(Value::as_array)
        .is_some_and(|d| d.iter().any(|v| v == "All"));
    Ok((policy, (pre("uid"), pre("resourceVersion")), dry_run))
}

fn delete_collection(
    state: &mut State,
    kind: &KindInfo,
    ns: Option<&str>,
    req: &Incoming<'_>,
    dry_run: bool,
) -> Result<Response<FakeBody>, ApiError> {
    let (labels, fields) = selectors(&req.query)?;
    let (policy, _, body_dry_run) = delete_options(req)?;
    let names: Vec<(String, String)> = state
        .objects_of(&kind.ar.group, &kind.ar.plural, ns)
        .filter(|(_, o)| labels.matches(o) && fields.matches(o))
        .map(|(k, _)| (k.namespace.clone(), k.name.clone()))
        .collect();
    let mut items = Vec::new();
    for (namespace, name) in names {
        let namespace = Some(namespace.as_str()).filter(|n| !n.is_empty());
        match state.delete(kind, namespace, &name, policy, (None, None), dry_run || body_dry_run) {
            Ok(Deleted::Gone(o) | Deleted::Pending(o)) => items.push(o),
            // Already collected as a dependent of an earlier item.
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    ok(&json!({
        "apiVersion": kind.ar.api_version,
        "kind": format!("{}List", kind.ar.kind),
        "metadata": {"resourceVersion": state.rv.to_string()},
        "items": items,
    }))
}
