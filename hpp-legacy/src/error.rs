//! Errors at the boundary of the library; refusals are not errors (see [`crate::decision`]).

use std::path::PathBuf;

/// Why an I/O step of provisioning or deletion failed. Each variant maps to a bounded
/// [`Error::category`] used as a metric label.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API answered with an error or could not be reached.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A filesystem operation on a volume directory failed.
    #[error("{op} {path}: {source}")]
    Fs {
        /// The operation that failed, such as `mkdir` or `rename`.
        op: &'static str,
        /// The path it failed on.
        path: PathBuf,
        /// The errno from the kernel.
        #[source]
        source: std::io::Error,
    },
    /// A deletion met something it must not touch (a symlink out, a mount point, a path
    /// outside the base directory): the directory is left alone.
    #[error("refusing to remove {path}: {reason}")]
    UnsafeDelete {
        /// The directory that was to be removed.
        path: PathBuf,
        /// Why it was left alone.
        reason: String,
    },
    /// The configuration cannot work at all (checked at start-up).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Leader election failed.
    #[error("leader election: {0}")]
    Lease(#[from] hpp_reconcile::leader::LeaderError),
    /// The pool's quota backend failed (see [`hpp_fs::quota`]).
    #[error("quota backend: {0}")]
    Quota(#[from] hpp_fs::quota::QuotaError),
}

impl Error {
    /// A bounded label for metrics and logs.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Fs { .. } => "filesystem",
            Error::UnsafeDelete { .. } => "unsafe_delete",
            Error::Config(_) => "config",
            Error::Lease(_) => "lease",
            Error::Quota(_) => "quota",
        }
    }

    /// Shorthand for a filesystem error.
    pub fn fs(op: &'static str, path: impl Into<PathBuf>, source: impl Into<std::io::Error>) -> Self {
        Error::Fs {
            op,
            path: path.into(),
            source: source.into(),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
