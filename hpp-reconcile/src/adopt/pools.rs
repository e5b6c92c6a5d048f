//! hpp's pools and StorageClasses as adoption sees them, where a directory sits relative to a
//! pool, and whether a name can be a volume id. Pure.
//!
//! A pool's directory on the host is `<spec.storagePools[].path>/csi` (a `pathConfig` CR: the
//! pool `legacy` at `<pathConfig.path>/csi`), exactly what the operator gives the driver
//! ([`pool_mounts`]), and the driver finds a volume by its name alone: `<pool dir>/<volume id>`.
//! So a directory directly inside a pool's directory is adopted under its own name, without a
//! rename. Any other place needs one rename on the node first, which adoption never does
//! itself (it has no access to nodes, and a rename is the one step that cannot be checked from
//! the API): [`Location::Nested`] and [`Location::Beside`] carry what to run.

use std::collections::BTreeMap;

use hpp_api::HostPathProvisioner;
use hpp_api::constants::{DEFAULT_POOL_NAME, DRIVER_NAME, PARAM_STORAGE_POOL};
use hpp_api::quota::QuotaMode;
use k8s_openapi::api::storage::v1::StorageClass;

use crate::reconcilers::csi_daemonset::pool_mounts;

/// Longest volume id the driver accepts (`hpp-csi` `pool::validate::MAX_ID_LEN`).
pub const MAX_ID_LEN: usize = 230;
/// Names the driver never serves as volumes (`hpp-csi` `pool::ALWAYS_RESERVED`).
const ALWAYS_RESERVED: &[&str] = &["lost+found"];
/// The snapshot directory inside a pool with a `snapshotProvider` (`<pool dir>/snapshots`).
const SNAPSHOT_DIR: &str = "snapshots";

/// One pool of the CR, with its directory on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolInfo {
    /// Pool name (the `storagePool` parameter and volume attribute).
    pub name: String,
    /// The CR's path (`spec.storagePools[].path`, or `pathConfig.path`).
    pub base: String,
    /// The driver's directory of the pool on the host: `<base>/csi`.
    pub dir: String,
    /// One ReadWriteMany claim shared by every node: volumes get no node affinity.
    pub shared: bool,
    /// How sizes are enforced.
    pub quota: QuotaMode,
    /// Whether `<dir>/snapshots` holds snapshots (a reserved name).
    pub snapshots: bool,
    /// The CR's `pathConfig` pool, whose base also holds the legacy provisioner's volumes.
    pub path_config: bool,
}

/// The pools the driver serves for `cr`, or why the CR cannot be read.
pub fn pools_of(cr: &HostPathProvisioner) -> Result<Vec<PoolInfo>, String> {
    let path_config = cr.spec.path_config.is_some();
    Ok(pool_mounts(cr)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|m| {
            let base = normalise(&m.host_path).unwrap_or_else(|| m.host_path.clone());
            PoolInfo {
                dir: join(&base, "csi"),
                base,
                name: m.entry.name,
                shared: m.entry.shared,
                quota: m.entry.quota,
                snapshots: m.entry.snapshot_path.is_some(),
                path_config,
            }
        })
        .collect())
}

fn join(dir: &str, name: &str) -> String {
    match dir {
        "/" => format!("/{name}"),
        _ => format!("{dir}/{name}"),
    }
}

/// `path` absolute, without empty components or a trailing `/`; `None` when it is relative,
/// holds `.`/`..` or a control character (it cannot be compared with a pool's directory).
pub fn normalise(path: &str) -> Option<String> {
    if !path.starts_with('/') || path.chars().any(char::is_control) {
        return None;
    }
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    if parts.iter().any(|c| *c == "." || *c == "..") {
        return None;
    }
    Some(format!("/{}", parts.join("/")))
}

/// Parses `FROM=TO` (`--moved`): directories under `FROM` are now under `TO` (renamed on the
/// nodes, same filesystem), both absolute paths.
pub fn parse_moved(s: &str) -> Result<(String, String), String> {
    let (from, to) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not FROM=TO (two absolute directories)"))?;
    let path = |p: &str| normalise(p).ok_or_else(|| format!("{p:?} is not an absolute, normalised directory"));
    let (from, to) = (path(from)?, path(to)?);
    if from == to {
        return Err(format!("{s:?} moves a directory onto itself"));
    }
    Ok((from, to))
}

/// `dir` after the renames in `moved` (the longest matching `FROM` wins); `dir` itself when
/// none matches.
pub fn relocate(dir: &str, moved: &[(String, String)]) -> String {
    moved
        .iter()
        .filter(|(from, _)| dir == from || dir.starts_with(&format!("{}/", from.trim_end_matches('/'))))
        .max_by_key(|(from, _)| from.len())
        .map_or_else(
            || dir.to_owned(),
            |(from, to)| match &dir[from.len()..] {
                "" => to.clone(),
                rest if to == "/" => rest.to_owned(),
                rest => format!("{to}{rest}"),
            },
        )
}

/// Where a directory sits relative to the pools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location<'a> {
    /// Directly inside the pool's directory, under `name`: adoptable as volume `name`.
    Inside {
        /// The pool.
        pool: &'a PoolInfo,
        /// The directory's name.
        name: String,
    },
    /// Deeper inside the pool's directory (`<pool dir>/a/b`): the driver only finds volumes
    /// directly in it, and would list `a` as a volume of its own.
    Nested {
        /// The pool.
        pool: &'a PoolInfo,
    },
    /// Directly in the pool's base, beside its `csi` directory: a `pathConfig` CR's legacy
    /// volume (`<pathConfig.path>/<pv>`), one rename away on the same filesystem.
    Beside {
        /// The pool.
        pool: &'a PoolInfo,
    },
    /// The directory is a pool's directory or base, or holds one: never a volume.
    HoldsPool {
        /// The pool.
        pool: &'a PoolInfo,
    },
    /// In no pool.
    Outside,
}

/// Where the (normalised) directory `dir` sits among `pools`.
pub fn locate<'a>(dir: &str, pools: &'a [PoolInfo]) -> Location<'a> {
    let within = |parent: &str, child: &str| parent == "/" || child.starts_with(&format!("{parent}/"));
    if let Some(pool) = pools
        .iter()
        .find(|p| p.dir == dir || p.base == dir || within(dir, &p.dir))
    {
        return Location::HoldsPool { pool };
    }
    for pool in pools {
        if within(&pool.dir, dir) {
            let rel = &dir[pool.dir.len()..].trim_start_matches('/');
            return match rel.contains('/') {
                false => Location::Inside {
                    pool,
                    name: (*rel).to_owned(),
                },
                true => Location::Nested { pool },
            };
        }
    }
    let parent = dir.rsplit_once('/').map(|(p, _)| if p.is_empty() { "/" } else { p });
    match pools.iter().find(|p| parent == Some(p.base.as_str())) {
        Some(pool) => Location::Beside { pool },
        None => Location::Outside,
    }
}

/// Why `id` cannot be a volume id in `pool`, or `None`: the driver's rules (`hpp-csi`
/// `pool::validate::check_id` and the pool's reserved names).
pub fn id_problem(id: &str, pool: &PoolInfo) -> Option<String> {
    if id.is_empty() {
        Some("it is empty".into())
    } else if id.len() > MAX_ID_LEN {
        Some(format!(
            "it is {} bytes long; the driver accepts at most {MAX_ID_LEN}",
            id.len()
        ))
    } else if id.contains('/') {
        Some("it contains '/'".into())
    } else if id.chars().any(char::is_control) {
        Some("it contains a control character".into())
    } else if id.starts_with('.') {
        Some("it starts with '.' (the driver keeps such names for itself)".into())
    } else if ALWAYS_RESERVED.contains(&id) || (pool.snapshots && id == SNAPSHOT_DIR) {
        Some(format!("{id:?} is reserved in pool {}", pool.name))
    } else {
        None
    }
}

/// An hpp StorageClass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassInfo {
    /// Class name.
    pub name: String,
    /// The pool its volumes go to.
    pub pool: String,
    /// Its parameters (CreateVolume copies them into the volume attributes).
    pub parameters: BTreeMap<String, String>,
    /// Its mount options (csi-provisioner copies them onto the PV).
    pub mount_options: Vec<String>,
}

/// The StorageClasses of hpp's CSI driver among `classes`, with the pool each serves: its
/// `storagePool` parameter, else the pool the driver picks without one (`legacy`, else the
/// first pool).
pub fn hpp_classes(classes: &[StorageClass], pools: &[PoolInfo]) -> Vec<ClassInfo> {
    let default_pool = pools
        .iter()
        .find(|p| p.name == DEFAULT_POOL_NAME)
        .or_else(|| pools.first())
        .map_or(DEFAULT_POOL_NAME, |p| p.name.as_str());
    classes
        .iter()
        .filter(|c| c.provisioner == DRIVER_NAME)
        .map(|c| {
            let parameters = c.parameters.clone().unwrap_or_default();
            ClassInfo {
                name: c.metadata.name.clone().unwrap_or_default(),
                pool: parameters
                    .get(PARAM_STORAGE_POOL)
                    .cloned()
                    .unwrap_or_else(|| default_pool.to_owned()),
                parameters,
                mount_options: c.mount_options.clone().unwrap_or_default(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn cr(spec: serde_json::Value) -> HostPathProvisioner {
        serde_json::from_value(json!({
            "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1", "kind": "HostPathProvisioner",
            "metadata": {"name": "hostpath-provisioner"}, "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn pool_directories_are_path_slash_csi() {
        let pools = pools_of(&cr(json!({"storagePools": [
            {"name": "local", "path": "/var/hpvolumes"},
            {"name": "nfs", "path": "/mnt/nfs/", "snapshotProvider": "reflink",
             "pvcTemplate": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}},
        ]})))
        .unwrap();
        assert_eq!(pools[0].dir, "/var/hpvolumes/csi");
        assert!(!pools[0].shared && !pools[0].path_config);
        assert_eq!(
            (pools[1].dir.as_str(), pools[1].shared, pools[1].snapshots),
            ("/mnt/nfs/csi", true, true)
        );
        let legacy = pools_of(&cr(json!({"pathConfig": {"path": "/var/hpvolumes"}}))).unwrap();
        assert_eq!(
            (legacy[0].name.as_str(), legacy[0].dir.as_str()),
            ("legacy", "/var/hpvolumes/csi")
        );
        assert!(legacy[0].path_config);
    }

    #[test]
    fn a_directory_is_inside_nested_beside_or_outside_a_pool() {
        let pools = pools_of(&cr(
            json!({"storagePools": [{"name": "local", "path": "/var/hpvolumes"}]}),
        ))
        .unwrap();
        let at = |d: &str| locate(&normalise(d).unwrap(), &pools);
        assert_eq!(
            at("/var/hpvolumes/csi/pvc-1/"),
            Location::Inside {
                pool: &pools[0],
                name: "pvc-1".into()
            }
        );
        assert_eq!(at("/var/hpvolumes/csi/ns/claim"), Location::Nested { pool: &pools[0] });
        assert_eq!(at("/var/hpvolumes/pvc-1"), Location::Beside { pool: &pools[0] });
        assert_eq!(at("/var/hpvolumes/csi"), Location::HoldsPool { pool: &pools[0] });
        assert_eq!(at("/var"), Location::HoldsPool { pool: &pools[0] });
        assert_eq!(at("/var/hpvolumes"), Location::HoldsPool { pool: &pools[0] });
        assert_eq!(at("/var/hpvolumes/csiother/x"), Location::Outside);
        assert_eq!(at("/opt/local-path-provisioner/pvc-1_ns_c"), Location::Outside);
        assert_eq!(normalise("var/x"), None);
        assert_eq!(normalise("/var/../etc"), None);
        assert_eq!(normalise("//var//x/").as_deref(), Some("/var/x"));
    }

    #[test]
    fn moves_map_directories_under_one_path_to_another() {
        let moved = vec![
            parse_moved("/var/hpvolumes=/var/hpvolumes/csi").unwrap(),
            parse_moved("/opt/local-path-provisioner/=/srv/lpp/csi").unwrap(),
            parse_moved("/opt=/elsewhere").unwrap(),
        ];
        assert_eq!(relocate("/var/hpvolumes/pvc-1", &moved), "/var/hpvolumes/csi/pvc-1");
        assert_eq!(
            relocate("/opt/local-path-provisioner/pvc-2_ns_c", &moved),
            "/srv/lpp/csi/pvc-2_ns_c"
        );
        assert_eq!(relocate("/opt/other/x", &moved), "/elsewhere/other/x");
        assert_eq!(relocate("/var/hpvolumes2/x", &moved), "/var/hpvolumes2/x");
        for bad in ["/a", "a=/b", "/a=b", "/a=/a", "/a/../b=/c"] {
            assert!(parse_moved(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn volume_ids_follow_the_drivers_rules() {
        let mut pool = pools_of(&cr(json!({"storagePools": [{"name": "local", "path": "/p"}]})))
            .unwrap()
            .remove(0);
        assert_eq!(
            id_problem("pvc-5b1c9c9e-1a2b-4c3d-8e9f-001122334455_ns_claim", &pool),
            None
        );
        assert_eq!(id_problem("snapshots", &pool), None);
        for bad in ["", ".hidden", "lost+found", "a\nb"] {
            assert!(id_problem(bad, &pool).is_some(), "{bad:?}");
        }
        assert!(
            id_problem(&"a".repeat(MAX_ID_LEN + 1), &pool)
                .unwrap()
                .contains("231 bytes")
        );
        assert_eq!(id_problem(&"a".repeat(MAX_ID_LEN), &pool), None);
        pool.snapshots = true;
        assert!(id_problem("snapshots", &pool).is_some());
    }

    #[test]
    fn classes_serve_their_storage_pool_or_the_drivers_default() {
        let pools = pools_of(&cr(
            json!({"storagePools": [{"name": "local", "path": "/p"}, {"name": "legacy", "path": "/q"}]}),
        ))
        .unwrap();
        let sc = |name: &str, provisioner: &str, params: serde_json::Value| -> StorageClass {
            serde_json::from_value(
                json!({"metadata": {"name": name}, "provisioner": provisioner, "parameters": params}),
            )
            .unwrap()
        };
        let classes = hpp_classes(
            &[
                sc("hostpath-csi", DRIVER_NAME, json!({"storagePool": "local"})),
                sc("csi-hostpath-provisioner", DRIVER_NAME, json!({})),
                sc("other", "rancher.io/local-path", json!({})),
            ],
            &pools,
        );
        let pairs: Vec<(&str, &str)> = classes.iter().map(|c| (c.name.as_str(), c.pool.as_str())).collect();
        assert_eq!(
            pairs,
            [("hostpath-csi", "local"), ("csi-hostpath-provisioner", "legacy")]
        );
    }
}
