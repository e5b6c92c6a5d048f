//! A pool's lane: one thread that runs the pool's short filesystem jobs (empty-volume creates)
//! one after another.
//!
//! Why: a request handed to tokio's blocking pool wakes a sleeping thread, which goes back to
//! sleep when the job is done: two context switches per request, the largest share of a
//! CreateVolume's CPU time on a small virtual machine. A lane that is busy takes the next job
//! from its queue without sleeping, so under load a create costs no wake-up at all; when it is
//! idle it costs the one wake-up the blocking pool would. A pool on a hung filesystem stalls
//! only its own lane, as it would stall its own blocking threads. Jobs that can take long
//! (copies for clones and restores) and jobs on shared pools (network filesystems, where
//! several can wait at once) stay on the blocking pool. The thread ends after [`IDLE_EXIT`]
//! without work, and with the lane.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::pool::inflight::Guard;

/// How long an idle lane thread waits for work before it ends (tokio's blocking threads wait 10 s).
pub const IDLE_EXIT: Duration = Duration::from_secs(10);
/// The lane thread's stack: filesystem calls, JSON records and log lines.
const STACK: usize = 512 << 10;

type Job = Box<dyn FnOnce() + Send>;

/// A pool's lane (see the module documentation). Cloning a [`crate::pool::Pool`] shares it.
#[derive(Debug, Default)]
pub struct Lane {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    work: Condvar,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// A thread is serving the queue (running a job or waiting for one).
    running: bool,
    /// That thread is waiting, and must be woken for a new job.
    waiting: bool,
    closed: bool,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("jobs", &self.jobs.len())
            .field("running", &self.running)
            .field("waiting", &self.waiting)
            .finish_non_exhaustive()
    }
}

/// Where a lane job sends its answer: at once, or later from another thread (a journal flush's
/// callback), so the waiting caller is woken once, when the answer is final. Dropped unsent (the
/// job panicked), the caller hears Internal.
#[derive(Debug)]
pub struct Reply<T>(tokio::sync::oneshot::Sender<Result<T>>);

impl<T> Reply<T> {
    /// Answers the caller (nothing happens when it stopped waiting).
    pub fn send(self, outcome: Result<T>) {
        let _ = self.0.send(outcome);
    }
}

/// [`Lane::run_replying`] on the blocking pool: for jobs that may wait long (a copy, a quota
/// backend, a network filesystem), which must not hold up a pool's lane, but whose answer, like a
/// lane job's, may come later from a flush's callback. A job runs to its end, and its answer is
/// delivered, when the caller stops waiting.
pub async fn blocking_replying<T, F>(f: F) -> Result<T>
where
    F: FnOnce(Reply<T>) + Send + 'static,
    T: Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    blocking(move || {
        f(Reply(tx));
        Ok(())
    })
    .await?;
    rx.await
        .unwrap_or_else(|_| Err(Error::Internal("a job ended before it answered".to_owned())))
}

impl Lane {
    /// Runs `f` on the lane and returns its result. A job already started runs to its end when
    /// the caller stops waiting (as on the blocking pool). When no thread can be started, `f`
    /// runs on the blocking pool instead.
    pub async fn run<T, F>(&self, f: F) -> Result<T>
    where
        F: FnOnce() -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        self.run_replying(move |reply| reply.send(f())).await
    }

    /// [`run`](Self::run) for a job that answers through its [`Reply`], possibly after it has
    /// returned: the caller waits for that answer.
    pub async fn run_replying<T, F>(&self, f: F) -> Result<T>
    where
        F: FnOnce(Reply<T>) + Send + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        // A panic drops the reply unsent; the lane goes on with the next job.
        let job: Job = Box::new(move || drop(std::panic::catch_unwind(AssertUnwindSafe(move || f(Reply(tx))))));
        if let Err(job) = self.submit(job) {
            blocking(move || {
                job();
                Ok(())
            })
            .await?;
        }
        rx.await.unwrap_or_else(|_| {
            Err(Error::Internal(
                "a pool lane job panicked before it answered".to_owned(),
            ))
        })
    }

    /// Queues `job`, starting the thread when none serves the queue. Gives the job back when no
    /// thread can be started.
    fn submit(&self, job: Job) -> std::result::Result<(), Job> {
        let mut st = self.shared.lock();
        if !st.running {
            let shared = self.shared.clone();
            let started = std::thread::Builder::new()
                .name("hpp-pool-lane".to_owned())
                .stack_size(STACK)
                .spawn(move || shared.serve());
            if started.is_err() {
                return Err(job);
            }
            st.running = true;
        }
        st.jobs.push_back(job);
        if st.waiting {
            st.waiting = false;
            self.shared.work.notify_one();
        }
        Ok(())
    }
}

impl Drop for Lane {
    /// Lets the thread end once the queue is empty.
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.work.notify_all();
    }
}

impl Shared {
    /// The lane thread: runs jobs while there are any, waits up to [`IDLE_EXIT`] for more.
    fn serve(&self) {
        let mut st = self.lock();
        loop {
            if let Some(job) = st.jobs.pop_front() {
                drop(st);
                job();
                st = self.lock();
                continue;
            }
            if st.closed {
                break;
            }
            st.waiting = true;
            let (next, timeout) = self
                .work
                .wait_timeout(st, IDLE_EXIT)
                .unwrap_or_else(PoisonError::into_inner);
            st = next;
            st.waiting = false;
            if timeout.timed_out() && st.jobs.is_empty() {
                break;
            }
        }
        st.running = false;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Runs blocking filesystem work off the async runtime.
pub async fn blocking<T, F>(f: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("blocking task failed: {e}")))?
}

/// Runs blocking work that owns the in-flight `guard`. The guard moves into the blocking task,
/// so it is released when the work ends, not when the request is dropped: a CO whose deadline
/// passed cancels only its wait, and its retry answers Aborted until the first attempt is done
/// instead of racing it.
pub async fn blocking_locked<T, F>(guard: Guard, f: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    blocking(move || {
        let _guard = guard;
        f()
    })
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// What a blocking job holds (a volume's lock) goes with its answer: kept after its caller
    /// stopped waiting, until the answer is given (to nobody), then released.
    #[tokio::test]
    async fn a_blocking_job_keeps_what_it_holds_until_it_answers_even_without_a_caller() {
        let held = Arc::new(());
        let (answer, answer_now) = std::sync::mpsc::channel::<()>();
        let h = held.clone();
        let call = blocking_replying(move |reply: Reply<Arc<()>>| {
            std::thread::spawn(move || {
                let _ = answer_now.recv();
                reply.send(Ok(h));
            });
        });
        assert!(tokio::time::timeout(Duration::from_millis(20), call).await.is_err());
        assert_eq!(Arc::strong_count(&held), 2, "released before the answer");
        answer.send(()).unwrap();
        for _ in 0..30_000 {
            if Arc::strong_count(&held) == 1 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(Arc::strong_count(&held), 1, "kept after the answer");
        let answered = blocking_replying(|reply: Reply<u32>| reply.send(Ok(7))).await;
        assert_eq!(answered.unwrap(), 7);
        let dropped = blocking_replying(|reply: Reply<u32>| drop(reply)).await;
        assert!(matches!(dropped, Err(Error::Internal(_))), "{dropped:?}");
    }

    #[tokio::test]
    async fn jobs_run_in_order_and_answer_their_callers() {
        let lane = Lane::default();
        let order = Arc::new(Mutex::new(Vec::new()));
        let runs: Vec<_> = (0..50)
            .map(|i| {
                let order = order.clone();
                lane.run(move || {
                    order.lock().unwrap().push(i);
                    Ok(i * 2)
                })
            })
            .collect();
        let answers = futures::future::join_all(runs).await;
        assert_eq!(
            answers.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
            (0..50).map(|i| i * 2).collect::<Vec<_>>()
        );
        assert_eq!(*order.lock().unwrap(), (0..50).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_failing_or_panicking_job_answers_with_an_error_and_the_lane_goes_on() {
        let lane = Lane::default();
        let failed = lane
            .run(|| -> Result<()> { Err(Error::NotFound("gone".to_owned())) })
            .await;
        assert!(matches!(failed, Err(Error::NotFound(_))));
        let panicked = lane.run(|| -> Result<()> { panic!("a bug") }).await;
        assert!(matches!(panicked, Err(Error::Internal(_))), "{panicked:?}");
        assert_eq!(lane.run(|| Ok(7)).await.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_job_may_answer_after_it_returned_from_another_thread() {
        let lane = Arc::new(Lane::default());
        let (hand_tx, hand_rx) = std::sync::mpsc::channel::<Reply<u32>>();
        let answered = tokio::spawn({
            let lane = lane.clone();
            async move { lane.run_replying(move |reply| hand_tx.send(reply).unwrap()).await }
        });
        // The job has returned, its reply is held elsewhere: the lane runs the next job.
        assert_eq!(lane.run(|| Ok(1)).await.unwrap(), 1);
        assert!(!answered.is_finished());
        let reply = hand_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        std::thread::spawn(move || reply.send(Ok(42))).join().unwrap();
        assert_eq!(answered.await.unwrap().unwrap(), 42);
        let dropped = lane.run_replying(|reply: Reply<()>| drop(reply)).await;
        assert!(matches!(dropped, Err(Error::Internal(_))), "{dropped:?}");
    }

    #[tokio::test]
    async fn the_thread_ends_with_the_lane() {
        let lane = Lane::default();
        lane.run(|| Ok(())).await.unwrap();
        let shared = Arc::downgrade(&lane.shared);
        drop(lane);
        for _ in 0..1000 {
            if shared.strong_count() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(shared.strong_count(), 0, "the lane thread outlived its lane");
    }
}
