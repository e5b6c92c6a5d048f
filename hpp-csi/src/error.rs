//! The one error type of the driver and its single mapping onto gRPC status codes.

use std::io;

use tonic::{Code, Status};

/// Result alias used throughout the driver.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while serving a CSI request.
///
/// Each variant carries a message fit for the CO's event log; [`From<Error> for Status`] is the
/// only place that decides the gRPC code, so no error ever leaves as `Unknown`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed or hostile (bad id, path traversal, missing field).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The volume, snapshot or pool does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// An object with that name exists but is incompatible with the request.
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// The system is not in a state that allows the operation (pool not mounted, volume in use).
    #[error("failed precondition: {0}")]
    FailedPrecondition(String),
    /// Out of space, inodes or another resource.
    #[error("resource exhausted: {0}")]
    ResourceExhausted(String),
    /// The requested capacity cannot be provided by the pool.
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// Another operation on the same object is in flight, or a pagination token is stale.
    #[error("aborted: {0}")]
    Aborted(String),
    /// The driver or a pool is not ready to serve.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A system call failed unexpectedly.
    #[error("{context}: {source}")]
    Io {
        /// What the driver was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A bug or broken invariant.
    #[error("internal: {0}")]
    Internal(String),
}

impl Error {
    /// Wraps an I/O error with what the driver was doing, for [`Error::Io`].
    pub fn io(context: impl Into<String>, source: impl Into<io::Error>) -> Self {
        Error::Io {
            context: context.into(),
            source: source.into(),
        }
    }

    /// For a step that failed after the object it builds became visible (renamed into place):
    /// a code the CO retries (Aborted), since a "final" code makes the external-provisioner
    /// stop tracking the call and can orphan the volume if the claim goes away meanwhile. The
    /// retry finds the object and finishes the step.
    pub fn after_visible(self) -> Error {
        match self {
            Error::Aborted(_) | Error::Unavailable(_) => self,
            other => Error::Aborted(format!("{other}; the volume exists, retry to finish")),
        }
    }

    /// The gRPC code this error maps to; also used as a metric label.
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::OutOfRange(_) => Code::OutOfRange,
            Error::Aborted(_) => Code::Aborted,
            Error::Unavailable(_) => Code::Unavailable,
            Error::Io { source, .. } => io_code(source),
            Error::Internal(_) => Code::Internal,
        }
    }
}

/// Maps an errno to the gRPC code a CO can act on: ENOSPC is retryable after cleanup, EROFS and
/// friends are preconditions, everything else is internal.
fn io_code(err: &io::Error) -> Code {
    match err.raw_os_error().map(rustix::io::Errno::from_raw_os_error) {
        Some(rustix::io::Errno::NOSPC) | Some(rustix::io::Errno::DQUOT) => Code::ResourceExhausted,
        Some(rustix::io::Errno::ROFS) | Some(rustix::io::Errno::BUSY) => Code::FailedPrecondition,
        Some(rustix::io::Errno::NOENT) => Code::NotFound,
        _ => match err.kind() {
            io::ErrorKind::NotFound => Code::NotFound,
            _ => Code::Internal,
        },
    }
}

/// Walk errors carry the path they happened at (relative to the walk's root); the message
/// names it and the code says what the CO can do.
impl From<hpp_fs::WalkError> for Error {
    fn from(e: hpp_fs::WalkError) -> Self {
        use hpp_fs::WalkError as W;
        match e {
            W::CrossesMount { .. } | W::TooDeep { .. } => Error::FailedPrecondition(e.to_string()),
            W::Moved { .. } => Error::Aborted(format!("{e}; retry")),
            W::NoSpace { .. } => Error::ResourceExhausted(e.to_string()),
            W::Io { op, path, source } => Error::io(format!("{op} {}", path.display()), source),
            other => Error::Internal(other.to_string()),
        }
    }
}

/// Quota backend errors: an unusable backend is a precondition, an impossible limit is out
/// of range, kernel errors keep their errno's code (EDQUOT/ENOSPC: ResourceExhausted).
impl From<hpp_fs::quota::QuotaError> for Error {
    fn from(e: hpp_fs::quota::QuotaError) -> Self {
        use hpp_fs::quota::QuotaError as Q;
        match e {
            Q::Io { op, source } => Error::io(op, source),
            Q::Unsupported(m) | Q::Refused(m) => Error::FailedPrecondition(m),
            Q::OutOfRange(m) => Error::OutOfRange(m),
            Q::Invalid(m) => Error::InvalidArgument(m),
            Q::Walk(w) => w.into(),
            other => Error::Internal(other.to_string()),
        }
    }
}

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        let code = err.code();
        let message = match &err {
            Error::InvalidArgument(m)
            | Error::NotFound(m)
            | Error::AlreadyExists(m)
            | Error::FailedPrecondition(m)
            | Error::ResourceExhausted(m)
            | Error::OutOfRange(m)
            | Error::Aborted(m)
            | Error::Unavailable(m)
            | Error::Internal(m) => m.clone(),
            Error::Io { .. } => err.to_string(),
        };
        Status::new(code, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_maps_to_a_specific_code() {
        let cases = [
            (Error::InvalidArgument("x".into()), Code::InvalidArgument),
            (Error::NotFound("x".into()), Code::NotFound),
            (Error::AlreadyExists("x".into()), Code::AlreadyExists),
            (Error::FailedPrecondition("x".into()), Code::FailedPrecondition),
            (Error::ResourceExhausted("x".into()), Code::ResourceExhausted),
            (Error::OutOfRange("x".into()), Code::OutOfRange),
            (Error::Aborted("x".into()), Code::Aborted),
            (Error::Unavailable("x".into()), Code::Unavailable),
            (Error::Internal("x".into()), Code::Internal),
            (
                Error::io("mkdir", io::Error::from_raw_os_error(28)),
                Code::ResourceExhausted,
            ),
            (
                Error::io("mkdir", io::Error::from_raw_os_error(30)),
                Code::FailedPrecondition,
            ),
            (Error::io("mkdir", io::Error::from_raw_os_error(5)), Code::Internal),
        ];
        for (err, code) in cases {
            let status = Status::from(err);
            assert_eq!(status.code(), code);
            assert_ne!(status.code(), Code::Unknown);
        }
    }

    #[test]
    fn a_failure_after_the_volume_is_visible_is_retried_not_final() {
        let eio = Error::io("syncing the pool directory", io::Error::from_raw_os_error(5)).after_visible();
        assert_eq!(eio.code(), Code::Aborted);
        assert!(eio.to_string().contains("syncing the pool directory"), "{eio}");
        let gone = Error::io("opening", io::Error::from_raw_os_error(2)).after_visible();
        assert_eq!(gone.code(), Code::Aborted);
        assert_eq!(Error::Unavailable("x".into()).after_visible().code(), Code::Unavailable);
    }

    #[test]
    fn io_errors_keep_their_context() {
        let status = Status::from(Error::io("creating volume dir", io::Error::from_raw_os_error(5)));
        assert!(status.message().contains("creating volume dir"), "{}", status.message());
    }
}
