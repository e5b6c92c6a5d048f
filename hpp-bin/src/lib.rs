//! Shared start-up code for the hpp executables (`hpp-operator`, `hpp-csi-driver`,
//! `hpp-provisioner`): logging, telemetry, the metrics/health server and signal handling.

pub mod admin;
pub mod columns;
pub mod csi_driver;
pub mod memory;
pub mod metrics_tls;
pub mod operator;
pub mod provisioner;
pub mod telemetry;
pub mod webhook_cmd;

/// The git revision `images/build.sh` builds from (`HPP_BUILD_REVISION` at compile time).
pub const BUILD_REVISION: Option<&str> = option_env!("HPP_BUILD_REVISION");

/// The build, as the executables print it: `0.1.0 (revision abc123)`, or just the version when
/// built without `HPP_BUILD_REVISION`.
pub fn build_version() -> String {
    match BUILD_REVISION.filter(|r| !r.is_empty()) {
        Some(rev) => format!("{} (revision {rev})", env!("CARGO_PKG_VERSION")),
        None => env!("CARGO_PKG_VERSION").to_owned(),
    }
}

/// glibc malloc arenas each executable allows (see [`hpp_sys::malloc`]): one, so freed memory
/// stays in one place. Against two, measured with `cargo xtask bench` on the static driver: idle
/// with 10,000 volumes 8,256 → 7,904 KiB, throughput at c=16 no lower (allocation is a small
/// share of a call that does file system work).
pub const MALLOC_ARENAS: u16 = 1;

/// How long the operator's allocator (jemalloc, see `hpp_sys::malloc::tune_jemalloc`) keeps
/// freed pages before giving them back: long enough that a pass reuses the previous pass's
/// pages, short enough that the resident memory of a quiet operator is what it holds (measured
/// at 1,000 nodes: 38.4 MiB at most in a quiet window, against 103.9 MiB with jemalloc's defaults: 10 s, freed
/// pages handed back only while the process allocates, and through `MADV_FREE`, whose pages count
/// as resident until the kernel runs short).
pub const OPERATOR_ALLOCATOR_DECAY: std::time::Duration = std::time::Duration::from_secs(1);

/// How many tokio worker threads an executable runs. `TOKIO_WORKER_THREADS`, tokio's own knob,
/// overrides it for any executable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workers {
    /// One per core (tokio's default).
    PerCore,
    /// A fixed number, whatever the node's size.
    Fixed(usize),
}

/// The operator's tokio workers: it waits on watches and runs one reconcile at a time, so two
/// workers (one can serve the webhook and probes while the other reconciles) do on a 64-core
/// node what 64 would, without 62 idle threads' stacks and allocator caches.
pub const OPERATOR_WORKERS: Workers = Workers::Fixed(2);

/// The CSI driver's tokio workers: one. Its file system work runs on the blocking pool (and
/// empty-volume creates on each pool's lane, `hpp_csi` `pool::lane`), so the workers only frame gRPC (tens of µs a call: one worker serves tens of thousands of calls a
/// second, far beyond what kubelet and the sidecars send). A second worker mostly costs wake-ups
/// between the two: measured with `cargo xtask bench` on 2 cores (the bench client on the same
/// cores), one worker against two gave Probe 44.6k / 30.0k ops/s at c=16 against 24.9k / 34.9k,
/// GetCapacity 54.2k / 46.1k against 21.1k / 35.1k, CreateVolume and the mounts the same within
/// the noise, and 0.5 MiB less idle memory (4,796 against 5,412 KiB). On a 64-core node the
/// default would start 64.
pub const DRIVER_WORKERS: Workers = Workers::Fixed(1);

/// Runs `main` on the multi-threaded tokio runtime with one worker per core; see [`run_with`].
pub fn run<F: std::future::Future>(main: F) -> std::io::Result<F::Output> {
    run_with(Workers::PerCore, main)
}

/// Runs `main` on a multi-threaded tokio runtime with `workers` worker threads (or
/// `TOKIO_WORKER_THREADS`), after capping the allocator's arenas (which must happen before any
/// thread starts, so not under `#[tokio::main]`), and hands freed memory back to the kernel every
/// few seconds ([`memory`]).
pub fn run_with<F: std::future::Future>(workers: Workers, main: F) -> std::io::Result<F::Output> {
    hpp_sys::malloc::limit_arenas(MALLOC_ARENAS);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.on_thread_start(hpp_sys::malloc::on_thread_start);
    if let Some(n) = worker_threads(workers, std::env::var("TOKIO_WORKER_THREADS").ok().as_deref())? {
        builder.worker_threads(n);
    }
    Ok(builder.enable_all().build()?.block_on(async {
        let release = tokio::spawn(memory::release_periodically(memory::RELEASE_INTERVAL));
        let out = main.await;
        release.abort();
        out
    }))
}

/// The worker count to set, `None` for tokio's default (one per core). `TOKIO_WORKER_THREADS`
/// wins when set, and is checked here: tokio itself would panic on a bad value.
fn worker_threads(workers: Workers, env: Option<&str>) -> std::io::Result<Option<usize>> {
    match env {
        Some(value) => match value.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("TOKIO_WORKER_THREADS={value:?}: expected a whole number of threads, at least 1"),
            )),
        },
        None => Ok(match workers {
            Workers::PerCore => None,
            Workers::Fixed(n) => Some(n.max(1)),
        }),
    }
}

/// Ends an executable: on error, one line on stderr (`NAME: error: cause: cause`), never a
/// backtrace (even with `RUST_BACKTRACE` set), and exit status 1.
pub fn exit_code(name: &str, result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", error_line(name, &e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The one-line form of an error and its causes.
pub fn error_line(name: &str, e: &anyhow::Error) -> String {
    format!("{name}: error: {}", causes(e)).replace('\n', " ")
}

/// An error and its causes joined by `: `, each stated once: a cause whose text the errors
/// wrapping it already show (a `"{context}: {source}"` message that also returns that source)
/// is not repeated, as anyhow's `{:#}` would.
pub fn causes(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let cause = cause.to_string();
        if text.contains(cause.as_str()) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    #[test]
    fn errors_end_the_process_with_one_line_and_every_cause() {
        let e = anyhow::anyhow!("NotFound: volume nope does not exist").context("call publish");
        assert_eq!(
            super::error_line("hpp-csi-driver", &e),
            "hpp-csi-driver: error: call publish: NotFound: volume nope does not exist"
        );
        let multi = anyhow::anyhow!("first line\nsecond line");
        assert!(!super::error_line("x", &multi).contains('\n'));
    }

    /// An error type that shows its source in its own message and also returns it.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot listen on /tmp/x.sock: {0}")]
    struct Both(#[source] std::io::Error);

    #[test]
    fn a_cause_already_in_its_wrappers_message_is_not_repeated() {
        let e = anyhow::Error::new(Both(std::io::Error::from_raw_os_error(13))).context("starting the driver");
        assert_eq!(
            super::error_line("hpp-csi-driver", &e),
            "hpp-csi-driver: error: starting the driver: cannot listen on /tmp/x.sock: Permission denied (os error 13)"
        );
    }

    #[test]
    fn a_driver_start_that_fails_on_a_quota_backend_names_the_mode_once() {
        let dir = tempfile::tempdir().unwrap();
        let is_btrfs = std::process::Command::new("stat")
            .args(["-f", "-c", "%T"])
            .arg(dir.path())
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "btrfs");
        if is_btrfs {
            eprintln!("skipped: the temporary directory is on btrfs");
            return;
        }
        let err = hpp_csi::Driver::builder()
            .node_id("n")
            .pool(hpp_csi::PoolConfig::new("b", dir.path().join("b")).quota(hpp_api::quota::QuotaMode::Btrfs, 100))
            .build()
            .unwrap_err();
        let line = super::error_line("hpp-csi-driver", &anyhow::Error::new(err));
        assert_eq!(
            line,
            "hpp-csi-driver: error: storage pool \"b\": quota mode btrfs needs the pool directory on a btrfs filesystem"
        );
        assert!(!dir.path().join("b").exists(), "a refused pool leaves nothing behind");
    }

    #[test]
    fn fixed_workers_run_that_many_threads_whatever_the_core_count() {
        let workers = |w| super::run_with(w, async { tokio::runtime::Handle::current().metrics().num_workers() });
        assert_eq!(workers(super::OPERATOR_WORKERS).unwrap(), 2);
        assert_eq!(workers(super::Workers::Fixed(0)).unwrap(), 1, "never zero workers");
        assert!(workers(super::Workers::PerCore).unwrap() >= 1);
    }

    #[test]
    fn tokio_worker_threads_overrides_the_default_and_a_bad_value_is_an_error() {
        use super::{Workers, worker_threads};
        assert_eq!(worker_threads(super::DRIVER_WORKERS, None).unwrap(), Some(1));
        assert_eq!(worker_threads(Workers::PerCore, None).unwrap(), None);
        assert_eq!(worker_threads(Workers::Fixed(1), Some("4")).unwrap(), Some(4));
        assert_eq!(worker_threads(Workers::PerCore, Some(" 3 ")).unwrap(), Some(3));
        for bad in ["0", "-1", "many", ""] {
            let err = worker_threads(Workers::Fixed(2), Some(bad)).unwrap_err();
            assert!(err.to_string().contains("TOKIO_WORKER_THREADS"), "{err}");
        }
    }

    #[test]
    fn build_version_starts_with_the_package_version() {
        assert!(super::build_version().starts_with(env!("CARGO_PKG_VERSION")));
    }
}
