//! What a volume operation does, on top of [`crate::pool`]: creating, deleting and listing
//! volumes ([`volumes`]), the journal that makes them durable ([`volume_journal`]), snapshots
//! and copies, sizes ([`sizing`], [`ledger`], [`expand`], [`modify`]), the trash ([`trash`]),
//! and mounting for publish ([`mount`]). Nothing here knows about gRPC beyond the CSI message
//! types ([`caps`]); the services in [`crate::service`] call these.

pub mod caps;
pub mod copy;
pub mod expand;
pub mod ledger;
pub mod modify;
pub mod mount;
pub mod sizing;
pub mod snapshots;
pub mod trash;
pub mod volume_journal;
pub mod volumes;
