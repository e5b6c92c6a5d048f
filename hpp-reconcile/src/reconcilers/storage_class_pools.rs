//! StorageClasses of the CSI driver whose `storagePool` names no configured pool. With capacity
//! tracking and WaitForFirstConsumer such a class only ever shows the pod event "node(s) did not
//! have enough free storage"; this step says the real reason where an admin looks: a Warning
//! Event on the class, a condition on the CR and the `kubevirt_hpp_storageclass_unknown_pool`
//! gauge. It owns nothing; it reads every StorageClass.

use std::collections::BTreeSet;

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use hpp_api::constants as c;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::ResourceExt;
use serde_json::Value;

use super::common::storage_class_kind;
use crate::apply::Applier;
use crate::config::OperatorConfig;
use crate::error::Result;
use crate::facts::ClusterFacts;
use crate::object::{DesiredObject, Kind};
use crate::subreconciler::{ObjectWarning, Readiness, StepCondition, SubReconciler};

/// Condition type on the CR: every driver StorageClass names a configured pool.
pub const CONDITION_STORAGE_CLASSES_VALID: &str = "StorageClassesValid";
/// Reason (condition and Event): a class names a pool the CR does not configure.
pub const REASON_UNKNOWN_STORAGE_POOL: &str = "UnknownStoragePool";
/// Reason: every driver class names a configured pool.
pub const REASON_ALL_POOLS_KNOWN: &str = "AllPoolsKnown";

/// A StorageClass of the CSI driver that names a pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolClass {
    /// Class name.
    pub name: String,
    /// Class uid (for the Event's object reference).
    pub uid: Option<String>,
    /// Its `storagePool` parameter.
    pub pool: String,
}

/// Every driver StorageClass with a `storagePool` parameter, gathered each pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolClasses(pub Vec<PoolClass>);

/// Pool names the CR configures (`legacy` for a `pathConfig` CR, as the driver names it).
pub fn configured_pools(hpp: &HostPathProvisioner) -> BTreeSet<String> {
    if hpp.spec.path_config.is_some() {
        return BTreeSet::from([c::DEFAULT_POOL_NAME.to_owned()]);
    }
    hpp.spec
        .storage_pools
        .iter()
        .flatten()
        .map(|p| p.name.clone())
        .collect()
}

/// The classes whose pool is not configured, with the reason in words.
pub fn unknown_pool_classes<'a>(hpp: &HostPathProvisioner, classes: &'a [PoolClass]) -> Vec<(&'a PoolClass, String)> {
    let configured = configured_pools(hpp);
    let list = configured.iter().cloned().collect::<Vec<_>>().join(", ");
    classes
        .iter()
        .filter(|cl| !configured.contains(&cl.pool))
        .map(|cl| {
            let msg = format!(
                "StorageClass {} names storagePool \"{}\", which HostPathProvisioner {} does not configure \
                 (configured pools: {list}); volumes of this class are never provisioned and pods only \
                 show \"node(s) did not have enough free storage\". Fix the class's storagePool or add the pool",
                cl.name,
                cl.pool,
                hpp.name_any()
            );
            (cl, msg)
        })
        .collect()
}

/// Sub-reconciler checking the driver's StorageClasses against the configured pools.
pub struct StorageClassPools;

fn class_ref(cl: &PoolClass) -> ObjectReference {
    ObjectReference {
        api_version: Some("storage.k8s.io/v1".into()),
        kind: Some("StorageClass".into()),
        name: Some(cl.name.clone()),
        uid: cl.uid.clone(),
        ..Default::default()
    }
}

#[async_trait]
impl SubReconciler for StorageClassPools {
    fn name(&self) -> &str {
        crate::names::STEP_STORAGE_CLASS_POOLS
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        Vec::new()
    }

    fn watches(&self) -> Vec<(Kind, String)> {
        vec![(storage_class_kind(), String::new())]
    }

    async fn gather(&self, applier: &Applier, cfg: &OperatorConfig, facts: &mut ClusterFacts) -> Result<()> {
        let classes = applier
            .list(&storage_class_kind(), "", &cfg.namespace)
            .await?
            .into_iter()
            .filter(|o| o.data.get("provisioner").and_then(Value::as_str) == Some(c::DRIVER_NAME))
            .filter_map(|o| {
                let pool = o
                    .data
                    .pointer(&format!("/parameters/{}", c::PARAM_STORAGE_POOL))
                    .and_then(Value::as_str)?
                    .to_owned();
                Some(PoolClass {
                    name: o.name_any(),
                    uid: o.metadata.uid.clone(),
                    pool,
                })
            })
            .collect();
        facts.extensions.insert(PoolClasses(classes));
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
        let classes = facts.get::<PoolClasses>().map(|p| p.0.as_slice()).unwrap_or_default();
        let unknown = unknown_pool_classes(hpp, classes);
        let mut r = Readiness::ready();
        r.conditions.push(match unknown.first() {
            None => StepCondition {
                type_: CONDITION_STORAGE_CLASSES_VALID.into(),
                status: true,
                reason: REASON_ALL_POOLS_KNOWN.into(),
                message: "Every StorageClass of the driver names a configured storage pool".into(),
            },
            Some((_, first)) => StepCondition {
                type_: CONDITION_STORAGE_CLASSES_VALID.into(),
                status: false,
                reason: REASON_UNKNOWN_STORAGE_POOL.into(),
                message: if unknown.len() > 1 {
                    format!("{first} (and {} more classes)", unknown.len() - 1)
                } else {
                    first.clone()
                },
            },
        });
        r.warnings = unknown
            .into_iter()
            .map(|(cl, message)| ObjectWarning {
                regarding: class_ref(cl),
                reason: REASON_UNKNOWN_STORAGE_POOL.into(),
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

/// Names of the classes a report's warnings flag as naming an unknown pool (for the gauge).
pub fn flagged_classes(warnings: &[ObjectWarning]) -> Vec<String> {
    warnings
        .iter()
        .filter(|w| w.reason == REASON_UNKNOWN_STORAGE_POOL && w.regarding.kind.as_deref() == Some("StorageClass"))
        .filter_map(|w| w.regarding.name.clone())
        .collect()
}
