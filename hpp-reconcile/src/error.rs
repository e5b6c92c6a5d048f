//! The one error type of the operator library, with a bounded category for metric labels and
//! Event reasons (never the free-form message, which would explode label cardinality).

use kube::runtime::finalizer;

/// Everything a reconcile can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A call to the Kubernetes API failed.
    #[error("{action} {what}: {source}")]
    Kube {
        /// What we were doing (`apply`, `get`, `delete`, ...).
        action: &'static str,
        /// Kind/name of the object.
        what: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// An object could not be converted to or from JSON.
    #[error("serialize {what}: {source}")]
    Serialize {
        /// Kind/name of the object.
        what: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// The CR asks for something the operator cannot build.
    #[error("invalid HostPathProvisioner: {0}")]
    InvalidSpec(String),
    /// The running operator is older than the version that last completed a deployment.
    #[error("operator downgraded from {from} to {to}, will not reconcile")]
    Downgrade {
        /// Version recorded in `status.observedVersion`.
        from: String,
        /// Version of this operator.
        to: String,
    },
    /// The volume audit could not make its report token (no secure random source).
    #[error("volume audit: {0}")]
    VolumeAudit(String),
    /// Deletion is waiting for cleanup Jobs or mounter Deployments to finish.
    #[error("cleanup in progress: {0}")]
    CleanupPending(String),
    /// A step failed in a way of its own (a call outside Kubernetes, a check it makes), made
    /// with [`Error::other`]. The operator treats it like any failed pass: the CR's status
    /// turns Degraded with this message, a Warning Event with reason `StepFailed` is
    /// published, and the pass is retried with exponential backoff (1 s doubling to 5 min).
    #[error("step {step}: {source}")]
    Other {
        /// Name of the failing step.
        step: String,
        /// What went wrong.
        #[source]
        source: BoxError,
    },
    /// A step wants a namespaced object outside the operator's namespace, or a namespaced
    /// object without a namespace: the operator watches and sweeps owned objects only in its
    /// own namespace, so such an object would never be repaired or deleted.
    #[error(
        "step {step} wants {object}, outside the operator's namespace {namespace}: a step owns \
         namespaced objects in the operator's namespace only (they are watched and swept there alone); \
         create the object in {namespace}, make it cluster-scoped, or change it from `act` without owning it"
    )]
    ForeignNamespace {
        /// Name of the step.
        step: String,
        /// Kind, namespace and name of the object.
        object: String,
        /// The operator's namespace.
        namespace: String,
    },
    /// [`DesiredObject::edit`](crate::DesiredObject::edit) was asked for another kind than
    /// the object's.
    #[error("cannot edit {object} as {expected}: its kind is {actual}")]
    KindMismatch {
        /// Kind, namespace and name of the object.
        object: String,
        /// The kind the edit expected (`group/version/Kind`).
        expected: String,
        /// The object's kind (`group/version/Kind`).
        actual: String,
    },
    /// A pipeline edit named a missing step or added a second step of one name.
    #[error("pipeline: {0}")]
    Pipeline(#[from] crate::pipeline::PipelineError),
    /// The finalizer helper failed (boxed to break the type cycle).
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
}

/// Any error of an embedder's own, as [`Error::Other`] carries it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Short alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A bounded, stable label: safe as a Prometheus label value and as an Event reason suffix.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube { source, .. } => match source {
                kube::Error::Api(status) if status.code == 409 => "conflict",
                kube::Error::Api(status) if status.code == 403 => "forbidden",
                kube::Error::Api(status) if status.code == 404 => "not_found",
                kube::Error::Api(status) if status.code == 422 || status.code == 400 => "invalid",
                kube::Error::Api(status) if status.code >= 500 => "api_unavailable",
                kube::Error::Api(_) => "api",
                kube::Error::HyperError(_) | kube::Error::Service(_) => "api_unavailable",
                _ => "client",
            },
            Error::Serialize { .. } => "serialize",
            Error::InvalidSpec(_) => "invalid_spec",
            Error::Downgrade { .. } => "downgrade",
            Error::CleanupPending(_) => "cleanup_pending",
            Error::VolumeAudit(_) => "volume_audit",
            Error::Pipeline(_) => "pipeline",
            Error::Other { .. } => "step_failed",
            Error::ForeignNamespace { .. } => "foreign_namespace",
            Error::KindMismatch { .. } => "kind_mismatch",
            Error::Finalizer(inner) => match inner.as_ref() {
                finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e.category(),
                _ => "finalizer",
            },
        }
    }

    /// The category as a CamelCase Event reason (`api_unavailable` → `ApiUnavailable`).
    pub fn event_reason(&self) -> String {
        self.category()
            .split('_')
            .map(|w| {
                let mut c = w.chars();
                c.next()
                    .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                    .unwrap_or_default()
            })
            .collect()
    }

    /// Builds a [`Error::Kube`] from a client error.
    pub fn kube(action: &'static str, what: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            action,
            what: what.into(),
            source,
        }
    }

    /// An [`Error::Other`]: step `step` failed with `source`, any error (or message) of the
    /// embedder's own: `Error::other(self.name(), e)` or `Error::other("my-step", "no quota left")`.
    pub fn other(step: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Other {
            step: step.into(),
            source: source.into(),
        }
    }

    /// The error itself, or the one the finalizer helper wrapped when applying or cleaning up
    /// failed: what retry decisions look at.
    pub fn root(&self) -> &Error {
        match self {
            Error::Finalizer(inner) => match inner.as_ref() {
                finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e.root(),
                _ => self,
            },
            other => other,
        }
    }
}

impl From<finalizer::Error<Error>> for Error {
    fn from(e: finalizer::Error<Error>) -> Self {
        Error::Finalizer(Box::new(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> Error {
        let status = kube::core::Status::failure("boom", "Reason").with_code(code);
        Error::kube("get", "x", kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn categories_are_bounded_and_stable() {
        assert_eq!(api_error(409).category(), "conflict");
        assert_eq!(api_error(503).category(), "api_unavailable");
        assert_eq!(api_error(403).category(), "forbidden");
        assert_eq!(Error::InvalidSpec("x".into()).category(), "invalid_spec");
        let down = Error::Downgrade {
            from: "2".into(),
            to: "1".into(),
        };
        assert_eq!(down.category(), "downgrade");
        assert_eq!(down.to_string(), "operator downgraded from 2 to 1, will not reconcile");
        let wrapped: Error = finalizer::Error::CleanupFailed(Error::CleanupPending("jobs".into())).into();
        assert_eq!(wrapped.category(), "cleanup_pending");
        assert_eq!(wrapped.event_reason(), "CleanupPending");
        assert_eq!(api_error(500).event_reason(), "ApiUnavailable");
        assert!(matches!(wrapped.root(), Error::CleanupPending(_)));
    }

    #[test]
    fn an_embedders_error_keeps_its_source_and_names_the_step() {
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "inventory service timed out");
        let e = Error::other("site-inventory", io);
        assert_eq!(e.to_string(), "step site-inventory: inventory service timed out");
        assert_eq!(e.category(), "step_failed");
        assert_eq!(e.event_reason(), "StepFailed");
        let source = std::error::Error::source(&e).unwrap();
        assert!(
            source.downcast_ref::<std::io::Error>().is_some(),
            "the source stays typed"
        );
        let plain = Error::other("site-inventory", "no quota left");
        assert_eq!(plain.to_string(), "step site-inventory: no quota left");
    }
}
