//! Names shared by every hpp component. They are wire contracts with existing KubeVirt
//! installations: changing one breaks an in-place upgrade.

/// API group of the `HostPathProvisioner` custom resource.
pub const GROUP: &str = "hostpathprovisioner.kubevirt.io";
/// Kind of the custom resource.
pub const KIND: &str = "HostPathProvisioner";
/// Plural resource name of the custom resource.
pub const PLURAL: &str = "hostpathprovisioners";
/// Name of the CustomResourceDefinition object.
pub const CRD_NAME: &str = "hostpathprovisioners.hostpathprovisioner.kubevirt.io";

/// CSI driver name registered with the kubelet and used as the StorageClass provisioner.
pub const DRIVER_NAME: &str = "kubevirt.io.hostpath-provisioner";
/// Provisioner name of the non-CSI (legacy) provisioner.
pub const LEGACY_PROVISIONER_NAME: &str = "kubevirt.io/hostpath-provisioner";
/// Topology segment key published by `NodeGetInfo` and honoured by `CreateVolume`.
pub const TOPOLOGY_KEY: &str = "topology.hostpath.csi/node";

/// StorageClass / VolumeSnapshotClass parameter that selects the storage pool.
pub const PARAM_STORAGE_POOL: &str = "storagePool";
/// Parameter the operator sets on the RWX overlay StorageClass; the driver ignores it.
pub const PARAM_OVERLAY_CSI: &str = "overlayCSI";
/// StorageClass parameter: what the operator does with the claims of this class pinned to a
/// node that is lost (deleted, or tainted out-of-service): `Retain` (default, nothing) or
/// `Recreate` (after the grace period, delete the claim and its PV so a StatefulSet re-creates
/// the claim on another node, with an empty volume). CreateVolume copies it into the volume
/// attributes, which the operator reads when the class no longer exists.
pub const PARAM_NODE_LOSS_POLICY: &str = "nodeLossPolicy";
/// StorageClass parameter: how long a node must stay lost before `nodeLossPolicy: Recreate`
/// releases its claims, a duration such as `90s`, `5m` or `1h` (default `5m`), measured from
/// when the operator first saw the loss.
pub const PARAM_NODE_LOSS_GRACE_PERIOD: &str = "nodeLossGracePeriod";
/// [`PARAM_NODE_LOSS_POLICY`] value: leave the claims alone (the default).
pub const NODE_LOSS_POLICY_RETAIN: &str = "Retain";
/// [`PARAM_NODE_LOSS_POLICY`] value: release the claims after the grace period.
pub const NODE_LOSS_POLICY_RECREATE: &str = "Recreate";
/// Grace period of [`PARAM_NODE_LOSS_GRACE_PERIOD`] when the class does not set one.
pub const DEFAULT_NODE_LOSS_GRACE_PERIOD: &str = "5m";
/// Node taint of Kubernetes' non-graceful node shutdown: the node is down and will not come
/// back on its own; any effect counts as a lost node.
pub const TAINT_OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";
/// Finalizer the external provisioner (csi-provisioner) puts on the PVs it provisions and
/// removes after DeleteVolume; a lost node's provisioner never removes it.
pub const FINALIZER_EXTERNAL_PROVISIONER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
/// Pool used when a request names no pool (the `pathConfig` pool of a legacy CR).
pub const DEFAULT_POOL_NAME: &str = "legacy";

/// Snapshot provider that clones files copy-on-write where the filesystem supports it.
pub const SNAPSHOT_PROVIDER_REFLINK: &str = "reflink";
/// Snapshot provider that takes read-only btrfs subvolume snapshots (instant) of volumes that
/// are subvolumes (pools with `quota: btrfs`); other volumes fall back to reflink copies.
pub const SNAPSHOT_PROVIDER_BTRFS: &str = "btrfs";
/// Every snapshot provider hpp implements.
pub const KNOWN_SNAPSHOT_PROVIDERS: &[&str] = &[SNAPSHOT_PROVIDER_REFLINK, SNAPSHOT_PROVIDER_BTRFS];

/// Feature gate that deploys the csi-snapshotter sidecar and its RBAC (when a pool has a
/// `snapshotProvider`).
pub const FEATURE_GATE_SNAPSHOTTING: &str = "Snapshotting";
/// Every feature gate hpp understands.
pub const KNOWN_FEATURE_GATES: &[&str] = &[FEATURE_GATE_SNAPSHOTTING];

/// PVC annotation of the legacy provisioner: provision only on this node.
pub const ANNOTATION_PROVISION_ON_NODE: &str = "kubevirt.io/provisionOnNode";
/// PVC annotation set by the scheduler for WaitForFirstConsumer claims.
pub const ANNOTATION_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// PV annotation recording which provisioner instance created the volume.
pub const ANNOTATION_PROVISIONER_IDENTITY: &str = "hostPathProvisionerIdentity";
/// PV annotation written by external provisioners.
pub const ANNOTATION_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// PVC annotation naming the provisioner that should handle the claim (GA key).
pub const ANNOTATION_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// PVC annotation naming the provisioner that should handle the claim (beta key).
pub const ANNOTATION_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";

/// Finalizer the operator keeps on the CR until every owned object is cleaned up.
pub const FINALIZER: &str = "finalizer.delete.hostpath-provisioner";

/// Label every owned object carries; the value is [`LABEL_APP_VALUE`].
pub const LABEL_APP: &str = "k8s-app";
/// Value of [`LABEL_APP`].
pub const LABEL_APP_VALUE: &str = "hostpath-provisioner";
/// Standard managed-by label.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`LABEL_MANAGED_BY`] on objects the operator owns.
pub const LABEL_MANAGED_BY_VALUE: &str = "hostpath-provisioner-operator";
/// Standard component label.
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
/// Value of [`LABEL_COMPONENT`].
pub const LABEL_COMPONENT_VALUE: &str = "storage";
/// Standard part-of label (copied from `INSTALLER_PART_OF_LABEL` when set).
pub const LABEL_PART_OF: &str = "app.kubernetes.io/part-of";
/// Standard version label (copied from `INSTALLER_VERSION_LABEL` when set).
pub const LABEL_VERSION: &str = "app.kubernetes.io/version";
/// Label selecting the pods Prometheus scrapes.
pub const LABEL_PROMETHEUS: &str = "prometheus.hostpathprovisioner.kubevirt.io";
/// Label on pvcTemplate pool PVCs and mounter Deployments: `<pool>-hpp`.
pub const LABEL_STORAGE_POOL: &str = "kubevirt.io.hostpath-provisioner/storagePool";
/// Selector label of a pool's mounter Deployments: `<pool>-hpp`.
pub const LABEL_HPP_POOL: &str = "hpp-pool";

/// Annotation on a CR that lets the webhook allow deleting it while hpp PVs still exist.
pub const ANNOTATION_FORCE_DELETE: &str = "hostpathprovisioner.kubevirt.io/force-delete";
/// Annotation that carries the v1beta1 fields v1alpha1 cannot express, so conversion is lossless.
pub const ANNOTATION_CONVERSION_DATA: &str = "hostpathprovisioner.kubevirt.io/v1beta1-data";
/// Most storage pools a HostPathProvisioner may list (CRD `maxItems` and validation). Each pool
/// is a host mount in the CSI DaemonSet; 64 is far beyond any real node layout.
pub const MAX_STORAGE_POOLS: usize = 64;
/// Most feature gates a HostPathProvisioner may list.
pub const MAX_FEATURE_GATES: usize = 16;
/// Most field errors a validation reports; the rest are counted ("and N more").
pub const MAX_REPORTED_ERRORS: usize = 20;
