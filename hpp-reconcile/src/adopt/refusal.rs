//! Why a claim is not adopted: a stable reason (the table's and the Event's word) and a message
//! that says what to do about it.

use serde::Serialize;

/// The reason, stable for scripts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Reason {
    /// The claim or its PV is not Bound.
    NotBound,
    /// The claim is being deleted (by someone else).
    BeingDeleted,
    /// The PV is not a directory on a node (another CSI driver, NFS, ...).
    NotADirectory,
    /// A block volume: hpp volumes are directories.
    BlockVolume,
    /// The PV's path is not an absolute, normalised path.
    BadPath,
    /// No pool's directory holds the directory.
    NoPool,
    /// The directory is in a pool, or beside one, but needs a rename on the node first.
    MoveFirst,
    /// The directory is a pool directory or holds one.
    HoldsPool,
    /// Its name cannot be a volume id.
    InvalidVolumeId,
    /// The pool enforces sizes, which an adopted directory does not have.
    QuotaPool,
    /// The pool is node-local and the PV names no single node.
    NoNode,
    /// A ReadWriteMany (or ReadOnlyMany) volume used from several nodes, on a node-local pool.
    RwxAcrossNodes,
    /// hpp's CSI driver is not registered on the node.
    DriverNotOnNode,
    /// No hpp StorageClass serves the pool.
    NoStorageClass,
    /// Several hpp StorageClasses serve the pool.
    SeveralStorageClasses,
    /// `--storage-class` serves another pool.
    StorageClassOtherPool,
    /// Pods still use the claim.
    InUse,
    /// The claim asks for more than the PV holds: the new PV would not bind.
    RequestTooLarge,
    /// Another hpp PV already serves this volume id on that node.
    VolumeIdTaken,
    /// Another claim of this run maps to the same volume.
    SameVolume,
    /// A PV with the name the new PV needs exists and is not this adoption's.
    PvNameTaken,
}

/// A reason with its explanation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// The reason.
    pub reason: Reason,
    /// What is wrong and what to do, in words.
    pub message: String,
}

impl Refusal {
    /// A refusal for `reason`.
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.reason, self.message)
    }
}
