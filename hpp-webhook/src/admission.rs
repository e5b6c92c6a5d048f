//! The validating webhook: AdmissionReview `admission.k8s.io/v1` or `v1beta1` in, the same
//! version out.
//!
//! - CREATE: `hpp-api` create rules, then a second HostPathProvisioner is refused.
//! - UPDATE: `hpp-api` update rules (old and new; problems the old object already had are
//!   tolerated and returned as warnings).
//! - DELETE: refused while PersistentVolumes provisioned by hpp exist, unless the CR carries
//!   [`ANNOTATION_FORCE_DELETE`]`: "true"`, because deleting the CR removes the CSI driver those
//!   volumes need.
//!
//! Denials carry the JSON field paths in the message and in `status.details.causes`. Cluster
//! lookups that fail deny the request (fail closed). Without a cluster the singleton and volume
//! checks are off.

use hpp_api::HostPathProvisioner;
use hpp_api::constants::{ANNOTATION_FORCE_DELETE, GROUP, KIND};
use hpp_api::conversion::{API_VERSION_V1BETA1, convert_json};
use hpp_api::validation::{ValidateCreate, ValidateUpdate, ValidationErrors};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::{StatusCause, StatusDetails};
use kube::core::{DynamicObject, Status};
use serde_json::Value;
use std::time::Duration;
use tracing::{Instrument, info, info_span, warn};

use crate::cluster::ClusterState;
use crate::reply::Reply;

/// Longest validation may take before the request is refused. Validation is bounded by the
/// pool limit and runs on the blocking pool, never on an async worker; the budget is the
/// backstop that still answers the API server in time if it is ever slow.
pub const VALIDATION_BUDGET: Duration = Duration::from_secs(2);

/// AdmissionReview versions served.
pub const ADMISSION_VERSIONS: &[&str] = &["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];

/// The outcome of one admission request.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Admit, with warnings shown to the client.
    Allow(Vec<String>),
    /// Refuse with this status (message, reason, code, causes).
    Deny(Box<Status>),
}

/// Answers one webhook call. Never panics: input that is not an AdmissionReview gets a 400
/// `Status`; a review whose request cannot be read gets a denial naming the problem.
pub async fn review(body: &[u8], cluster: Option<&dyn ClusterState>) -> Reply {
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return Reply::bad_request(format!("request body is not JSON: {e}")),
    };
    let api_version = value.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or_default();
    if kind != "AdmissionReview" || !ADMISSION_VERSIONS.contains(&api_version) {
        return Reply::bad_request(format!(
            "expected an AdmissionReview of apiVersion {}, got kind {kind:?} apiVersion {api_version:?}",
            ADMISSION_VERSIONS.join(" or ")
        ));
    }
    let Some(uid) = value
        .pointer("/request/uid")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return Reply::bad_request("AdmissionReview has no request.uid");
    };
    let (api_version, kind) = (api_version.to_string(), kind.to_string());
    let request: AdmissionRequest<DynamicObject> = match serde_json::from_value::<AdmissionReview<DynamicObject>>(value)
        .map_err(|e| e.to_string())
        .and_then(|r| {
            r.try_into()
                .map_err(|e: kube::core::admission::ConvertAdmissionReviewError| e.to_string())
        }) {
        Ok(r) => r,
        Err(e) => {
            warn!(%uid, error = %e, "malformed AdmissionReview");
            let mut response = AdmissionResponse::invalid(format!("malformed AdmissionReview request: {e}"));
            response.uid = uid;
            response.types.api_version = api_version;
            response.types.kind = kind;
            response.result.code = 400;
            response.result.reason = "BadRequest".into();
            return Reply::ok(to_json(response));
        }
    };
    let span = info_span!(
        "admission",
        uid = %request.uid,
        operation = ?request.operation,
        name = %request.name,
        version = %request.types.api_version,
    );
    async move {
        let verdict = decide(&request, cluster).await;
        let response = AdmissionResponse::from(&request);
        let response = match verdict {
            Verdict::Allow(warnings) => {
                info!(allowed = true, "admission");
                let mut r = response;
                if !warnings.is_empty() {
                    r.warnings = Some(warnings);
                }
                r
            }
            Verdict::Deny(status) => {
                info!(allowed = false, reason = %status.reason, message = %status.message, "admission");
                let mut r = response.deny(&status.message);
                r.result = *status;
                r
            }
        };
        Reply::ok(to_json(response))
    }
    .instrument(span)
    .await
}

fn to_json(response: AdmissionResponse) -> Value {
    serde_json::to_value(response.into_review()).unwrap_or(Value::Null)
}

/// The admission decision for a parsed request.
pub async fn decide(req: &AdmissionRequest<DynamicObject>, cluster: Option<&dyn ClusterState>) -> Verdict {
    if req.kind.group != GROUP || req.kind.kind != KIND {
        warn!(kind = ?req.kind, "request for a kind this webhook does not validate; allowing");
        return Verdict::Allow(Vec::new());
    }
    if req.sub_resource.as_deref().is_some_and(|s| !s.is_empty()) {
        // Status writes by the operator; the spec is unchanged.
        return Verdict::Allow(Vec::new());
    }
    match req.operation {
        Operation::Create => admit_create(req, cluster).await,
        Operation::Update => admit_update(req).await,
        Operation::Delete => admit_delete(req, cluster).await,
        Operation::Connect => Verdict::Allow(Vec::new()),
    }
}

/// A HostPathProvisioner from the request, converted to v1beta1 if it came as v1alpha1.
fn decode(
    req: &AdmissionRequest<DynamicObject>,
    obj: Option<&DynamicObject>,
    field: &str,
) -> Result<HostPathProvisioner, Box<Status>> {
    let Some(obj) = obj else {
        return Err(bad_request(format!("AdmissionReview request.{field} is missing")));
    };
    let mut value = serde_json::to_value(obj).map_err(|e| bad_request(format!("request.{field}: {e}")))?;
    if value.get("apiVersion").is_none()
        && let Some(map) = value.as_object_mut()
    {
        map.insert(
            "apiVersion".into(),
            format!("{}/{}", req.kind.group, req.kind.version).into(),
        );
        map.insert("kind".into(), KIND.into());
    }
    let value = convert_json(value, API_VERSION_V1BETA1).map_err(|e| bad_request(format!("request.{field}: {e}")))?;
    serde_json::from_value(value)
        .map_err(|e| bad_request(format!("request.{field} is not a valid HostPathProvisioner: {e}")))
}

fn bad_request(message: String) -> Box<Status> {
    Status::failure(&message, "BadRequest").with_code(400).boxed()
}

fn display_name(req: &AdmissionRequest<DynamicObject>, obj: Option<&HostPathProvisioner>) -> String {
    let name = obj
        .and_then(|o| o.metadata.name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| req.name.clone());
    format!("{KIND}.{GROUP} {name:?}")
}

fn details(name: &str, causes: Vec<StatusCause>) -> StatusDetails {
    StatusDetails {
        name: name.to_string(),
        group: GROUP.to_string(),
        kind: KIND.to_string(),
        uid: String::new(),
        causes,
        retry_after_seconds: 0,
    }
}

/// 422 Invalid with one cause per field, like the API server's own validation errors.
fn invalid(req: &AdmissionRequest<DynamicObject>, obj: &HostPathProvisioner, errors: &ValidationErrors) -> Box<Status> {
    let mut causes: Vec<StatusCause> = errors
        .errors()
        .iter()
        .map(|e| StatusCause {
            reason: "FieldValueInvalid".into(),
            message: e.message.clone(),
            field: e.path.clone(),
        })
        .collect();
    if errors.omitted() > 0 {
        causes.push(StatusCause {
            reason: "FieldValueInvalid".into(),
            message: format!("and {} more", errors.omitted()),
            field: "spec".into(),
        });
    }
    let message = format!("{} is invalid: {errors}", display_name(req, Some(obj)));
    let name = obj.metadata.name.clone().unwrap_or_default();
    Status::failure(&message, "Invalid")
        .with_code(422)
        .with_details(details(&name, causes))
        .boxed()
}

/// 403 Forbidden; `cause` is a (field, what to do about it) pair.
fn forbidden(name: &str, message: String, cause: Option<(String, String)>) -> Box<Status> {
    let causes = cause
        .map(|(field, message)| {
            vec![StatusCause {
                reason: "FieldValueForbidden".into(),
                message,
                field,
            }]
        })
        .unwrap_or_default();
    Status::failure(&message, "Forbidden")
        .with_code(403)
        .with_details(details(name, causes))
        .boxed()
}

/// Runs `check` on the blocking pool within [`VALIDATION_BUDGET`].
async fn off_worker<T: Send + 'static>(check: impl FnOnce() -> T + Send + 'static) -> Result<T, Box<Status>> {
    match tokio::time::timeout(VALIDATION_BUDGET, tokio::task::spawn_blocking(check)).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(
            Status::failure(&format!("validation did not complete: {e}"), "InternalError")
                .with_code(500)
                .boxed(),
        ),
        Err(_) => Err(Status::failure(
            &format!(
                "validation took longer than {}s and was abandoned; the object is too large or complex",
                VALIDATION_BUDGET.as_secs()
            ),
            "Timeout",
        )
        .with_code(504)
        .boxed()),
    }
}

fn lookup_failed(what: &str, error: impl std::fmt::Display) -> Box<Status> {
    Status::failure(
        &format!("cannot check {what}: {error}; retry the request"),
        "InternalError",
    )
    .with_code(500)
    .boxed()
}

async fn admit_create(req: &AdmissionRequest<DynamicObject>, cluster: Option<&dyn ClusterState>) -> Verdict {
    let obj = match decode(req, req.object.as_ref(), "object") {
        Ok(o) => o,
        Err(s) => return Verdict::Deny(s),
    };
    let checked = obj.clone();
    match off_worker(move || checked.validate_create()).await {
        Err(status) => return Verdict::Deny(status),
        Ok(Err(errors)) => return Verdict::Deny(invalid(req, &obj, &errors)),
        Ok(Ok(())) => {}
    }
    // Settings that are valid but probably not what the user meant (never a rejection).
    let advice = hpp_api::validation::warnings(&obj.spec);
    let Some(cluster) = cluster else {
        return Verdict::Allow(advice);
    };
    let name = obj.metadata.name.clone().unwrap_or_else(|| req.name.clone());
    match cluster.hostpath_provisioners().await {
        Err(e) => Verdict::Deny(lookup_failed("for an existing HostPathProvisioner", e)),
        Ok(existing) => {
            let others: Vec<String> = existing.into_iter().filter(|n| *n != name).collect();
            match others.first() {
                None => Verdict::Allow(advice),
                Some(first) => Verdict::Deny(forbidden(
                    &name,
                    format!(
                        "only one HostPathProvisioner is allowed per cluster and {first:?} already exists; change it instead (kubectl edit hostpathprovisioner {first})"
                    ),
                    None,
                )),
            }
        }
    }
}

async fn admit_update(req: &AdmissionRequest<DynamicObject>) -> Verdict {
    // Once deletion has started only the finalizer removal matters; never block it, or a CR the
    // rules reject (say, from an older release) could never go away.
    if req
        .object
        .as_ref()
        .is_some_and(|o| o.metadata.deletion_timestamp.is_some())
    {
        return Verdict::Allow(Vec::new());
    }
    let new = match decode(req, req.object.as_ref(), "object") {
        Ok(o) => o,
        Err(s) => return Verdict::Deny(s),
    };
    if req.old_object.is_none() {
        return Verdict::Deny(bad_request("AdmissionReview request.oldObject is missing".to_string()));
    }
    let old = match decode(req, req.old_object.as_ref(), "oldObject") {
        Ok(o) => o,
        Err(status) => {
            // The stored object is unreadable as v1beta1 (written by something else): judge the
            // new object on its own so it can still be repaired.
            warn!(error = %status.message, "stored object cannot be decoded; applying the create rules");
            let checked = new.clone();
            return match off_worker(move || checked.validate_create()).await {
                Err(status) => Verdict::Deny(status),
                Ok(Ok(())) => Verdict::Allow(vec![format!(
                    "the stored object could not be read ({}); the new object was checked on its own",
                    status.message
                )]),
                Ok(Err(errors)) => Verdict::Deny(invalid(req, &new, &errors)),
            };
        }
    };
    let checked = new.clone();
    let outcome = off_worker(move || (checked.validate_update(&old), checked.validate_create().err())).await;
    let tolerated = match outcome {
        Err(status) => return Verdict::Deny(status),
        Ok((Err(errors), _)) => return Verdict::Deny(invalid(req, &new, &errors)),
        Ok((Ok(()), tolerated)) => tolerated,
    };
    // Problems the stored object already had are tolerated; say so instead of staying silent.
    let mut warnings = tolerated
        .map(|e| {
            let mut w: Vec<String> = e
                .errors()
                .iter()
                .map(|f| format!("{f} (tolerated because the stored object already has it)"))
                .collect();
            if e.omitted() > 0 {
                w.push(format!("and {} more tolerated problems", e.omitted()));
            }
            w
        })
        .unwrap_or_default();
    warnings.extend(hpp_api::validation::warnings(&new.spec));
    Verdict::Allow(warnings)
}

fn force_delete(obj: Option<&DynamicObject>) -> bool {
    obj.and_then(|o| o.metadata.annotations.as_ref())
        .and_then(|a| a.get(ANNOTATION_FORCE_DELETE))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

async fn admit_delete(req: &AdmissionRequest<DynamicObject>, cluster: Option<&dyn ClusterState>) -> Verdict {
    let Some(cluster) = cluster else {
        return Verdict::Allow(Vec::new());
    };
    let forced = force_delete(req.old_object.as_ref());
    let count = match cluster.hpp_volume_count().await {
        Ok(n) => n,
        Err(e) if forced => {
            return Verdict::Allow(vec![format!(
                "{ANNOTATION_FORCE_DELETE} is set; the PersistentVolume check was skipped ({e})"
            )]);
        }
        Err(e) => return Verdict::Deny(lookup_failed("for PersistentVolumes provisioned by hpp", e)),
    };
    if count == 0 {
        return Verdict::Allow(Vec::new());
    }
    let volumes = if count == 1 {
        "1 PersistentVolume provisioned by hpp still exists".to_string()
    } else {
        format!("{count} PersistentVolumes provisioned by hpp still exist")
    };
    if forced {
        return Verdict::Allow(vec![format!(
            "{volumes}; deleting anyway because {ANNOTATION_FORCE_DELETE} is \"true\": those volumes cannot be mounted or deleted until hpp is installed again"
        )]);
    }
    let name = &req.name;
    Verdict::Deny(forbidden(
        name,
        format!(
            "{KIND} {name:?} cannot be deleted: {volumes}, and deleting the {KIND} removes the CSI driver that mounts and cleans up those volumes. Delete the volumes first, or force it with: kubectl annotate hostpathprovisioner {name} {ANNOTATION_FORCE_DELETE}=true"
        ),
        Some((
            format!("metadata.annotations[{ANNOTATION_FORCE_DELETE}]"),
            "set to \"true\" to delete while hpp volumes exist".to_string(),
        )),
    ))
}
