//! OpenShift's cluster-wide crypto policy: the `config.openshift.io/v1` APIServer `cluster`
//! object's `spec.tlsSecurityProfile`, followed as it changes. On clusters without that API the
//! default policy stays in force.

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use tokio::sync::watch;
use tracing::{info, warn};

use super::policy::{PolicySource, Resolved, TlsPolicy, TlsVersion, parse_cipher_names, parse_min_version};

/// API group/version of the OpenShift APIServer config object.
pub const APISERVER_API_VERSION: &str = "config.openshift.io/v1";
/// Name of the cluster-wide APIServer config object.
pub const APISERVER_NAME: &str = "cluster";

/// The policy a `tlsSecurityProfile` value asks for. Never fails: anything that cannot be
/// honoured falls back to Intermediate (or is narrowed to what rustls serves) with a warning.
pub fn policy_from_profile(profile: Option<&Value>) -> Resolved {
    let mut warnings = Vec::new();
    let kind = profile
        .and_then(|p| p.get("type"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let source = |t: &str| PolicySource::OpenShift(t.to_string());
    let policy = match kind {
        // An unset profile means Intermediate on OpenShift.
        "" | "Intermediate" => TlsPolicy::intermediate(source("Intermediate")),
        "Modern" => TlsPolicy::modern(source("Modern")),
        "Old" => {
            warnings.push(
                "tlsSecurityProfile Old allows TLS 1.0/1.1 and CBC suites; rustls serves TLS 1.2+ with AEAD suites only"
                    .to_string(),
            );
            TlsPolicy::old(source("Old"))
        }
        "Custom" => custom_policy(profile.and_then(|p| p.get("custom")), &mut warnings),
        other => {
            warnings.push(format!("unknown tlsSecurityProfile type {other:?}; using Intermediate"));
            TlsPolicy::intermediate(source("Intermediate"))
        }
    };
    Resolved { policy, warnings }
}

fn custom_policy(custom: Option<&Value>, warnings: &mut Vec<String>) -> TlsPolicy {
    let source = PolicySource::OpenShift("Custom".to_string());
    let min = match custom.and_then(|c| c.get("minTLSVersion")).and_then(Value::as_str) {
        None => TlsVersion::Tls12,
        Some(v) => parse_min_version(v, warnings).unwrap_or_else(|e| {
            warnings.push(format!("tlsSecurityProfile custom: {e}; using VersionTLS12"));
            TlsVersion::Tls12
        }),
    };
    let names: Vec<&str> = custom
        .and_then(|c| c.get("ciphers"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let parsed = parse_cipher_names(names);
    let ignored: Vec<&String> = parsed.not_implemented.iter().chain(&parsed.unknown).collect();
    if !ignored.is_empty() {
        warnings.push(format!(
            "tlsSecurityProfile custom ciphers {ignored:?} are unknown or not implemented by rustls and are not offered"
        ));
    }
    if parsed.supported.is_empty() {
        warnings.push("tlsSecurityProfile custom names no usable cipher; using the Intermediate suites".to_string());
        let base = TlsPolicy::intermediate(source.clone());
        let suites = base.cipher_suites();
        return TlsPolicy::from_parts(min, &suites, source, warnings).unwrap_or(base);
    }
    TlsPolicy::from_parts(min, &parsed.supported, source.clone(), warnings)
        .unwrap_or_else(|_| TlsPolicy::intermediate(source))
}

/// Publishes each profile from `profiles` (None = object absent) into `tx` when the resolved
/// policy changes, logging warnings. Returns when the stream ends or nobody listens any more.
pub async fn follow_profiles(profiles: impl Stream<Item = Option<Value>>, tx: &watch::Sender<TlsPolicy>) {
    let mut profiles = std::pin::pin!(profiles);
    loop {
        let next = tokio::select! {
            next = profiles.next() => next,
            () = tx.closed() => return,
        };
        let Some(profile) = next else { return };
        let Resolved { policy, warnings } = policy_from_profile(profile.as_ref());
        for w in &warnings {
            warn!(warning = %w, "TLS security profile");
        }
        tx.send_if_modified(|current| {
            if *current == policy {
                return false;
            }
            info!(policy = %policy, "TLS policy changed");
            *current = policy;
            true
        });
    }
}

fn apiserver_resource() -> ApiResource {
    ApiResource {
        group: "config.openshift.io".into(),
        version: "v1".into(),
        api_version: APISERVER_API_VERSION.into(),
        kind: "APIServer".into(),
        plural: "apiservers".into(),
    }
}

/// Whether the cluster serves `config.openshift.io/v1` apiservers; retries transient errors.
async fn has_apiserver_api(client: &kube::Client, tx: &watch::Sender<TlsPolicy>) -> bool {
    loop {
        match client.list_api_group_resources(APISERVER_API_VERSION).await {
            Ok(list) => return list.resources.iter().any(|r| r.name == "apiservers"),
            Err(kube::Error::Api(status)) if status.code == 404 => return false,
            Err(e) => {
                warn!(error = %e, "cannot discover the OpenShift APIServer API; retrying");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(10)) => {}
                    () = tx.closed() => return false,
                }
            }
        }
    }
}

/// Follows the APIServer `cluster` object's `tlsSecurityProfile` into `tx` until every receiver
/// is dropped. Returns at once (leaving `tx` alone) when the cluster is not OpenShift.
pub async fn follow_openshift(client: kube::Client, tx: watch::Sender<TlsPolicy>) {
    if !has_apiserver_api(&client, &tx).await {
        info!("no config.openshift.io/v1 APIServer API: not OpenShift, keeping the default TLS policy");
        return;
    }
    info!("following the OpenShift APIServer tlsSecurityProfile");
    let api: Api<DynamicObject> = Api::all_with(client, &apiserver_resource());
    let config = watcher::Config::default().fields(&format!("metadata.name={APISERVER_NAME}"));
    let mut seen = false;
    let profiles = watcher::watcher(api, config)
        .default_backoff()
        .filter_map(move |event| {
            let profile = match event {
                Ok(Event::Apply(obj) | Event::InitApply(obj)) => {
                    seen = true;
                    Some(obj.data.pointer("/spec/tlsSecurityProfile").cloned())
                }
                Ok(Event::Delete(_)) => Some(None),
                Ok(Event::Init) => {
                    seen = false;
                    None
                }
                Ok(Event::InitDone) => (!seen).then_some(None),
                Err(e) => {
                    warn!(error = %e, "watching the OpenShift APIServer object");
                    None
                }
            };
            std::future::ready(profile)
        });
    follow_profiles(profiles, &tx).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn names(r: &Resolved) -> Vec<&'static str> {
        r.policy.cipher_names()
    }

    #[test]
    fn named_profiles() {
        let r = policy_from_profile(None);
        assert_eq!(
            r.policy,
            TlsPolicy::intermediate(PolicySource::OpenShift("Intermediate".into()))
        );
        let r = policy_from_profile(Some(&json!({"type": "Modern", "modern": {}})));
        assert_eq!(r.policy.min_version(), TlsVersion::Tls13);
        assert_eq!(r.policy.metrics_tls_version_flag(), "VersionTLS13");
        let r = policy_from_profile(Some(&json!({"type": "Old", "old": {}})));
        assert_eq!(r.policy.min_version(), TlsVersion::Tls12);
        assert_eq!(names(&r).len(), 9);
        assert!(r.warnings[0].contains("TLS 1.0/1.1"));
        let r = policy_from_profile(Some(&json!({"type": "Paranoid"})));
        assert_eq!(r.policy.min_version(), TlsVersion::Tls12);
        assert!(r.warnings[0].contains("Paranoid"));
    }

    #[test]
    fn custom_profile() {
        let r = policy_from_profile(Some(&json!({
            "type": "Custom",
            "custom": {
                "minTLSVersion": "VersionTLS12",
                "ciphers": ["ECDHE-RSA-AES128-GCM-SHA256", "DHE-RSA-AES128-GCM-SHA256", "bogus"]
            }
        })));
        assert_eq!(
            names(&r),
            [
                "TLS_AES_256_GCM_SHA384",
                "TLS_AES_128_GCM_SHA256",
                "TLS_CHACHA20_POLY1305_SHA256",
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"
            ]
        );
        assert!(
            r.warnings[0].contains("bogus") && r.warnings[0].contains("DHE-RSA"),
            "{:?}",
            r.warnings
        );

        let r = policy_from_profile(Some(&json!({
            "type": "Custom",
            "custom": {"minTLSVersion": "VersionTLS13", "ciphers": ["TLS_AES_128_GCM_SHA256"]}
        })));
        assert_eq!(names(&r), ["TLS_AES_128_GCM_SHA256"]);
        assert_eq!(r.policy.min_version(), TlsVersion::Tls13);

        let r = policy_from_profile(Some(&json!({"type": "Custom", "custom": {"ciphers": ["AES128-SHA"]}})));
        assert_eq!(names(&r).len(), 9);
        assert!(r.warnings.iter().any(|w| w.contains("no usable cipher")));
    }

    #[tokio::test]
    async fn follows_changes_and_deletion() {
        let (tx, mut rx) = watch::channel(TlsPolicy::default());
        let modern = || futures::stream::iter([Some(json!({"type": "Modern"}))]);
        follow_profiles(modern(), &tx).await;
        assert!(rx.has_changed().unwrap());
        assert_eq!(rx.borrow_and_update().min_version(), TlsVersion::Tls13);
        // The same profile again is not a change.
        follow_profiles(modern(), &tx).await;
        assert!(!rx.has_changed().unwrap());
        // The object disappears: back to Intermediate.
        follow_profiles(futures::stream::iter([None]), &tx).await;
        assert!(rx.has_changed().unwrap());
        assert_eq!(rx.borrow_and_update().min_version(), TlsVersion::Tls12);
    }
}
