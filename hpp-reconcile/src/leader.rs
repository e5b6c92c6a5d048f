//! Leader election on a `coordination.k8s.io/v1` Lease, so only one replica of a controller
//! acts at a time. The one implementation the operator and the legacy provisioner share (and an
//! embedder's own controller can use): [`Election::start`] contends in the background,
//! [`Election::acquired`] waits for the lease, [`Election::lost`] resolves when another holder
//! took it, and [`Election::step_down`] releases it for the next candidate at once.
//!
//! The Lease is read, created and updated, never patched, as client-go's leader election (so
//! controller-runtime's, so KubeVirt's operator's) does: KubeVirt's operator Role grants
//! `leases` get, list, watch, create, update and delete but not patch, and a swap that changes
//! only the operator's image runs hpp's operator with that Role. The rules are client-go's too:
//! a candidate takes a Lease that has no holder, or whose record it has seen unchanged for the
//! Lease's `leaseDurationSeconds` on its own clock (so clock skew between nodes does not
//! matter); the holder renews `grace_seconds` before its lease would lapse.
//!
//! A holder cut off from the API server must also stop acting before another candidate takes
//! over, as client-go's renew deadline makes it: once its renewals have failed, or gone
//! unanswered, for half the grace period (the lease then has about half the grace left), it
//! reports the lease lost: a renewal that goes unanswered is given up when the hold runs
//! out. When the API server answers again it renews the lease it still holds, or waits like
//! any candidate.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

/// Pause after a failed lease call before the next (doubling up to [`MAX_RETRY`]).
const FIRST_RETRY: Duration = Duration::from_millis(250);
/// Longest pause between lease calls while they fail.
const MAX_RETRY: Duration = Duration::from_secs(5);
/// How often a waiting candidate reads a Lease another candidate holds (client-go's retry
/// period), or half the lease duration when that is shorter.
const RETRY_PERIOD: Duration = Duration::from_secs(2);

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
    /// Field manager of the Lease writes (the client's default when `None`).
    pub field_manager: Option<String>,
}

impl LeaseSettings {
    /// Seconds a holder keeps the lease by default (as client-go's leader election).
    pub const DEFAULT_DURATION_SECONDS: u64 = 15;
    /// Seconds before expiry the holder renews by default.
    pub const DEFAULT_GRACE_SECONDS: u64 = 5;

    /// The RBAC the election needs: `create` on leases in its namespace (a create cannot be
    /// narrowed by name) and `get`, `update` on this Lease (it is never listed, watched or
    /// patched).
    pub fn permissions(&self) -> Vec<crate::Permission> {
        use crate::permissions::Scope;
        let why = format!(
            "Leader election: the Lease {} is read, created and updated (never patched, as client-go's election).",
            self.name
        );
        vec![
            crate::Permission::resource("coordination.k8s.io", "leases", Scope::Namespace, &["create"])
                .because(why.clone()),
            crate::Permission::resource("coordination.k8s.io", "leases", Scope::Namespace, &["get", "update"])
                .named([self.name.clone()])
                .because(why),
        ]
    }

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
        /// What the API server (or the connection to it) answered.
        #[source]
        source: kube::Error,
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
    task: JoinHandle<Result<(), kube::Error>>,
}

impl Election {
    /// Starts contending for the Lease (creating it when absent) in the background. Fails only
    /// on settings that cannot work; an API server that cannot be reached is retried (and each
    /// failure logged) by the campaign.
    pub async fn start(client: Client, settings: LeaseSettings) -> Result<Self, LeaderError> {
        let (duration_seconds, grace_seconds) = (settings.duration_seconds, settings.grace_seconds);
        if duration_seconds == 0 || grace_seconds == 0 || grace_seconds >= duration_seconds {
            return Err(LeaderError::InvalidTiming {
                lease: settings.lease(),
                duration_seconds,
                grace_seconds,
            });
        }
        let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
        let (sender, leader) = watch::channel(false);
        let task = tokio::spawn(campaign(api, settings.clone(), sender));
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
            Ok(Ok(())) => {
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

/// Half the grace period: how long renewals may fail before the holder stops acting, and
/// how long a release may take.
fn renew_deadline(settings: &LeaseSettings) -> Duration {
    Duration::from_millis(settings.grace_seconds.saturating_mul(500))
}

/// How often a holder renews: `grace_seconds` before its lease would lapse.
fn renew_interval(settings: &LeaseSettings) -> Duration {
    Duration::from_secs(settings.duration_seconds.saturating_sub(settings.grace_seconds))
}

/// How long after its last renewal a holder stops acting unless it renewed again: the time
/// until its next renewal plus [`renew_deadline`] (12.5 s by default), half the grace before
/// the lease can pass to another candidate, whose clock starts no earlier than the renewal.
fn hold_limit(settings: &LeaseSettings) -> Duration {
    renew_interval(settings) + renew_deadline(settings)
}

/// What a candidate does with the Lease it read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Move {
    /// It holds the lease: renew it.
    Renew,
    /// Nobody holds it, or its holder has not renewed it for its whole duration: take it.
    Take,
    /// Another candidate holds it: read it again later.
    Wait,
}

/// client-go's rule: a Lease held by another candidate is free once its record has stayed the
/// same for the lease's duration, measured on this candidate's clock (`unchanged_for`).
pub fn next_move(me: &str, holder: Option<&str>, unchanged_for: Duration, lease_duration: Duration) -> Move {
    match holder.filter(|h| !h.is_empty()) {
        None => Move::Take,
        Some(h) if h == me => Move::Renew,
        Some(_) if unchanged_for >= lease_duration => Move::Take,
        Some(_) => Move::Wait,
    }
}

/// What one read-and-write round came to.
enum Round {
    /// This candidate holds the lease (written just now).
    Held,
    /// Another candidate holds it.
    Waiting,
    /// Another write got there first (409): read again at once.
    Raced,
}

/// The Lease record as this candidate last saw it, and since when.
struct Observed {
    spec: Option<LeaseSpec>,
    since: Instant,
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

fn seconds(s: u64) -> i32 {
    i32::try_from(s).unwrap_or(i32::MAX)
}

/// One round: read the Lease, then create, renew or take it, or leave it to its holder.
async fn round(api: &Api<Lease>, s: &LeaseSettings, observed: &mut Option<Observed>) -> Result<Round, kube::Error> {
    let pp = PostParams {
        field_manager: s.field_manager.clone(),
        ..Default::default()
    };
    let Some(mut lease) = api.get_opt(&s.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(s.name.clone()),
                namespace: Some(s.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(s.identity.clone()),
                lease_duration_seconds: Some(seconds(s.duration_seconds)),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match api.create(&pp, &lease).await {
            Ok(_) => Ok(Round::Held),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Round::Raced),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    if observed.as_ref().is_none_or(|o| o.spec.as_ref() != Some(&spec)) {
        *observed = Some(Observed {
            spec: Some(spec.clone()),
            since: Instant::now(),
        });
    }
    let unchanged_for = observed.as_ref().map_or(Duration::ZERO, |o| o.since.elapsed());
    let lease_duration = Duration::from_secs(
        spec.lease_duration_seconds
            .and_then(|d| u64::try_from(d).ok())
            .unwrap_or(s.duration_seconds),
    );
    let holder = spec.holder_identity.as_deref();
    let next = next_move(&s.identity, holder, unchanged_for, lease_duration);
    let mut new = spec.clone();
    match next {
        Move::Wait => return Ok(Round::Waiting),
        Move::Renew => {}
        Move::Take => {
            if holder.is_some_and(|h| !h.is_empty()) {
                new.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            }
            new.holder_identity = Some(s.identity.clone());
            new.acquire_time = Some(now());
        }
    }
    new.renew_time = Some(now());
    new.lease_duration_seconds = Some(seconds(s.duration_seconds));
    lease.spec = Some(new);
    // An update carries the resourceVersion read: a concurrent write makes it a 409, not a
    // second holder.
    match api.replace(&s.name, &pp, &lease).await {
        Ok(_) => Ok(Round::Held),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Round::Raced),
        Err(e) => Err(e),
    }
}

/// Gives the lease up if this candidate holds it: no holder, so the next candidate takes it at
/// once (client-go's release on cancel).
async fn release(api: &Api<Lease>, s: &LeaseSettings) -> Result<(), kube::Error> {
    let Some(mut lease) = api.get_opt(&s.name).await? else {
        return Ok(());
    };
    let Some(spec) = lease.spec.as_mut() else { return Ok(()) };
    if spec.holder_identity.as_deref() != Some(s.identity.as_str()) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.renew_time = Some(now());
    let pp = PostParams {
        field_manager: s.field_manager.clone(),
        ..Default::default()
    };
    match api.replace(&s.name, &pp, &lease).await {
        // Someone else wrote it meanwhile: it is not ours to release any more.
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Why a lease call came to nothing.
#[derive(Debug, thiserror::Error)]
enum Failed {
    /// The API server (or the connection to it) answered with an error.
    #[error(transparent)]
    Call(#[from] kube::Error),
    /// No answer in time: a partition, or an API server that hangs. Without this bound a
    /// holder would wait on one call for ever and never notice it can no longer renew.
    #[error("no answer from the API server within {0:?}")]
    NoAnswer(Duration),
}

/// Runs `call`, giving up at `until`.
async fn bounded<T>(until: Instant, call: impl Future<Output = Result<T, kube::Error>>) -> Result<T, Failed> {
    let limit = until.saturating_duration_since(Instant::now());
    match tokio::time::timeout_at(until.into(), call).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(Failed::NoAnswer(limit)),
    }
}

/// Contends for the lease until every receiver of `sender` is gone, then releases it. Sends
/// each change of leadership, and `false` once the lease has gone unrenewed for
/// [`hold_limit`] while leading: whether the calls failed or were never answered.
async fn campaign(api: Api<Lease>, s: LeaseSettings, sender: watch::Sender<bool>) -> Result<(), kube::Error> {
    let renew_every = renew_interval(&s);
    let poll = RETRY_PERIOD.min(Duration::from_millis(s.duration_seconds.saturating_mul(500)));
    let hold = hold_limit(&s);
    let mut observed = None;
    // When the last round that wrote the lease as this candidate's started: the API server
    // stored the write after that, so another candidate's clock for it starts later still.
    let mut renewed = Instant::now();
    let mut retry = FIRST_RETRY;
    loop {
        let leading = *sender.borrow();
        // A holder's round may not outlast its hold on the lease; a waiting candidate's gets
        // as long (it only delays its next look).
        let started = Instant::now();
        let until = match leading {
            true => renewed + hold,
            false => started + hold,
        };
        let result = tokio::select! {
            biased;
            () = sender.closed() => break,
            result = bounded(until, round(&api, &s, &mut observed)) => result,
        };
        let pause = match result {
            Ok(round) => {
                retry = FIRST_RETRY;
                let (held, pause) = match round {
                    Round::Held => {
                        renewed = started;
                        // Counted from the round's start, so a slow round does not eat into
                        // the next one's time before the hold runs out.
                        (true, (started + renew_every).saturating_duration_since(Instant::now()))
                    }
                    Round::Waiting => (false, poll),
                    Round::Raced => (leading, FIRST_RETRY),
                };
                if leading != held {
                    debug!(lease = %s.lease(), held, "leadership changed");
                    if sender.send(held).is_err() {
                        break;
                    }
                }
                pause
            }
            Err(error) => {
                let unrenewed = renewed.elapsed();
                if leading && unrenewed >= hold {
                    warn!(lease = %s.lease(), %error, unrenewed_for = ?unrenewed,
                        "cannot renew the lease; no longer acting as leader");
                    if sender.send(false).is_err() {
                        break;
                    }
                } else {
                    warn!(lease = %s.lease(), %error, retry_seconds = retry.as_secs_f64(),
                        "cannot read or write the leader Lease (API server unreachable or refusing); retrying");
                }
                let pause = match leading && unrenewed < hold {
                    // Looked at again no later than the hold runs out.
                    true => retry.min(hold - unrenewed),
                    false => retry,
                };
                retry = (retry * 2).min(MAX_RETRY);
                pause
            }
        };
        tokio::select! {
            biased;
            () = sender.closed() => break,
            () = tokio::time::sleep(pause) => {}
        }
    }
    // Best effort: on an API server that does not answer the lease lapses by itself.
    match bounded(Instant::now() + renew_deadline(&s), release(&api, &s)).await {
        Ok(()) => Ok(()),
        Err(Failed::Call(e)) => Err(e),
        Err(e @ Failed::NoAnswer(_)) => {
            warn!(lease = %s.lease(), error = %e, "could not release the lease; it lapses by itself");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_follow_client_gos_rules() {
        let d = Duration::from_secs(15);
        assert_eq!(next_move("me", None, Duration::ZERO, d), Move::Take);
        assert_eq!(next_move("me", Some(""), Duration::ZERO, d), Move::Take, "released");
        assert_eq!(next_move("me", Some("me"), Duration::ZERO, d), Move::Renew);
        assert_eq!(next_move("me", Some("other"), Duration::from_secs(14), d), Move::Wait);
        assert_eq!(next_move("me", Some("other"), d, d), Move::Take, "lapsed");
    }
}
