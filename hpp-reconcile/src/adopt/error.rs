//! What stops a whole adoption run (a single claim's trouble is reported on its row instead).

/// Why a run could not start or go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdoptError {
    /// A call to the Kubernetes API failed.
    #[error("{action} {what}: {source}")]
    Kube {
        /// What was being done (`list`, `get`, ...).
        action: &'static str,
        /// Kind and name of the object(s).
        what: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// No HostPathProvisioner exists, so there are no pools to adopt into.
    #[error("no HostPathProvisioner exists: adopting needs its storage pools (install hpp and create the CR first)")]
    NoHostPathProvisioner,
    /// More than one HostPathProvisioner (the webhook allows one).
    #[error("{} HostPathProvisioners exist ({}); hpp serves one: delete the others", .0.len(), .0.join(", "))]
    SeveralHostPathProvisioners(Vec<String>),
    /// The CR's pools cannot be read.
    #[error("HostPathProvisioner {name}: {why}")]
    InvalidHostPathProvisioner {
        /// The CR's name.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// `--storage-class` does not name an hpp StorageClass.
    #[error("--storage-class {name}: {why}")]
    StorageClass {
        /// The name given.
        name: String,
        /// What is wrong.
        why: String,
    },
}

impl AdoptError {
    pub(crate) fn kube(action: &'static str, what: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let what = what.into();
        move |source| AdoptError::Kube { action, what, source }
    }
}
