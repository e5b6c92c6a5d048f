//! The bearer token the operator presents to the drivers' volume report: a Secret in the
//! operator's namespace, mounted read-only into the driver container. The token is made once, at
//! the edge (when the Secret does not exist or holds no token), and read back from the live
//! Secret afterwards, so what the step renders is a function of the CR and that Secret alone.
//! Deleting the Secret rotates the token: the next pass makes a new one, and kubelet refreshes
//! the mounted file (the driver reads it per request).

use std::collections::BTreeMap;

use hpp_api::HostPathProvisioner;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::DynamicObject;

use crate::config::OperatorConfig;
use crate::error::{Error, Result};
use crate::names;
use crate::object::{DesiredObject, Kind};
use crate::reconcilers::common;

/// Random bytes in a token (hex-encoded: 64 characters).
const TOKEN_BYTES: usize = 32;

/// The kind of the token Secret.
pub fn secret_kind() -> Kind {
    Kind::of::<Secret>()
}

/// The token Secret holding `token`, or only its metadata when the token is not known (offline
/// rendering: the token is made when the Secret is first created).
pub fn desired_secret(hpp: &HostPathProvisioner, cfg: &OperatorConfig, token: Option<&str>) -> Result<DesiredObject> {
    let secret = Secret {
        metadata: common::object_meta(names::VOLUME_REPORT_SECRET, Some(&cfg.namespace), cfg, &[], Some(hpp)),
        type_: Some("Opaque".into()),
        data: token.map(|t| {
            BTreeMap::from([(
                names::VOLUME_REPORT_TOKEN_KEY.to_owned(),
                ByteString(t.as_bytes().to_vec()),
            )])
        }),
        ..Default::default()
    };
    common::typed_ssa(&secret)
}

/// Puts `token` into the rendered Secret (at the edge, when it is applied).
pub fn set_token(secret: &mut DesiredObject, token: &str) -> Result<()> {
    let encoded = serde_json::to_value(ByteString(token.as_bytes().to_vec())).map_err(|source| Error::Serialize {
        what: names::VOLUME_REPORT_SECRET.into(),
        source,
    })?;
    if let serde_json::Value::Object(map) = &mut secret.object.data {
        map.insert(
            "data".into(),
            serde_json::json!({ names::VOLUME_REPORT_TOKEN_KEY: encoded }),
        );
    }
    Ok(())
}

/// The token a live Secret holds, if it holds a usable one: non-empty text once trimmed, as the
/// driver reads it.
pub fn token_of(live: &DynamicObject) -> Option<String> {
    let secret: Secret = serde_json::to_value(live)
        .ok()
        .and_then(|v| serde_json::from_value(v).ok())?;
    let bytes = secret.data?.remove(names::VOLUME_REPORT_TOKEN_KEY)?.0;
    let text = String::from_utf8(bytes).ok()?;
    // The driver trims what it reads, so a token written with a trailing newline still works.
    let trimmed = text.trim();
    (!trimmed.is_empty()).then(|| trimmed.to_owned())
}

/// A new random token: 32 bytes from the system's secure random source, hex-encoded.
pub fn new_token() -> Result<String> {
    let mut bytes = [0u8; TOKEN_BYTES];
    super::fetch::provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| Error::VolumeAudit("no secure random source to make the report token".into()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tokens_are_long_random_and_read_back() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        let hpp = HostPathProvisioner::new("hpp", Default::default());
        let desired = desired_secret(&hpp, &OperatorConfig::default(), Some(&a)).unwrap();
        let live: DynamicObject = serde_json::from_value(desired.to_value().unwrap()).unwrap();
        assert_eq!(token_of(&live), Some(a.clone()));
        let empty = desired_secret(&hpp, &OperatorConfig::default(), None).unwrap();
        let live: DynamicObject = serde_json::from_value(empty.to_value().unwrap()).unwrap();
        assert_eq!(token_of(&live), None, "no token yet");
        let mut filled = desired_secret(&hpp, &OperatorConfig::default(), None).unwrap();
        set_token(&mut filled, &a).unwrap();
        assert_eq!(
            filled,
            desired_secret(&hpp, &OperatorConfig::default(), Some(&a)).unwrap()
        );
        let blank = desired_secret(&hpp, &OperatorConfig::default(), Some(" ")).unwrap();
        let live: DynamicObject = serde_json::from_value(blank.to_value().unwrap()).unwrap();
        assert_eq!(token_of(&live), None, "a blank token is made anew");
    }
}
