//! The claims a run looks at: read once from the cluster, then sorted into adoptions to start,
//! to finish, and refusals.

use std::collections::{BTreeMap, BTreeSet};

use hpp_api::HostPathProvisioner;
use hpp_api::constants::{DRIVER_NAME, PARAM_STORAGE_POOL};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::assess::{Assessment, Inputs, Plan, assess, refuse_duplicates};
use super::build::claim_template;
use super::error::AdoptError;
use super::keys;
use super::pools::{hpp_classes, pools_of};
use super::report::{Report, Row, Status};
use super::source::{Source, Volume, classify};
use super::steps::{Ids, adopted};
use crate::facts::NodeFact;

/// What to look at.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    /// Only claims of this namespace (`None`: every namespace).
    pub namespace: Option<String>,
    /// Only claims with these labels (a label selector, as `kubectl -l` takes it). An adoption
    /// already started is finished whatever its labels, so no claim stays half adopted.
    pub selector: Option<String>,
    /// The StorageClass of every new PV and claim, instead of the one class serving the pool.
    pub storage_class: Option<String>,
    /// Directories renamed on the nodes since their PVs were made: `(from, to)`, as
    /// [`parse_moved`](super::pools::parse_moved) reads `--moved FROM=TO`.
    pub moved: Vec<(String, String)>,
}

/// One claim: its row, and what carrying out its adoption needs.
#[derive(Clone, Debug)]
pub struct Unit {
    /// What was found.
    pub row: Assessment,
    /// Adoptable, in progress, or refused.
    pub status: Status,
    /// The objects it is about; `None` for a refused claim that cannot be told apart (no uid).
    pub ids: Option<Ids>,
}

impl Unit {
    /// The objects to create, when it can be adopted.
    pub fn plan(&self) -> Option<&Plan> {
        self.row.plan.as_ref()
    }

    /// Whether a real run acts on it.
    pub fn actionable(&self) -> bool {
        matches!(self.status, Status::Adoptable | Status::InProgress) && self.ids.is_some()
    }
}

/// Everything a run found.
#[derive(Clone, Debug, Default)]
pub struct Survey {
    /// One per claim, by namespace and name.
    pub units: Vec<Unit>,
}

impl Survey {
    /// The dry run's report.
    pub fn report(&self) -> Report {
        Report::new(
            true,
            self.units
                .iter()
                .map(|u| Row {
                    found: u.row.clone(),
                    status: u.status,
                    message: None,
                })
                .collect(),
        )
    }
}

/// The cluster as a run reads it.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The HostPathProvisioner.
    pub cr: HostPathProvisioner,
    /// Every StorageClass.
    pub classes: Vec<StorageClass>,
    /// Every Node.
    pub nodes: Vec<NodeFact>,
    /// Nodes whose CSINode lists hpp's driver.
    pub driver_nodes: BTreeSet<String>,
    /// Every PersistentVolume.
    pub volumes: Vec<PersistentVolume>,
    /// The claims in scope.
    pub claims: Vec<PersistentVolumeClaim>,
    /// The pods of the namespace in scope (or all).
    pub pods: Vec<Pod>,
}

/// Reads what a run needs, in `scope`.
pub async fn read(client: &Client, scope: &Scope) -> Result<Snapshot, AdoptError> {
    let all = ListParams::default();
    let mut crs = Api::<HostPathProvisioner>::all(client.clone())
        .list(&all)
        .await
        .map_err(AdoptError::kube("list", "HostPathProvisioners"))?
        .items;
    let cr = match crs.len() {
        0 => return Err(AdoptError::NoHostPathProvisioner),
        1 => crs.remove(0),
        _ => {
            return Err(AdoptError::SeveralHostPathProvisioners(
                crs.iter().map(|c| c.name_any()).collect(),
            ));
        }
    };
    let classes = Api::<StorageClass>::all(client.clone())
        .list(&all)
        .await
        .map_err(AdoptError::kube("list", "StorageClasses"))?
        .items;
    let nodes = Api::<Node>::all(client.clone())
        .list(&all)
        .await
        .map_err(AdoptError::kube("list", "Nodes"))?
        .items
        .into_iter()
        .map(|n| NodeFact {
            name: n.name_any(),
            labels: n.labels().clone(),
            taints: Vec::new(),
            ready: true,
        })
        .collect();
    let driver_nodes = Api::<CSINode>::all(client.clone())
        .list(&all)
        .await
        .map_err(AdoptError::kube("list", "CSINodes"))?
        .items
        .into_iter()
        .filter(|n| n.spec.drivers.iter().any(|d| d.name == DRIVER_NAME))
        .map(|n| n.name_any())
        .collect();
    let volumes = Api::<PersistentVolume>::all(client.clone())
        .list(&all)
        .await
        .map_err(AdoptError::kube("list", "PersistentVolumes"))?
        .items;
    let (claims_api, pods_api) = match &scope.namespace {
        Some(ns) => (Api::namespaced(client.clone(), ns), Api::namespaced(client.clone(), ns)),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let claim_params = match &scope.selector {
        Some(s) => ListParams::default().labels(s),
        None => ListParams::default(),
    };
    let mut claims: Vec<PersistentVolumeClaim> = claims_api
        .list(&claim_params)
        .await
        .map_err(AdoptError::kube("list", "PersistentVolumeClaims"))?
        .items;
    // Claims of adoptions already started are finished whatever their labels: read those the
    // selector left out.
    let in_scope = |ns: &str| scope.namespace.as_deref().is_none_or(|s| s == ns);
    for (ns, name) in started_claims(&volumes) {
        let listed = claims.iter().any(|c| {
            c.metadata.namespace.as_deref() == Some(ns.as_str()) && c.metadata.name.as_deref() == Some(name.as_str())
        });
        if listed || !in_scope(&ns) {
            continue;
        }
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        if let Some(claim) = api
            .get_opt(&name)
            .await
            .map_err(AdoptError::kube("get", format!("PersistentVolumeClaim {ns}/{name}")))?
        {
            claims.push(claim);
        }
    }
    let pods: Vec<Pod> = pods_api
        .list(&all)
        .await
        .map_err(AdoptError::kube("list", "Pods"))?
        .items;
    Ok(Snapshot {
        cr,
        classes,
        nodes,
        driver_nodes,
        volumes,
        claims,
        pods,
    })
}

/// Sorts `snap` into adoptions. Fails only on a CR whose pools cannot be read or a
/// `--storage-class` that is not hpp's; everything about one claim lands on its row.
pub fn survey(snap: &Snapshot, scope: &Scope) -> Result<Survey, AdoptError> {
    let pools = pools_of(&snap.cr).map_err(|why| AdoptError::InvalidHostPathProvisioner {
        name: snap.cr.name_any(),
        why,
    })?;
    let classes = hpp_classes(&snap.classes, &pools);
    if let Some(wanted) = &scope.storage_class
        && !classes.iter().any(|c| &c.name == wanted)
    {
        let why = match snap.classes.iter().find(|c| c.metadata.name.as_deref() == Some(wanted)) {
            Some(c) => format!("its provisioner is {}, not {DRIVER_NAME}", c.provisioner),
            None => "no such StorageClass".to_owned(),
        };
        return Err(AdoptError::StorageClass {
            name: wanted.clone(),
            why,
        });
    }
    let inputs = Inputs {
        pools: &pools,
        classes: &classes,
        nodes: &snap.nodes,
        driver_nodes: &snap.driver_nodes,
        pods: &snap.pods,
        volumes: &snap.volumes,
        storage_class: scope.storage_class.as_deref(),
        moved: &scope.moved,
    };
    let by_name: BTreeMap<&str, &PersistentVolume> = snap
        .volumes
        .iter()
        .filter_map(|v| v.metadata.name.as_deref().map(|n| (n, v)))
        .collect();
    let mut units: BTreeMap<(String, String), Unit> = BTreeMap::new();
    let mut assessed = Vec::new();
    for claim in &snap.claims {
        let Some(pv_name) = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|n| !n.is_empty())
        else {
            continue;
        };
        let pv = by_name.get(pv_name).copied();
        if pv.is_some_and(|pv| classify(pv) == Volume::Hpp) {
            continue;
        }
        assessed.push(assess(claim, pv, &inputs));
    }
    refuse_duplicates(&mut assessed);
    for row in assessed {
        let claim_uid = snap
            .claims
            .iter()
            .find(|c| {
                c.metadata.namespace.as_deref() == Some(row.namespace.as_str())
                    && c.metadata.name.as_deref() == Some(row.claim.as_str())
            })
            .and_then(|c| c.metadata.uid.clone());
        let ids = claim_uid.map(|claim_uid| Ids {
            namespace: row.namespace.clone(),
            claim: row.claim.clone(),
            claim_uid,
            old_pv: row.pv.clone(),
            new_pv: keys::new_pv_name(&row.pv),
        });
        let started = ids.as_ref().is_some_and(|ids| {
            by_name
                .get(ids.old_pv.as_str())
                .is_some_and(|p| super::steps::old_pv_marked(p, ids))
                || by_name
                    .get(ids.new_pv.as_str())
                    .is_some_and(|p| super::steps::new_pv_ours(p, ids))
        });
        let status = match (started, row.plan.is_some()) {
            (true, _) => Status::InProgress,
            (false, true) => Status::Adoptable,
            (false, false) => Status::Refused,
        };
        units.insert((row.namespace.clone(), row.claim.clone()), Unit { row, status, ids });
    }
    // Adoptions past the old claim's deletion, found from their PVs.
    let in_scope = |ns: &str| scope.namespace.as_deref().is_none_or(|s| s == ns);
    // New PVs first: they say more about the adoption than the old PV does.
    let (new, old): (Vec<&PersistentVolume>, Vec<&PersistentVolume>) = snap
        .volumes
        .iter()
        .partition(|pv| annotation(pv, keys::ADOPTED_FROM).is_some());
    for pv in new.into_iter().chain(old) {
        if let Some(unit) = resumed(pv)
            && in_scope(&unit.row.namespace)
        {
            units
                .entry((unit.row.namespace.clone(), unit.row.claim.clone()))
                .or_insert(unit);
        }
    }
    Ok(Survey {
        units: units.into_values().collect(),
    })
}

/// The claims (namespace, name) of the adoptions the PVs show under way.
fn started_claims(volumes: &[PersistentVolume]) -> Vec<(String, String)> {
    volumes
        .iter()
        .filter_map(resumed)
        .map(|u| (u.row.namespace, u.row.claim))
        .collect()
}

fn annotation<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a str> {
    pv.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The adoption a PV shows to be under way: a new PV not yet `Adopted`, or an old PV marked
/// by step 1 (its claim may be gone).
fn resumed(pv: &PersistentVolume) -> Option<Unit> {
    let name = pv.metadata.name.clone()?;
    let claim_uid = annotation(pv, keys::CLAIM_UID)?.to_owned();
    if let Some(old_pv) = annotation(pv, keys::ADOPTED_FROM) {
        if adopted(pv) {
            return None;
        }
        let (namespace, claim) = match claim_template(pv) {
            Ok(t) => (
                t.metadata.namespace.unwrap_or_default(),
                t.metadata.name.unwrap_or_default(),
            ),
            Err(_) => {
                let r = pv.spec.as_ref()?.claim_ref.as_ref()?;
                (r.namespace.clone()?, r.name.clone()?)
            }
        };
        let csi = pv.spec.as_ref().and_then(|s| s.csi.as_ref());
        let (node, directory) = annotation(pv, keys::ADOPTED_DIRECTORY)
            .and_then(|d| d.split_once(':'))
            .map_or((None, None), |(n, d)| {
                ((!n.is_empty()).then(|| n.to_owned()), Some(d.to_owned()))
            });
        let row = Assessment {
            namespace: namespace.clone(),
            claim: claim.clone(),
            pv: old_pv.to_owned(),
            source: annotation(pv, keys::ADOPTED_SOURCE).and_then(Source::parse),
            node,
            directory,
            pool: csi
                .and_then(|c| c.volume_attributes.as_ref())
                .and_then(|a| a.get(PARAM_STORAGE_POOL))
                .cloned(),
            volume_id: csi.map(|c| c.volume_handle.clone()),
            storage_class: pv.spec.as_ref().and_then(|s| s.storage_class_name.clone()),
            new_pv: Some(name.clone()),
            refusals: Vec::new(),
            plan: None,
        };
        return Some(Unit {
            ids: Some(Ids {
                namespace,
                claim,
                claim_uid,
                old_pv: old_pv.to_owned(),
                new_pv: name,
            }),
            row,
            status: Status::InProgress,
        });
    }
    // An old PV being deleted is past step 5: its new PV tells the rest.
    if pv.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let new_pv = annotation(pv, keys::ADOPT_INTO)?.to_owned();
    let r = pv.spec.as_ref()?.claim_ref.as_ref()?;
    let (namespace, claim) = (r.namespace.clone()?, r.name.clone()?);
    let row = Assessment {
        namespace: namespace.clone(),
        claim: claim.clone(),
        pv: name.clone(),
        source: match classify(pv) {
            Volume::Directory { source, .. } => Some(source),
            _ => None,
        },
        node: None,
        directory: None,
        pool: None,
        volume_id: None,
        storage_class: None,
        new_pv: Some(new_pv.clone()),
        refusals: Vec::new(),
        plan: None,
    };
    Some(Unit {
        ids: Some(Ids {
            namespace,
            claim,
            claim_uid,
            old_pv: name,
            new_pv,
        }),
        row,
        status: Status::InProgress,
    })
}
