//! The non-CSI hostPath provisioner.
//!
//! Watches PersistentVolumeClaims for its provisioner name and answers them with hostPath
//! PersistentVolumes: node-local (KubeVirt legacy, single-node DIY) or on a shared filesystem
//! mounted at the same path on every node.
