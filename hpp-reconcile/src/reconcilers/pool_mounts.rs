//! Driver pods that cannot start because a pool path is not on a shared or slave mount. The
//! DaemonSet mounts pools with HostToContainer propagation, which the container runtime refuses
//! on a private mount ("... is mounted on / but it is not a shared or slave mount"); without
//! this step the CR only says DeployStarted. It reports the node, the path and the fix as a
//! condition and a Warning Event on the CR. It owns nothing; it reads the operator's pods.

use std::collections::BTreeSet;

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use hpp_api::constants as c;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::Resource;

use crate::apply::Applier;
use crate::config::OperatorConfig;
use crate::error::Result;
use crate::facts::ClusterFacts;
use crate::object::{DesiredObject, Kind};
use crate::subreconciler::{ObjectWarning, Readiness, StepCondition, SubReconciler};

/// Condition type on the CR: no pod of the operator fails on mount propagation.
pub const CONDITION_POOL_MOUNTS_SHARED: &str = "PoolMountsShared";
/// Reason (condition and Event): a pool path is on a private mount.
pub const REASON_POOL_MOUNT_NOT_SHARED: &str = "PoolMountNotShared";
/// Reason: no pod reports the problem.
pub const REASON_MOUNTS_SHARED: &str = "MountsShared";

/// The runtime's words for the problem (containerd, CRI-O and runc share them).
const NOT_SHARED: &str = "is not a shared or slave mount";

/// A node where a pool path is on a private mount.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PrivateMount {
    /// Node the failing pod runs on.
    pub node: String,
    /// The pool path the runtime named (empty when it named none).
    pub path: String,
    /// The mount point it sits on (empty when the runtime named none).
    pub mount_point: String,
}

/// Every private-mount failure the operator's pods report, gathered each pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrivateMounts(pub Vec<PrivateMount>);

/// The first `"..."` after `marker` in `text`.
fn quoted_after<'a>(text: &'a str, marker: &str) -> Option<&'a str> {
    let rest = &text[text.find(marker)? + marker.len()..];
    let rest = &rest[rest.find('"')? + 1..];
    Some(&rest[..rest.find('"')?])
}

/// Path and mount point from a runtime message such as
/// `path "/var/hpvolumes" is mounted on "/" but it is not a shared or slave mount`.
pub fn parse_private_mount(message: &str) -> Option<(String, String)> {
    if !message.contains(NOT_SHARED) {
        return None;
    }
    let path = quoted_after(message, "path").unwrap_or_default();
    let mount_point = quoted_after(message, "is mounted on").unwrap_or_default();
    Some((path.to_owned(), mount_point.to_owned()))
}

fn status_messages(s: &ContainerStatus) -> impl Iterator<Item = &str> {
    let waiting = s
        .state
        .as_ref()
        .and_then(|st| st.waiting.as_ref())
        .and_then(|w| w.message.as_deref());
    let terminated = s
        .state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .and_then(|t| t.message.as_deref());
    let last = s
        .last_state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .and_then(|t| t.message.as_deref());
    [waiting, terminated, last].into_iter().flatten()
}

/// The private-mount failures one pod reports in its container statuses.
pub fn pod_private_mounts(pod: &Pod) -> Vec<PrivateMount> {
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .flat_map(status_messages)
        .filter_map(parse_private_mount)
        .map(|(path, mount_point)| PrivateMount {
            node: node.clone(),
            path,
            mount_point,
        })
        .collect()
}

/// What to tell the admin about one private mount.
pub fn describe(m: &PrivateMount) -> String {
    let path = if m.path.is_empty() {
        "a pool path"
    } else {
        m.path.as_str()
    };
    let on = if m.mount_point.is_empty() {
        "its mount"
    } else {
        m.mount_point.as_str()
    };
    let fix_target = if m.mount_point.is_empty() { path } else { on };
    format!(
        "node {}: pool path {path} is mounted on {on}, which is not a shared or slave mount, so the \
         driver pods cannot start; on that node run `mount --make-rshared {fix_target}` (and make it \
         persistent, e.g. a systemd mount unit with shared propagation)",
        m.node
    )
}

/// Sub-reconciler reporting pool paths on private mounts.
pub struct PoolMounts;

fn pod_kind() -> Kind {
    Kind::of::<Pod>()
}

fn pod_selector() -> String {
    format!("{}={}", c::LABEL_APP, c::LABEL_APP_VALUE)
}

#[async_trait]
impl SubReconciler for PoolMounts {
    fn name(&self) -> &str {
        crate::names::STEP_POOL_MOUNTS
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        Vec::new()
    }

    fn watches(&self) -> Vec<(Kind, String)> {
        vec![(pod_kind(), pod_selector())]
    }

    async fn gather(&self, applier: &Applier, cfg: &OperatorConfig, facts: &mut ClusterFacts) -> Result<()> {
        let mut found = BTreeSet::new();
        for o in applier.list(&pod_kind(), &pod_selector(), &cfg.namespace).await? {
            let Ok(pod) = serde_json::to_value(&o).and_then(serde_json::from_value::<Pod>) else {
                continue;
            };
            found.extend(pod_private_mounts(&pod));
        }
        facts.extensions.insert(PrivateMounts(found.into_iter().collect()));
        Ok(())
    }

    fn desired(
        &self,
        _hpp: &HostPathProvisioner,
        _cfg: &OperatorConfig,
        _facts: &ClusterFacts,
    ) -> Result<Vec<DesiredObject>> {
        Ok(Vec::new())
    }

    fn readiness(
        &self,
        hpp: &HostPathProvisioner,
        facts: &ClusterFacts,
        _live: &[kube::api::DynamicObject],
    ) -> Readiness {
        let mounts = facts.get::<PrivateMounts>().map(|m| m.0.as_slice()).unwrap_or_default();
        let mut r = Readiness::ready();
        let messages: Vec<String> = mounts.iter().map(describe).collect();
        r.conditions.push(if messages.is_empty() {
            StepCondition {
                type_: CONDITION_POOL_MOUNTS_SHARED.into(),
                status: true,
                reason: REASON_MOUNTS_SHARED.into(),
                message: "No pod reports a pool path on a private mount".into(),
            }
        } else {
            StepCondition {
                type_: CONDITION_POOL_MOUNTS_SHARED.into(),
                status: false,
                reason: REASON_POOL_MOUNT_NOT_SHARED.into(),
                message: messages.join("; "),
            }
        });
        let cr = hpp.object_ref(&());
        r.warnings = messages
            .into_iter()
            .map(|message| ObjectWarning {
                regarding: cr.clone(),
                reason: REASON_POOL_MOUNT_NOT_SHARED.into(),
                message,
            })
            .collect();
        r
    }

    /// Owns nothing, so deletes nothing.
    async fn cleanup(
        &self,
        _applier: &Applier,
        _hpp: &HostPathProvisioner,
        _cfg: &OperatorConfig,
        _facts: &ClusterFacts,
    ) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_runtime_message() {
        let msg = "Error: failed to generate container \"abc\" spec: failed to generate spec: path \
                   \"/var/hpvolumes\" is mounted on \"/\" but it is not a shared or slave mount";
        assert_eq!(parse_private_mount(msg), Some(("/var/hpvolumes".into(), "/".into())));
        assert_eq!(parse_private_mount("back-off restarting failed container"), None);
        let bare = parse_private_mount("it is not a shared or slave mount").unwrap();
        assert_eq!(bare, (String::new(), String::new()));
    }
}
