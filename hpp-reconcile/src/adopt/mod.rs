//! Adoption: volumes another provisioner made (KubeVirt's legacy provisioner, rancher's
//! local-path-provisioner, OpenEBS LocalPV hostpath, torchbox's shared provisioner, hand-made
//! hostPath or local PVs) become volumes of hpp's CSI driver in place: the directory is not
//! copied, moved or renamed. `hpp-operator adopt` is the command; this is the library.
//!
//! - [`survey()`] (pure, over a [`Snapshot`] that [`read`] takes): for each Bound claim whose PV
//!   is not hpp's, the [`Source`] ([`source`]), node ([`placement`]), directory, the pool that
//!   holds it and the volume id it gets ([`pools`]), the StorageClass of the new objects, and
//!   every reason it cannot be adopted ([`refusal`]); adoptions an earlier run left unfinished
//!   are found from the annotations on their PVs ([`keys`]).
//! - [`adopt()`]: per claim, the [`steps`] (Retain the old PV, create the CSI PV, delete and
//!   re-create the claim bound to it, delete the old PV, finish), each decided from what the
//!   objects show, so a run that stops anywhere is finished by the next one, or undone when the
//!   claim became unadoptable before its old claim was deleted. An Event on each claim
//!   (`Adopted`, `AdoptionFailed`) and a [`Report`] with the summary line.
//!
//! **What a directory must be.** A volume of hpp's driver is `<pool dir>/<volume id>`, the pool
//! directory being `<spec.storagePools[].path>/csi` on the node (`<pathConfig.path>/csi` for a
//! `pathConfig` CR), and the driver finds it by name alone. A directory directly inside a pool
//! directory is adopted under its own name. Anything deeper, or a `pathConfig` CR's legacy
//! volume (`<pathConfig.path>/<pv>`, beside the pool directory), needs one rename on the node
//! (same filesystem: nothing is copied) before it can be adopted; the refusal says which
//! command, and the annotation [`keys::MOVED_TO`] on the old PV tells the next run where the
//! directory went (a PV's path cannot be changed). Deeper directories are not served where they
//! are because a volume id is one name (no `/`, by the driver's rules and KubeVirt's), and the
//! driver would list the parent as a volume of its own.
//!
//! **Sizes.** The driver records a volume's capacity in the extended attribute
//! `trusted.hpp.capacity` on the volume directory when it creates it. Adoption runs against the
//! API and never touches a node, so an adopted volume has no such record: the driver serves it
//! like any directory KubeVirt's driver made (the record only decides whether a CreateVolume
//! retried with another size is AlreadyExists, which never happens to an adopted volume), its
//! PV carries the old PV's capacity, and the first expansion of the claim records it. Pools
//! with a `quota` are refused: an adopted directory has no quota attached (no subvolume, no
//! project id, no image); cloning the adopted claim into such a pool gives a sized volume.

pub mod assess;
pub mod build;
mod error;
pub mod keys;
pub mod placement;
pub mod pools;
pub mod refusal;
pub mod report;
mod run;
pub mod source;
pub mod steps;
mod survey;

pub use error::AdoptError;
pub use refusal::{Reason, Refusal};
pub use report::{Report, Row, Status};
pub use run::{EVENT_CONTROLLER, REASON_ADOPTED, REASON_ADOPTION_FAILED, RunOptions, adopt};
pub use source::Source;
pub use survey::{Scope, Snapshot, Survey, Unit, read, survey};

/// Reads the cluster and surveys it: what [`adopt()`] would do, and what a dry run prints.
pub async fn plan(client: &kube::Client, scope: &Scope) -> Result<Survey, AdoptError> {
    let snapshot = read(client, scope).await?;
    survey(&snapshot, scope)
}
