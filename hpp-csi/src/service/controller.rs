//! The CSI Controller service: volumes (create, clone, restore, delete, list, get, validate,
//! expand, modify), capacity and reflink snapshots.

use std::borrow::Cow;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::csi::{self, controller_service_capability::rpc::Type as Cap, volume_content_source};
use crate::error::{Error, Result};
use crate::ops::caps;
use crate::ops::expand::{self, ExpansionMode};
use crate::ops::modify;
use crate::ops::sizing::{self, Range};
use crate::ops::snapshots::{self, SnapshotInfo};
use crate::ops::volume_journal::Deferred;
use crate::ops::volumes::{self, Created};
use crate::pool::inflight::{snapshot_key, volume_key};
use crate::pool::lane::{Reply, blocking_replying};
use crate::pool::lane::{blocking, blocking_locked};
use crate::pool::validate::check_id;
use crate::pool::{Pool, PoolHealth};
use crate::service::listing::{self, Listings};
use crate::service::pagination::{self, pool_key};
use crate::service::state::DriverState;

/// Controller service over the configured pools.
#[derive(Debug, Clone)]
pub struct ControllerService {
    state: Arc<DriverState>,
}

impl ControllerService {
    /// Wraps shared driver state.
    pub fn new(state: Arc<DriverState>) -> Self {
        ControllerService { state }
    }
}

fn record(field: &str, value: &str) {
    tracing::Span::current().record(field, value);
}

pub(crate) fn require_usable(pool: &Pool) -> Result<PoolHealth> {
    open_usable(pool).map(|(h, _)| h)
}

/// [`require_usable`], with the pool directory it opened (mount guard passed) to work in.
pub(crate) fn open_usable(pool: &Pool) -> Result<(PoolHealth, OwnedFd)> {
    match pool.measure_open() {
        (h, Some(dir)) if h.reason.is_none() => Ok((h, dir)),
        (h, _) => {
            let reason = h
                .reason
                .unwrap_or_else(|| format!("storage pool {} is not usable", pool.name));
            match pool.require_mount_point && !h.mount_point {
                true => Err(Error::FailedPrecondition(reason)),
                false => Err(Error::Unavailable(reason)),
            }
        }
    }
}

/// Where new volume content comes from.
enum Source {
    Snapshot { id: String, pool: Pool },
    Volume { id: String, pool: Pool },
}

impl Source {
    /// The capacity the source records (0: unknown, or its pool enforces no sizes).
    fn capacity(&self) -> u64 {
        match self {
            Source::Snapshot { id, pool } => snapshot_size(pool, id),
            Source::Volume { id, pool } => enforced_size(pool, id).unwrap_or(0),
        }
    }
}

/// The pool that holds volume `id`, preferring `first`.
fn locate_volume(state: &DriverState, id: &str, first: Option<&Pool>) -> Result<Option<Pool>> {
    let ordered = first.into_iter().chain(
        state
            .pools
            .iter()
            .filter(|p| Some(p.name.as_str()) != first.map(|f| f.name.as_str())),
    );
    for pool in ordered {
        if pool.is_reserved(id) {
            continue;
        }
        match volumes::exists(pool, id) {
            Ok(true) => return Ok(Some(pool.clone())),
            Ok(false) | Err(Error::Unavailable(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// The name of a pool other than `chosen` that already holds a volume called `id`. Pools that
/// cannot be read are passed over: a broken pool must not stop creates in the others.
fn held_elsewhere(state: &DriverState, id: &str, chosen: &Pool) -> Option<String> {
    state
        .pools
        .iter()
        .filter(|p| p.name != chosen.name && !p.is_reserved(id))
        .find(|p| volumes::exists(p, id).unwrap_or(false))
        .map(|p| p.name.clone())
}

/// Answers a lane or blocking job's caller with what the job made once its journal record is
/// durable (at once when it has none); a failed flush comes after the change was visible.
fn answer_when_durable<T: Send + 'static>(outcome: Result<(T, Option<Deferred>)>, reply: Reply<T>) {
    match outcome {
        Ok((made, Some(durable))) => {
            durable.then(move |flushed| reply.send(flushed.map_err(Error::after_visible).map(|()| made)))
        }
        Ok((made, None)) => reply.send(Ok(made)),
        Err(e) => reply.send(Err(e)),
    }
}

/// The snapshot called `id` in any pool, preferring `first`.
fn locate_snapshot(state: &DriverState, id: &str, first: Option<&Pool>) -> Result<Option<(Pool, SnapshotInfo)>> {
    let ordered = first.into_iter().chain(
        state
            .pools
            .iter()
            .filter(|p| Some(p.name.as_str()) != first.map(|f| f.name.as_str())),
    );
    for pool in ordered {
        if let Some(info) = snapshots::get(pool, id)? {
            return Ok(Some((pool.clone(), info)));
        }
    }
    Ok(None)
}

/// The size volume `id` records, where `pool` enforces sizes (elsewhere the pool's size is
/// reported, as KubeVirt does).
fn enforced_size(pool: &Pool, id: &str) -> Option<u64> {
    if !pool.quota.enforces() {
        return None;
    }
    let dir = pool.open_unguarded().ok()?;
    volumes::recorded_capacity(dir.as_fd(), id).ok().flatten()
}

/// Size of snapshot `id` of `pool` as a restore needs it: the capacity its source volume had
/// (its record travels with the data). Known only where the pool enforces sizes; 0 (unknown)
/// elsewhere, as KubeVirt answers, so restores into smaller PVCs keep working there.
fn snapshot_size(pool: &Pool, id: &str) -> u64 {
    if !pool.quota.enforces() {
        return 0;
    }
    let Ok(data) = snapshots::open_data(pool, id) else {
        return 0;
    };
    let mut buf = [0u8; 32];
    match rustix::fs::fgetxattr(&data, volumes::CAPACITY_XATTR, &mut buf[..]) {
        Ok(n) => std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        Err(_) => 0,
    }
}

fn snapshot_message(info: &SnapshotInfo, size_bytes: u64) -> csi::Snapshot {
    let since = info.created.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    csi::Snapshot {
        size_bytes: i64::try_from(size_bytes).unwrap_or(i64::MAX),
        snapshot_id: info.id.clone(),
        source_volume_id: info.source_volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(since.subsec_nanos()).unwrap_or(0),
        }),
        ready_to_use: true,
        group_snapshot_id: String::new(),
    }
}

/// Whether this node may serve a volume of `pool` under the requested topology.
fn topology_allows(state: &DriverState, pool: &Pool, req: Option<&csi::TopologyRequirement>) -> bool {
    let Some(req) = req else { return true };
    if pool.shared || (req.requisite.is_empty() && req.preferred.is_empty()) {
        return true;
    }
    req.requisite
        .iter()
        .chain(&req.preferred)
        .any(|t| t.segments.get(&state.topology_key) == Some(&state.node_id))
}

fn capability(t: Cap) -> csi::ControllerServiceCapability {
    csi::ControllerServiceCapability {
        r#type: Some(csi::controller_service_capability::Type::Rpc(
            csi::controller_service_capability::Rpc { r#type: t as i32 },
        )),
    }
}

/// A content source as the request names it: its id checked, not yet looked up (that is file
/// system work, done on a blocking thread).
enum SourceRef {
    Snapshot(String),
    Volume(String),
}

impl SourceRef {
    fn parse(src: &csi::VolumeContentSource) -> Result<SourceRef> {
        match &src.r#type {
            Some(volume_content_source::Type::Snapshot(s)) => {
                Ok(SourceRef::Snapshot(check_id("snapshot id", &s.snapshot_id)?.to_owned()))
            }
            Some(volume_content_source::Type::Volume(v)) => Ok(SourceRef::Volume(
                check_id("source volume id", &v.volume_id)?.to_owned(),
            )),
            None => Err(Error::InvalidArgument("volume_content_source has no type".into())),
        }
    }

    /// The in-flight key the source is shared under while a volume is made from it.
    fn shared_key(&self) -> String {
        match self {
            SourceRef::Snapshot(id) => snapshot_key(id),
            SourceRef::Volume(id) => volume_key(id),
        }
    }

    /// Finds the source on this node, in `pool` first. Blocking: call it off the async workers.
    fn locate(self, state: &DriverState, pool: &Pool) -> Result<Source> {
        match self {
            SourceRef::Snapshot(id) => {
                let (pool, _) = locate_snapshot(state, &id, Some(pool))?.ok_or_else(|| {
                    Error::NotFound(format!("snapshot {id} does not exist on node {}", state.node_id))
                })?;
                Ok(Source::Snapshot { id, pool })
            }
            SourceRef::Volume(id) => {
                let pool = locate_volume(state, &id, Some(pool))?.ok_or_else(|| {
                    Error::NotFound(format!("source volume {id} does not exist on node {}", state.node_id))
                })?;
                Ok(Source::Volume { id, pool })
            }
        }
    }
}

impl ControllerService {
    async fn create_volume_inner(&self, req: csi::CreateVolumeRequest) -> Result<csi::CreateVolumeResponse> {
        let name = check_id("name", &req.name)?.to_owned();
        record("volume_id", &name);
        caps::check_all(&req.volume_capabilities)?;
        let pool = self.state.pool_for(&req.parameters)?.clone();
        pool.check_volume_name(&name)?;
        if !topology_allows(&self.state, &pool, req.accessibility_requirements.as_ref()) {
            return Err(Error::ResourceExhausted(format!(
                "the requested topology does not include node {} ({}); pool {} is node-local",
                self.state.node_id, self.state.topology_key, pool.name
            )));
        }
        let range = Range::parse(req.capacity_range.as_ref())?;
        let (required, limit) = (range.required, range.limit);
        // Enforcing pools give the volume a real, rounded size; the others answer as before.
        let enforced = match pool.quota.enforces() {
            true => Some(sizing::create_size(range, pool.quota.granularity())?),
            false => None,
        };
        let tuning = modify::parse(&pool, &req.mutable_parameters)?;
        // Whose volume this is, for the trash listing (only pools with a trash record it).
        let claim = pool.trash.and_then(|_| crate::ops::trash::claim_of(&req.parameters));
        let source = req.volume_content_source.as_ref().map(SourceRef::parse).transpose()?;
        if matches!(&source, Some(SourceRef::Volume(src)) if *src == name) {
            return Err(Error::InvalidArgument(format!(
                "volume {name} cannot be cloned from itself (volume_content_source names the volume being created)"
            )));
        }
        let shared_key: Vec<String> = source.iter().map(SourceRef::shared_key).collect();
        let guard = self.state.inflight.acquire(&[volume_key(&name)], &shared_key)?;
        // An empty, plain volume in a node-local pool whose journal is open is a few quick system
        // calls and no sync: the pool's lane runs it without a thread wake-up per request. The
        // rest stays on the blocking pool, where requests wait side by side: a copy can take
        // long, a shared pool's filesystem can wait on the network, a quota backend may commit
        // its filesystem, and a pool without its journal syncs its directory (concurrent
        // callers share that sync; one after another they would each pay for it).
        let on_lane = source.is_none() && volumes::makes_volumes_in_place(&pool) && pool.journal_in_use();
        let (p, n, state) = (pool.clone(), name.clone(), self.state.clone());
        let work = move || {
            let guard = guard;
            // Looked up here, not on the async worker: a pool on a hung filesystem must stall
            // only this request.
            let source = source.map(|s| s.locate(&state, &p)).transpose()?;
            // A copy is never smaller than its source where sizes are enforced, and takes the
            // source's size when none is asked (elsewhere KubeVirt's answers stand).
            let enforced = match (enforced, &source) {
                (Some(_), Some(src)) => Some(sizing::copy_size(range, src.capacity(), p.quota.granularity())?),
                (enforced, _) => enforced,
            };
            let (health, dir) = open_usable(&p)?;
            let size = enforced.unwrap_or(required);
            // Checks only a new volume must pass: a retry of an existing one is judged by its
            // record (AlreadyExists when it does not satisfy the request), not by another pool,
            // the pool's size or the budget. The pool is looked into only when that matters.
            let refused = match held_elsewhere(&state, &n, &p) {
                Some(other) => Some(Error::AlreadyExists(format!(
                    "volume {n} already exists in storage pool {other}, not in the requested pool {}",
                    p.name
                ))),
                None if size > health.total_bytes => Some(Error::OutOfRange(format!(
                    "requested {size} bytes but storage pool {} is only {} bytes",
                    p.name, health.total_bytes
                ))),
                None => None,
            };
            let is_new = match (refused.is_some(), enforced) {
                (false, None) => None,
                _ => Some(!volumes::exists_in(dir.as_fd(), &n)?),
            };
            if let (Some(refused), Some(true)) = (refused, is_new) {
                return Err(refused);
            }
            let promised = match enforced {
                Some(bytes) if is_new == Some(true) => Some(state.ledger.reserve(&p, &health, &n, bytes, 0)?),
                _ => None,
            };
            let src_fd = match &source {
                Some(Source::Snapshot { id, pool }) => Some(snapshots::open_data(pool, id)?),
                Some(Source::Volume { id, pool }) => Some(volumes::open(pool, id)?),
                None => None,
            };
            let requested = volumes::Requested { required: size, limit };
            let (created, durable) =
                volumes::create_in(&p, dir.as_fd(), &n, src_fd.as_ref(), requested, &tuning, true)?;
            // From here on the volume exists: a failure is for a retry to finish.
            let recorded = (|| {
                // The class's settings, applied again on a retry (tuning is idempotent).
                modify::apply(&p, &n, &tuning)?;
                if let Some(claim) = &claim {
                    crate::ops::trash::remember_claim(&p, dir.as_fd(), &n, claim);
                }
                match enforced {
                    Some(_) => volumes::recorded_capacity(dir.as_fd(), &n),
                    None => Ok(None),
                }
            })()
            .map_err(Error::after_visible)?;
            if let Some(promised) = promised {
                promised.settle(&p, Some(recorded.unwrap_or(0)));
            }
            Ok(((health, created, recorded, guard), durable))
        };
        // The volume stays locked (`guard`) until it is durable, so a concurrent request for it
        // waits for the same outcome, also when this caller stops waiting. The flush is not
        // waited for on a thread: the job answers from the flush's callback (one wake-up of this
        // task per request), which also releases the lock.
        let (health, created, recorded, guard) = match on_lane {
            true => {
                pool.lane()
                    .run_replying(move |reply| answer_when_durable(work(), reply))
                    .await?
            }
            false => blocking_replying(move |reply| answer_when_durable(work(), reply)).await?,
        };
        drop(guard);
        match created {
            Created::New(stats) => {
                tracing::info!(volume_id = %name, pool = %pool.name, files = stats.files, reflinked = stats.reflinked, "volume created")
            }
            Created::Existing => tracing::info!(volume_id = %name, pool = %pool.name, "volume already exists"),
        }
        let capacity = match (enforced, recorded) {
            (Some(_), Some(have)) => have,
            (Some(size), None) => size,
            (None, _) if required > 0 => required,
            // The pool's size stands for "any size", but never above what the caller allows.
            (None, _) if limit > 0 => caps::listed_capacity(&health).min(limit),
            (None, _) => caps::listed_capacity(&health),
        };
        Ok(csi::CreateVolumeResponse {
            volume: Some(caps::volume(
                &name,
                &pool,
                capacity,
                req.parameters,
                req.volume_content_source,
                &self.state.topology(),
            )),
        })
    }

    async fn delete_volume_inner(&self, req: csi::DeleteVolumeRequest) -> Result<()> {
        let id = check_id("volume_id", &req.volume_id)?.to_owned();
        record("volume_id", &id);
        let guard = self.state.inflight.acquire(&[volume_key(&id)], &[])?;
        let state = self.state.clone();
        blocking_locked(guard, move || {
            let mut unavailable = Vec::new();
            let mut deleted = false;
            for pool in &state.pools {
                if pool.is_reserved(&id) {
                    continue;
                }
                let health = pool.measure();
                if !health.usable {
                    unavailable.push(health.reason.unwrap_or_default());
                    continue;
                }
                state.ledger.check(pool);
                if volumes::delete(pool, &id, &state.mounts)? {
                    state.ledger.forget(pool, &id);
                    // A pool with a trash logs the move itself.
                    if pool.trash.is_none() {
                        tracing::info!(volume_id = %id, pool = %pool.name, "volume deleted");
                    }
                    deleted = true;
                }
            }
            if !deleted && !unavailable.is_empty() {
                return Err(Error::Unavailable(format!(
                    "cannot confirm volume {id} is gone while a pool is unusable: {}",
                    unavailable.join("; ")
                )));
            }
            Ok(())
        })
        .await
    }

    async fn list_volumes_inner(&self, req: csi::ListVolumesRequest) -> Result<csi::ListVolumesResponse> {
        let state = self.state.clone();
        // The sorted view of every pool, reused by the next pages while no pool changed
        // (`listing`); entries are built for the requested page alone.
        let (all, built, health) = blocking(move || {
            let mounts = state.mount_table().unwrap_or_default();
            let health: Vec<PoolHealth> = state.pools.iter().map(|p| p.health(&mounts)).collect();
            let (view, built) = state.listings.current(&state.pools);
            Ok((view, built, health))
        })
        .await?;
        if built {
            // A walk that stops before its last page leaves the view to this timer (which
            // does not keep a stopped driver's state alive).
            let state = Arc::downgrade(&self.state);
            tokio::spawn(async move {
                tokio::time::sleep(listing::MAX_AGE).await;
                if let Some(state) = state.upgrade() {
                    Listings::release_after(state.listings.expire());
                }
            });
        }
        let pools = &self.state.pools;
        let topology = self.state.topology();
        let page = pagination::page_of(
            all.slots(),
            |e| pool_key(all.id(e), &pools[e.pool()].name),
            req.max_entries,
            &req.starting_token,
            pagination::MAX_PAGE_BYTES,
            |e| csi::list_volumes_response::Entry {
                volume: Some(caps::volume(
                    all.id(e),
                    &pools[e.pool()],
                    e.size().unwrap_or_else(|| caps::listed_capacity(&health[e.pool()])),
                    Default::default(),
                    None,
                    &topology,
                )),
                status: Some(csi::list_volumes_response::VolumeStatus {
                    published_node_ids: vec![self.state.node_id.clone()],
                    volume_condition: Some(caps::condition(&health[e.pool()], true)),
                }),
            },
        )?;
        // The walk is over: the view goes now, not at the next walk (at 100,000 volumes it
        // is a few MiB, and glibc keeps freed pages until asked). The pages go back to the
        // kernel once this last page's messages, freed after they are sent, went too: a page
        // asked with `max_entries` 0 holds a few MiB of messages.
        if page.next_token.is_empty() {
            Listings::release_soon(self.state.listings.finished(all));
        }
        Ok(csi::ListVolumesResponse {
            entries: page.items,
            next_token: page.next_token,
        })
    }

    async fn get_volume_inner(&self, req: csi::ControllerGetVolumeRequest) -> Result<csi::ControllerGetVolumeResponse> {
        let id = check_id("volume_id", &req.volume_id)?.to_owned();
        record("volume_id", &id);
        let state = self.state.clone();
        let (pool, health, size) = blocking(move || {
            let pool = locate_volume(&state, &id, None)?
                .ok_or_else(|| Error::NotFound(format!("volume {id} does not exist on node {}", state.node_id)))?;
            let health = pool.measure();
            let size = enforced_size(&pool, &id);
            Ok((pool, health, size))
        })
        .await?;
        Ok(csi::ControllerGetVolumeResponse {
            volume: Some(caps::volume(
                &req.volume_id,
                &pool,
                size.unwrap_or_else(|| caps::listed_capacity(&health)),
                Default::default(),
                None,
                &self.state.topology(),
            )),
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids: vec![self.state.node_id.clone()],
                volume_condition: Some(caps::condition(&health, true)),
            }),
        })
    }

    async fn create_snapshot_inner(&self, req: csi::CreateSnapshotRequest) -> Result<csi::CreateSnapshotResponse> {
        let source = check_id("source_volume_id", &req.source_volume_id)?.to_owned();
        let name = check_id("name", &req.name)?.to_owned();
        record("volume_id", &source);
        record("snapshot_id", &name);
        // The pool a VolumeSnapshotClass names (or the default one) is only where the source
        // is looked for first: a snapshot lives in its source's pool, wherever that is.
        let hint = self.state.pool_for(&req.parameters)?.clone();
        let guard = self
            .state
            .inflight
            .acquire(&[snapshot_key(&name)], &[volume_key(&source)])?;
        let state = self.state.clone();
        let (info, size) = blocking_locked(guard, move || {
            if let Some((spool, info)) = locate_snapshot(&state, &name, Some(&hint))? {
                if info.source_volume_id == source {
                    // Found, perhaps renamed into place just before a crash: durable first.
                    snapshots::sync_entries(&spool)?;
                    return Ok((info, snapshot_size(&spool, &name)));
                }
                return Err(Error::AlreadyExists(format!(
                    "snapshot {name} already exists for volume {} in pool {}",
                    info.source_volume_id, spool.name
                )));
            }
            let Some(pool) = locate_volume(&state, &source, Some(&hint))? else {
                // Opened in the first pool for its precise error (a symlink planted there is
                // InvalidArgument), else NotFound.
                return Err(volumes::open(&hint, &source).err().unwrap_or_else(|| {
                    Error::NotFound(format!(
                        "source volume {source} does not exist on node {}",
                        state.node_id
                    ))
                }));
            };
            if pool.snapshot_path.is_none() {
                return Err(Error::InvalidArgument(format!(
                    "storage pool {} (of volume {source}) has no snapshotPath/snapshotProvider configured",
                    pool.name
                )));
            }
            require_usable(&pool)?;
            let src = volumes::open(&pool, &source)?;
            let info = snapshots::create(&pool, &name, &source, &src)?;
            Ok((info, snapshot_size(&pool, &name)))
        })
        .await?;
        Ok(csi::CreateSnapshotResponse {
            snapshot: Some(snapshot_message(&info, size)),
        })
    }

    async fn delete_snapshot_inner(&self, req: csi::DeleteSnapshotRequest) -> Result<()> {
        let id = check_id("snapshot_id", &req.snapshot_id)?.to_owned();
        record("snapshot_id", &id);
        let guard = self.state.inflight.acquire(&[snapshot_key(&id)], &[])?;
        let state = self.state.clone();
        blocking_locked(guard, move || {
            for pool in &state.pools {
                if snapshots::delete(pool, &id)? {
                    tracing::info!(snapshot_id = %id, pool = %pool.name, "snapshot deleted");
                }
            }
            Ok(())
        })
        .await
    }

    async fn list_snapshots_inner(&self, req: csi::ListSnapshotsRequest) -> Result<csi::ListSnapshotsResponse> {
        let state = self.state.clone();
        let (by_id, by_source) = (req.snapshot_id.clone(), req.source_volume_id.clone());
        let (max_entries, starting_token) = (req.max_entries, req.starting_token.clone());
        let page = blocking(move || {
            let mut all: Vec<(Cow<'_, Pool>, SnapshotInfo)> = Vec::new();
            if !by_id.is_empty() {
                // An id this driver could never have issued simply matches nothing.
                if check_id("snapshot_id", &by_id).is_ok()
                    && let Some((pool, info)) = locate_snapshot(&state, &by_id, None)?
                {
                    all.push((Cow::Owned(pool), info));
                }
            } else {
                for pool in &state.pools {
                    all.extend(snapshots::list(pool)?.into_iter().map(|s| (Cow::Borrowed(pool), s)));
                }
            }
            if !by_source.is_empty() {
                all.retain(|(_, s)| s.source_volume_id == by_source);
            }
            // Sized for the page's entries alone: a size is an open and an xattr read.
            pagination::paginate(
                all,
                |(_, s)| pool_key(&s.id, &s.pool),
                max_entries,
                &starting_token,
                pagination::MAX_PAGE_BYTES,
                |(pool, s)| csi::list_snapshots_response::Entry {
                    snapshot: Some(snapshot_message(s, snapshot_size(pool, &s.id))),
                },
            )
        })
        .await?;
        Ok(csi::ListSnapshotsResponse {
            entries: page.items,
            next_token: page.next_token,
        })
    }

    async fn get_snapshot_inner(&self, req: csi::GetSnapshotRequest) -> Result<csi::GetSnapshotResponse> {
        let id = check_id("snapshot_id", &req.snapshot_id)?.to_owned();
        record("snapshot_id", &id);
        let state = self.state.clone();
        let (info, size) = blocking(move || {
            let (pool, info) = locate_snapshot(&state, &id, None)?
                .ok_or_else(|| Error::NotFound(format!("snapshot {id} does not exist on node {}", state.node_id)))?;
            let size = snapshot_size(&pool, &id);
            Ok((info, size))
        })
        .await?;
        Ok(csi::GetSnapshotResponse {
            snapshot: Some(snapshot_message(&info, size)),
        })
    }

    async fn validate_inner(
        &self,
        req: csi::ValidateVolumeCapabilitiesRequest,
    ) -> Result<csi::ValidateVolumeCapabilitiesResponse> {
        let id = check_id("volume_id", &req.volume_id)?.to_owned();
        record("volume_id", &id);
        if req.volume_capabilities.is_empty() {
            return Err(Error::InvalidArgument("volume_capabilities are required".into()));
        }
        let hint = if req.parameters.contains_key(hpp_api::constants::PARAM_STORAGE_POOL) {
            Some(self.state.pool_for(&req.parameters)?.clone())
        } else if req.volume_context.contains_key(hpp_api::constants::PARAM_STORAGE_POOL) {
            Some(self.state.pool_for(&req.volume_context)?.clone())
        } else {
            None
        };
        let state = self.state.clone();
        let found = blocking(move || match hint {
            Some(pool) => Ok(volumes::exists(&pool, &id)?),
            None => Ok(locate_volume(&state, &id, None)?.is_some()),
        })
        .await?;
        if !found {
            return Err(Error::NotFound(format!("volume {} does not exist", req.volume_id)));
        }
        if let Some(why) = req.volume_capabilities.iter().find_map(caps::unsupported) {
            return Ok(csi::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: why,
            });
        }
        Ok(csi::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: req.volume_capabilities,
                parameters: req.parameters,
                mutable_parameters: req.mutable_parameters,
            }),
            message: String::new(),
        })
    }

    async fn expand_volume_inner(
        &self,
        req: csi::ControllerExpandVolumeRequest,
    ) -> Result<csi::ControllerExpandVolumeResponse> {
        let id = check_id("volume_id", &req.volume_id)?.to_owned();
        record("volume_id", &id);
        if req.capacity_range.is_none() {
            return Err(Error::InvalidArgument("capacity_range is required".into()));
        }
        let range = Range::parse(req.capacity_range.as_ref())?;
        if let Some(why) = req.volume_capability.as_ref().and_then(caps::unsupported) {
            return Err(Error::InvalidArgument(why));
        }
        let guard = self.state.inflight.acquire(&[volume_key(&id)], &[])?;
        let state = self.state.clone();
        let expanded = blocking_locked(guard, move || {
            let pool = locate_volume(&state, &id, None)?
                .ok_or_else(|| Error::NotFound(format!("volume {id} does not exist on node {}", state.node_id)))?;
            let health = require_usable(&pool)?;
            expand::controller_expand(&state.ledger, &pool, &health, &id, range)
        })
        .await?;
        Ok(csi::ControllerExpandVolumeResponse {
            capacity_bytes: i64::try_from(expanded.capacity).unwrap_or(i64::MAX),
            node_expansion_required: expanded.node_expansion_required,
        })
    }

    async fn modify_volume_inner(&self, req: csi::ControllerModifyVolumeRequest) -> Result<()> {
        let id = check_id("volume_id", &req.volume_id)?.to_owned();
        record("volume_id", &id);
        let guard = self.state.inflight.acquire(&[volume_key(&id)], &[])?;
        let state = self.state.clone();
        blocking_locked(guard, move || {
            let pool = locate_volume(&state, &id, None)?
                .ok_or_else(|| Error::NotFound(format!("volume {id} does not exist on node {}", state.node_id)))?;
            let tuning = modify::parse(&pool, &req.mutable_parameters)?;
            if !tuning.is_empty() {
                require_usable(&pool)?;
            }
            modify::apply(&pool, &id, &tuning)
        })
        .await
    }

    async fn get_capacity_inner(&self, req: csi::GetCapacityRequest) -> Result<csi::GetCapacityResponse> {
        let pool = self.state.pool_for(&req.parameters)?.clone();
        record("pool", &pool.name);
        for cap in &req.volume_capabilities {
            if caps::unsupported(cap).is_some() {
                return Ok(zero_capacity());
            }
        }
        if let Some(t) = &req.accessible_topology
            && !pool.shared
            && t.segments
                .get(&self.state.topology_key)
                .is_some_and(|n| *n != self.state.node_id)
        {
            return Ok(zero_capacity());
        }
        // A pool without enforced sizes answers from a measurement at most a second old, made
        // by a recent request or the background watch (which also runs after every mount-table
        // change): capacity is polled once a minute by the csi-provisioner, and a statvfs per
        // call would cost a blocking-thread hop, several times the call itself.
        if !pool.quota.enforces()
            && let Some(health) = pool.recent_health(RECENT_CAPACITY)
        {
            return Ok(capacity_of(&health));
        }
        let state = self.state.clone();
        let (health, budget) = blocking(move || {
            let health = pool.measure();
            let budget = match pool.quota.enforces() && health.usable {
                true => Some((state.ledger.budget(&pool, &health)?, pool.quota.granularity())),
                false => None,
            };
            Ok((health, budget))
        })
        .await?;
        if !health.usable {
            return Ok(zero_capacity());
        }
        if let Some((budget, granularity)) = budget {
            // What can still be promised; the largest volume is that, in whole granules.
            let available = budget.available();
            return Ok(csi::GetCapacityResponse {
                available_capacity: i64::try_from(available).unwrap_or(i64::MAX),
                maximum_volume_size: Some(
                    i64::try_from(sizing::round_down(available, granularity)).unwrap_or(i64::MAX),
                ),
                minimum_volume_size: Some(0),
            });
        }
        Ok(capacity_of(&health))
    }
}

/// How old a measurement GetCapacity may answer from (pools without enforced sizes).
const RECENT_CAPACITY: std::time::Duration = std::time::Duration::from_secs(1);

/// Capacity of a pool without enforced sizes: its free space, any volume up to the
/// filesystem's size; zero while it is unusable.
fn capacity_of(health: &PoolHealth) -> csi::GetCapacityResponse {
    if !health.usable {
        return zero_capacity();
    }
    csi::GetCapacityResponse {
        available_capacity: i64::try_from(health.available_bytes).unwrap_or(i64::MAX),
        maximum_volume_size: Some(i64::try_from(health.total_bytes).unwrap_or(i64::MAX)),
        minimum_volume_size: Some(0),
    }
}

fn zero_capacity() -> csi::GetCapacityResponse {
    csi::GetCapacityResponse {
        available_capacity: 0,
        maximum_volume_size: Some(0),
        minimum_volume_size: Some(0),
    }
}

#[tonic::async_trait]
impl csi::controller_server::Controller for ControllerService {
    async fn create_volume(
        &self,
        req: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        Ok(Response::new(self.create_volume_inner(req.into_inner()).await?))
    }

    async fn delete_volume(
        &self,
        req: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        self.delete_volume_inner(req.into_inner()).await?;
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        Ok(Response::new(self.validate_inner(req.into_inner()).await?))
    }

    async fn list_volumes(
        &self,
        req: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        Ok(Response::new(self.list_volumes_inner(req.into_inner()).await?))
    }

    async fn get_capacity(
        &self,
        req: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        Ok(Response::new(self.get_capacity_inner(req.into_inner()).await?))
    }

    async fn controller_get_capabilities(
        &self,
        _req: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        let mut caps = vec![
            Cap::CreateDeleteVolume,
            Cap::GetVolume,
            Cap::GetCapacity,
            Cap::ListVolumes,
            Cap::VolumeCondition,
            Cap::CloneVolume,
        ];
        // In node mode the resizer must not route these to a node without the volume.
        if self.state.expansion == ExpansionMode::Controller {
            caps.extend([Cap::ExpandVolume, Cap::ModifyVolume]);
        }
        // GetSnapshot is served but not advertised: csi-sanity fails a driver on any capability
        // outside its list, which GET_SNAPSHOT (CSI 1.10, alpha) is not on, and no sidecar
        // calls it yet.
        if self.state.pools.iter().any(|p| p.snapshot_path.is_some()) {
            caps.extend([Cap::CreateDeleteSnapshot, Cap::ListSnapshots]);
        }
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: caps.into_iter().map(capability).collect(),
        }))
    }

    async fn create_snapshot(
        &self,
        req: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        Ok(Response::new(self.create_snapshot_inner(req.into_inner()).await?))
    }

    async fn delete_snapshot(
        &self,
        req: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        self.delete_snapshot_inner(req.into_inner()).await?;
        Ok(Response::new(csi::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        req: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        Ok(Response::new(self.list_snapshots_inner(req.into_inner()).await?))
    }

    async fn controller_expand_volume(
        &self,
        req: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        Ok(Response::new(self.expand_volume_inner(req.into_inner()).await?))
    }

    async fn controller_modify_volume(
        &self,
        req: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        self.modify_volume_inner(req.into_inner()).await?;
        Ok(Response::new(csi::ControllerModifyVolumeResponse {}))
    }

    async fn get_snapshot(
        &self,
        req: Request<csi::GetSnapshotRequest>,
    ) -> Result<Response<csi::GetSnapshotResponse>, Status> {
        Ok(Response::new(self.get_snapshot_inner(req.into_inner()).await?))
    }

    async fn controller_get_volume(
        &self,
        req: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        Ok(Response::new(self.get_volume_inner(req.into_inner()).await?))
    }
}
