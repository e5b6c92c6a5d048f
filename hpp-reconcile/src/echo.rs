//! Telling the operator's own status writes apart when they come back as watch events of the
//! CR. Without this, every status write started one more pass (its echo): at 1,000 nodes that
//! is a pass of about 8 ms for each status change, to find that nothing changed.
//!
//! A CR event triggers a pass when anything a pass reads changed: the CR's identity, spec
//! (its `generation`), deletion, labels, annotations, finalizers or owners; or when its status
//! is not one this process wrote or accepted. A status someone else wrote triggers, so the
//! next pass puts it right.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::sync::Mutex;

use hpp_api::{HostPathProvisioner, HostPathProvisionerStatus};
use kube::ResourceExt;

/// The status each CR (by name) was last written with or found right, as a hash.
#[derive(Debug, Default)]
pub(crate) struct OwnStatus {
    by_name: Mutex<HashMap<String, Noted>>,
}

#[derive(Debug)]
struct Noted {
    /// The CR's `resourceVersion` when the status was accepted as found (`None`: written).
    resource_version: Option<String>,
    hash: u64,
}

impl OwnStatus {
    /// Notes that `status` is about to be written to CR `name` (before the write, so an echo
    /// that arrives before the write call returns is known).
    pub(crate) fn note(&self, name: &str, status: &HostPathProvisionerStatus) {
        let hash = status_hash(Some(status));
        if let Ok(mut by_name) = self.by_name.lock() {
            by_name.insert(
                name.to_owned(),
                Noted {
                    resource_version: None,
                    hash,
                },
            );
        }
    }

    /// Notes that the status `hpp` has is right as it is: a pass found nothing to write.
    /// Hashes it only when the CR changed since it was last accepted.
    pub(crate) fn accept(&self, hpp: &HostPathProvisioner) {
        let name = hpp.name_any();
        let version = hpp.resource_version();
        let known = |by_name: &HashMap<String, Noted>| {
            version.is_some() && by_name.get(&name).is_some_and(|n| n.resource_version == version)
        };
        if self.by_name.lock().map(|by_name| known(&by_name)).unwrap_or(true) {
            return;
        }
        // Hashed without the lock: the filter takes it for every event of the CR.
        let hash = status_hash(hpp.status.as_ref());
        if let Ok(mut by_name) = self.by_name.lock() {
            by_name.insert(
                name,
                Noted {
                    resource_version: version,
                    hash,
                },
            );
        }
    }

    /// Forgets CR `name` (it is gone).
    pub(crate) fn forget(&self, name: &str) {
        if let Ok(mut by_name) = self.by_name.lock() {
            by_name.remove(name);
        }
    }

    fn is_own(&self, hpp: &HostPathProvisioner) -> bool {
        let hash = status_hash(hpp.status.as_ref());
        let Ok(by_name) = self.by_name.lock() else { return false };
        by_name
            .get(hpp.metadata.name.as_deref().unwrap_or_default())
            .is_some_and(|n| n.hash == hash)
    }
}

/// The controller's filter of CR watch events: lets through those that should start a pass.
#[derive(Debug, Default)]
pub(crate) struct EchoFilter {
    /// The fingerprint of each CR's last event (by name).
    seen: HashMap<String, u64>,
}

impl EchoFilter {
    /// Whether this event of `hpp` starts a pass: its metadata fingerprint changed since its
    /// last event, or its status is not one `own` knows.
    pub(crate) fn passes(&mut self, hpp: &HostPathProvisioner, own: &OwnStatus) -> bool {
        let fingerprint = metadata_fingerprint(hpp);
        let changed = self.seen.insert(hpp.name_any(), fingerprint) != Some(fingerprint);
        changed || !own.is_own(hpp)
    }
}

/// Fingerprint of what a pass reads from a CR besides its status (`resourceVersion` and
/// `managedFields` change with every write and are left out).
fn metadata_fingerprint(hpp: &HostPathProvisioner) -> u64 {
    let meta = &hpp.metadata;
    let mut h = DefaultHasher::new();
    meta.uid.hash(&mut h);
    meta.generation.hash(&mut h);
    meta.deletion_timestamp.as_ref().map(|t| t.0.to_string()).hash(&mut h);
    hpp.labels().hash(&mut h);
    hpp.annotations().hash(&mut h);
    hpp.finalizers().hash(&mut h);
    for owner in hpp.owner_references() {
        owner.uid.hash(&mut h);
    }
    h.finish()
}

/// Hash of a status's JSON form (its types have no `Hash`; serialising streams into the hasher
/// without building the text).
fn status_hash(status: Option<&HostPathProvisionerStatus>) -> u64 {
    struct HashWriter(DefaultHasher);
    impl io::Write for HashWriter {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.write(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut w = HashWriter(DefaultHasher::new());
    // Serialising these types cannot fail (plain data, string keys); if it ever did, the
    // partial hash would only make the status look foreign: one more pass.
    let _ = serde_json::to_writer(&mut w, &status);
    w.0.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpp_api::v1beta1::{Condition, HostPathProvisionerSpec};

    const NAME: &str = "hostpath-provisioner";

    fn cr(status: Option<HostPathProvisionerStatus>, version: u32) -> HostPathProvisioner {
        let mut hpp = HostPathProvisioner::new(NAME, HostPathProvisionerSpec::default());
        hpp.metadata.uid = Some("u1".into());
        hpp.metadata.generation = Some(1);
        hpp.metadata.resource_version = Some(version.to_string());
        hpp.status = status;
        hpp
    }

    fn status(version: &str) -> HostPathProvisionerStatus {
        HostPathProvisionerStatus {
            observed_version: Some(version.into()),
            conditions: vec![Condition::default()],
            ..Default::default()
        }
    }

    #[test]
    fn the_echo_of_an_own_status_write_starts_no_pass() {
        let own = OwnStatus::default();
        let mut filter = EchoFilter::default();
        assert!(filter.passes(&cr(Some(status("v1")), 10), &own), "first seen");
        own.note(NAME, &status("v2"));
        assert!(!filter.passes(&cr(Some(status("v2")), 11), &own), "the echo");
        own.note(NAME, &status("v3"));
        assert!(!filter.passes(&cr(Some(status("v3")), 12), &own), "the next echo");
    }

    #[test]
    fn a_status_written_by_someone_else_starts_a_pass_and_the_write_back_does_not() {
        let own = OwnStatus::default();
        let mut filter = EchoFilter::default();
        own.note(NAME, &status("v1"));
        assert!(filter.passes(&cr(Some(status("v1")), 10), &own), "first seen");
        assert!(filter.passes(&cr(Some(status("edited")), 11), &own), "an edit");
        assert!(filter.passes(&cr(None, 12), &own), "status removed");
        own.note(NAME, &status("v1"));
        assert!(!filter.passes(&cr(Some(status("v1")), 13), &own), "written back");
    }

    #[test]
    fn a_status_accepted_as_found_is_own() {
        let own = OwnStatus::default();
        let mut filter = EchoFilter::default();
        let found = cr(Some(status("v1")), 10);
        assert!(filter.passes(&found, &own), "first seen");
        own.accept(&found);
        // Another event at a later version (say a label of ours went and came back).
        assert!(!filter.passes(&cr(Some(status("v1")), 11), &own));
        // Accepting again at the same version does not hash again; the note stays.
        let mut same_version = found.clone();
        same_version.status = Some(status("ignored: same version"));
        own.accept(&same_version);
        assert!(!filter.passes(&cr(Some(status("v1")), 12), &own));
    }

    #[test]
    fn spec_deletion_metadata_and_identity_changes_start_a_pass() {
        let own = OwnStatus::default();
        own.note(NAME, &status("v1"));
        let base = cr(Some(status("v1")), 10);
        let changes: Vec<fn(&mut HostPathProvisioner)> = vec![
            |h| h.metadata.generation = Some(2),
            |h| h.metadata.uid = Some("u2".into()),
            |h| {
                h.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ))
            },
            |h| h.metadata.finalizers = Some(vec![hpp_api::constants::FINALIZER.into()]),
            |h| h.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into()),
            |h| h.metadata.annotations = Some([("a".to_owned(), "b".to_owned())].into()),
        ];
        for (i, change) in changes.into_iter().enumerate() {
            let mut filter = EchoFilter::default();
            assert!(filter.passes(&base, &own));
            let mut changed = base.clone();
            change(&mut changed);
            assert!(filter.passes(&changed, &own), "change {i}");
            assert!(!filter.passes(&changed, &own), "change {i} seen again");
        }
    }

    #[test]
    fn a_forgotten_cr_has_no_own_status() {
        let own = OwnStatus::default();
        let mut filter = EchoFilter::default();
        own.note(NAME, &status("v1"));
        assert!(filter.passes(&cr(Some(status("v1")), 10), &own));
        own.forget(NAME);
        assert!(filter.passes(&cr(Some(status("v1")), 11), &own));
    }
}
