//! Pool health kept current in the background, so Probe answers without touching the
//! filesystem: a report (statvfs per pool, the mount table) runs when the mount table changes
//! (`/proc/self/mountinfo` signals `POLLPRI`) and at a fixed interval otherwise.
//!
//! Probe itself only answers "ready": one unusable pool takes only itself out (see
//! `identity.rs`). What the background keeps current are the pool gauges and the
//! once-per-transition log lines an admin reads.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hpp_sys::mount_watch::MountTableWatch;

use crate::ops::trash;
use crate::service::state::DriverState;

/// Default time between reports when nothing changes.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(30);

/// Shortest time between two reports. Mount changes come in bursts (every NodePublish is one),
/// and one report after a burst says all there is to say.
const MIN_GAP: Duration = Duration::from_millis(500);

/// When the last report ran, and whether one is running now.
#[derive(Debug, Default)]
pub(crate) struct HealthClock {
    last: Mutex<Option<Instant>>,
    running: AtomicBool,
}

impl HealthClock {
    /// Notes that a report just finished.
    pub(crate) fn reported(&self) {
        *self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
    }

    /// Whether no report ran within `max_age`.
    fn stale(&self, max_age: Duration) -> bool {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_none_or(|t| t.elapsed() > max_age)
    }
}

/// Starts a report in a blocking thread unless one is running or the last one is younger than
/// `max_age`; never waits for it. Probe calls this so that a driver whose embedder composes
/// the services without [`watch`] still refreshes its gauges.
pub fn refresh_if_stale(state: &Arc<DriverState>, max_age: Duration) {
    if state.health.stale(max_age) {
        // Not waited for: the JoinHandle is dropped, the report runs on.
        drop(start_report(state));
    }
}

/// Runs one pool report in a blocking thread, unless one is running already (then `None`).
/// The running flag is cleared by the report itself, so a caller that stops waiting (a
/// cancelled [`watch`]) cannot leave it set.
fn start_report(state: &Arc<DriverState>) -> Option<tokio::task::JoinHandle<()>> {
    if state.health.running.swap(true, Ordering::AcqRel) {
        return None;
    }
    // Made before the spawn: a task dropped unrun (the runtime shutting down) clears it too.
    let running = Running(state.clone());
    Some(tokio::task::spawn_blocking(move || {
        let running = running;
        running.0.pools_report();
    }))
}

/// A report in progress: clears the running flag when dropped, after a panic too.
struct Running(Arc<DriverState>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.health.running.store(false, Ordering::Release);
    }
}

/// Keeps the pool report current until dropped: after each mount-table change (at most one
/// report per 500 ms) and every `interval`. Spawned by `BoundDriver::serve`; an embedder
/// composing its own server spawns it next to the services.
pub async fn watch(state: Arc<DriverState>, interval: Duration) {
    let mut changes = match MountTableWatch::open() {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the mount table; pool health is refreshed every {interval:?} only");
            None
        }
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = next_change(&mut changes) => {}
        }
        if let Some(report) = start_report(&state) {
            let _ = report.await;
        }
        tokio::time::sleep(MIN_GAP).await;
    }
}

/// Waits for the next mount-table change; forever when the table cannot be watched.
async fn next_change(changes: &mut Option<MountTableWatch>) {
    match changes {
        Some(c) => {
            if let Err(e) = c.changed().await {
                tracing::warn!(error = %e, "mount table watch failed; pool health is refreshed periodically only");
                *changes = None;
            }
        }
        None => std::future::pending().await,
    }
}

/// Purges due entries of every pool with a trash, measures new entries and updates the
/// gauges, every [`trash::purge_interval`] of the shortest retention, until the task is dropped.
pub async fn purge_trash(state: Arc<DriverState>) {
    let interval = state
        .pools
        .iter()
        .filter_map(|p| p.trash.map(|t| trash::purge_interval(t.retention)))
        .min();
    run_every(interval, state, purge_trash_once).await;
}

/// Runs `once` on the blocking pool every `interval` (first right away), until the task is
/// dropped; returns at once without an interval (no pool needs it).
async fn run_every(interval: Option<Duration>, state: Arc<DriverState>, once: fn(&DriverState)) {
    let Some(interval) = interval else { return };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let state = state.clone();
        let _ = tokio::task::spawn_blocking(move || once(&state)).await;
    }
}

/// One pass of [`purge_trash`] over every pool with a trash.
pub fn purge_trash_once(state: &DriverState) {
    for pool in state.pools.iter().filter(|p| p.trash.is_some()) {
        match trash::purge(
            pool,
            trash::Purge::Due {
                now: std::time::SystemTime::now(),
            },
        ) {
            Ok(report) => {
                if let Some(m) = &state.metrics {
                    for (_, reason) in &report.purged {
                        m.trash_purged(&pool.name, *reason);
                    }
                }
            }
            // An unmounted guarded pool, say: its health reports say why.
            Err(e) => tracing::debug!(pool = %pool.name, error = %e, "trash not purged this time"),
        }
        if let (Ok(totals), Some(m)) = (trash::refresh_sizes(pool), &state.metrics) {
            m.set_trash(&pool.name, totals);
        }
    }
}

/// Adds subvolumes tenants made inside volumes to their volume's limit, for every pool whose
/// backend needs it done ([`hpp_fs::quota::QuotaBackend::nested_containment`]: btrfs with full
/// quotas), at the shortest interval one asks for, until the task is dropped.
pub async fn contain_nested(state: Arc<DriverState>) {
    let interval = state.pools.iter().filter_map(|p| p.quota.nested_containment()).min();
    run_every(interval, state, contain_nested_once).await;
}

/// One pass of [`contain_nested`].
pub fn contain_nested_once(state: &DriverState) {
    for pool in state.pools.iter().filter(|p| p.quota.nested_containment().is_some()) {
        let outcome = pool.open().map_err(|e| e.to_string()).and_then(|dir| {
            pool.quota
                .contain_nested(std::os::fd::AsFd::as_fd(&dir))
                .map_err(|e| e.to_string())
        });
        if let Err(e) = outcome {
            tracing::debug!(pool = %pool.name, error = %e, "nested subvolumes not checked this time");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_clock_without_a_report_is_stale_and_a_fresh_report_is_not() {
        let clock = HealthClock::default();
        assert!(clock.stale(Duration::from_secs(3600)));
        clock.reported();
        assert!(!clock.stale(Duration::from_secs(3600)));
        std::thread::sleep(Duration::from_millis(2));
        assert!(clock.stale(Duration::from_millis(1)));
    }
}
