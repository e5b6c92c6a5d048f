//! The hpp CSI driver as an embeddable library.
//!
//! Serves the CSI Identity, Controller and Node services over tonic for node-local (or shared)
//! directory pools: a volume is the directory `<pool path>/<volume id>`. Wire-compatible with the
//! KubeVirt hostpath CSI driver so existing volumes are served unchanged.
