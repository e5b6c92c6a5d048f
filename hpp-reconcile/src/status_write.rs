//! Writing a HostPathProvisioner's status: through `/status`, or, on a CRD without the status
//! subresource (KubeVirt's `deploy/operator.yaml` ships it so), through the object itself as
//! KubeVirt's operator does with its full `Update`. A 404 from `/status` is never retried as is:
//! it either switches the path (the CR exists) or is returned (the CR is gone).

use std::sync::atomic::{AtomicBool, Ordering};

use hpp_api::HostPathProvisioner;
use hpp_api::v1beta1::HostPathProvisionerStatus;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde_json::{Map, Value, json};
use tracing::{info, warn};

use crate::error::{Error, Result};

/// Field manager of status writes.
pub const STATUS_MANAGER: &str = "hpp-operator/status";

/// How this process writes status: through `/status` until a 404 shows the CRD has no status
/// subresource, then through the whole object until discovery lists the subresource again.
#[derive(Debug, Default)]
pub struct StatusPath {
    via_main: AtomicBool,
}

impl StatusPath {
    /// Whether status goes through the whole object (the CRD has no status subresource).
    pub fn via_main(&self) -> bool {
        self.via_main.load(Ordering::Relaxed)
    }

    fn set(&self, via_main: bool) {
        self.via_main.store(via_main, Ordering::Relaxed);
    }
}

/// What a write found out about the CRD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// Written the way [`StatusPath`] said.
    Done,
    /// Not written: the CRD has no status subresource (`/status` answered 404 while the CR
    /// exists). [`StatusPath`] now says so; derive the status again and [`write_whole`] it.
    SubresourceMissing,
}

/// Full status as a merge patch body: absent fields become null so they are cleared.
/// `nodeLoss` is written only when `with_node_loss` (a pass whose step reported it), so a pass
/// that read an older copy of the CR never overwrites a newer one.
pub fn status_patch(status: &HostPathProvisionerStatus, with_node_loss: bool) -> Result<Value> {
    status_patch_since(status, None, with_node_loss)
}

/// [`status_patch`] without the fields that are the same in `prev` (the status the CR had
/// when the pass read it). The pool statuses list a claim per node (about 120 KiB at 1,000
/// nodes), so a change of a condition's message (a DaemonSet with 998 of 1,000 pods ready)
/// writes the conditions alone. Should `prev` be older than what was last written, the write's
/// own watch event brings the newer status and the next pass writes what still differs.
pub fn status_patch_since(
    status: &HostPathProvisionerStatus,
    prev: Option<&HostPathProvisionerStatus>,
    with_node_loss: bool,
) -> Result<Value> {
    // Every field by name (a new one does not compile until it is handled here), and only
    // the changed ones are serialised: at 1,000 nodes the pool statuses are most of a pass's
    // serialising when only a condition changed.
    let HostPathProvisionerStatus {
        conditions,
        observed_version,
        operator_version,
        target_version,
        storage_pool_statuses,
        node_loss,
        volume_audit,
    } = status;
    let changed = |same: fn(&HostPathProvisionerStatus, &HostPathProvisionerStatus) -> bool| {
        prev.is_none_or(|prev| !same(status, prev))
    };
    let mut map = Map::new();
    if changed(|a, b| a.conditions == b.conditions) {
        map.insert("conditions".into(), json_or_null(conditions, conditions.is_empty())?);
    }
    if changed(|a, b| a.observed_version == b.observed_version) {
        map.insert(
            "observedVersion".into(),
            json_or_null(observed_version, observed_version.is_none())?,
        );
    }
    if changed(|a, b| a.operator_version == b.operator_version) {
        map.insert(
            "operatorVersion".into(),
            json_or_null(operator_version, operator_version.is_none())?,
        );
    }
    if changed(|a, b| a.target_version == b.target_version) {
        map.insert(
            "targetVersion".into(),
            json_or_null(target_version, target_version.is_none())?,
        );
    }
    if changed(|a, b| a.storage_pool_statuses == b.storage_pool_statuses) {
        map.insert(
            "storagePoolStatuses".into(),
            json_or_null(storage_pool_statuses, storage_pool_statuses.is_empty())?,
        );
    }
    if changed(|a, b| a.volume_audit == b.volume_audit) {
        // A merge patch merges objects key by key: what the audit no longer says is cleared.
        let audit = with_nulls(
            volume_audit.as_ref(),
            &["lastAuditTime", "nodesAudited", "nodesNotAudited", "notAudited"],
        )?;
        map.insert("volumeAudit".into(), audit);
    }
    if with_node_loss && changed(|a, b| a.node_loss == b.node_loss) {
        let loss = with_nulls(node_loss.as_ref(), &["claimsReleased", "lostNodes"])?;
        map.insert("nodeLoss".into(), loss);
    }
    Ok(json!({ "status": map }))
}

/// `value` as JSON, or null when `absent` (the status leaves it out, so the patch clears it).
fn json_or_null<T: Serialize>(value: &T, absent: bool) -> Result<Value> {
    match absent {
        true => Ok(Value::Null),
        false => serde_json::to_value(value).map_err(|source| Error::Serialize {
            what: "status".into(),
            source,
        }),
    }
}

/// An object field of the status as JSON, with `keys` it leaves out set to null (cleared by
/// the merge patch); null when there is none.
fn with_nulls<T: Serialize>(value: Option<&T>, keys: &[&str]) -> Result<Value> {
    let Some(value) = value else { return Ok(Value::Null) };
    let mut v = json_or_null(value, false)?;
    if let Value::Object(fields) = &mut v {
        for key in keys {
            fields.entry(*key).or_insert(Value::Null);
        }
    }
    Ok(v)
}

/// Writes `sent` as the status of `name` the way `path` says. A 404 from `/status` for a CR
/// that exists switches `path` to the whole object and writes nothing
/// ([`Written::SubresourceMissing`]); for a CR that is gone it is returned as the error.
pub async fn write(
    api: &Api<HostPathProvisioner>,
    name: &str,
    sent: &HostPathProvisionerStatus,
    with_node_loss: bool,
    path: &StatusPath,
) -> Result<Written> {
    write_since(api, name, sent, None, with_node_loss, path).await
}

/// [`write()`] of what differs from `prev` alone ([`status_patch_since`]).
pub async fn write_since(
    api: &Api<HostPathProvisioner>,
    name: &str,
    sent: &HostPathProvisionerStatus,
    prev: Option<&HostPathProvisionerStatus>,
    with_node_loss: bool,
    path: &StatusPath,
) -> Result<Written> {
    if path.via_main() {
        write_whole_since(api, name, sent, prev, with_node_loss).await?;
        return Ok(Written::Done);
    }
    let body = status_patch_since(sent, prev, with_node_loss)?;
    match patch_unread(api, name, &body, true).await {
        Ok(_) => Ok(Written::Done),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            let exists = api
                .get_opt(name)
                .await
                .map_err(|e| Error::kube("get", name, e))?
                .is_some();
            if !exists {
                return Err(Error::kube("patch status", name, kube::Error::Api(e)));
            }
            warn!(hpp = name, answer = %e.message,
                "PATCH status answered 404 NotFound while the CR exists: the CRD has no status subresource \
                 (KubeVirt's); writing status with the whole object from now on");
            path.set(true);
            Ok(Written::SubresourceMissing)
        }
        Err(e) => Err(Error::kube("patch status", name, e)),
    }
}

/// Writes `sent` as the status of `name` with a merge patch of the whole object: how status is
/// written on a CRD without the status subresource (the patch touches nothing but `status`).
pub async fn write_whole(
    api: &Api<HostPathProvisioner>,
    name: &str,
    sent: &HostPathProvisionerStatus,
    with_node_loss: bool,
) -> Result<()> {
    write_whole_since(api, name, sent, None, with_node_loss).await
}

/// [`write_whole`] of what differs from `prev` alone ([`status_patch_since`]).
pub async fn write_whole_since(
    api: &Api<HostPathProvisioner>,
    name: &str,
    sent: &HostPathProvisionerStatus,
    prev: Option<&HostPathProvisionerStatus>,
    with_node_loss: bool,
) -> Result<()> {
    patch_unread(api, name, &status_patch_since(sent, prev, with_node_loss)?, false)
        .await
        .map_err(|e| Error::kube("patch status through the whole object", name, e))
}

/// Merge-patches CR `name` (its status subresource when `status`) without parsing the
/// answer. The answer is the whole CR (about 120 KiB at 1,000 nodes, a claim status per
/// node), nothing reads it, and the CR's watch brings the same object anyway.
async fn patch_unread(api: &Api<HostPathProvisioner>, name: &str, body: &Value, status: bool) -> kube::Result<()> {
    let request = kube::core::Request::new(api.resource_url());
    let patch = Patch::Merge(body);
    let mut req = match status {
        true => request.patch_subresource("status", name, &params(), &patch),
        false => request.patch(name, &params(), &patch),
    }
    .map_err(kube::Error::BuildRequest)?;
    // The verb kube's own calls name, for whatever reads it (metrics, tracing layers).
    req.extensions_mut()
        .insert(if status { "patch_status" } else { "patch" });
    api.clone().into_client().request_text(req).await?;
    Ok(())
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(STATUS_MANAGER.to_owned()),
        ..Default::default()
    }
}

/// While status goes through the whole object, asks API discovery whether the CRD has the
/// status subresource now (someone applied hpp's CRD); if so, switches `path` back and returns
/// true. Every authenticated user may read discovery, so this needs no RBAC on
/// CustomResourceDefinitions.
pub async fn recheck(client: &Client, path: &StatusPath) -> Result<bool> {
    if !path.via_main() {
        return Ok(false);
    }
    let api_version = HostPathProvisioner::api_version(&());
    let resources = client
        .list_api_group_resources(&api_version)
        .await
        .map_err(|e| Error::kube("discover", api_version.to_string(), e))?;
    let wanted = format!("{}/status", HostPathProvisioner::plural(&()));
    if !resources.resources.iter().any(|r| r.name == wanted) {
        return Ok(false);
    }
    info!("the HostPathProvisioner CRD has the status subresource now: writing status through /status again");
    path.set(false);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_clears_what_the_status_no_longer_has() {
        let body = status_patch(&HostPathProvisionerStatus::default(), false).unwrap();
        assert_eq!(body["status"]["observedVersion"], Value::Null);
        assert!(body["status"].as_object().unwrap().contains_key("storagePoolStatuses"));
        assert_eq!(
            body["status"]["volumeAudit"],
            Value::Null,
            "the audit turned off is cleared"
        );
        let audited = HostPathProvisionerStatus {
            volume_audit: Some(hpp_api::v1beta1::VolumeAuditStatus {
                nodes_audited: 2,
                ..Default::default()
            }),
            ..Default::default()
        };
        let body = status_patch(&audited, false).unwrap();
        assert_eq!(body["status"]["volumeAudit"]["nodesAudited"], 2);
        assert_eq!(
            body["status"]["volumeAudit"]["notAudited"],
            Value::Null,
            "nodes that answer again leave the list"
        );
    }

    #[test]
    fn a_patch_since_a_status_leaves_out_what_did_not_change() {
        use hpp_api::v1beta1::{Condition, StoragePoolStatus};
        let condition = |message: &str| Condition {
            type_: "Available".into(),
            status: "True".into(),
            message: Some(message.into()),
            ..Default::default()
        };
        let prev = HostPathProvisionerStatus {
            conditions: vec![condition("DaemonSet has 998 of 1000 pods ready")],
            observed_version: Some("v1".into()),
            storage_pool_statuses: vec![StoragePoolStatus {
                name: "local".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let next = HostPathProvisionerStatus {
            conditions: vec![condition("DaemonSet has 999 of 1000 pods ready")],
            ..prev.clone()
        };
        let body = status_patch_since(&next, Some(&prev), true).unwrap();
        let sent = body["status"].as_object().unwrap();
        assert_eq!(
            sent.keys().collect::<Vec<_>>(),
            ["conditions"],
            "only the changed condition goes: {body}"
        );
        // A field that went away is still cleared.
        let cleared = HostPathProvisionerStatus {
            observed_version: None,
            ..prev.clone()
        };
        let body = status_patch_since(&cleared, Some(&prev), false).unwrap();
        assert_eq!(body["status"]["observedVersion"], Value::Null);
        assert!(body["status"].as_object().unwrap().contains_key("observedVersion"));
        assert!(!body["status"].as_object().unwrap().contains_key("storagePoolStatuses"));
        // Without a previous status everything goes.
        let body = status_patch_since(&next, None, false).unwrap();
        assert!(body["status"].as_object().unwrap().contains_key("storagePoolStatuses"));
    }
}
