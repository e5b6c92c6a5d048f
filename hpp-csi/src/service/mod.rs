//! What serves RPCs, on top of [`crate::ops`]: the state the services share ([`state`]), the
//! three CSI services ([`identity`], [`controller`], [`node`]), the RPC layer (spans, logs,
//! metrics: [`rpc_layer`]), the `:authority` fix for non-Go clients ([`authority`]), and the
//! background upkeep (pool health, trash purges: [`health`]).

pub mod authority;
pub mod controller;
pub mod health;
pub mod identity;
pub mod listing;
pub mod node;
pub mod pagination;
pub mod rpc_layer;
pub mod state;
