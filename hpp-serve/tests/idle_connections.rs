//! Many idle connections neither starve new clients nor stay open.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use hpp_serve::{Limits, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Idle connections opened at once: far beyond the cap, within the default listen backlog.
const IDLE: usize = 1000;

fn limits() -> Limits {
    Limits {
        max_connections: 64,
        handshake_timeout: Duration::from_millis(300),
        header_read_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_secs(1),
        drain_timeout: Duration::from_secs(1),
    }
}

async fn start(server: Server) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let router = Router::new().route("/healthz", get(|| async { "ok" }));
    tokio::spawn(server.serve(listener, router, async {
        let _ = stopped.await;
    }));
    (addr, stop)
}

async fn get_healthz(addr: SocketAddr) -> String {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).await.unwrap();
    response
}

/// Whether the server closed `conn` (EOF or reset) rather than leaving it open forever.
async fn closed_by_server(mut conn: TcpStream) -> bool {
    let mut buf = [0u8; 64];
    match conn.read(&mut buf).await {
        Ok(0) | Err(_) => true,
        // The header timeout may answer 408 before closing; then EOF follows.
        Ok(_) => matches!(conn.read(&mut buf).await, Ok(0) | Err(_)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_client_is_served_while_idle_connections_hold_every_slot_and_idle_ones_are_closed() {
    let (addr, stop) = start(Server::new("test", limits())).await;
    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    // Every slot is held by a silent client; the new one is served once they are reaped.
    let response = get_healthz(addr).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("ok"), "{response}");
    let mut closed = 0;
    for conn in idle {
        closed += usize::from(closed_by_server(conn).await);
    }
    assert_eq!(closed, IDLE, "every idle connection is closed by the server");
    stop.send(()).unwrap();
}

#[tokio::test]
async fn a_keep_alive_connection_that_stops_talking_is_closed() {
    let (addr, stop) = start(Server::new("test", limits())).await;
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 1024];
    let n = conn.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    // No next request: the server hangs up instead of holding the descriptor.
    assert!(closed_by_server(conn).await);
    stop.send(()).unwrap();
}

#[tokio::test]
async fn a_tls_listener_closes_connections_that_never_shake_hands() {
    let source: hpp_serve::AcceptorSource = Arc::new(|| Err("no certificate in this test".to_owned()));
    let (addr, stop) = start(Server::new("test", limits()).with_tls(source)).await;
    let conn = TcpStream::connect(addr).await.unwrap();
    assert!(closed_by_server(conn).await);
    stop.send(()).unwrap();
}
