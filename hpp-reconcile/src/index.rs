//! Indexes a step keeps over a watched kind, fed by the controller's watch events.
//!
//! A step that needs a question answered about many objects on every pass ("which
//! PersistentVolumes are pinned to this node?") would otherwise scan a whole watch cache each
//! pass. With a [`WatchIndex`] it keeps exactly the fields it needs, updated per event (O(1)
//! per change), and a pass asks the index instead. The controller feeds every index a step
//! returns from [`SubReconciler::indexes`](crate::SubReconciler::indexes) from the same watch
//! (and after the same trimming) as the cache of that kind and selector; without a running
//! controller (tests calling `reconcile`) an index never becomes ready and the step reads the
//! API instead, as the caches do.

use kube::api::DynamicObject;
use kube::runtime::watcher::Event;

/// An index over one watched kind and label selector.
///
/// Relists (`Init`, `InitApply`…, `InitDone`) must replace the indexed set atomically at
/// `InitDone`, as the reflector's store does, so objects deleted while the watch was down leave
/// the index too.
pub trait WatchIndex: Send + Sync {
    /// Applies one watch event. Returns whether the index changed in a way its step must act
    /// on: the controller then runs a pass even when the cache's own trigger filter (which
    /// suppresses, for example, deletions of objects whose watched fields did not change)
    /// would not.
    fn apply(&self, event: &Event<DynamicObject>) -> bool;

    /// Whether the index holds a complete listing (it has seen an `InitDone`).
    fn is_ready(&self) -> bool;
}
