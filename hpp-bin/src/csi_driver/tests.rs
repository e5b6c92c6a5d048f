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
fn expansion_defaults_to_controller_and_accepts_node() {
    let d = parse(&["--datadir-root", "/tmp/x"]).serve.expansion;
    assert_eq!(ExpansionMode::from(d), ExpansionMode::Controller);
    let n = parse(&["--datadir-root", "/tmp/x", "--expansion=node"]).serve.expansion;
    assert_eq!(ExpansionMode::from(n), ExpansionMode::Node);
    let bad = Args::try_parse_from(["hpp-csi-driver", "--expansion=sideways"]);
    assert!(bad.is_err());
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

/// `call ARGS` against `endpoint`, as the command line would run it.
async fn call_cli(endpoint: &Endpoint, args: &[&str]) -> Result<String, call::CallError> {
    let endpoint = endpoint.to_string();
    let mut argv = vec!["call", "--endpoint", endpoint.as_str()];
    argv.extend_from_slice(args);
    let Some(Command::Call(call)) = parse(&argv).command else {
        panic!("call expected")
    };
    call::run(call).await
}

#[tokio::test]
async fn call_prints_tables_by_default_json_or_yaml_on_request_and_errors_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_string_lossy().into_owned();
    let running = start(parse(&["--datadir-root", &root, "--nodeid", "test-node"]).serve)
        .await
        .unwrap();
    let ep = running.endpoint().clone();

    let created = call_cli(&ep, &["create-volume", "demo"]).await.unwrap();
    let lines: Vec<&str> = created.lines().collect();
    assert_eq!(lines.len(), 2, "{created}");
    assert!(
        lines[0].starts_with("VOLUME") && lines[0].contains("CAPACITY"),
        "{created}"
    );
    assert!(lines[1].starts_with("demo "), "{created}");
    assert!(lines[1].contains("test-node"), "{created}");
    assert!(!created.contains("Volume {"), "no Rust debug structs: {created}");

    let json: serde_json::Value =
        serde_json::from_str(&call_cli(&ep, &["-o", "json", "list-volumes"]).await.unwrap()).unwrap();
    assert_eq!(json[0]["volumeId"], "demo");
    // `-o` also after the RPC, as kubectl takes it anywhere.
    let yaml = call_cli(&ep, &["probe", "-o", "yaml"]).await.unwrap();
    let probe: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(probe["ready"], true, "{yaml}");
    assert_eq!(call_cli(&ep, &["probe"]).await.unwrap(), "ready\n");

    let target = dir.path().join("target");
    let published = call_cli(&ep, &["publish", "demo", target.to_str().unwrap()])
        .await
        .unwrap();
    assert_eq!(published, format!("published demo {}\n", target.display()));
    call_cli(&ep, &["unpublish", "demo", target.to_str().unwrap()])
        .await
        .unwrap();

    let err = call_cli(&ep, &["publish", "missing", target.to_str().unwrap()])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("NotFound: "), "{err}");
    assert!(
        err.contains("missing") && !err.contains('\n') && !err.contains("metadata"),
        "{err}"
    );
    drop(running);
}

#[test]
fn human_sizes_are_binary_units() {
    assert_eq!(call::human_bytes(512), "512");
    assert_eq!(call::human_bytes(10 << 30), "10Gi");
    assert_eq!(call::human_bytes(3 << 19), "1.5Mi");
}

#[test]
fn version_is_printed_by_bare_flag_short_flag_and_subcommand_but_a_value_is_kubevirts() {
    assert!(parse(&["--version"]).wants_version());
    assert!(parse(&["-V"]).wants_version());
    assert!(parse(&["version"]).wants_version());
    let kubevirt = parse(&["--version=latest", "--nodeid=n"]);
    assert!(!kubevirt.wants_version());
    assert_eq!(kubevirt.serve.vendor_version.as_deref(), Some("latest"));
    let spaced = parse(&["--version", "v0.26.0", "--nodeid=n"]);
    assert_eq!(spaced.serve.vendor_version.as_deref(), Some("v0.26.0"));
    assert!(version_line().starts_with(concat!("hpp-csi-driver ", env!("CARGO_PKG_VERSION"))));
}

#[test]
fn startup_hint_names_this_binary_not_cargo() {
    let hint = startup_hint(
        "/usr/bin/hpp-csi-driver",
        &Endpoint::Unix("/csi/csi.sock".into()),
        "https://[::]:8443",
    );
    assert!(
        hint.contains("/usr/bin/hpp-csi-driver call --endpoint unix:///csi/csi.sock info"),
        "{hint}"
    );
    assert!(!hint.contains("cargo"), "{hint}");
    assert!(own_command().ends_with(std::env::current_exe().unwrap().file_name().unwrap().to_str().unwrap()));
}

#[test]
fn metrics_tls_policy_names_the_flag_not_the_environment() {
    let policy = http::metrics_tls_policy("VersionTLS12").policy.to_string();
    assert!(policy.contains("--metrics-tls-version"), "{policy}");
    assert!(!policy.contains("environment"), "{policy}");
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
        output: None,
        op: call::Op::CreateVolume {
            name: "demo".into(),
            size: None,
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
    let live = http_get(&base, "/livez", None).await;
    assert!(live.starts_with("HTTP/1.1 200") && live.ends_with("ok"), "{live}");
    // Pool gone: /healthz says "not ok" and nothing more (no pool names or paths to
    // unauthenticated callers); /livez still passes (the driver keeps answering Probe ready:
    // one unusable pool takes only itself out).
    std::fs::remove_dir_all(dir.path().join("pools/legacy")).unwrap();
    let health = http_get(&base, "/healthz", None).await;
    assert!(health.starts_with("HTTP/1.1 503"), "{health}");
    assert!(health.ends_with("\r\n\r\nnot ok"), "{health}");
    assert!(!health.contains("legacy") && !health.contains("pools"), "{health}");
    let live = http_get(&base, "/livez", None).await;
    assert!(live.starts_with("HTTP/1.1 200") && live.ends_with("ok"), "{live}");
    // CSI socket gone: the driver can no longer be reached, so /livez fails.
    std::fs::remove_file(dir.path().join("csi.sock")).unwrap();
    let live = http_get(&base, "/livez", None).await;
    assert!(live.starts_with("HTTP/1.1 500"), "{live}");
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
    // Only one of the two files: KubeVirt's self-signed fallback, still HTTPS.
    let only_cert = parse(&["--datadir-root", &root, "--nodeid", "n", "--metrics-cert-file", &cert]);
    assert_eq!(http::scheme(&only_cert.serve), http::Scheme::Https);
    let running = start(only_cert.serve).await.unwrap();
    let scrape = metrics_scrape(running.metrics_url()).await;
    assert!(scrape.response.starts_with("HTTP/1.1 200"), "{}", scrape.response);
    assert_ne!(
        scrape.peer_cert,
        ck.cert.der().clone(),
        "self-signed, not the lone file"
    );
    running.run_until(async {}).await.unwrap();
    // A certificate that does not parse fails start-up.
    std::fs::write(dir.path().join("tls.crt"), "garbage").unwrap();
    let broken = parse(&[
        "--datadir-root",
        &root,
        "--nodeid",
        "n",
        "--metrics-cert-file",
        &cert,
        "--metrics-key-file",
        &key,
    ]);
    assert!(start(broken.serve).await.is_err());
}

/// Scrapes like the ServiceMonitor: HTTPS, insecureSkipVerify, TLS 1.3.
async fn metrics_scrape(base: &str) -> crate::metrics_tls::test_client::Scrape {
    use crate::metrics_tls::test_client::{Trust, https_get};
    let addr: SocketAddr = base.strip_prefix("https://").unwrap().parse().unwrap();
    https_get(addr, "/metrics", Trust::Any, &[&rustls::version::TLS13])
        .await
        .unwrap()
}

#[test]
fn metrics_tls_version_is_kubevirts() {
    use hpp_webhook::tls::TlsVersion;
    let min = |flag: &str| http::metrics_tls_policy(flag).policy.min_version();
    assert_eq!(min("VersionTLS12"), TlsVersion::Tls12);
    assert_eq!(min("VersionTLS13"), TlsVersion::Tls13);
    // rustls has no TLS 1.0/1.1: raised to 1.2; unknown values fall back to 1.3, not an error.
    assert_eq!(min("VersionTLS10"), TlsVersion::Tls12);
    assert_eq!(min("TLS1.9"), TlsVersion::Tls13);
    assert_eq!(min(""), TlsVersion::Tls13);
}

#[test]
fn scheme_follows_the_flags() {
    let cluster = parse(&["--nodeid=n"]);
    assert_eq!(http::scheme(&cluster.serve), http::Scheme::Https);
    let opt_out = parse(&["--nodeid=n", "--metrics-insecure-http"]);
    assert_eq!(http::scheme(&opt_out.serve), http::Scheme::Http);
    let demo = parse(&["--datadir-root=/tmp/x"]);
    assert_eq!(http::scheme(&demo.serve), http::Scheme::Http);
    let demo_tls = parse(&["--datadir-root=/tmp/x", "--metrics-cert-file=a", "--metrics-key-file=b"]);
    assert_eq!(http::scheme(&demo_tls.serve), http::Scheme::Https);
    let both = Args::try_parse_from(["hpp-csi-driver", "--metrics-insecure-http", "--metrics-cert-file=a"]);
    assert!(both.is_err(), "plain HTTP and a certificate contradict each other");
}

/// The DaemonSet's flags (no certificate files): HTTPS with a self-signed certificate, so the
/// ServiceMonitor's scrape works and HPPSharingPoolPathWithOS can fire.
#[tokio::test]
async fn kubevirt_flags_serve_self_signed_https_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool");
    std::fs::create_dir(&pool).unwrap();
    let datadir = format!(r#"--datadir=[{{"name":"legacy","path":"{}"}}]"#, pool.display());
    let endpoint = format!("--endpoint=unix://{}", dir.path().join("csi.sock").display());
    let a = parse(&[
        "--nodeid=node-1",
        &datadir,
        &endpoint,
        "--metrics-address=127.0.0.1:0",
        "--metrics-tls-version=VersionTLS12",
    ]);
    let running = start(a.serve).await.unwrap();
    let base = running.metrics_url().to_owned();
    assert!(base.starts_with("https://127.0.0.1:"), "{base}");
    let scrape = metrics_scrape(&base).await;
    assert!(scrape.response.starts_with("HTTP/1.1 200"), "{}", scrape.response);
    assert!(
        scrape.response.contains("\nkubevirt_hpp_pool_path_shared_with_os 1\n"),
        "{}",
        scrape.response
    );
    // Plain HTTP is not spoken on the HTTPS port.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(base.strip_prefix("https://").unwrap())
            .await
            .unwrap();
        tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let _ = tcp.read_to_end(&mut answer).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            !answer.contains("kubevirt_hpp"),
            "metrics leaked over plain HTTP: {answer}"
        );
    }
    running.run_until(async {}).await.unwrap();

    // The opt-out serves plain HTTP.
    let opt_out = parse(&[
        "--nodeid=node-1",
        &datadir,
        &endpoint,
        "--metrics-address=127.0.0.1:0",
        "--metrics-insecure-http",
    ]);
    let running = start(opt_out.serve).await.unwrap();
    let base = running.metrics_url().to_owned();
    assert!(base.starts_with("http://"), "{base}");
    assert!(
        http_get(&base, "/metrics", None)
            .await
            .contains("kubevirt_hpp_pool_path_shared_with_os")
    );
    running.run_until(async {}).await.unwrap();
}

#[tokio::test]
async fn healthz_runs_one_report_at_a_time_and_a_hung_one_answers_not_ok() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::http::pools_usable;

    let reports = Arc::new(tokio::sync::Semaphore::new(1));
    let started = Arc::new(AtomicUsize::new(0));
    let (release, hung) = std::sync::mpsc::channel::<()>();
    let (began, first_began) = std::sync::mpsc::channel::<()>();
    // A report that hangs (a pool on a dead NFS server) until released.
    let s = started.clone();
    let first = pools_usable(reports.clone(), Duration::from_millis(50), move || {
        s.fetch_add(1, Ordering::SeqCst);
        let _ = began.send(());
        hung.recv().is_ok()
    });
    assert_eq!(first.await, None, "not finished in time: not ok");
    // Its thread holds the permit from the start, but may begin running only now.
    first_began.recv_timeout(Duration::from_secs(30)).unwrap();
    // While it hangs, later requests answer "not ok" without a report (a thread) of their own.
    for _ in 0..3 {
        let s = started.clone();
        let later = pools_usable(reports.clone(), Duration::from_millis(20), move || {
            s.fetch_add(1, Ordering::SeqCst);
            true
        });
        assert_eq!(later.await, None);
    }
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "one stuck thread, not one per request"
    );
    // Once the filesystem answers, reports run again.
    release.send(()).unwrap();
    assert_eq!(
        pools_usable(reports.clone(), Duration::from_secs(30), || true).await,
        Some(true)
    );
    assert_eq!(
        pools_usable(reports, Duration::from_secs(30), || false).await,
        Some(false)
    );
}

#[tokio::test]
async fn call_trash_lists_restores_purges_and_moves_orphans() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let pool = root.join("pool");
    let datadir = format!(
        r#"[{{"name":"local","path":"{}","trashRetention":"72h"}}]"#,
        pool.display()
    );
    let endpoint = format!("unix://{}", root.join("csi.sock").display());
    let args = parse(&[
        "--datadir",
        &datadir,
        "--endpoint",
        &endpoint,
        "--nodeid",
        "n1",
        "--metrics-address",
        "127.0.0.1:0",
    ]);
    let running = start(args.serve).await.unwrap();
    let ep = running.endpoint().clone();
    call_cli(&ep, &["create-volume", "pvc-1", "--pool", "local"])
        .await
        .unwrap();
    std::fs::write(pool.join("pvc-1/data"), b"precious").unwrap();
    call_cli(&ep, &["delete-volume", "pvc-1"]).await.unwrap();

    let listed = call_cli(&ep, &["trash", "list"]).await.unwrap();
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 2, "{listed}");
    for header in ["POOL", "ENTRY", "CLAIM", "SIZE", "DELETED", "PURGE"] {
        assert!(lines[0].contains(header), "{listed}");
    }
    assert!(
        lines[1].starts_with("local ") && lines[1].contains("pvc-1@"),
        "{listed}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&call_cli(&ep, &["trash", "list", "-o", "json"]).await.unwrap()).unwrap();
    let entry = json[0]["entry"].as_str().unwrap().to_owned();
    assert_eq!(json[0]["volumeId"], "pvc-1");
    assert!(json[0]["purgeAt"].as_str().unwrap().ends_with('Z'), "{json}");

    let restored = call_cli(&ep, &["trash", "restore", &entry, "--as", "pvc-back"])
        .await
        .unwrap();
    assert_eq!(restored, format!("restored {entry} as volume pvc-back in pool local\n"));
    assert_eq!(std::fs::read(pool.join("pvc-back/data")).unwrap(), b"precious");

    let moved = call_cli(&ep, &["-o", "json", "trash", "move", "pvc-back"])
        .await
        .unwrap();
    let moved: serde_json::Value = serde_json::from_str(&moved).unwrap();
    let entry = moved["entry"].as_str().unwrap().to_owned();
    assert_eq!(
        call_cli(&ep, &["trash", "purge", &entry]).await.unwrap(),
        format!("purged {entry}\n")
    );
    assert_eq!(call_cli(&ep, &["trash", "list"]).await.unwrap().lines().count(), 1);
    let err = call_cli(&ep, &["trash", "purge", &entry])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("NotFound: "), "{err}");
    drop(running);
}

/// `GET path` over plain HTTP with an optional bearer token; the whole response.
async fn http_get_bearer(url_base: &str, path: &str, token: Option<&str>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let hostport = url_base.strip_prefix("http://").unwrap();
    let mut tcp = tokio::net::TcpStream::connect(hostport).await.unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn the_volume_report_needs_its_token_and_lists_every_volume() {
    // Without the flag the endpoint does not exist.
    let other = tempfile::tempdir().unwrap();
    let other_root = other.path().to_string_lossy().into_owned();
    let plain = start(parse(&["--datadir-root", &other_root, "--nodeid", "n1"]).serve)
        .await
        .unwrap();
    let missing = http_get_bearer(plain.metrics_url(), "/volumes", Some("x")).await;
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    drop(plain);

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_string_lossy().into_owned();

    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let args = parse(&[
        "--datadir-root",
        &root,
        "--nodeid",
        "n1",
        "--volume-report-token-file",
        token.to_str().unwrap(),
    ]);
    let running = start(args.serve).await.unwrap();
    let ep = running.endpoint().clone();
    call_cli(&ep, &["create-volume", "vol-a"]).await.unwrap();
    call_cli(&ep, &["create-volume", "vol-b"]).await.unwrap();
    std::fs::write(dir.path().join("pools/legacy/vol-a/blob"), vec![1u8; 64 << 10]).unwrap();
    let base = running.metrics_url().to_owned();
    for bad in [None, Some("wrong"), Some("s3cre")] {
        let r = http_get_bearer(&base, "/volumes", bad).await;
        assert!(r.starts_with("HTTP/1.1 401"), "{bad:?}: {r}");
        assert!(!r.contains("vol-a"), "{r}");
    }
    let r = http_get_bearer(&base, "/volumes?usage=vol-a", Some("s3cret")).await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let body = r.split_once("\r\n\r\n").unwrap().1;
    let report: hpp_csi::inventory::Inventory = serde_json::from_str(body).unwrap();
    assert_eq!(report.node, "n1");
    let pool = &report.pools[0];
    assert!(pool.usable && !pool.shared);
    let ids: Vec<&str> = pool.volumes.iter().map(|v| v.id.as_str()).collect();
    assert_eq!(ids, ["vol-a", "vol-b"]);
    assert!(pool.volumes[0].used_bytes.unwrap() >= 64 << 10, "{body}");
    assert_eq!(pool.volumes[1].used_bytes, None, "usage only for the ids asked for");
    assert!(pool.volumes.iter().all(|v| !v.published && v.created_at.is_some()));
    // A rotated token takes effect at once.
    std::fs::write(&token, "rotated").unwrap();
    assert!(
        http_get_bearer(&base, "/volumes", Some("s3cret"))
            .await
            .starts_with("HTTP/1.1 401")
    );
    assert!(
        http_get_bearer(&base, "/volumes", Some("rotated"))
            .await
            .starts_with("HTTP/1.1 200")
    );
    drop(running);
}

/// KubeVirt's legacy DaemonSet (no command, no args, PV_DIR) runs the legacy provisioner; every
/// CSI DaemonSet start (arguments, CSI_ENDPOINT) and a bare start without PV_DIR stay the driver.
#[test]
fn only_kubevirts_legacy_daemonset_start_runs_the_legacy_provisioner() {
    use std::ffi::OsString;
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| OsString::from(v))
    };
    let bare = [OsString::from("/usr/bin/hpp-csi-driver")];
    let legacy: &[(&str, &str)] = &[
        ("USE_NAMING_PREFIX", "false"),
        ("NODE_NAME", "n1"),
        ("PV_DIR", "/var/hpvolumes"),
    ];
    assert!(is_kubevirt_legacy_start(&bare, env(legacy)));
    // KubeVirt's CSI DaemonSet: arguments, and CSI_ENDPOINT and PV_DIR in the environment.
    let csi: &[(&str, &str)] = &[
        ("CSI_ENDPOINT", "unix:///csi/csi.sock"),
        ("PV_DIR", "[]"),
        ("NODE_NAME", "n1"),
    ];
    let with_args = [
        OsString::from("hpp-csi-driver"),
        OsString::from("--endpoint=$(CSI_ENDPOINT)"),
    ];
    assert!(!is_kubevirt_legacy_start(&with_args, env(csi)));
    assert!(!is_kubevirt_legacy_start(&bare, env(csi)));
    // Arguments always mean the driver, whatever the environment.
    assert!(!is_kubevirt_legacy_start(&with_args, env(legacy)));
    // A bare start without PV_DIR (or with it empty) is the driver's own defaults.
    assert!(!is_kubevirt_legacy_start(&bare, env(&[("NODE_NAME", "n1")])));
    assert!(!is_kubevirt_legacy_start(&bare, env(&[("PV_DIR", "")])));
}

/// A driver serving `datadir` (a `--datadir` JSON) with `extra` flags, its socket and plain-HTTP
/// metrics in `dir`.
async fn start_with(dir: &std::path::Path, datadir: &str, extra: &[&str]) -> anyhow::Result<Running> {
    let endpoint = format!("unix://{}", dir.join("csi.sock").display());
    let mut argv = vec![
        "--datadir",
        datadir,
        "--endpoint",
        &endpoint,
        "--nodeid",
        "n1",
        "--metrics-address",
        "127.0.0.1:0",
        "--metrics-insecure-http",
    ];
    argv.extend_from_slice(extra);
    start(parse(&argv).serve).await
}

fn json_of(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[tokio::test]
async fn call_creates_sized_volumes_expands_and_modifies_them_with_sizes_in_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let datadir = format!(r#"[{{"name":"local","path":"{}"}}]"#, root.join("pool").display());
    let running = start_with(&root, &datadir, &[]).await.unwrap();
    let ep = running.endpoint().clone();

    let created = call_cli(&ep, &["-o", "json", "create-volume", "demo", "--size", "64Mi"])
        .await
        .unwrap();
    assert_eq!(json_of(&created)["capacityBytes"], 67_108_864, "{created}");
    let table = call_cli(&ep, &["create-volume", "demo", "--size", "64Mi"])
        .await
        .unwrap();
    assert!(table.lines().nth(1).unwrap().contains("64Mi"), "{table}");
    // A size larger than the one recorded: AlreadyExists, on one line.
    let err = call_cli(&ep, &["create-volume", "demo", "--size", "1Gi"])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("AlreadyExists: "), "{err}");

    // The default driver expands on the controller; no node call is asked for here.
    let expanded = call_cli(&ep, &["expand", "demo", "128Mi", "-o", "yaml"]).await.unwrap();
    let expanded: serde_json::Value = serde_saphyr::from_str(&expanded).unwrap();
    assert_eq!(expanded["capacityBytes"], 134_217_728);
    assert_eq!(expanded["calls"], serde_json::json!(["ControllerExpandVolume"]));
    let listed = json_of(&call_cli(&ep, &["-o", "json", "list-volumes"]).await.unwrap());
    assert_eq!(listed[0]["volumeId"], "demo");

    // A pool without a quota backend applies no mutable parameter: the driver says which.
    let err = call_cli(&ep, &["modify", "demo", "compression=zstd"])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("InvalidArgument: ") && err.contains("compression"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");

    // Bad sizes and parameters are refused before any call.
    for bad in [
        &["create-volume", "x", "--size", "64MB"][..],
        &["expand", "demo", "lots"][..],
        &["modify", "demo", "compression"][..],
        &["modify", "demo"][..],
    ] {
        let mut argv = vec!["call", "--endpoint", "unix:///nowhere"];
        argv.extend_from_slice(bad);
        assert!(
            Args::try_parse_from(std::iter::once("hpp-csi-driver").chain(argv)).is_err(),
            "{bad:?}"
        );
    }
    running.run_until(async {}).await.unwrap();
}

#[tokio::test]
async fn call_expand_makes_the_node_call_where_the_driver_expands_on_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let datadir = format!(r#"[{{"name":"local","path":"{}"}}]"#, root.join("pool").display());
    let running = start_with(&root, &datadir, &["--expansion=node"]).await.unwrap();
    let ep = running.endpoint().clone();
    call_cli(&ep, &["create-volume", "demo", "--size", "64Mi"])
        .await
        .unwrap();
    let err = call_cli(&ep, &["expand", "demo", "128Mi"])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("--target") && err.contains("node only"), "{err}");

    let target = root.join("target");
    let target_text = target.to_str().unwrap();
    if call_cli(&ep, &["publish", "demo", target_text]).await.is_err() {
        eprintln!("skipping the node half: publishing (a bind mount) needs root");
        running.run_until(async {}).await.unwrap();
        return;
    }
    let out = call_cli(&ep, &["-o", "json", "expand", "demo", "128Mi", "--target", target_text])
        .await
        .unwrap();
    let expanded = json_of(&out);
    assert_eq!(expanded["capacityBytes"], 134_217_728, "{out}");
    assert_eq!(expanded["calls"], serde_json::json!(["NodeExpandVolume"]));
    call_cli(&ep, &["unpublish", "demo", target_text]).await.unwrap();
    running.run_until(async {}).await.unwrap();
}

#[tokio::test]
async fn call_snapshot_finds_its_source_in_any_pool() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let datadir = format!(
        r#"[{{"name":"first","path":"{0}/first","snapshotPath":"{0}/snap-first","snapshotProvider":"reflink"}},
            {{"name":"second","path":"{0}/second","snapshotPath":"{0}/snap-second","snapshotProvider":"reflink"}}]"#,
        root.display()
    );
    let running = start_with(&root, &datadir, &[]).await.unwrap();
    let ep = running.endpoint().clone();
    call_cli(&ep, &["create-volume", "vol-2", "--pool", "second"])
        .await
        .unwrap();
    let snap = json_of(
        &call_cli(&ep, &["-o", "json", "snapshot", "vol-2", "snap-2"])
            .await
            .unwrap(),
    );
    assert_eq!(snap["sourceVolumeId"], "vol-2");
    assert!(root.join("snap-second/snap-2").is_dir());
    running.run_until(async {}).await.unwrap();
}

#[tokio::test]
async fn a_datadir_with_a_typo_or_a_missing_parent_is_refused_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let pool = root.join("pool");
    let typo = format!(r#"[{{"name":"a","path":"{}","Quota":"image"}}]"#, pool.display());
    let err = crate::error_line("hpp-csi-driver", &start_with(&root, &typo, &[]).await.err().unwrap());
    assert!(
        err.contains(r#"storage pool "a": unknown key "Quota" (known: name, path,"#)
            && err.contains("keys are case-sensitive"),
        "{err}"
    );
    let zero = format!(r#"[{{"name":"a","path":"{}","overcommitPercent":0}}]"#, pool.display());
    let err = crate::error_line("hpp-csi-driver", &start_with(&root, &zero, &[]).await.err().unwrap());
    assert!(
        err.contains(r#"storage pool "a": overcommitPercent: 0 is out of range; use a percentage"#),
        "{err}"
    );
    assert!(!pool.exists(), "nothing made for a refused configuration");

    let deep = root.join("not/yet/there");
    let missing = format!(r#"[{{"name":"a","path":"{}"}}]"#, deep.display());
    let err = crate::error_line("hpp-csi-driver", &start_with(&root, &missing, &[]).await.err().unwrap());
    assert!(
        err.contains("does not exist") && err.contains("--create-pool-parents"),
        "{err}"
    );
    assert!(
        !root.join("not").exists(),
        "no parents made on whatever disk holds them"
    );
    let running = start_with(&root, &missing, &["--create-pool-parents"]).await.unwrap();
    assert!(deep.is_dir());
    running.run_until(async {}).await.unwrap();

    // KubeVirt's layout: the hostPath exists, its `csi` child is made.
    let kubevirt = format!(r#"[{{"name":"legacy","path":"{}/csi"}}]"#, root.display());
    let running = start_with(&root, &kubevirt, &[]).await.unwrap();
    assert!(root.join("csi").is_dir());
    running.run_until(async {}).await.unwrap();
}
