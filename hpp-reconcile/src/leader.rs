//! Leader election on a `coordination.k8s.io/v1` Lease, so only one replica of a controller
//! acts at a time. The one implementation the operator and the legacy provisioner share (and an
//! embedder's own controller can use): [`Election::start`] contends in the background,
//! [`Election::acquired`] waits for the lease, [`Election::lost`] resolves when another holder
//! took it, and [`Election::step_down`] releases it for the next candidate at once.
//!
//! Built on `kube-lease-manager`: the holder renews `grace_seconds` before the lease expires;
//! a holder that stops renewing (crashed, partitioned) loses it `duration_seconds` after its
//! last renewal, and a waiting candidate takes it over.
//!
//! A holder cut off from the API server must also stop acting before that happens, as
//! client-go's renew deadline makes it. `kube-lease-manager`'s own watch loop keeps reporting
//! "leader" while its renewals fail, so the campaign here drives it step by step: once renewals
//! have failed for half the grace period (the lease then has about half the grace left), it
//! reports the lease lost and releases it as soon as the API server answers again.

use std::time::{Duration, Instant};

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// Pause after a failed lease call before the next (doubling up to [`MAX_RETRY`]).
const FIRST_RETRY: Duration = Duration::from_millis(250);
/// Longest pause between lease calls while they fail.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// Where the Lease lives, who we are, and how long a holder keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Lease name; every candidate of one controller must use the same.
    pub name: String,
    /// Namespace of the Lease.
    pub namespace: String,
    /// This candidate's identity (the pod name, or the host name out of cluster).
    pub identity: String,
    /// Seconds a holder keeps the lease without renewing.
    pub duration_seconds: u64,
    /// Seconds before expiry the holder renews; less than `duration_seconds`.
    pub grace_seconds: u64,
    /// Field manager of the Lease writes (`kube-lease-manager`'s default when `None`).
    pub field_manager: Option<String>,
}

impl LeaseSettings {
    /// Seconds a holder keeps the lease by default (as client-go's leader election).
    pub const DEFAULT_DURATION_SECONDS: u64 = 15;
    /// Seconds before expiry the holder renews by default.
    pub const DEFAULT_GRACE_SECONDS: u64 = 5;

    /// Settings with the default duration (15 s) and renewal grace (5 s).
    pub fn new(name: impl Into<String>, namespace: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            duration_seconds: Self::DEFAULT_DURATION_SECONDS,
            grace_seconds: Self::DEFAULT_GRACE_SECONDS,
            field_manager: None,
        }
    }

    /// Sets how long a holder keeps the lease and how early it renews.
    pub fn with_timing(mut self, duration_seconds: u64, grace_seconds: u64) -> Self {
        self.duration_seconds = duration_seconds;
        self.grace_seconds = grace_seconds;
        self
    }

    /// Sets the field manager of the Lease writes.
    pub fn with_field_manager(mut self, field_manager: impl Into<String>) -> Self {
        self.field_manager = Some(field_manager.into());
        self
    }

    fn lease(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Why leader election failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaderError {
    /// The settings cannot work: both times must be positive and the grace shorter than the lease.
    #[error(
        "leader election on Lease {lease}: invalid timing (duration {duration_seconds}s, grace {grace_seconds}s); both must be positive and the grace shorter than the duration"
    )]
    InvalidTiming {
        /// `namespace/name` of the Lease.
        lease: String,
        /// The lease duration asked for.
        duration_seconds: u64,
        /// The renewal grace asked for.
        grace_seconds: u64,
    },
    /// The Lease could not be read, created or written.
    #[error("leader election on Lease {lease}: {source}")]
    Lease {
        /// `namespace/name` of the Lease.
        lease: String,
        /// What the lease manager reported.
        #[source]
        source: LeaseManagerError,
    },
    /// The background election task ended although nobody asked it to.
    #[error("leader election on Lease {lease} stopped unexpectedly")]
    Stopped {
        /// `namespace/name` of the Lease.
        lease: String,
    },
}

/// A running candidacy. Dropping it stops contending and releases the lease if held (in the
/// background); [`step_down`](Self::step_down) does the same and waits for the release.
#[derive(Debug)]
pub struct Election {
    settings: LeaseSettings,
    leader: watch::Receiver<bool>,
    task: JoinHandle<Result<LeaseManager, LeaseManagerError>>,
}

impl Election {
    /// Starts contending for the Lease (creating it when absent).
    pub async fn start(client: Client, settings: LeaseSettings) -> Result<Self, LeaderError> {
        let (duration_seconds, grace_seconds) = (settings.duration_seconds, settings.grace_seconds);
        if duration_seconds == 0 || grace_seconds == 0 || grace_seconds >= duration_seconds {
            return Err(LeaderError::InvalidTiming {
                lease: settings.lease(),
                duration_seconds,
                grace_seconds,
            });
        }
        let mut builder = LeaseManagerBuilder::new(client, &settings.name)
            .with_namespace(&settings.namespace)
            .with_identity(&settings.identity)
            .with_duration(settings.duration_seconds)
            .with_grace(settings.grace_seconds);
        if let Some(field_manager) = &settings.field_manager {
            builder = builder.with_field_manager(field_manager);
        }
        let manager = builder.build().await.map_err(|source| LeaderError::Lease {
            lease: settings.lease(),
            source,
        })?;
        let (sender, leader) = watch::channel(false);
        let task = tokio::spawn(campaign(manager, sender, renew_deadline(&settings)));
        info!(lease = %settings.lease(), identity = %settings.identity, "contending for leadership");
        Ok(Self { settings, leader, task })
    }

    /// The settings this candidacy runs with.
    pub fn settings(&self) -> &LeaseSettings {
        &self.settings
    }

    /// Whether this candidate holds the lease now.
    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// Waits until this candidate holds the lease; fails when the election task ended.
    pub async fn acquired(&mut self) -> Result<(), LeaderError> {
        match self.leader.wait_for(|held| *held).await {
            Ok(_) => {
                info!(lease = %self.settings.lease(), identity = %self.settings.identity, "acquired leadership");
                Ok(())
            }
            Err(_) => Err(LeaderError::Stopped {
                lease: self.settings.lease(),
            }),
        }
    }

    /// Resolves when this candidate no longer holds the lease (another candidate took it over,
    /// or the election task ended).
    pub async fn lost(&mut self) {
        if self.leader.wait_for(|held| !*held).await.is_err() {
            warn!(lease = %self.settings.lease(), "leader election stopped");
        } else {
            warn!(lease = %self.settings.lease(), identity = %self.settings.identity, "lost leadership");
        }
    }

    /// Stops contending and releases the lease if held, so another candidate takes over at
    /// once instead of after it expires.
    pub async fn step_down(self) -> Result<(), LeaderError> {
        let Self { settings, leader, task } = self;
        drop(leader);
        match task.await {
            Ok(Ok(_)) => {
                info!(lease = %settings.lease(), identity = %settings.identity, "released leadership");
                Ok(())
            }
            Ok(Err(source)) => Err(LeaderError::Lease {
                lease: settings.lease(),
                source,
            }),
            Err(_) => Err(LeaderError::Stopped {
                lease: settings.lease(),
            }),
        }
    }
}

/// How long renewals may fail before the holder stops acting: half the grace period, so it
/// stops about half the grace before the lease can pass to another candidate.
fn renew_deadline(settings: &LeaseSettings) -> Duration {
    Duration::from_millis(settings.grace_seconds.saturating_mul(500))
}

/// Contends for the lease until every receiver of `sender` is gone, then releases it. Sends
/// each change of leadership, and `false` once renewals have failed for `deadline` while
/// leading; the lease is then released as soon as the API server answers, so that this
/// candidate (or another) acquires it afresh instead of holding it without acting.
async fn campaign(
    manager: LeaseManager,
    sender: watch::Sender<bool>,
    deadline: Duration,
) -> Result<LeaseManager, LeaseManagerError> {
    let mut failing_since: Option<Instant> = None;
    let mut retry = FIRST_RETRY;
    let mut must_release = false;
    loop {
        let step = async {
            if must_release {
                manager.release().await.map(|()| None)
            } else {
                manager.changed().await.map(Some)
            }
        };
        let result = tokio::select! {
            biased;
            () = sender.closed() => break,
            result = step => result,
        };
        match result {
            Ok(changed) => {
                failing_since = None;
                retry = FIRST_RETRY;
                match changed {
                    None => must_release = false,
                    Some(held) => {
                        if sender.send(held).is_err() {
                            break;
                        }
                    }
                }
            }
            Err(error) => {
                let since = *failing_since.get_or_insert_with(Instant::now);
                if *sender.borrow() && since.elapsed() >= deadline {
                    warn!(%error, failing_for = ?since.elapsed(), "cannot renew the lease; no longer acting as leader");
                    must_release = true;
                    if sender.send(false).is_err() {
                        break;
                    }
                } else {
                    warn!(%error, "lease call failed; retrying");
                }
                tokio::select! {
                    biased;
                    () = sender.closed() => break,
                    () = tokio::time::sleep(retry) => {}
                }
                retry = (retry * 2).min(MAX_RETRY);
            }
        }
    }
    manager.release().await?;
    Ok(manager)
}
