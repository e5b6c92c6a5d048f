//! Whether one claim can be adopted, and if so the objects it becomes. Pure: everything comes
//! in through [`Inputs`], gathered once per run.

use std::collections::BTreeSet;

use hpp_api::constants::{DRIVER_NAME, PARAM_STORAGE_POOL, TOPOLOGY_KEY};
use hpp_api::quantity::parse_bytes;
use hpp_api::quota::QuotaMode;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use serde::Serialize;

use super::build::{self, NewVolume};
use super::keys;
use super::placement::{Placement, place};
use super::pools::{ClassInfo, Location, PoolInfo, id_problem, locate, normalise, relocate};
use super::refusal::{Reason, Refusal};
use super::source::{Source, Volume, classify};
use crate::facts::NodeFact;

/// What an assessment reads.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// hpp's pools (from the HostPathProvisioner).
    pub pools: &'a [PoolInfo],
    /// hpp's StorageClasses.
    pub classes: &'a [ClassInfo],
    /// Every Node.
    pub nodes: &'a [NodeFact],
    /// Nodes where hpp's CSI driver is registered (their CSINode lists it).
    pub driver_nodes: &'a BTreeSet<String>,
    /// The pods of the claims' namespaces.
    pub pods: &'a [Pod],
    /// Every PersistentVolume.
    pub volumes: &'a [PersistentVolume],
    /// `--storage-class`, when given (checked to be an hpp class beforehand).
    pub storage_class: Option<&'a str>,
    /// `--moved`: directories renamed on the nodes, `(from, to)`.
    pub moved: &'a [(String, String)],
}

/// What adopting one claim creates.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The claim's uid (the delete's precondition).
    pub claim_uid: String,
    /// The old PV's name.
    pub old_pv: String,
    /// The old PV's reclaim policy.
    pub reclaim_policy: String,
    /// The CSI PV to create.
    pub new_pv: PersistentVolume,
    /// The claim to create once the old one is gone.
    pub new_claim: PersistentVolumeClaim,
}

/// One claim's row: what was found, and why it cannot be adopted or what it becomes.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Assessment {
    /// Namespace.
    pub namespace: String,
    /// Claim name.
    pub claim: String,
    /// The PV it is bound to.
    pub pv: String,
    /// Who made the volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    /// Its node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Its directory on the node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub directory: Option<String>,
    /// The pool holding that directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The volume id it gets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_id: Option<String>,
    /// The StorageClass of the new PV and claim.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
    /// The new PV's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_pv: Option<String>,
    /// Why it cannot be adopted; empty when it can.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<Refusal>,
    /// The objects to create, when it can be adopted.
    #[serde(skip)]
    pub plan: Option<Plan>,
}

/// Access modes that let pods on several nodes use a volume at once.
const MULTI_NODE_MODES: &[&str] = &["ReadWriteMany", "ReadOnlyMany"];

/// Pods that use claim `name` of `namespace` and have not finished, by name.
pub fn pods_using(pods: &[Pod], namespace: &str, name: &str) -> Vec<String> {
    pods.iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .filter(|p| {
            let pod = p.metadata.name.as_deref().unwrap_or_default();
            p.spec.iter().flat_map(|s| s.volumes.iter().flatten()).any(|v| {
                v.persistent_volume_claim.as_ref().is_some_and(|c| c.claim_name == name)
                    || (v.ephemeral.is_some() && format!("{pod}-{}", v.name) == name)
            })
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

fn annotation<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a str> {
    pv.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Assesses `claim`, bound (or meant to be) to `pv` (`None`: the PV does not exist). The
/// caller passes only claims whose PV is not hpp's.
pub fn assess(claim: &PersistentVolumeClaim, pv: Option<&PersistentVolume>, inputs: &Inputs<'_>) -> Assessment {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let pv_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    let mut row = Assessment {
        namespace,
        claim: name,
        pv: pv_name,
        source: None,
        node: None,
        directory: None,
        pool: None,
        volume_id: None,
        storage_class: None,
        new_pv: None,
        refusals: Vec::new(),
        plan: None,
    };
    let refuse =
        |row: &mut Assessment, reason: Reason, message: String| row.refusals.push(Refusal::new(reason, message));
    if claim.metadata.deletion_timestamp.is_some() {
        refuse(&mut row, Reason::BeingDeleted, "the claim is being deleted".into());
    }
    let Some(pv) = pv else {
        let message = format!("its PersistentVolume {} does not exist", row.pv);
        refuse(&mut row, Reason::NotBound, message);
        return row;
    };
    let claim_phase = claim.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    let pv_phase = pv.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    let bound_to_it = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .is_some_and(|r| r.uid.is_some() && r.uid == claim.metadata.uid);
    if claim_phase != "Bound" || pv_phase != "Bound" || !bound_to_it {
        let message = format!(
            "the claim is {}, its PersistentVolume {} is {}{}: only a Bound pair can be adopted",
            or_unknown(&claim_phase),
            row.pv,
            or_unknown(&pv_phase),
            if bound_to_it {
                ""
            } else {
                " and not bound to this claim"
            }
        );
        refuse(&mut row, Reason::NotBound, message);
    }
    // What the claim and PV alone tell, listed whatever else is wrong.
    let users = pods_using(inputs.pods, &row.namespace, &row.claim);
    if !users.is_empty() {
        let message = format!(
            "pods still use the claim: {}; scale their workloads down (or stop the VMs) first",
            users.join(", ")
        );
        refuse(&mut row, Reason::InUse, message);
    }
    let request = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone());
    let capacity = pv
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .map(|q| q.0.clone());
    if let (Some(request), Some(capacity)) = (&request, &capacity)
        && let (Some(r), Some(c)) = (parse_bytes(request), parse_bytes(capacity))
        && r > c
    {
        let message = format!(
            "the claim requests {request} but its PersistentVolume holds {capacity} (an expansion the old provisioner never made?): the new PersistentVolume, of the same capacity, would not bind"
        );
        refuse(&mut row, Reason::RequestTooLarge, message);
    }
    let path = match classify(pv) {
        Volume::Directory { source, path } => {
            row.source = Some(source);
            annotation(pv, keys::MOVED_TO).map_or(path, str::to_owned)
        }
        Volume::Hpp => return row,
        Volume::Other(what) => {
            refuse(
                &mut row,
                Reason::NotADirectory,
                format!("the PersistentVolume is {what}, not a directory on a node"),
            );
            return row;
        }
    };
    let block = |mode: Option<&String>| mode.is_some_and(|m| m == "Block");
    if block(claim.spec.as_ref().and_then(|s| s.volume_mode.as_ref()))
        || block(pv.spec.as_ref().and_then(|s| s.volume_mode.as_ref()))
    {
        refuse(
            &mut row,
            Reason::BlockVolume,
            "a Block volume: hpp volumes are directories".into(),
        );
    }
    let placement = place(pv, inputs.nodes);
    if let Placement::Node(n) = &placement {
        row.node = Some(n.clone());
    }
    let Some(dir) = normalise(&path) else {
        refuse(
            &mut row,
            Reason::BadPath,
            format!("its path {path:?} is not an absolute, normalised path"),
        );
        return row;
    };
    // A directory the user recorded as moved stays where the annotation says.
    let dir = match annotation(pv, keys::MOVED_TO) {
        Some(_) => dir,
        None => relocate(&dir, inputs.moved),
    };
    row.directory = Some(dir.clone());
    let on_node = row
        .node
        .clone()
        .map_or_else(|| "its node".to_owned(), |n| format!("node {n}"));
    let (pool, id) = match locate(&dir, inputs.pools) {
        Location::Inside { pool, name } => (pool, name),
        Location::Outside => {
            let pools: Vec<String> = inputs.pools.iter().map(|p| format!("{} ({})", p.name, p.dir)).collect();
            let message = format!(
                "no hpp pool holds {dir}: a volume must sit directly in a pool's directory, {}; add a pool whose path/csi holds it, or copy the data into a new claim",
                if pools.is_empty() {
                    "and the HostPathProvisioner has no pool".to_owned()
                } else {
                    format!("one of {}", pools.join(", "))
                }
            );
            refuse(&mut row, Reason::NoPool, message);
            return row;
        }
        Location::HoldsPool { pool } => {
            let message = format!("{dir} is, or holds, pool {}'s directory {}", pool.name, pool.dir);
            refuse(&mut row, Reason::HoldsPool, message);
            return row;
        }
        Location::Nested { pool } | Location::Beside { pool } => {
            row.pool = Some(pool.name.clone());
            let base = dir.rsplit('/').next().unwrap_or_default();
            let target_name = if id_problem(base, pool).is_none() {
                base
            } else {
                row.pv.as_str()
            };
            let target = format!("{}/{target_name}", pool.dir);
            let why = match pool.path_config && dir.rsplit_once('/').map(|(p, _)| p) == Some(pool.base.as_str()) {
                true => format!(
                    "{dir} is a legacy volume of pathConfig {}, beside pool {}'s directory {}",
                    pool.base, pool.name, pool.dir
                ),
                false if dir.starts_with(&format!("{}/", pool.dir)) => format!(
                    "{dir} is nested in pool {}'s directory {}, and the driver finds a volume only directly in it",
                    pool.name, pool.dir
                ),
                false => format!("{dir} is beside pool {}'s directory {}, not in it", pool.name, pool.dir),
            };
            let message = format!(
                "{why}: on {on_node}, rename it into the pool (same filesystem: nothing is copied) with `mv {dir} {target}`, then `kubectl annotate pv {} {}={target}` (or, for many, pass --moved FROM=TO) and run adopt again",
                row.pv,
                keys::MOVED_TO
            );
            refuse(&mut row, Reason::MoveFirst, message);
            return row;
        }
    };
    row.pool = Some(pool.name.clone());
    row.volume_id = Some(id.clone());
    if let Some(why) = id_problem(&id, pool) {
        refuse(
            &mut row,
            Reason::InvalidVolumeId,
            format!("{id:?} cannot be a volume id: {why}"),
        );
    }
    if pool.quota != QuotaMode::None {
        let message = format!(
            "pool {} enforces sizes (quota: {}), which an adopted directory has none of: adopt into a pool without a quota, then clone the claim into this one",
            pool.name,
            pool.quota.as_str()
        );
        refuse(&mut row, Reason::QuotaPool, message);
    }
    let modes = claim
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.clone())
        .unwrap_or_default();
    let multi_node = modes.iter().any(|m| MULTI_NODE_MODES.contains(&m.as_str()));
    match (&placement, pool.shared) {
        (_, true) => row.node = None,
        (Placement::Node(n), false) => {
            if !inputs.driver_nodes.contains(n) {
                let message = format!(
                    "hpp's CSI driver is not registered on node {n} (its CSINode does not list {DRIVER_NAME}): nothing would serve the volume there"
                );
                refuse(&mut row, Reason::DriverNotOnNode, message);
            }
        }
        (Placement::Unpinned | Placement::Several(_), false) if multi_node => {
            let message = format!(
                "a {} volume that pods on several nodes may use, and pool {} is node-local: adopt it into a shared pool (a ReadWriteMany pvcTemplate)",
                modes.join(","),
                pool.name
            );
            refuse(&mut row, Reason::RwxAcrossNodes, message);
        }
        (Placement::Unpinned, false) => {
            let message = format!(
                "the PersistentVolume names no node, and pool {} is node-local",
                pool.name
            );
            refuse(&mut row, Reason::NoNode, message);
        }
        (Placement::Several(nodes), false) => {
            let message = format!(
                "its node affinity admits several nodes ({}), and pool {} is node-local",
                nodes.join(", "),
                pool.name
            );
            refuse(&mut row, Reason::NoNode, message);
        }
        (Placement::Missing(why), false) => {
            let message = format!("{why}, and pool {} is node-local", pool.name);
            refuse(&mut row, Reason::NoNode, message);
        }
    }
    let class = pick_class(pool, inputs, &mut row.refusals);
    row.storage_class = class.map(|c| c.name.clone());
    let new_pv_name = keys::new_pv_name(&row.pv);
    row.new_pv = Some(new_pv_name.clone());
    for other in inputs.volumes {
        let other_name = other.metadata.name.as_deref().unwrap_or_default();
        let ours = annotation(other, keys::ADOPTED_FROM) == Some(row.pv.as_str());
        if other_name == new_pv_name && !ours {
            let message = format!(
                "PersistentVolume {new_pv_name} (the name the new PersistentVolume needs) exists and is not this adoption's"
            );
            refuse(&mut row, Reason::PvNameTaken, message);
        } else if !ours && serves(other, &pool.name, &id, row.node.as_deref()) {
            let message = format!(
                "PersistentVolume {other_name} already serves volume {id} of pool {}",
                pool.name
            );
            refuse(&mut row, Reason::VolumeIdTaken, message);
        }
    }
    if !row.refusals.is_empty() {
        return row;
    }
    let (Some(class), Some(claim_uid)) = (class, claim.metadata.uid.clone()) else {
        return row;
    };
    let reclaim_policy = annotation(pv, keys::RECLAIM_POLICY)
        .map(str::to_owned)
        .or_else(|| {
            pv.spec
                .as_ref()
                .and_then(|s| s.persistent_volume_reclaim_policy.clone())
        })
        .unwrap_or_else(|| "Delete".to_owned());
    let template = build::new_claim(claim, &new_pv_name, &class.name, &row.pv);
    let new_volume = NewVolume {
        old_pv: pv,
        source: row.source.unwrap_or(Source::Hostpath),
        node: row.node.as_deref(),
        directory: &dir,
        pool,
        volume_id: &id,
        class,
        reclaim_policy: &reclaim_policy,
    };
    match build::new_pv(&new_volume, &template, &claim_uid) {
        Ok(new_pv) => {
            row.plan = Some(Plan {
                claim_uid,
                old_pv: row.pv.clone(),
                reclaim_policy,
                new_pv,
                new_claim: template,
            })
        }
        Err(e) => refuse(
            &mut row,
            Reason::NotADirectory,
            format!("cannot record the claim on the new PersistentVolume: {e}"),
        ),
    }
    row
}

fn or_unknown(phase: &str) -> &str {
    if phase.is_empty() { "of unknown phase" } else { phase }
}

/// Whether `pv` is hpp's and serves volume `id` of `pool` where `node` (`None`: a shared
/// pool) would see it: the driver finds a volume by its name, so two PVs of one directory
/// would share it.
fn serves(pv: &PersistentVolume, pool: &str, id: &str, node: Option<&str>) -> bool {
    let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
        return false;
    };
    if csi.driver != DRIVER_NAME || csi.volume_handle != id {
        return false;
    }
    let same_pool = csi
        .volume_attributes
        .as_ref()
        .and_then(|a| a.get(PARAM_STORAGE_POOL))
        .is_none_or(|p| p == pool);
    let nodes: Vec<&str> = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .into_iter()
        .flat_map(|r| r.node_selector_terms.iter())
        .flat_map(|t| t.match_expressions.iter().flatten())
        .filter(|r| r.key == TOPOLOGY_KEY)
        .flat_map(|r| r.values.iter().flatten().map(String::as_str))
        .collect();
    same_pool && (node.is_none() || nodes.is_empty() || nodes.iter().any(|n| Some(*n) == node))
}

/// The hpp StorageClass for `pool`: `--storage-class` (refused if it serves another pool), else
/// the one class that serves the pool.
fn pick_class<'a>(pool: &PoolInfo, inputs: &Inputs<'a>, refusals: &mut Vec<Refusal>) -> Option<&'a ClassInfo> {
    if let Some(wanted) = inputs.storage_class {
        let class = inputs.classes.iter().find(|c| c.name == wanted)?;
        if class.pool != pool.name {
            refusals.push(Refusal::new(
                Reason::StorageClassOtherPool,
                format!(
                    "StorageClass {wanted} serves pool {}, and the directory is in pool {}",
                    class.pool, pool.name
                ),
            ));
            return None;
        }
        return Some(class);
    }
    let serving: Vec<&ClassInfo> = inputs.classes.iter().filter(|c| c.pool == pool.name).collect();
    match serving.as_slice() {
        [one] => Some(one),
        [] => {
            refusals.push(Refusal::new(
                Reason::NoStorageClass,
                format!(
                    "no StorageClass of {DRIVER_NAME} serves pool {} (parameter {PARAM_STORAGE_POOL}: {}): create one",
                    pool.name, pool.name
                ),
            ));
            None
        }
        several => {
            let names: Vec<&str> = several.iter().map(|c| c.name.as_str()).collect();
            refusals.push(Refusal::new(
                Reason::SeveralStorageClasses,
                format!(
                    "StorageClasses {} all serve pool {}: choose one with --storage-class",
                    names.join(", "),
                    pool.name
                ),
            ));
            None
        }
    }
}

/// Refuses every assessment whose volume (node, pool, id) another one of `rows` maps to too:
/// one directory can be one volume of one claim only.
pub fn refuse_duplicates(rows: &mut [Assessment]) {
    let key = |r: &Assessment| {
        r.volume_id
            .as_ref()
            .map(|id| (r.node.clone(), r.pool.clone(), id.clone()))
    };
    let keys: Vec<_> = rows.iter().map(key).collect();
    let names: Vec<String> = rows.iter().map(|r| format!("{}/{}", r.namespace, r.claim)).collect();
    for (i, row) in rows.iter_mut().enumerate() {
        let Some(mine) = &keys[i] else { continue };
        let others: Vec<&str> = keys
            .iter()
            .zip(&names)
            .enumerate()
            .filter(|(j, (k, _))| *j != i && k.as_ref() == Some(mine))
            .map(|(_, (_, n))| n.as_str())
            .collect();
        if !others.is_empty() {
            row.plan = None;
            row.refusals.push(Refusal::new(
                Reason::SameVolume,
                format!(
                    "claim {} maps to the same volume {} of pool {}",
                    others.join(", "),
                    mine.2,
                    mine.1.clone().unwrap_or_default()
                ),
            ));
        }
    }
}
