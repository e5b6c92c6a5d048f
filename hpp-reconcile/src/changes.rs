//! What changed since the last pass, as the watches saw it: the objects of the steps' kinds
//! that changed, the Nodes that changed (labels, taints, readiness) or went away, whether a
//! PersistentVolume or a CSIStorageCapacity object changed, or "something else" (a relist, a
//! kind only a plugged-in step watches). A pass after changes to rendered objects or
//! Nodes only renders the parts those objects came from or that read those Nodes
//! ([`Pipeline::apply_changed`](crate::Pipeline)); anything else runs a full pass.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use hpp_api::HostPathProvisioner;
use kube::ResourceExt;

use crate::config::OperatorConfig;
use crate::facts::ClusterFacts;
use crate::object::ObjectKey;
use crate::pipeline::PartIndex;

/// Changes recorded by the watches, taken by the next pass.
#[derive(Debug, Default)]
pub struct ChangeLog {
    inner: Mutex<Recorded>,
}

#[derive(Debug, Default)]
struct Recorded {
    /// Whether watches feed the log (the controller runs): a reconcile called without them
    /// cannot know what changed, so its passes are full ones.
    watching: bool,
    objects: BTreeSet<ObjectKey>,
    nodes: BTreeSet<String>,
    storage: bool,
    everything: bool,
    /// Which part rendered each object, as of the last successful pass, for the CR and the
    /// inputs it was made with.
    index: Option<(String, u64, PartIndex)>,
}

impl Recorded {
    /// The next pass is a full one: what was recorded of single changes goes.
    fn everything(&mut self) {
        self.everything = true;
        self.objects.clear();
        self.nodes.clear();
        self.storage = false;
    }
}

/// What [`ChangeLog::begin`] took for one pass.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    watching: bool,
    changed: Changed,
    everything: bool,
    index: Option<(String, u64, PartIndex)>,
}

impl Taken {
    /// What a pass over `hpp` with `inputs` ([`pass_inputs`]) may limit itself to.
    pub(crate) fn scope(self, hpp: &HostPathProvisioner, inputs: u64) -> Scope {
        let uid = hpp.uid().unwrap_or_default();
        match self.index {
            Some((of, at, index)) if self.watching && !self.everything && of == uid && at == inputs => {
                Scope::Changed(self.changed, Box::new(index))
            }
            _ => Scope::Full,
        }
    }
}

/// What the next pass may limit itself to.
pub(crate) enum Scope {
    /// Everything: the first pass, a pass after a failure, a change of the CR's spec or of the
    /// configuration, or a change of something besides the rendered objects.
    Full,
    /// Only these rendered objects and Nodes changed; the index says where the objects came
    /// from.
    Changed(Changed, Box<PartIndex>),
}

/// What changed since the last pass, when a pass over parts can stand for a full one.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Changed {
    /// Rendered objects that changed or went away.
    pub objects: BTreeSet<ObjectKey>,
    /// Nodes (by name) whose labels, taints or readiness changed, or that were deleted.
    pub nodes: BTreeSet<String>,
    /// Whether a PersistentVolume or a CSIStorageCapacity object changed (see
    /// [`SubReconciler::parts_read_storage`](crate::SubReconciler::parts_read_storage)).
    pub storage: bool,
}

impl ChangeLog {
    /// Whether watches record changes from now on (the controller starts, or stops). Either
    /// way the next pass is a full one.
    pub fn watching(&self, on: bool) {
        if let Ok(mut r) = self.inner.lock() {
            r.watching = on;
            r.everything();
        }
    }

    /// A rendered object of one of the steps' kinds changed (or went away).
    pub fn object(&self, key: ObjectKey) {
        if let Ok(mut r) = self.inner.lock() {
            r.objects.insert(key);
        }
    }

    /// A Node's labels, taints or readiness changed, or it was deleted.
    pub fn node(&self, name: String) {
        if let Ok(mut r) = self.inner.lock() {
            r.nodes.insert(name);
        }
    }

    /// A PersistentVolume or a CSIStorageCapacity object changed (the pools' usage, node
    /// loss).
    pub fn storage(&self) {
        if let Ok(mut r) = self.inner.lock() {
            r.storage = true;
        }
    }

    /// Something else changed: the next pass is a full one.
    pub fn everything(&self) {
        if let Ok(mut r) = self.inner.lock() {
            r.everything();
        }
    }

    /// Takes what was recorded since the last pass, for a pass over `hpp` with `inputs`
    /// ([`pass_inputs`]).
    #[cfg(test)]
    pub(crate) fn take(&self, hpp: &HostPathProvisioner, inputs: u64) -> Scope {
        self.begin().scope(hpp, inputs)
    }

    /// Takes what was recorded since the last pass, before the pass reads the caches: a change
    /// recorded after that is left to the next pass, never used up by a pass that read the
    /// caches before it landed. [`Taken::scope`] then says what the pass may limit itself to.
    pub(crate) fn begin(&self) -> Taken {
        let Ok(mut r) = self.inner.lock() else {
            return Taken::default();
        };
        Taken {
            watching: r.watching,
            changed: Changed {
                objects: std::mem::take(&mut r.objects),
                nodes: std::mem::take(&mut r.nodes),
                storage: std::mem::take(&mut r.storage),
            },
            everything: std::mem::take(&mut r.everything),
            index: r.index.take(),
        }
    }

    /// Keeps the index a successful pass over `hpp` with `inputs` left.
    pub(crate) fn keep(&self, hpp: &HostPathProvisioner, inputs: u64, index: PartIndex) {
        if let Ok(mut r) = self.inner.lock() {
            r.index = Some((hpp.uid().unwrap_or_default(), inputs, index));
        }
    }

    /// Forgets the index (a deletion's cleanup, a failed pass): the next pass is a full one.
    pub(crate) fn forget(&self) {
        if let Ok(mut r) = self.inner.lock() {
            r.index = None;
        }
    }
}

/// A fingerprint of what a pass renders from besides the watched objects: the CR without its
/// status (its own status writes must not force a full pass), the configuration and the
/// optional APIs.
pub(crate) fn pass_inputs(hpp: &HostPathProvisioner, cfg: &OperatorConfig, facts: &ClusterFacts) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    hpp.metadata.uid.hash(&mut h);
    hpp.metadata.labels.hash(&mut h);
    hpp.metadata.annotations.hash(&mut h);
    hpp.metadata.finalizers.hash(&mut h);
    hpp.metadata.deletion_timestamp.is_some().hash(&mut h);
    serde_json::to_vec(&hpp.spec).unwrap_or_default().hash(&mut h);
    format!("{cfg:?}").hash(&mut h);
    facts.has_scc.hash(&mut h);
    facts.has_prometheus.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            kind: "apps/Deployment".into(),
            namespace: Some("hpp".into()),
            name: name.into(),
        }
    }

    fn cr(uid: &str) -> HostPathProvisioner {
        let mut hpp = HostPathProvisioner::new("hpp", Default::default());
        hpp.metadata.uid = Some(uid.into());
        hpp
    }

    #[test]
    fn a_pass_is_limited_only_after_a_successful_pass_over_the_same_inputs() {
        let log = ChangeLog::default();
        let hpp = cr("u1");
        log.keep(&hpp, 1, PartIndex::default());
        assert!(matches!(log.take(&hpp, 1), Scope::Full), "no watches, no way to know");
        log.watching(true);
        log.object(key("a"));
        assert!(matches!(log.take(&hpp, 1), Scope::Full), "no pass yet");
        log.keep(&hpp, 1, PartIndex::default());
        log.object(key("a"));
        log.object(key("b"));
        match log.take(&hpp, 1) {
            Scope::Changed(changed, _) => assert_eq!(changed.objects, [key("a"), key("b")].into()),
            Scope::Full => panic!("only rendered objects changed"),
        }
        // The index is taken by the pass; a pass that does not keep one (it failed) is
        // followed by a full one.
        assert!(matches!(log.take(&hpp, 1), Scope::Full));

        log.keep(&hpp, 1, PartIndex::default());
        assert!(matches!(log.take(&hpp, 2), Scope::Full), "other inputs");
        log.keep(&hpp, 1, PartIndex::default());
        assert!(matches!(log.take(&cr("u2"), 1), Scope::Full), "another CR");
        log.keep(&hpp, 1, PartIndex::default());
        log.object(key("a"));
        log.everything();
        assert!(matches!(log.take(&hpp, 1), Scope::Full), "something else changed");
        log.keep(&hpp, 1, PartIndex::default());
        log.forget();
        assert!(matches!(log.take(&hpp, 1), Scope::Full), "forgotten");
        // Nothing recorded (a requeue): a pass over no parts.
        log.keep(&hpp, 1, PartIndex::default());
        assert!(matches!(log.take(&hpp, 1), Scope::Changed(c, _) if c == Changed::default()));
        // A Node's change is kept by name, and dropped with everything else.
        log.keep(&hpp, 1, PartIndex::default());
        log.node("n1".into());
        log.object(key("a"));
        match log.take(&hpp, 1) {
            Scope::Changed(changed, _) => {
                assert_eq!(changed.nodes, ["n1".to_owned()].into());
                assert_eq!(changed.objects, [key("a")].into());
            }
            Scope::Full => panic!("only a node and a rendered object changed"),
        }
        log.keep(&hpp, 1, PartIndex::default());
        log.node("n1".into());
        log.everything();
        assert!(matches!(log.take(&hpp, 1), Scope::Full));
        // A PV: kept as a flag.
        log.keep(&hpp, 1, PartIndex::default());
        log.storage();
        assert!(matches!(log.take(&hpp, 1), Scope::Changed(c, _) if c.storage && c.objects.is_empty()));
        log.keep(&hpp, 1, PartIndex::default());
        log.watching(false);
        assert!(matches!(log.take(&hpp, 1), Scope::Full), "the watches stopped");
    }

    #[test]
    fn the_status_is_not_an_input_but_the_spec_is() {
        let cfg = OperatorConfig::default();
        let facts = ClusterFacts::default();
        let mut hpp = cr("u1");
        let before = pass_inputs(&hpp, &cfg, &facts);
        hpp.status = Some(Default::default());
        assert_eq!(pass_inputs(&hpp, &cfg, &facts), before);
        hpp.spec.image_pull_policy = Some("Always".into());
        assert_ne!(pass_inputs(&hpp, &cfg, &facts), before);
    }
}
