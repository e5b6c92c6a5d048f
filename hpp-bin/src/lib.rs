//! Shared start-up code for the hpp executables (`hpp-operator`, `hpp-csi-driver`,
//! `hpp-provisioner`): logging, telemetry, the metrics/health server and signal handling.

pub mod admin;
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

/// glibc malloc arenas each executable allows (see [`hpp_sys::malloc`]): two keep a little
/// allocation concurrency while freed memory stays in two places, not one per thread.
pub const MALLOC_ARENAS: u16 = 2;

/// Runs `main` on the multi-threaded tokio runtime every executable uses, after capping the
/// allocator's arenas (which must happen before any thread starts, so not under
/// `#[tokio::main]`), and hands freed memory back to the kernel every few seconds
/// ([`memory`]).
pub fn run<F: std::future::Future>(main: F) -> std::io::Result<F::Output> {
    hpp_sys::malloc::limit_arenas(MALLOC_ARENAS);
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let release = tokio::spawn(memory::release_periodically(memory::RELEASE_INTERVAL));
            let out = main.await;
            release.abort();
            out
        }))
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
    format!("{name}: error: {e:#}").replace('\n', " ")
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

    #[test]
    fn build_version_starts_with_the_package_version() {
        assert!(super::build_version().starts_with(env!("CARGO_PKG_VERSION")));
    }
}
