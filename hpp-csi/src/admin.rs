//! hpp's own admin service (`hpp.admin.v1.Trash`), served on the CSI socket beside the CSI
//! services: list, restore and purge the trash of deleted volumes, and move a volume (an
//! orphan) into it. `hpp-csi-driver call trash …` is its client; kubelet and the CSI sidecars
//! never call it.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tonic::{Request, Response, Status};

use crate::error::{Error, Result};
use crate::ops::trash::{self, Purge, TrashEntry};
use crate::pool::Pool;
use crate::pool::inflight::volume_key;
use crate::pool::lane::{blocking, blocking_locked};
use crate::pool::validate::check_id;
use crate::service::state::DriverState;

/// The generated types and service of `proto/hpp/admin/v1/trash.proto`.
#[allow(missing_docs, clippy::all, clippy::unwrap_used, clippy::expect_used, clippy::panic)]
pub mod proto {
    tonic::include_proto!("hpp.admin.v1");
}

pub use proto::trash_client::TrashClient;
pub use proto::trash_server::TrashServer;

/// The Trash service.
#[derive(Debug, Clone)]
pub struct TrashService {
    state: Arc<DriverState>,
}

impl TrashService {
    /// A service over the driver's pools.
    pub fn new(state: Arc<DriverState>) -> Self {
        TrashService { state }
    }

    /// The named pool, or (empty name) every pool.
    fn pools(&self, name: &str) -> Result<Vec<Pool>> {
        match name {
            "" => Ok(self.state.pools.clone()),
            name => Ok(vec![self.state.pool(name)?.clone()]),
        }
    }

    async fn list_inner(&self, req: proto::ListTrashRequest) -> Result<proto::ListTrashResponse> {
        let pools = self.pools(&req.pool)?;
        let entries = blocking(move || {
            let mut all = Vec::new();
            for pool in &pools {
                // Entries the background has not measured yet (a few walks at most), so a
                // listing right after a deletion shows its size.
                let _ = trash::refresh_sizes(pool);
                match trash::list(pool) {
                    Ok(entries) => all.extend(entries.iter().map(entry_message)),
                    // One unusable pool (unmounted, say) must not hide the others' trash.
                    Err(e) if pools.len() > 1 => {
                        tracing::debug!(pool = %pool.name, error = %e, "trash not listed")
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(all)
        })
        .await?;
        Ok(proto::ListTrashResponse { entries })
    }

    async fn restore_inner(&self, req: proto::RestoreTrashRequest) -> Result<proto::RestoreTrashResponse> {
        let name = trash::EntryName::parse(&req.entry).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{:?} is not the name of a trash entry (<volume id>@<seconds>; `call trash list` shows them)",
                req.entry
            ))
        })?;
        let new_id = match req.volume_id.as_str() {
            "" => format!("{}-restored", name.volume_id),
            id => id.to_owned(),
        };
        check_id("volume_id", &new_id)?;
        let pool = self.pool_holding(&req.pool, &req.entry).await?;
        pool.check_volume_name(&new_id)?;
        let guard = self.state.inflight.acquire(&[volume_key(&new_id)], &[])?;
        let state = self.state.clone();
        let entry = req.entry.clone();
        let restored = blocking_locked(guard, move || {
            if let Some(other) = state
                .pools
                .iter()
                .find(|p| p.name != pool.name && crate::ops::volumes::exists(p, &new_id).unwrap_or(false))
            {
                return Err(Error::AlreadyExists(format!(
                    "volume {new_id} already exists in storage pool {}; restore under another id",
                    other.name
                )));
            }
            // An enforcing pool promises the restored volume its recorded size again.
            let promised = match (pool.quota.enforces(), trash::entry_capacity(&pool, &entry)?) {
                (true, Some(bytes)) => {
                    let health = pool.measure();
                    Some((state.ledger.reserve(&pool, &health, &new_id, bytes, 0)?, bytes))
                }
                _ => None,
            };
            state.ledger.check(&pool);
            let restored = trash::restore(&pool, &entry, &new_id)?;
            match promised {
                Some((reservation, bytes)) => reservation.settle(&pool, Some(bytes)),
                None => state.ledger.check(&pool),
            }
            Ok((pool.name.clone(), restored))
        })
        .await?;
        let (pool, restored) = restored;
        Ok(proto::RestoreTrashResponse {
            pool,
            volume_id: restored.volume_id,
            capacity_bytes: restored.capacity.map_or(0, |c| i64::try_from(c).unwrap_or(i64::MAX)),
        })
    }

    /// The pool named, or the one pool whose trash holds `entry`.
    async fn pool_holding(&self, pool: &str, entry: &str) -> Result<Pool> {
        if !pool.is_empty() {
            return Ok(self.state.pool(pool)?.clone());
        }
        let pools = self.state.pools.clone();
        let entry = entry.to_owned();
        blocking(move || {
            let holding: Vec<&Pool> = pools
                .iter()
                .filter(|p| trash::list(p).is_ok_and(|es| es.iter().any(|e| e.name.to_string() == entry)))
                .collect();
            match holding.as_slice() {
                [one] => Ok((*one).clone()),
                [] => Err(Error::NotFound(format!(
                    "no storage pool has a trash entry {entry:?} (it may have been purged or restored already)"
                ))),
                _ => Err(Error::InvalidArgument(format!(
                    "several storage pools have a trash entry {entry:?}; name the pool"
                ))),
            }
        })
        .await
    }

    async fn purge_inner(&self, req: proto::PurgeTrashRequest) -> Result<()> {
        let pool = self.pool_holding(&req.pool, &req.entry).await?;
        let metrics = self.state.metrics.clone();
        blocking(move || {
            let report = trash::purge(&pool, Purge::Entry(&req.entry))?;
            if let Some(m) = &metrics {
                for (_, reason) in &report.purged {
                    m.trash_purged(&pool.name, *reason);
                }
            }
            Ok(())
        })
        .await
    }

    async fn trash_volume_inner(&self, req: proto::TrashVolumeRequest) -> Result<proto::TrashVolumeResponse> {
        let id = check_id("volume_id", &req.volume_id)?.to_owned();
        let pools = self.pools(&req.pool)?;
        let guard = self.state.inflight.acquire(&[volume_key(&id)], &[])?;
        let state = self.state.clone();
        blocking_locked(guard, move || {
            for pool in &pools {
                if pool.is_reserved(&id) || !crate::ops::volumes::exists(pool, &id)? {
                    continue;
                }
                let dir = pool.open()?;
                state.ledger.check(pool);
                let moved = trash::delete_into(pool, std::os::fd::AsFd::as_fd(&dir), &id, &state.mounts)?;
                if let Some(entry) = moved {
                    state.ledger.forget(pool, &id);
                    return Ok(proto::TrashVolumeResponse {
                        pool: pool.name.clone(),
                        entry: entry.to_string(),
                    });
                }
            }
            Err(Error::NotFound(format!(
                "volume {id} does not exist in any storage pool of this node"
            )))
        })
        .await
    }
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn entry_message(e: &TrashEntry) -> proto::TrashEntry {
    let (claim_namespace, claim_name) = e.claim.clone().unwrap_or_default();
    proto::TrashEntry {
        pool: e.pool.clone(),
        entry: e.name.to_string(),
        volume_id: e.name.volume_id.clone(),
        claim_namespace,
        claim_name,
        deleted_at: unix(e.name.deleted_at()),
        purge_at: e.purge_at.map_or(0, unix),
        bytes: e.bytes.map_or(-1, |b| i64::try_from(b).unwrap_or(i64::MAX)),
    }
}

#[tonic::async_trait]
impl proto::trash_server::Trash for TrashService {
    async fn list_trash(
        &self,
        req: Request<proto::ListTrashRequest>,
    ) -> std::result::Result<Response<proto::ListTrashResponse>, Status> {
        Ok(Response::new(self.list_inner(req.into_inner()).await?))
    }

    async fn restore_trash(
        &self,
        req: Request<proto::RestoreTrashRequest>,
    ) -> std::result::Result<Response<proto::RestoreTrashResponse>, Status> {
        Ok(Response::new(self.restore_inner(req.into_inner()).await?))
    }

    async fn purge_trash(
        &self,
        req: Request<proto::PurgeTrashRequest>,
    ) -> std::result::Result<Response<proto::PurgeTrashResponse>, Status> {
        self.purge_inner(req.into_inner()).await?;
        Ok(Response::new(proto::PurgeTrashResponse {}))
    }

    async fn trash_volume(
        &self,
        req: Request<proto::TrashVolumeRequest>,
    ) -> std::result::Result<Response<proto::TrashVolumeResponse>, Status> {
        Ok(Response::new(self.trash_volume_inner(req.into_inner()).await?))
    }
}
