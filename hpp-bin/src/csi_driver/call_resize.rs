//! `hpp-csi-driver call expand` and `call modify`: what a resizer and kubelet do to a sized
//! volume, by hand. `expand` makes the calls a cluster would: ControllerExpandVolume when the
//! driver offers it, then NodeExpandVolume where the answer asks for it (or where the driver
//! raises limits on the node only, `--expansion=node`).

use std::collections::HashMap;

use serde_json::json;

use hpp_csi::csi::{self, controller_client::ControllerClient, node_client::NodeClient};

use super::call::{CallError, Reply, human_bytes};

/// A size on the command line: a Kubernetes quantity (`64Mi`, `1Gi`, `500M`, bytes), as a CSI
/// byte count.
pub fn parse_size(text: &str) -> Result<i64, String> {
    let bytes = hpp_api::quantity::parse_bytes(text)
        .ok_or_else(|| format!("{text:?} is not a quantity; use a size such as 64Mi, 1Gi or 500M"))?;
    if bytes == 0 {
        return Err(format!("{text:?} is zero; a size must be positive"));
    }
    i64::try_from(bytes).map_err(|_| format!("{text:?} is larger than a CSI size can be"))
}

/// A `key=value` mutable parameter of `call modify`.
pub fn parse_parameter(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{text:?} is not key=value (for example inodeLimit=100000)")),
    }
}

/// What `expand` learned from the driver's capabilities: who raises limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expanders {
    /// The driver offers ControllerExpandVolume.
    pub controller: bool,
    /// The driver offers NodeExpandVolume.
    pub node: bool,
}

/// Which calls `expand` makes: the controller's when offered; the node's when the controller
/// answer asks for it, or when only the node expands.
pub fn node_call_needed(by: Expanders, controller_answer: Option<bool>) -> bool {
    by.node && controller_answer.unwrap_or(true)
}

async fn expanders(ch: &tonic::transport::Channel) -> Result<Expanders, CallError> {
    use csi::controller_service_capability::{Type as CType, rpc::Type as CRpc};
    use csi::node_service_capability::{Type as NType, rpc::Type as NRpc};
    let controller = ControllerClient::new(ch.clone())
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await?
        .into_inner()
        .capabilities
        .iter()
        .any(|c| matches!(&c.r#type, Some(CType::Rpc(r)) if r.r#type == CRpc::ExpandVolume as i32));
    let node = NodeClient::new(ch.clone())
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await?
        .into_inner()
        .capabilities
        .iter()
        .any(|c| matches!(&c.r#type, Some(NType::Rpc(r)) if r.r#type == NRpc::ExpandVolume as i32));
    Ok(Expanders { controller, node })
}

/// ControllerExpandVolume, then NodeExpandVolume at `target` when needed.
pub async fn expand(
    ch: tonic::transport::Channel,
    id: String,
    size: i64,
    target: Option<String>,
) -> Result<Reply, CallError> {
    let by = expanders(&ch).await?;
    if !by.controller && !by.node {
        return Err(CallError::Usage("this driver offers no volume expansion".into()));
    }
    let range = Some(csi::CapacityRange {
        required_bytes: size,
        limit_bytes: 0,
    });
    let mut capacity = None;
    let mut answer = None;
    if by.controller {
        let r = ControllerClient::new(ch.clone())
            .controller_expand_volume(csi::ControllerExpandVolumeRequest {
                volume_id: id.clone(),
                capacity_range: range,
                ..Default::default()
            })
            .await?
            .into_inner();
        capacity = Some(r.capacity_bytes);
        answer = Some(r.node_expansion_required);
    }
    let node = node_call_needed(by, answer);
    if node {
        let Some(target) = target.clone() else {
            return Err(CallError::Usage(match by.controller {
                true => format!(
                    "volume {id} was expanded to {} by the controller and needs NodeExpandVolume too: \
                     pass --target, the directory the volume is published at",
                    capacity.map(human_bytes).unwrap_or_default()
                ),
                false => "this driver expands volumes on the node only (--expansion=node): pass --target, \
                          the directory the volume is published at"
                    .to_owned(),
            }));
        };
        let r = NodeClient::new(ch)
            .node_expand_volume(csi::NodeExpandVolumeRequest {
                volume_id: id.clone(),
                volume_path: target,
                capacity_range: range,
                ..Default::default()
            })
            .await?
            .into_inner();
        capacity = Some(r.capacity_bytes);
    }
    let capacity = capacity.unwrap_or_default();
    let calls: Vec<&str> = [("ControllerExpandVolume", by.controller), ("NodeExpandVolume", node)]
        .into_iter()
        .filter_map(|(name, made)| made.then_some(name))
        .collect();
    Ok(Reply::table(
        json!({ "volumeId": id, "capacityBytes": capacity, "calls": calls }),
        vec!["VOLUME", "CAPACITY", "EXPANDED BY"],
        vec![vec![id.clone(), human_bytes(capacity), calls.join(", ")]],
    ))
}

/// ControllerModifyVolume with `parameters` as its mutable parameters.
pub async fn modify(
    ch: tonic::transport::Channel,
    id: String,
    parameters: Vec<(String, String)>,
) -> Result<Reply, CallError> {
    let mutable_parameters: HashMap<String, String> = parameters.iter().cloned().collect();
    ControllerClient::new(ch)
        .controller_modify_volume(csi::ControllerModifyVolumeRequest {
            volume_id: id.clone(),
            mutable_parameters: mutable_parameters.clone(),
            ..Default::default()
        })
        .await?;
    let shown: Vec<String> = parameters.iter().map(|(k, v)| format!("{k}={v}")).collect();
    Ok(Reply::line(
        json!({ "action": "modified", "volumeId": id, "mutableParameters": mutable_parameters }),
        format!("modified {id} {}", shown.join(" ")),
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sizes_are_quantities_in_bytes() {
        assert_eq!(parse_size("64Mi"), Ok(67_108_864));
        assert_eq!(parse_size("1G"), Ok(1_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        for bad in ["", "64MB", "-1Gi", "0", "1Ei0"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert!(parse_size("64MB").unwrap_err().contains("64Mi"));
    }

    #[test]
    fn parameters_are_key_value() {
        assert_eq!(
            parse_parameter("compression=zstd"),
            Ok(("compression".into(), "zstd".into()))
        );
        assert_eq!(parse_parameter("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(parse_parameter("compression").is_err());
        assert!(parse_parameter("=zstd").is_err());
    }

    #[test]
    fn the_node_is_called_when_the_controller_asks_or_cannot_expand() {
        let both = Expanders {
            controller: true,
            node: true,
        };
        assert!(!node_call_needed(both, Some(false)));
        assert!(node_call_needed(both, Some(true)));
        let node_only = Expanders {
            controller: false,
            node: true,
        };
        assert!(node_call_needed(node_only, None));
        let controller_only = Expanders {
            controller: true,
            node: false,
        };
        assert!(!node_call_needed(controller_only, Some(true)));
    }
}
