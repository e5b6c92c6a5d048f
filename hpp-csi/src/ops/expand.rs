//! Online expansion. The controller raises the backend's limit first and records the new size
//! on the volume second, so a crash between the two leaves the old record: the CO's retry sees
//! a volume still too small, raises the (already raised, idempotent) limit again and records
//! it. A volume never shrinks: asking for less than it has answers its current size.
//!
//! The node side has nothing to do for directory volumes (the new limit is in force the moment
//! the controller set it); backends that present a filesystem image grow it there.
//!
//! Node-local volumes exist on one node only, but the csi-resizer calls ControllerExpandVolume
//! on whichever driver it runs next to. In [`ExpansionMode::Node`] the driver therefore does
//! not offer controller expansion at all: the resizer only updates the PV's size, and kubelet
//! calls NodeExpandVolume on the node where the volume is published (or at its next publish),
//! which raises the limit itself with the same steps as the controller.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use hpp_fs::quota::{Layout, QuotaError};
use rustix::io::Errno;

use crate::error::{Error, Result};
use crate::mountinfo::MountTable;
use crate::ops::ledger::Ledger;
use crate::ops::sizing::{self, Range};
use crate::ops::volumes::{self, CAPACITY_XATTR};
use crate::pool::fsops;
use crate::pool::{Pool, PoolHealth};

/// Which CSI service raises a volume's limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ExpansionMode {
    /// ControllerExpandVolume and ControllerModifyVolume are offered: right for a single
    /// driver that sees every volume (one node, a test, a conformance suite).
    #[default]
    Controller,
    /// Only NodeExpandVolume is offered, and it raises the limit: right for a DaemonSet of
    /// node-local drivers, where a controller call may reach a node without the volume.
    /// ControllerModifyVolume is not offered either (it would be misrouted the same way).
    Node,
}

/// Outcome of a controller expansion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expanded {
    /// The volume's size now.
    pub capacity: u64,
    /// Whether NodeExpandVolume has work to do.
    pub node_expansion_required: bool,
}

/// The driver error for a backend failure.
pub fn quota_error(e: QuotaError) -> Error {
    match e {
        QuotaError::Io { op, source } => Error::io(op, source),
        QuotaError::Unsupported(m) => Error::FailedPrecondition(m),
        QuotaError::OutOfRange(m) => Error::OutOfRange(m),
        other => Error::Internal(other.to_string()),
    }
}

/// Grows volume `id` of `pool` to satisfy `range` (the caller holds the volume's lock).
pub fn controller_expand(
    ledger: &Ledger,
    pool: &Pool,
    health: &PoolHealth,
    id: &str,
    range: Range,
) -> Result<Expanded> {
    expand_with(ledger, pool, health, id, range, None).map(|(expanded, _)| expanded)
}

/// [`controller_expand`], running `grow` (the node growing the filesystem it presents) after
/// the limit is raised and before the new size is recorded, so the record never runs ahead of
/// what the volume holds: a failed `grow` leaves the old size recorded and charged, and the
/// retry raises the (already raised) limit again and grows. Returns whether `grow` ran.
fn expand_with(
    ledger: &Ledger,
    pool: &Pool,
    health: &PoolHealth,
    id: &str,
    range: Range,
    grow: Option<&dyn Fn() -> Result<()>>,
) -> Result<(Expanded, bool)> {
    let backend = &pool.quota;
    let target = sizing::expand_size(range, backend.granularity())?;
    let dir = pool.open()?;
    let current = volumes::recorded_capacity(dir.as_fd(), id)?;
    let node_expansion_required = backend.needs_node_expansion();
    if let Some(have) = current
        && have >= range.required.max(1)
    {
        // Volumes never shrink: a limit below the size it has cannot be met.
        if range.limit > 0 && have > range.limit {
            return Err(Error::OutOfRange(format!(
                "volume {id} already has {have} bytes, more than the limit of {} bytes; volumes cannot shrink",
                range.limit
            )));
        }
        // Already big enough (a retry, or a request to shrink): the size it has.
        return Ok((
            Expanded {
                capacity: have,
                node_expansion_required,
            },
            false,
        ));
    }
    // An expansion killed after raising the limit and before recording it, retried with a
    // smaller request (Kubernetes lets a user lower a failed expansion): the volume already
    // holds more, which backends cannot shrink. It keeps that, within the request's limit.
    let target = match backend.usage(dir.as_fd(), id) {
        Ok(Some(usage)) if usage.limit_bytes > target && (range.limit == 0 || usage.limit_bytes <= range.limit) => {
            usage.limit_bytes
        }
        _ => target,
    };
    if target > health.total_bytes {
        return Err(Error::OutOfRange(format!(
            "requested {target} bytes but storage pool {} is only {} bytes",
            pool.name, health.total_bytes
        )));
    }
    let promised = match backend.enforces() {
        true => Some(ledger.reserve(pool, health, id, target, current.unwrap_or(0))?),
        false => None,
    };
    backend.set_limit(dir.as_fd(), id, target).map_err(quota_error)?;
    if let Some(grow) = grow {
        grow()?;
    }
    record(dir.as_fd(), id, target, backend.enforces())?;
    if let Some(promised) = promised {
        promised.settle(pool, Some(target));
    }
    tracing::info!(volume_id = %id, pool = %pool.name, from = current.unwrap_or(0), to = target, "volume expanded");
    Ok((
        Expanded {
            capacity: target,
            node_expansion_required,
        },
        grow.is_some(),
    ))
}

/// Records `bytes` as volume `id`'s capacity, durably. A filesystem without trusted xattrs
/// cannot keep it: fine for a pool that enforces nothing, an error for one that does (its
/// ledger would be wrong).
fn record(pool_dir: BorrowedFd<'_>, id: &str, bytes: u64, required: bool) -> Result<()> {
    let vol = fsops::open_child_dir(pool_dir, id).map_err(|e| Error::io(format!("opening volume {id}"), e))?;
    match rustix::fs::fsetxattr(
        &vol,
        CAPACITY_XATTR,
        bytes.to_string().as_bytes(),
        rustix::fs::XattrFlags::empty(),
    ) {
        Ok(()) => {}
        Err(Errno::OPNOTSUPP | Errno::PERM) if !required => return Ok(()),
        Err(e) => return Err(Error::io(format!("recording the capacity of volume {id}"), e)),
    }
    rustix::fs::fsync(&vol).map_err(|e| Error::io(format!("syncing volume {id}"), e))
}

/// Node side of an expansion of volume `id` published at `target`: checks that `target` is
/// where the volume is published, raises the limit first when `raise` holds `(ledger,
/// health)` (node expansion mode; the caller holds the volume's lock), lets the backend grow
/// what it presents, and answers the volume's size.
pub fn node_expand(
    pool: &Pool,
    id: &str,
    target: &Path,
    range: Range,
    raise: Option<(&Ledger, &PoolHealth)>,
) -> Result<u64> {
    let mounts = MountTable::read().map_err(|e| Error::io("reading mount table", e))?;
    let Some(mount) = mounts.mount_at(target) else {
        return Err(Error::NotFound(format!(
            "volume {id} is not published at {}",
            target.display()
        )));
    };
    if pool.quota.layout() == Layout::Directory {
        let ours = mounts
            .fs_location(&pool.volume_path(id))
            .is_some_and(|(dev, root)| mount.dev == dev && mount.root == root);
        if !ours {
            return Err(Error::NotFound(format!(
                "{} is a mount of {}, not of volume {id}",
                target.display(),
                mount.source
            )));
        }
    }
    let node_grows = pool.quota.needs_node_expansion();
    let grow = || pool.quota.expand_mounted(target).map_err(quota_error);
    let mut grown = false;
    if let Some((ledger, health)) = raise
        && (range.required > 0 || range.limit > 0)
    {
        let grow: &dyn Fn() -> Result<()> = &grow;
        (_, grown) = expand_with(ledger, pool, health, id, range, node_grows.then_some(grow))?;
    }
    let dir = pool.open()?;
    // Also when the size was recorded earlier (by ControllerExpandVolume, or before a growth
    // that failed): growing an already grown filesystem changes nothing.
    if node_grows && !grown {
        grow()?;
    }
    let recorded = volumes::recorded_capacity(dir.as_fd(), id)?;
    Ok(recorded.unwrap_or(range.required))
}
