//! The node-loss parameters of a StorageClass (or, once the class is gone, of a volume's
//! attributes, which CreateVolume copies from the class): `nodeLossPolicy` and
//! `nodeLossGracePeriod`. Pure.

use std::collections::BTreeMap;
use std::time::Duration;

use hpp_api::constants as c;

/// What happens to a claim pinned to a lost node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Nothing (the default): the claim waits for its node, as with every local volume.
    Retain,
    /// Once the node has been lost for `grace`, the claim and its PV are deleted.
    Recreate {
        /// How long the node must stay lost first.
        grace: Duration,
    },
}

impl Policy {
    /// Whether claims are released after a loss.
    pub fn is_recreate(self) -> bool {
        matches!(self, Policy::Recreate { .. })
    }
}

/// Reads the node-loss keys of a class's parameters (or a volume's attributes). Absent keys
/// mean `Retain` and the default grace period; a value that is not understood is an error
/// whose text names the key and what is allowed (the caller treats the class as `Retain`).
pub fn read(params: Option<&BTreeMap<String, String>>) -> Result<Policy, String> {
    let get = |key: &str| params.and_then(|p| p.get(key)).map(String::as_str);
    let grace = match get(c::PARAM_NODE_LOSS_GRACE_PERIOD) {
        None => default_grace(),
        Some(text) => {
            hpp_api::duration::parse(text).map_err(|e| format!("parameter {}: {e}", c::PARAM_NODE_LOSS_GRACE_PERIOD))?
        }
    };
    match get(c::PARAM_NODE_LOSS_POLICY) {
        None => Ok(Policy::Retain),
        Some(p) if p == c::NODE_LOSS_POLICY_RETAIN => Ok(Policy::Retain),
        Some(p) if p == c::NODE_LOSS_POLICY_RECREATE => Ok(Policy::Recreate { grace }),
        Some(other) => Err(format!(
            "parameter {} is {other:?}; allowed: {} (default) or {} (spelled exactly so)",
            c::PARAM_NODE_LOSS_POLICY,
            c::NODE_LOSS_POLICY_RETAIN,
            c::NODE_LOSS_POLICY_RECREATE
        )),
    }
}

/// Whether a parameter map says anything about node loss (either key present): without any
/// such class or volume, the node-loss step has nothing to do.
pub fn mentioned(params: Option<&BTreeMap<String, String>>) -> bool {
    params.is_some_and(|p| p.contains_key(c::PARAM_NODE_LOSS_POLICY) || p.contains_key(c::PARAM_NODE_LOSS_GRACE_PERIOD))
}

/// [`c::DEFAULT_NODE_LOSS_GRACE_PERIOD`] as a duration.
pub fn default_grace() -> Duration {
    hpp_api::duration::parse(c::DEFAULT_NODE_LOSS_GRACE_PERIOD).unwrap_or(Duration::from_secs(300))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn absent_and_retain_mean_nothing_happens() {
        assert_eq!(read(None), Ok(Policy::Retain));
        assert_eq!(read(Some(&params(&[("storagePool", "local")]))), Ok(Policy::Retain));
        assert_eq!(read(Some(&params(&[("nodeLossPolicy", "Retain")]))), Ok(Policy::Retain));
        assert!(!mentioned(Some(&params(&[("storagePool", "local")]))));
        assert!(mentioned(Some(&params(&[("nodeLossGracePeriod", "1m")]))));
    }

    #[test]
    fn recreate_takes_its_grace_period_or_five_minutes() {
        assert_eq!(
            read(Some(&params(&[("nodeLossPolicy", "Recreate")]))),
            Ok(Policy::Recreate {
                grace: Duration::from_secs(300)
            })
        );
        assert_eq!(
            read(Some(&params(&[
                ("nodeLossPolicy", "Recreate"),
                ("nodeLossGracePeriod", "1h30m")
            ]))),
            Ok(Policy::Recreate {
                grace: Duration::from_secs(5400)
            })
        );
        assert_eq!(
            read(Some(&params(&[
                ("nodeLossPolicy", "Recreate"),
                ("nodeLossGracePeriod", "0")
            ]))),
            Ok(Policy::Recreate { grace: Duration::ZERO })
        );
    }

    #[test]
    fn values_not_understood_are_errors_naming_the_key() {
        let err = read(Some(&params(&[("nodeLossPolicy", "recreate")]))).unwrap_err();
        assert!(
            err.contains("nodeLossPolicy") && err.contains("\"recreate\"") && err.contains("Recreate"),
            "{err}"
        );
        let err = read(Some(&params(&[
            ("nodeLossPolicy", "Recreate"),
            ("nodeLossGracePeriod", "soon"),
        ])))
        .unwrap_err();
        assert!(
            err.contains("nodeLossGracePeriod") && err.contains("not a duration"),
            "{err}"
        );
        // A bad grace period is reported even where the policy is Retain: the admin meant something.
        assert!(read(Some(&params(&[("nodeLossGracePeriod", "-1m")]))).is_err());
    }
}
