//! How one provisioner instance is configured: which of the three classic provisioners it
//! replaces, its name, node and base directory.

use std::path::PathBuf;

use hpp_api::constants::LEGACY_PROVISIONER_NAME;

/// PV annotation recording the base directory the volume was created under, so deletion can
/// confine itself to it even when the StorageClass is gone.
pub const ANNOTATION_BASE_DIR: &str = "hostpathprovisioner.kubevirt.io/legacy-base-dir";
/// PV annotation: `"true"` when the directory is to be renamed to `archived-…` instead of removed.
pub const ANNOTATION_ARCHIVE_ON_DELETE: &str = "hostpathprovisioner.kubevirt.io/archive-on-delete";
/// PV annotation the classic shared-filesystem provisioner (`torchbox.com/hostpath`) used for
/// its identity instead of `hostPathProvisionerIdentity`; read on deletion, written in shared mode.
pub const ANNOTATION_TORCHBOX_IDENTITY: &str = "torchbox.com/hostpath-provisioner-id";
/// Prefix of archived directories.
pub const ARCHIVE_PREFIX: &str = "archived-";
/// Provisioner name the classic shared-filesystem provisioner used.
pub const SHARED_DEFAULT_NAME: &str = "torchbox.com/hostpath";
/// Provisioner name the classic single-node provisioner used.
pub const SINGLE_NODE_DEFAULT_NAME: &str = "hostpath";
/// Lease used by shared mode for leader election.
pub const DEFAULT_LEASE_NAME: &str = "hpp-provisioner-shared";

/// Which classic provisioner this instance stands in for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// `kubevirt.io/hostpath-provisioner`: one instance per node, node-local directories.
    Kubevirt,
    /// The single-node "dynamic hostPath provisioner" of DIY clusters.
    SingleNode,
    /// One directory tree on a network filesystem mounted on every node; one active instance.
    Shared,
}

impl Mode {
    /// Stable lower-case name for metric labels and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Kubevirt => "kubevirt",
            Mode::SingleNode => "single-node",
            Mode::Shared => "shared",
        }
    }

    /// Whether volumes live on one node's disk (PVs get node affinity).
    pub fn is_node_local(self) -> bool {
        !matches!(self, Mode::Shared)
    }

    /// Provisioner name each classic provisioner registered, used when none is configured.
    pub fn default_provisioner_name(self) -> &'static str {
        match self {
            Mode::Kubevirt => LEGACY_PROVISIONER_NAME,
            Mode::SingleNode => SINGLE_NODE_DEFAULT_NAME,
            Mode::Shared => SHARED_DEFAULT_NAME,
        }
    }

    /// Default directory mode. KubeVirt's provisioner created 0777 directories (umask 0) and
    /// VMs run as qemu (uid 107) on hostPath volumes, which ignore `fsGroup`; keeping 0777 there
    /// avoids breaking existing VMs on upgrade. The other modes default to 0770.
    pub fn default_dir_mode(self) -> u32 {
        match self {
            Mode::Kubevirt => 0o777,
            Mode::SingleNode | Mode::Shared => 0o770,
        }
    }

    /// Directory-name template each classic provisioner effectively used.
    pub fn default_template(self, use_naming_prefix: bool) -> &'static str {
        match self {
            Mode::Kubevirt if use_naming_prefix => "{claim}-{pv}",
            Mode::Kubevirt => "{pv}",
            Mode::SingleNode => "{namespace}-{claim}-{pv}",
            Mode::Shared => "{pv}",
        }
    }
}

/// Reclaim policy forced on every PV, overriding the StorageClass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReclaimOverride {
    /// Always `Retain`: directories are kept when the claim goes.
    Retain,
    /// Always `Delete`.
    Delete,
}

impl ReclaimOverride {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ReclaimOverride::Retain => "Retain",
            ReclaimOverride::Delete => "Delete",
        }
    }
}

/// Everything one instance needs to decide and act.
#[derive(Clone, Debug)]
pub struct ProvisionerConfig {
    /// Which classic provisioner this replaces.
    pub mode: Mode,
    /// Provisioner name matched against StorageClasses and claim annotations.
    pub provisioner_name: String,
    /// Node this instance runs on (required in KubeVirt mode; optional in single-node mode).
    pub node_name: Option<String>,
    /// Base directory of node-local modes (`PV_DIR`). Shared mode takes it from the
    /// StorageClass parameter `pvDir` and uses this only as a fallback.
    pub pv_dir: Option<PathBuf>,
    /// KubeVirt `USE_NAMING_PREFIX`: directory `<claim>-<pv>` instead of `<pv>`.
    pub use_naming_prefix: bool,
    /// Forces the reclaim policy of new PVs (the classic `PV_RECLAIM_POLICY`).
    pub reclaim_override: Option<ReclaimOverride>,
    /// Value written to `hostPathProvisionerIdentity`; deletion requires it to match.
    pub identity: String,
    /// Extra identity values accepted on deletion (PVs written by the original provisioner).
    pub accepted_identities: Vec<String>,
    /// Quota backend of the node-local base directory (`pv_dir`): volumes made there are
    /// limited to their claim's request, as the CSI driver's are. `None`: plain directories,
    /// as the classic provisioner made them. Never used for shared mode's per-class bases.
    pub quota: Option<std::sync::Arc<dyn hpp_fs::quota::QuotaBackend>>,
    /// Released volumes go to `<base>/.hpp-trash` for this long instead of being removed
    /// (`None`: removed at once, as the classic provisioners do). A class's `archiveOnDelete`
    /// still archives instead.
    pub trash: Option<hpp_fs::trash::Settings>,
}

impl ProvisionerConfig {
    /// A configuration with the defaults of `mode`; the identity defaults as the original did:
    /// the provisioner name for KubeVirt and shared mode, the node name for single-node mode.
    pub fn new(mode: Mode, node_name: Option<String>, pv_dir: Option<PathBuf>) -> Self {
        let provisioner_name = mode.default_provisioner_name().to_owned();
        let identity = match (mode, &node_name) {
            (Mode::SingleNode, Some(node)) => node.clone(),
            _ => provisioner_name.clone(),
        };
        ProvisionerConfig {
            mode,
            provisioner_name,
            node_name,
            pv_dir,
            use_naming_prefix: false,
            reclaim_override: None,
            identity,
            accepted_identities: Vec::new(),
            quota: None,
            trash: None,
        }
    }

    /// The quota backend for volumes under `base`: the configured one when `base` is the
    /// node-local `pv_dir`, else none.
    pub fn quota_for(&self, base: &std::path::Path) -> Option<std::sync::Arc<dyn hpp_fs::quota::QuotaBackend>> {
        match (&self.quota, &self.pv_dir) {
            (Some(q), Some(dir)) if self.mode != Mode::Shared && dir == base => Some(q.clone()),
            _ => None,
        }
    }

    /// Checks the combination once at start-up so decisions never meet an impossible setup.
    pub fn validate(&self) -> Result<(), crate::Error> {
        let err = |m: &str| Err(crate::Error::Config(m.to_owned()));
        if self.provisioner_name.is_empty() {
            return err("the provisioner name is empty");
        }
        if self.mode == Mode::Kubevirt && self.node_name.as_deref().unwrap_or("").is_empty() {
            return err("KubeVirt mode needs NODE_NAME");
        }
        if self.mode.is_node_local() && self.pv_dir.is_none() {
            return err("node-local modes need PV_DIR");
        }
        if let Some(dir) = &self.pv_dir
            && (!dir.is_absolute() || dir.parent().is_none())
        {
            return err("PV_DIR must be an absolute path other than /");
        }
        Ok(())
    }

    /// Whether a PV identity annotation value belongs to this instance.
    pub fn owns_identity(&self, identity: &str) -> bool {
        identity == self.identity || self.accepted_identities.iter().any(|i| i == identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubevirt_needs_node_and_dir() {
        let cfg = ProvisionerConfig::new(Mode::Kubevirt, None, Some("/var/hpvolumes".into()));
        assert!(cfg.validate().is_err());
        let cfg = ProvisionerConfig::new(Mode::Kubevirt, Some("n1".into()), None);
        assert!(cfg.validate().is_err());
        let cfg = ProvisionerConfig::new(Mode::Kubevirt, Some("n1".into()), Some("/var/hpvolumes".into()));
        assert!(cfg.validate().is_ok());
        assert_eq!(cfg.identity, LEGACY_PROVISIONER_NAME);
    }

    #[test]
    fn root_and_relative_base_dirs_are_rejected() {
        for dir in ["/", "relative/dir"] {
            let cfg = ProvisionerConfig::new(Mode::SingleNode, None, Some(dir.into()));
            assert!(cfg.validate().is_err(), "{dir}");
        }
    }

    #[test]
    fn shared_mode_needs_no_dir_and_single_node_identity_is_the_node() {
        let cfg = ProvisionerConfig::new(Mode::Shared, None, None);
        assert!(cfg.validate().is_ok());
        assert_eq!(cfg.provisioner_name, SHARED_DEFAULT_NAME);
        let mut cfg = ProvisionerConfig::new(Mode::SingleNode, Some("box".into()), Some("/srv/pv".into()));
        assert_eq!(cfg.identity, "box");
        assert!(!cfg.owns_identity("other"));
        cfg.accepted_identities.push("other".into());
        assert!(cfg.owns_identity("other"));
    }

    #[test]
    fn defaults_per_mode() {
        assert_eq!(Mode::Kubevirt.default_dir_mode(), 0o777);
        assert_eq!(Mode::Shared.default_dir_mode(), 0o770);
        assert_eq!(Mode::Kubevirt.default_template(true), "{claim}-{pv}");
        assert_eq!(Mode::SingleNode.default_template(false), "{namespace}-{claim}-{pv}");
        assert!(!Mode::Shared.is_node_local());
    }
}
