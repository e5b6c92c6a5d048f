//! The CRD conversion webhook: ConversionReview `apiextensions.k8s.io/v1` (or `v1beta1`) in, the
//! same version out, every object converted by [`hpp_api::conversion::convert_json`].

use kube::core::Status;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use serde_json::Value;
use tracing::{info, info_span, warn};

use crate::reply::Reply;

/// ConversionReview versions served.
pub const CONVERSION_VERSIONS: &[&str] = &["apiextensions.k8s.io/v1", "apiextensions.k8s.io/v1beta1"];

/// Answers one conversion call. Input that is not a ConversionReview gets a 400 `Status`; an
/// object that cannot be converted fails the whole review with a message naming it.
pub fn review(body: &[u8]) -> Reply {
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return Reply::bad_request(format!("request body is not JSON: {e}")),
    };
    let api_version = value.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or_default();
    if kind != "ConversionReview" || !CONVERSION_VERSIONS.contains(&api_version) {
        return Reply::bad_request(format!(
            "expected a ConversionReview of apiVersion {}, got kind {kind:?} apiVersion {api_version:?}",
            CONVERSION_VERSIONS.join(" or ")
        ));
    }
    let request = match serde_json::from_value::<ConversionReview>(value)
        .map_err(|e| e.to_string())
        .and_then(|r| ConversionRequest::from_review(r).map_err(|e| e.to_string()))
    {
        Ok(r) => r,
        Err(e) => return Reply::bad_request(format!("malformed ConversionReview: {e}")),
    };
    let span = info_span!("conversion", uid = %request.uid, to = %request.desired_api_version, objects = request.objects.len());
    let _entered = span.enter();
    let desired = request.desired_api_version.clone();
    let objects = request.objects.clone();
    let response = ConversionResponse::for_request(request);
    let mut converted = Vec::with_capacity(objects.len());
    for (i, obj) in objects.into_iter().enumerate() {
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        match hpp_api::conversion::convert_json(obj, &desired) {
            Ok(o) => converted.push(o),
            Err(e) => {
                warn!(index = i, %name, error = %e, "conversion failed");
                let status = Status::failure(
                    &format!("cannot convert objects[{i}] ({name:?}) to {desired}: {e}"),
                    "BadRequest",
                )
                .with_code(400);
                return Reply::ok(to_json(response.failure(status)));
            }
        }
    }
    info!(converted = converted.len(), "conversion");
    Reply::ok(to_json(response.success(converted)))
}

fn to_json(response: ConversionResponse) -> Value {
    serde_json::to_value(response.into_review()).unwrap_or(Value::Null)
}
