//! Controller service over a real unix socket: volumes, capacity, listing, validation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use std::collections::HashMap;

use common::*;
use hpp_csi::PoolConfig;
use hpp_csi::csi::{self, controller_service_capability::rpc::Type as Cap};
use tonic::Code;

#[tokio::test]
async fn create_is_idempotent_and_returns_kubevirt_shape() {
    let mut h = Harness::start().await;
    let v1 = h.create("pvc-1").await;
    let v2 = h.create("pvc-1").await;
    assert_eq!(v1, v2);
    assert_eq!(v1.volume_id, "pvc-1");
    assert!(h.pool_path().join("pvc-1").is_dir());
    assert_eq!(v1.volume_context.get("storagePool").map(String::as_str), Some("legacy"));
    assert_eq!(v1.accessible_topology.len(), 1);
    assert_eq!(
        v1.accessible_topology[0]
            .segments
            .get("topology.hostpath.csi/node")
            .map(String::as_str),
        Some(NODE)
    );
    assert!(v1.capacity_bytes > 0);
    // Requested capacity is reported back instead of the whole filesystem.
    let mut req = create_req("pvc-sized");
    req.capacity_range = Some(csi::CapacityRange {
        required_bytes: 4096,
        limit_bytes: 0,
    });
    let v = h
        .controller
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.capacity_bytes, 4096);
    h.stop().await;
}

fn sized(name: &str, required: i64, limit: i64) -> csi::CreateVolumeRequest {
    let mut req = create_req(name);
    req.capacity_range = Some(csi::CapacityRange {
        required_bytes: required,
        limit_bytes: limit,
    });
    req
}

#[tokio::test]
async fn same_name_with_another_capacity_is_already_exists() {
    let mut h = Harness::start().await;
    h.controller.create_volume(sized("pvc-cap", 4096, 0)).await.unwrap();
    // Same request again, and a range the recorded capacity satisfies: idempotent.
    h.controller.create_volume(sized("pvc-cap", 4096, 0)).await.unwrap();
    h.controller.create_volume(sized("pvc-cap", 1024, 8192)).await.unwrap();
    h.controller.create_volume(create_req("pvc-cap")).await.unwrap();
    // A capacity the volume was not created with.
    assert_eq!(
        code(h.controller.create_volume(sized("pvc-cap", 8192, 8192)).await),
        Code::AlreadyExists
    );
    assert_eq!(
        code(h.controller.create_volume(sized("pvc-cap", 0, 1024)).await),
        Code::AlreadyExists
    );
    // Larger than the whole pool: still AlreadyExists (the volume is judged first), as
    // csi-sanity's "different capacity" case expects whatever the pool's size.
    let huge = i64::try_from(fs_total(&h.pool_path()) * 4).unwrap();
    assert_eq!(
        code(h.controller.create_volume(sized("pvc-cap", huge, huge)).await),
        Code::AlreadyExists
    );
    // A new volume that large is OutOfRange.
    assert_eq!(
        code(h.controller.create_volume(sized("pvc-huge", huge, huge)).await),
        Code::OutOfRange
    );
    // A directory KubeVirt made (no record) is still served whatever the request says.
    std::fs::create_dir(h.pool_path().join("pvc-kubevirt")).unwrap();
    h.controller
        .create_volume(sized("pvc-kubevirt", 8192, 8192))
        .await
        .unwrap();
    h.stop().await;
}

#[tokio::test]
async fn a_name_taken_in_another_pool_is_already_exists() {
    let mut h = Harness::with(|root, b| {
        b.pool(legacy_pool(root))
            .pool(PoolConfig::new("nfs", root.join("pools/nfs")).shared(true))
    })
    .await;
    h.create("pvc-one").await;
    let mut elsewhere = create_req("pvc-one");
    elsewhere.parameters = params("nfs");
    let err = h.controller.create_volume(elsewhere).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert!(err.message().contains("storage pool legacy"), "{}", err.message());
    assert!(
        !h.root.join("pools/nfs/pvc-one").exists(),
        "one id must never name two volumes"
    );
    // The retry in its own pool is still fine.
    h.create("pvc-one").await;
    h.stop().await;
}

#[tokio::test]
async fn the_capacity_answered_without_a_size_never_exceeds_the_limit() {
    let mut h = Harness::start().await;
    let v = h
        .controller
        .create_volume(sized("pvc-lim", 0, 1 << 20))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(
        fs_total(&h.pool_path()) > 1 << 20,
        "the pool must be larger than the limit"
    );
    assert_eq!(v.capacity_bytes, 1 << 20);
    h.stop().await;
}

#[tokio::test]
async fn ids_that_sort_differently_as_strings_are_listed_once_each() {
    let mut h = Harness::start().await;
    for id in ["a", "vol", "vol-2"] {
        h.create(id).await;
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    for _ in 0..10 {
        let resp = h
            .controller
            .list_volumes(csi::ListVolumesRequest {
                max_entries: 1,
                starting_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        seen.extend(resp.entries.into_iter().map(|e| e.volume.unwrap().volume_id));
        if resp.next_token.is_empty() {
            break;
        }
        token = resp.next_token;
    }
    assert_eq!(seen, ["a", "vol", "vol-2"]);
    h.stop().await;
}

#[tokio::test]
async fn create_validates_everything_up_front() {
    let mut h = Harness::start().await;
    let mut no_caps = create_req("pvc-x");
    no_caps.volume_capabilities.clear();
    assert_eq!(code(h.controller.create_volume(no_caps).await), Code::InvalidArgument);
    let mut block = create_req("pvc-x");
    block.volume_capabilities = vec![block_cap()];
    assert_eq!(code(h.controller.create_volume(block).await), Code::InvalidArgument);
    assert_eq!(
        code(h.controller.create_volume(create_req("")).await),
        Code::InvalidArgument
    );
    let mut unknown_pool = create_req("pvc-x");
    unknown_pool.parameters = params("nope");
    assert_eq!(code(h.controller.create_volume(unknown_pool).await), Code::NotFound);
    let mut wrong_node = create_req("pvc-x");
    wrong_node.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![csi::Topology {
            segments: HashMap::from([("topology.hostpath.csi/node".into(), "other-node".into())]),
        }],
        preferred: vec![],
    });
    assert_eq!(
        code(h.controller.create_volume(wrong_node).await),
        Code::ResourceExhausted
    );
    let mut bad_range = create_req("pvc-x");
    bad_range.capacity_range = Some(csi::CapacityRange {
        required_bytes: 10,
        limit_bytes: 5,
    });
    assert_eq!(code(h.controller.create_volume(bad_range).await), Code::InvalidArgument);
    let mut huge = create_req("pvc-x");
    huge.capacity_range = Some(csi::CapacityRange {
        required_bytes: i64::MAX,
        limit_bytes: 0,
    });
    assert_eq!(code(h.controller.create_volume(huge).await), Code::OutOfRange);
    let mut missing_snap = create_req("pvc-x");
    missing_snap.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: "nope".into(),
            },
        )),
    });
    assert_eq!(code(h.controller.create_volume(missing_snap).await), Code::NotFound);
    let mut missing_src = create_req("pvc-x");
    missing_src.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: "nope".into(),
            },
        )),
    });
    assert_eq!(code(h.controller.create_volume(missing_src).await), Code::NotFound);
    assert!(
        !h.pool_path().join("pvc-x").exists(),
        "failed requests must not leave a volume"
    );
    h.stop().await;
}

#[tokio::test]
async fn topology_is_honoured_and_shared_pools_have_none() {
    let mut h = Harness::with(|root, b| {
        b.pool(legacy_pool(root))
            .pool(PoolConfig::new("nfs", root.join("pools/nfs")).shared(true))
    })
    .await;
    let mut req = create_req("pvc-here");
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![],
        preferred: vec![csi::Topology {
            segments: HashMap::from([("topology.hostpath.csi/node".into(), NODE.into())]),
        }],
    });
    assert!(h.controller.create_volume(req).await.is_ok());
    let mut shared = create_req("pvc-shared");
    shared.parameters = params("nfs");
    let v = h
        .controller
        .create_volume(shared)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(v.accessible_topology.is_empty());
    assert!(h.root.join("pools/nfs/pvc-shared").is_dir());
    h.stop().await;
}

#[tokio::test]
async fn delete_removes_only_hpp_volumes_and_is_idempotent() {
    let mut h = Harness::start().await;
    h.create("pvc-del").await;
    std::fs::write(h.pool_path().join("pvc-del/data"), b"x").unwrap();
    let req = csi::DeleteVolumeRequest {
        volume_id: "pvc-del".into(),
        ..Default::default()
    };
    h.controller.delete_volume(req.clone()).await.unwrap();
    assert!(!h.pool_path().join("pvc-del").exists());
    h.controller.delete_volume(req).await.unwrap();
    // A plain file with a volume-like name is not an hpp volume: left alone.
    std::fs::write(h.pool_path().join("pvc-file"), b"precious").unwrap();
    let r = h.delete("pvc-file").await;
    assert_eq!(code(r), Code::FailedPrecondition);
    assert!(h.pool_path().join("pvc-file").exists());
    assert_eq!(
        code(h.controller.delete_volume(csi::DeleteVolumeRequest::default()).await),
        Code::InvalidArgument
    );
    h.stop().await;
}

#[tokio::test]
async fn delete_refuses_a_published_volume() {
    let mut h = Harness::start().await;
    h.create("pvc-busy").await;
    // A delete that reads the mount table first: the driver keeps the table it read, and the
    // publish below must still be seen (the table is read again after any mount change).
    h.create("pvc-warm").await;
    h.delete("pvc-warm").await.unwrap();
    let target = h.target("busy");
    h.publish("pvc-busy", &target, false).await.unwrap();
    let r = h.delete("pvc-busy").await;
    assert_eq!(code(r), Code::FailedPrecondition);
    assert!(h.pool_path().join("pvc-busy").is_dir());
    h.unpublish("pvc-busy", &target).await.unwrap();
    h.delete("pvc-busy").await.unwrap();
    h.stop().await;
}

#[tokio::test]
async fn pre_existing_kubevirt_directories_are_served() {
    let mut h = Harness::start().await;
    // A volume made by the KubeVirt driver: just a directory with data, no marker.
    std::fs::create_dir_all(h.pool_path().join("pvc-old")).unwrap();
    std::fs::write(h.pool_path().join("pvc-old/disk.img"), b"vm disk").unwrap();
    let got = h
        .controller
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: "pvc-old".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.volume.unwrap().volume_id, "pvc-old");
    assert!(!got.status.unwrap().volume_condition.unwrap().abnormal);
    // CreateVolume with the same name adopts it without touching the data.
    h.create("pvc-old").await;
    assert_eq!(
        std::fs::read(h.pool_path().join("pvc-old/disk.img")).unwrap(),
        b"vm disk"
    );
    let target = h.target("old");
    h.publish("pvc-old", &target, false).await.unwrap();
    assert_eq!(std::fs::read(target.join("disk.img")).unwrap(), b"vm disk");
    h.unpublish("pvc-old", &target).await.unwrap();
    h.stop().await;
}

/// Every page of a ListVolumes walk asking for `max_entries` a page, in order.
async fn list_pages(h: &Harness, max_entries: i32) -> Vec<csi::ListVolumesResponse> {
    let mut controller = h.controller.clone();
    let mut pages = Vec::new();
    let mut token = String::new();
    loop {
        let resp = controller
            .list_volumes(csi::ListVolumesRequest {
                max_entries,
                starting_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        token = resp.next_token.clone();
        pages.push(resp);
        if token.is_empty() {
            return pages;
        }
    }
}

#[tokio::test]
async fn list_volumes_paginates_over_many_pages() {
    let mut h = Harness::start().await;
    // Snapshot directory nested in the pool (KubeVirt's operator layout) must not be listed.
    let mut ids: Vec<String> = (0..53).map(|i| format!("pvc-{i:04}")).collect();
    for id in &ids {
        h.create(id).await;
    }
    std::fs::create_dir_all(h.pool_path().join(".hpp-tmp-crashed")).unwrap();
    std::os::unix::fs::symlink("/etc", h.pool_path().join("pvc-evil")).unwrap();
    let pages = list_pages(&h, 10).await;
    assert_eq!(pages.len(), 6);
    let mut seen = Vec::new();
    for resp in pages {
        assert!(resp.entries.len() <= 10);
        for e in resp.entries {
            let status = e.status.unwrap();
            assert!(!status.volume_condition.unwrap().abnormal);
            assert_eq!(status.published_node_ids, vec![NODE.to_owned()]);
            seen.push(e.volume.unwrap().volume_id);
        }
    }
    ids.sort();
    assert_eq!(seen, ids);
    let all = h
        .controller
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.entries.len(), 53);
    assert!(all.next_token.is_empty());
    let bad = h
        .controller
        .list_volumes(csi::ListVolumesRequest {
            max_entries: 5,
            starting_token: "17".into(),
        })
        .await;
    assert_eq!(code(bad), Code::Aborted);
    let negative = h
        .controller
        .list_volumes(csi::ListVolumesRequest {
            max_entries: -1,
            starting_token: String::new(),
        })
        .await;
    assert_eq!(code(negative), Code::InvalidArgument);
    h.stop().await;
}

/// A CO asking for every volume at once (`max_entries` 0, as the external health monitor
/// does) gets them over pages of at most 1 MiB, well under a gRPC client's default 4 MiB
/// receive limit (tonic's too, so this client refuses a larger answer), not one message it
/// cannot read.
#[tokio::test]
async fn listing_every_volume_at_once_pages_under_the_grpc_message_limit() {
    let h = Harness::start().await;
    // 14,000 ids of the longest length: about 5 MiB of entries. Made as directories, as
    // KubeVirt's driver left them.
    let long = "a".repeat(hpp_csi::pool::validate::MAX_ID_LEN - 10);
    let mut ids: Vec<String> = (0..14_000).map(|i| format!("pvc-{long}{i:06}")).collect();
    for id in &ids {
        std::fs::create_dir(h.pool_path().join(id)).unwrap();
    }
    let pages = list_pages(&h, 0).await;
    assert!(
        pages.len() >= 4,
        "about 4.5 MiB of entries take several pages, not {}",
        pages.len()
    );
    let mut seen = Vec::new();
    for resp in pages {
        assert!(prost::Message::encoded_len(&resp) <= 1024 * 1024 + 1024);
        seen.extend(resp.entries.into_iter().map(|e| e.volume.unwrap().volume_id));
    }
    ids.sort();
    assert_eq!(seen, ids);
    h.stop().await;
}

#[tokio::test]
async fn kubevirt_snapshot_dir_inside_pool_is_not_a_volume() {
    let mut h = Harness::with(|root, b| {
        b.pool(PoolConfig::new("legacy", root.join("csi")).with_snapshots(root.join("csi/snapshots")))
    })
    .await;
    h.create("pvc-a").await;
    h.controller
        .create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: "pvc-a".into(),
            name: "snap-a".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let all = h
        .controller
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<String> = all.entries.into_iter().map(|e| e.volume.unwrap().volume_id).collect();
    assert_eq!(ids, vec!["pvc-a".to_owned()]);
    assert_eq!(
        code(h.controller.create_volume(create_req("snapshots")).await),
        Code::InvalidArgument
    );
    h.stop().await;
}

#[tokio::test]
async fn get_volume_validate_and_capacity() {
    let mut h = Harness::start().await;
    h.create("pvc-v").await;
    assert_eq!(
        code(
            h.controller
                .controller_get_volume(csi::ControllerGetVolumeRequest {
                    volume_id: "nope".into()
                })
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            h.controller
                .controller_get_volume(csi::ControllerGetVolumeRequest::default())
                .await
        ),
        Code::InvalidArgument
    );
    let ok = h
        .controller
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: "pvc-v".into(),
            volume_capabilities: vec![mount_cap()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ok.confirmed.is_some());
    let block = h
        .controller
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: "pvc-v".into(),
            volume_capabilities: vec![block_cap()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(block.confirmed.is_none());
    assert!(block.message.contains("block"));
    let missing = h
        .controller
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: "nope".into(),
            volume_capabilities: vec![mount_cap()],
            ..Default::default()
        })
        .await;
    assert_eq!(code(missing), Code::NotFound);
    let no_caps = h
        .controller
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: "pvc-v".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(code(no_caps), Code::InvalidArgument);

    let cap = h
        .controller
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    let st = rustix::fs::statvfs(h.pool_path()).unwrap();
    assert!(cap.available_capacity > 0);
    assert_eq!(cap.maximum_volume_size, Some((st.f_blocks * st.f_frsize) as i64));
    assert_eq!(cap.minimum_volume_size, Some(0));
    let other_node = h
        .controller
        .get_capacity(csi::GetCapacityRequest {
            accessible_topology: Some(csi::Topology {
                segments: HashMap::from([("topology.hostpath.csi/node".into(), "elsewhere".into())]),
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(other_node.available_capacity, 0);
    assert_eq!(
        code(
            h.controller
                .get_capacity(csi::GetCapacityRequest {
                    parameters: params("nope"),
                    ..Default::default()
                })
                .await
        ),
        Code::NotFound
    );
    h.stop().await;
}

#[tokio::test]
async fn capabilities_advertise_only_what_is_implemented() {
    let mut h = Harness::start().await;
    let caps = h
        .controller
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    let mut types: Vec<i32> = caps
        .into_iter()
        .map(|c| match c.r#type.unwrap() {
            csi::controller_service_capability::Type::Rpc(r) => r.r#type,
        })
        .collect();
    types.sort();
    let mut want = vec![
        Cap::CreateDeleteVolume as i32,
        Cap::GetVolume as i32,
        Cap::GetCapacity as i32,
        Cap::ListVolumes as i32,
        Cap::VolumeCondition as i32,
        Cap::CloneVolume as i32,
        Cap::ExpandVolume as i32,
        Cap::ModifyVolume as i32,
        Cap::CreateDeleteSnapshot as i32,
        Cap::ListSnapshots as i32,
    ];
    want.sort();
    assert_eq!(types, want);
    // Everything else is UNIMPLEMENTED.
    let mut grpc = tonic::client::Grpc::new(hpp_csi::client::connect(&h.endpoint).await.unwrap());
    grpc.ready().await.unwrap();
    let r: Result<tonic::Response<()>, tonic::Status> = grpc
        .unary(
            tonic::Request::new(()),
            tonic::codegen::http::uri::PathAndQuery::from_static("/csi.v1.Controller/ControllerPublishVolume"),
            tonic_prost::ProstCodec::default(),
        )
        .await;
    assert_eq!(r.unwrap_err().code(), Code::Unimplemented);
    h.stop().await;
}

#[tokio::test]
async fn the_topology_key_follows_a_custom_driver_name_unless_set() {
    let mut h = Harness::with(|root, b| b.pool(legacy_pool(root)).driver_name("example.com.hostpath")).await;
    let volume = h.create("vol").await;
    let key = "topology.example.com.hostpath/node";
    assert_eq!(
        volume.accessible_topology[0].segments.get(key).map(String::as_str),
        Some(NODE),
        "{volume:?}"
    );
    let info = h
        .node
        .node_get_info(hpp_csi::csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(info.accessible_topology.unwrap().segments.contains_key(key));
    h.stop().await;

    // Kept as it was, for volumes made before the rename.
    let mut h = Harness::with(|root, b| {
        b.pool(legacy_pool(root))
            .driver_name("example.com.hostpath")
            .topology_key(hpp_api::constants::TOPOLOGY_KEY)
    })
    .await;
    let volume = h.create("vol").await;
    assert!(
        volume.accessible_topology[0]
            .segments
            .contains_key(hpp_api::constants::TOPOLOGY_KEY)
    );
    h.stop().await;
}
