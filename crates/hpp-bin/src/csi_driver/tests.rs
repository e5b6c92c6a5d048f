#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use clap::Parser;

use super::*;

fn parse(args: &[&str]) -> Args {
    Args::try_parse_from(std::iter::once("hpp-csi-driver").chain(args.iter().copied())).unwrap()
}

#[test]
fn kubevirt_daemonset_args_parse() {
    let a = parse(&[
        "--drivername=kubevirt.io.hostpath-provisioner",
        "--v=3",
        "--endpoint=unix:///csi/csi.sock",
        "--nodeid=node-1",
        "--version=latest",
        r#"--datadir=[{"name":"legacy","path":"/csi-data-dir"}]"#,
        "--metrics-tls-version=VersionTLS12",
    ]);
    assert!(a.command.is_none());
    let r = a.serve.resolve(|| None).unwrap();
    assert_eq!(r.endpoint, Endpoint::Unix("/csi/csi.sock".into()));
    assert_eq!(r.node_id, "node-1");
    assert_eq!(r.pools.len(), 1);
    assert_eq!(r.metrics_address.port(), 8443);
    assert_eq!(a.serve.vendor_version.as_deref(), Some("latest"));
}

#[test]
fn datadir_root_needs_nothing_else() {
    let a = parse(&["--datadir-root", "/tmp/hpp-demo"]);
    let r = a.serve.resolve(|| Some("laptop".into())).unwrap();
    assert_eq!(r.endpoint, Endpoint::Unix("/tmp/hpp-demo/csi.sock".into()));
    assert_eq!(r.node_id, "laptop");
    assert_eq!(r.pools[0].path, std::path::Path::new("/tmp/hpp-demo/pools/legacy"));
    assert!(r.metrics_address.ip().is_loopback());
}

#[test]
fn cluster_mode_requires_a_node_id_and_valid_pools() {
    assert!(parse(&[]).serve.resolve(|| Some("h".into())).is_err());
    let bad = parse(&["--nodeid=n", "--datadir=[{"]);
    let err = bad.serve.resolve(|| None).unwrap_err().to_string();
    assert!(err.contains("unable to parse storage pool info"), "{err}");
    let tcp = parse(&["--nodeid=n", "--endpoint=tcp://127.0.0.1:10000"]);
    assert_eq!(
        tcp.serve.resolve(|| None).unwrap().endpoint,
        Endpoint::Tcp("127.0.0.1:10000".into())
    );
}

#[test]
fn call_subcommand_parses() {
    let a = parse(&["call", "--endpoint", "unix:///tmp/x.sock", "create-volume", "demo"]);
    assert!(matches!(a.command, Some(Command::Call(_))));
}

async fn http_get(url_base: &str, path: &str, tls_root: Option<&str>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (scheme, hostport) = url_base.split_once("://").unwrap();
    let tcp = tokio::net::TcpStream::connect(hostport).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    if scheme == "https" {
        let mut roots = rustls::RootCertStore::empty();
        use rustls::pki_types::pem::PemObject;
        let cert = rustls::pki_types::CertificateDer::from_pem_slice(tls_root.unwrap().as_bytes()).unwrap();
        roots.add(cert).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = connector.connect(name, tcp).await.unwrap();
        tls.write_all(request.as_bytes()).await.unwrap();
        let _ = tls.read_to_string(&mut out).await;
    } else {
        let mut tcp = tcp;
        tcp.write_all(request.as_bytes()).await.unwrap();
        tcp.read_to_string(&mut out).await.unwrap();
    }
    out
}

#[tokio::test]
async fn serves_csi_metrics_and_health_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_string_lossy().into_owned();
    let a = parse(&["--datadir-root", &root, "--nodeid", "test-node"]);
    let running = start(a.serve).await.unwrap();
    let endpoint = running.endpoint().clone();
    assert_eq!(endpoint, Endpoint::Unix(dir.path().join("csi.sock")));
    let base = running.metrics_url().to_owned();
    assert!(base.starts_with("http://127.0.0.1:"), "{base}");
    // Talk CSI over the socket, like the `call` subcommand does.
    call::run(CallArgs {
        endpoint: endpoint.to_string(),
        op: call::Op::CreateVolume {
            name: "demo".into(),
            pool: None,
            from_snapshot: None,
            from_volume: None,
        },
    })
    .await
    .unwrap();
    assert!(dir.path().join("pools/legacy/demo").is_dir());
    let health = http_get(&base, "/healthz", None).await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let metrics = http_get(&base, "/metrics", None).await;
    assert!(
        metrics.contains("hpp_csi_rpc_requests_total{service=\"Controller\",method=\"CreateVolume\",code=\"Ok\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("kubevirt_hpp_pool_path_shared_with_os"), "{metrics}");
    // Pool gone: /healthz says why.
    std::fs::remove_dir_all(dir.path().join("pools/legacy")).unwrap();
    let health = http_get(&base, "/healthz", None).await;
    assert!(health.starts_with("HTTP/1.1 503"), "{health}");
    assert!(health.contains("legacy"), "{health}");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let stopper = tokio::spawn(running.run_until(async {
        let _ = rx.await;
    }));
    tx.send(()).unwrap();
    stopper.await.unwrap().unwrap();
    assert!(!dir.path().join("csi.sock").exists(), "socket removed on shutdown");
}

#[tokio::test]
async fn metrics_over_https_with_cert_flags() {
    let dir = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert_pem = ck.cert.pem();
    std::fs::write(dir.path().join("tls.crt"), &cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), ck.signing_key.serialize_pem()).unwrap();
    let root = dir.path().join("root").to_string_lossy().into_owned();
    let cert = dir.path().join("tls.crt").to_string_lossy().into_owned();
    let key = dir.path().join("tls.key").to_string_lossy().into_owned();
    let a = parse(&[
        "--datadir-root",
        &root,
        "--nodeid",
        "n",
        "--metrics-cert-file",
        &cert,
        "--metrics-key-file",
        &key,
        "--metrics-tls-version",
        "VersionTLS12",
    ]);
    let running = start(a.serve).await.unwrap();
    let base = running.metrics_url().to_owned();
    assert!(base.starts_with("https://"), "{base}");
    let metrics = http_get(&base, "/metrics", Some(&cert_pem)).await;
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(metrics.contains("hpp_pool_capacity_bytes"), "{metrics}");
    running.run_until(async {}).await.unwrap();
    // Only one of the two files: refused at start-up.
    let only_cert = parse(&["--datadir-root", &root, "--nodeid", "n", "--metrics-cert-file", &cert]);
    assert!(start(only_cert.serve).await.is_err());
}
