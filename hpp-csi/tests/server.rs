//! Identity, readiness, the mount guard, endpoints, socket lifecycle and metrics.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use common::*;
use hpp_csi::csi::{self, controller_client::ControllerClient, identity_client::IdentityClient};
use hpp_csi::{Driver, Endpoint, PoolConfig, ServeError};
use tonic::Code;

#[tokio::test]
async fn identity_reports_name_version_capabilities_and_readiness() {
    // Pool health is measured in the background: often, so the removal below is seen soon.
    let mut h = Harness::with(|root, b| {
        b.pool(legacy_pool(root))
            .health_interval(std::time::Duration::from_millis(50))
    })
    .await;
    let info = h
        .identity
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "kubevirt.io.hostpath-provisioner");
    assert_eq!(info.vendor_version, "test");
    let caps = h
        .identity
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.capabilities.len(), 3, "two services and online expansion");
    let probe = h.identity.probe(csi::ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));
    // Pool directory removed behind the driver's back: the driver still serves (ready), the
    // pool refuses work and says why.
    std::fs::remove_dir_all(h.pool_path()).unwrap();
    let probe = h.identity.probe(csi::ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));
    h.wait_for_metric("hpp_pool_usable{pool=\"legacy\"} 0").await;
    assert_eq!(
        code(h.controller.create_volume(create_req("pvc-x")).await),
        Code::Unavailable
    );
    h.stop().await;
}

#[tokio::test]
async fn plugin_info_without_a_version_is_unavailable() {
    let mut h = Harness::with(|root, b| b.pool(legacy_pool(root)).vendor_version("")).await;
    assert_eq!(
        code(h.identity.get_plugin_info(csi::GetPluginInfoRequest {}).await),
        Code::Unavailable
    );
    h.stop().await;
}

#[tokio::test]
async fn mount_guard_refuses_an_unmounted_pool_and_serves_a_mounted_one() {
    let mut h = Harness::with(|root, b| {
        // The mount point exists; the driver never makes a guarded pool's directory.
        std::fs::create_dir(root.join("disk")).unwrap();
        b.pool(legacy_pool(root))
            .pool(PoolConfig::new("guarded", root.join("disk")).require_mount_point(true))
    })
    .await;
    let guarded = h.root.join("disk");
    let mut req = create_req("pvc-g");
    req.parameters = params("guarded");
    let err = h.controller.create_volume(req.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("mount point"), "{}", err.message());
    assert!(!guarded.join("pvc-g").exists(), "nothing may land on the root disk");
    let cap = h
        .controller
        .get_capacity(csi::GetCapacityRequest {
            parameters: params("guarded"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cap.available_capacity, 0);
    assert_eq!(cap.maximum_volume_size, Some(0));
    assert_eq!(
        h.identity.probe(csi::ProbeRequest {}).await.unwrap().into_inner().ready,
        Some(true),
        "an unusable pool takes only itself out, never the driver"
    );
    h.wait_for_metric("hpp_pool_usable{pool=\"guarded\"} 0").await;

    // Mount a tmpfs there: the guard is satisfied.
    rustix::mount::mount("tmpfs", &guarded, "tmpfs", rustix::mount::MountFlags::empty(), None).unwrap();
    let v = h
        .controller
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.volume_id, "pvc-g");
    assert!(guarded.join("pvc-g").is_dir());
    let cap = h
        .controller
        .get_capacity(csi::GetCapacityRequest {
            parameters: params("guarded"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(cap.available_capacity > 0);
    assert_eq!(
        h.identity.probe(csi::ProbeRequest {}).await.unwrap().into_inner().ready,
        Some(true)
    );
    let got = h
        .controller
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: "pvc-g".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!got.status.unwrap().volume_condition.unwrap().abnormal);

    // A bind mount counts as a mount point too; unmounting flips the condition to abnormal.
    rustix::mount::unmount(&guarded, rustix::mount::UnmountFlags::empty()).unwrap();
    let side = h.root.join("side");
    std::fs::create_dir_all(side.join("pvc-g")).unwrap();
    let got = h
        .controller
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(got.entries.is_empty(), "the tmpfs volume is gone with the mount");
    rustix::mount::mount_bind(&side, &guarded).unwrap();
    let got = h
        .controller
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: "pvc-g".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!got.status.unwrap().volume_condition.unwrap().abnormal);
    rustix::mount::unmount(&guarded, rustix::mount::UnmountFlags::empty()).unwrap();
    std::fs::create_dir_all(guarded.join("pvc-g")).unwrap(); // shadow dir on the root disk
    let got = h
        .controller
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: "pvc-g".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let cond = got.status.unwrap().volume_condition.unwrap();
    assert!(cond.abnormal);
    assert!(cond.message.contains("mount point"), "{}", cond.message);
    // Publishing would hand the pod the shadow directory on the root disk: refused.
    let mut publish = publish_req("pvc-g", &h.target("g"), false);
    publish.volume_context = params("guarded");
    assert_eq!(
        code(h.node.node_publish_volume(publish).await),
        Code::FailedPrecondition
    );
    assert!(!is_mount_point(&h.target("g")));
    // Deleting while the pool is unmounted cannot confirm anything: Unavailable, nothing removed.
    let del = h.delete("pvc-g").await;
    assert_eq!(code(del), Code::Unavailable);
    assert!(guarded.join("pvc-g").exists());
    h.stop().await;
}

/// Issue 16: one unmounted guarded pool must not stop the healthy pool on the same node. Probe
/// stays ready (so the node's csi-provisioner runs), the healthy pool provisions, the broken one
/// reports zero capacity, refuses CreateVolume with the mount-guard reason, marks its published
/// volumes abnormal and shows 0 in `hpp_pool_usable`.
#[tokio::test]
async fn one_unusable_pool_takes_only_itself_out() {
    let mut h = Harness::with(|root, b| {
        // The mount point exists; the driver never makes a guarded pool's directory.
        std::fs::create_dir(root.join("disk")).unwrap();
        b.pool(legacy_pool(root))
            .pool(PoolConfig::new("guarded", root.join("disk")).require_mount_point(true))
    })
    .await;
    let guarded = h.root.join("disk");
    rustix::mount::mount("tmpfs", &guarded, "tmpfs", rustix::mount::MountFlags::empty(), None).unwrap();
    // Usable once mounted, so the wait for "unusable" below sees the unmount, not the start.
    h.wait_for_metric("hpp_pool_usable{pool=\"guarded\"} 1").await;
    let mut req = create_req("pvc-g");
    req.parameters = params("guarded");
    h.controller.create_volume(req).await.unwrap();
    let target = h.target("g");
    let mut publish = publish_req("pvc-g", &target, false);
    publish.volume_context = params("guarded");
    h.node.node_publish_volume(publish).await.unwrap();
    let stats = |path: &std::path::Path| csi::NodeGetVolumeStatsRequest {
        volume_id: "pvc-g".into(),
        volume_path: path.display().to_string(),
        staging_target_path: String::new(),
    };
    let healthy = h.node.node_get_volume_stats(stats(&target)).await.unwrap().into_inner();
    assert!(!healthy.volume_condition.unwrap().abnormal);

    // The pool's mount goes away (the pod keeps its bind mount of the old filesystem).
    rustix::mount::unmount(&guarded, rustix::mount::UnmountFlags::DETACH).unwrap();

    let probe = h.identity.probe(csi::ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true), "the driver keeps serving the healthy pool");
    let v = h.create("pvc-healthy").await;
    assert_eq!(v.volume_context.get("storagePool").map(String::as_str), Some("legacy"));
    assert!(h.pool_path().join("pvc-healthy").is_dir());

    let mut req = create_req("pvc-g2");
    req.parameters = params("guarded");
    let err = h.controller.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("storage pool guarded") && err.message().contains("mount point"),
        "{}",
        err.message()
    );
    let cap = |pool: &str| csi::GetCapacityRequest {
        parameters: params(pool),
        ..Default::default()
    };
    let broken = h.controller.get_capacity(cap("guarded")).await.unwrap().into_inner();
    assert_eq!((broken.available_capacity, broken.maximum_volume_size), (0, Some(0)));
    let fine = h.controller.get_capacity(cap("legacy")).await.unwrap().into_inner();
    assert!(fine.available_capacity > 0);

    let cond = h
        .node
        .node_get_volume_stats(stats(&target))
        .await
        .unwrap()
        .into_inner()
        .volume_condition
        .unwrap();
    assert!(cond.abnormal);
    assert!(
        cond.message.contains("guarded") && cond.message.contains("mount point"),
        "{}",
        cond.message
    );

    // The unmount alone (a mount-table change) refreshes the gauges.
    let metrics = h.wait_for_metric("hpp_pool_usable{pool=\"guarded\"} 0").await;
    assert!(metrics.contains("hpp_pool_usable{pool=\"legacy\"} 1"), "{metrics}");
    // Unpublish cannot prove the target holds pvc-g while its pool is gone; clean up by hand.
    rustix::mount::unmount(&target, rustix::mount::UnmountFlags::DETACH).unwrap();
    h.stop().await;
}

#[tokio::test]
async fn shared_with_os_metric_and_rpc_metrics() {
    let h = Harness::with(|root, b| b.pool(legacy_pool(root)).os_reference_path(root)).await;
    let mut id = h.identity.clone();
    id.probe(csi::ProbeRequest {}).await.unwrap();
    h.wait_for_metric("kubevirt_hpp_pool_path_shared_with_os 1").await;
    let mut c = h.controller.clone();
    let _ = c
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: "nope".into(),
        })
        .await;
    let text = h.metrics_text();
    assert!(text.contains("kubevirt_hpp_pool_path_shared_with_os 1"), "{text}");
    assert!(
        text.contains("hpp_pool_path_shared_with_os{pool=\"legacy\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("hpp_csi_rpc_requests_total{service=\"Identity\",method=\"Probe\",code=\"Ok\"} 1"),
        "{text}"
    );
    assert!(
        text.contains(
            "hpp_csi_rpc_requests_total{service=\"Controller\",method=\"ControllerGetVolume\",code=\"NotFound\"} 1"
        ),
        "{text}"
    );
    assert!(text.contains("hpp_csi_rpc_duration_seconds_bucket"), "{text}");
    assert!(text.contains("hpp_pool_capacity_bytes{pool=\"legacy\"}"), "{text}");
    h.stop().await;

    // A pool on its own tmpfs does not share the OS device.
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let pool = root.join("own");
    std::fs::create_dir_all(&pool).unwrap();
    rustix::mount::mount("tmpfs", &pool, "tmpfs", rustix::mount::MountFlags::empty(), None).unwrap();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = std::sync::Arc::new(hpp_csi::DriverMetrics::register(&mut registry));
    let driver = Driver::builder()
        .node_id(NODE)
        .pool(PoolConfig::new("own", &pool))
        .os_reference_path(&root)
        .metrics(metrics)
        .build()
        .unwrap();
    let d = driver.clone();
    let report = tokio::task::spawn_blocking(move || d.pools_report()).await.unwrap();
    assert!(!report.pools[0].2);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("kubevirt_hpp_pool_path_shared_with_os 0"), "{text}");
    unmount_below(&root);
}

#[tokio::test]
async fn tcp_endpoint_really_listens_on_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let driver = Driver::builder()
        .node_id(NODE)
        .pool(PoolConfig::new("legacy", dir.path().join("pool")))
        .endpoint("tcp://127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap();
    let bound = driver.bind().await.unwrap();
    let ep = bound.endpoint().clone();
    let Endpoint::Tcp(addr) = &ep else {
        panic!("expected tcp, got {ep}")
    };
    assert!(!addr.ends_with(":0"));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(bound.serve(async {
        let _ = rx.await;
    }));
    let ch = hpp_csi::client::connect(&ep).await.unwrap();
    let info = IdentityClient::new(ch.clone())
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap();
    assert_eq!(info.into_inner().name, "kubevirt.io.hostpath-provisioner");
    ControllerClient::new(ch)
        .create_volume(create_req("pvc-tcp"))
        .await
        .unwrap();
    assert!(dir.path().join("pool/pvc-tcp").is_dir());
    tx.send(()).unwrap();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn socket_lifecycle_stale_live_and_removal() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("run/csi.sock");
    let build = || {
        Driver::builder()
            .node_id(NODE)
            .pool(PoolConfig::new("legacy", dir.path().join("pool")))
            .endpoint(Endpoint::Unix(sock.clone()))
            .build()
            .unwrap()
    };
    // A stale socket from a crashed driver is replaced.
    std::fs::create_dir_all(sock.parent().unwrap()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let bound = build().bind().await.unwrap();
    // A second driver on the same live socket is refused, before it touches the pools.
    let second = Driver::builder()
        .node_id(NODE)
        .pool(PoolConfig::new("legacy", dir.path().join("pool")))
        .endpoint(Endpoint::Unix(sock.clone()))
        .build();
    assert!(matches!(second, Err(hpp_csi::ConfigError::EndpointInUse(_))));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(bound.serve(async {
        let _ = rx.await;
    }));
    assert!(sock.exists());
    tx.send(()).unwrap();
    task.await.unwrap().unwrap();
    assert!(!sock.exists(), "socket removed on shutdown");
    // A regular file is never deleted to make room for the socket.
    std::fs::write(&sock, b"not a socket").unwrap();
    assert!(matches!(build().bind().await, Err(ServeError::NotASocket(_))));
    assert!(sock.exists());
    // Building without a node id or pools fails with a clear error.
    assert!(
        Driver::builder()
            .pool(PoolConfig::new("a", dir.path()))
            .build()
            .is_err()
    );
    assert!(Driver::builder().node_id("n").build().is_err());
}

#[tokio::test]
async fn services_compose_into_a_custom_tonic_server() {
    let dir = tempfile::tempdir().unwrap();
    let driver = Driver::builder()
        .node_id(NODE)
        .pool(PoolConfig::new("legacy", dir.path().join("pool")))
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Only Identity and Node: a node-only deployment.
    let server = tonic::transport::Server::builder()
        .layer(driver.rpc_layer())
        .add_service(driver.identity_service())
        .add_service(driver.node_service())
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    let task = tokio::spawn(server);
    let ch = hpp_csi::client::connect(&Endpoint::Tcp(addr.to_string()))
        .await
        .unwrap();
    let info = hpp_csi::csi::node_client::NodeClient::new(ch.clone())
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap();
    assert_eq!(info.into_inner().node_id, NODE);
    let r = ControllerClient::new(ch).create_volume(create_req("pvc-x")).await;
    assert_eq!(code(r), Code::Unimplemented);
    task.abort();
}

/// An embedder that composes the services into its own server (no `serve`, so no background
/// watch) still gets current gauges: a Probe that finds them stale starts a measurement.
#[tokio::test]
async fn a_stale_probe_refreshes_the_gauges_when_nothing_watches() {
    use hpp_csi::csi::identity_server::Identity;
    let dir = tempfile::tempdir().unwrap();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = std::sync::Arc::new(hpp_csi::DriverMetrics::register(&mut registry));
    let driver = Driver::builder()
        .node_id(NODE)
        .pool(PoolConfig::new("legacy", dir.path().join("pool")))
        .metrics(metrics)
        .build()
        .unwrap();
    let identity = hpp_csi::service::identity::IdentityService::new(driver.state().clone());
    let text = |registry: &prometheus_client::registry::Registry| {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    };
    assert!(!text(&registry).contains("hpp_pool_usable{pool=\"legacy\"}"));
    let ready = identity.probe(tonic::Request::new(csi::ProbeRequest {})).await.unwrap();
    assert_eq!(ready.into_inner().ready, Some(true));
    // Fails unless the probe's measurement refreshes the gauges.
    wait_for_text(|| text(&registry), "hpp_pool_usable{pool=\"legacy\"} 1").await;
}

/// A clean stop checkpoints every pool's volume journal: nothing is left for a later start (or
/// for KubeVirt's driver after a rollback) to redo, and the gauge said the journal was in use.
#[tokio::test(flavor = "multi_thread")]
async fn a_clean_stop_leaves_the_volume_journal_empty() {
    let mut h = Harness::start().await;
    h.create("pvc-j").await;
    h.wait_for_metric("hpp_pool_journal{pool=\"legacy\"} 1").await;
    let pool = h.pool_path();
    // Keep the pool after the harness is gone.
    let _kept = std::mem::replace(&mut h.dir, tempfile::tempdir().unwrap());
    h.stop().await;
    let dir = rustix::fs::open(
        &pool,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let (_, records) = hpp_fs::journal::Journal::open(
        std::os::fd::AsFd::as_fd(&dir),
        hpp_csi::ops::volume_journal::JOURNAL_NAME,
        1 << 20,
    )
    .unwrap();
    assert!(records.is_empty(), "{} records left", records.len());
}
