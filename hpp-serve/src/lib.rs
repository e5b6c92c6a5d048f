//! The one accept loop of every hpp listener (webhook, metrics, health and admin servers).
//!
//! `axum::serve` has no timer, so hyper silently disables its header timeout, and it has no
//! connection cap or TLS handshake bound: a client holding thousands of idle connections
//! exhausts the process's file descriptors. [`Server::serve`] adds, for plain HTTP and TLS
//! alike:
//!
//! - a cap on connections served at once (further clients wait in the listen backlog);
//! - a TLS handshake timeout;
//! - a header read timeout (hyper's; it also closes keep-alive connections that send no next
//!   request);
//! - an idle timeout: a connection with no bytes read or written for that long is closed, even
//!   in the middle of a response to a client that stopped reading;
//! - a graceful drain on shutdown, bounded in time.

mod idle;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

pub use idle::Activity;

/// Limits and timeouts of a listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; further clients wait in the listen backlog.
    pub max_connections: usize,
    /// Time a client has to complete the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time a client has to send a request's headers, and to start the next request on a
    /// keep-alive connection.
    pub header_read_timeout: Duration,
    /// A connection with no traffic in either direction for this long is closed. Longer than any
    /// handler may take, since a handler computing its answer sends nothing.
    pub idle_timeout: Duration,
    /// How long open connections may finish after shutdown starts.
    pub drain_timeout: Duration,
}

impl Default for Limits {
    /// Defaults for small metrics and health servers: 256 connections, 10 s handshake and
    /// headers, 60 s idle, 10 s drain.
    fn default() -> Self {
        Self {
            max_connections: 256,
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(10),
        }
    }
}

/// Builds the TLS acceptor for each new connection, so certificate and policy changes apply
/// without a restart. An error drops the connection.
pub type AcceptorSource = Arc<dyn Fn() -> Result<TlsAcceptor, String> + Send + Sync>;

/// Called after each failed or timed-out TLS handshake (e.g. to count it).
pub type HandshakeFailed = Arc<dyn Fn() + Send + Sync>;

/// One listener: what it is called in logs, its limits, and its TLS (none for plain HTTP).
#[derive(Clone)]
pub struct Server {
    name: &'static str,
    limits: Limits,
    tls: Option<AcceptorSource>,
    on_handshake_failed: Option<HandshakeFailed>,
}

impl Server {
    /// A plain-HTTP listener called `name` in logs.
    pub fn new(name: &'static str, limits: Limits) -> Self {
        Self {
            name,
            limits,
            tls: None,
            on_handshake_failed: None,
        }
    }

    /// Serves HTTPS with the acceptor `source` builds per connection.
    #[must_use]
    pub fn with_tls(mut self, source: AcceptorSource) -> Self {
        self.tls = Some(source);
        self
    }

    /// Calls `hook` after each failed TLS handshake.
    #[must_use]
    pub fn on_handshake_failed(mut self, hook: HandshakeFailed) -> Self {
        self.on_handshake_failed = Some(hook);
        self
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Accepts connections on `listener` and serves `router` on each (HTTP/1.1) until
    /// `shutdown` resolves, then closes the port and drains for at most `drain_timeout`.
    pub async fn serve(self, listener: TcpListener, router: Router, shutdown: impl Future<Output = ()>) {
        let graceful = GracefulShutdown::new();
        let connections = Arc::new(Semaphore::new(self.limits.max_connections.max(1)));
        let mut shutdown = std::pin::pin!(shutdown);
        let name = self.name;
        if let Ok(addr) = listener.local_addr() {
            let scheme = if self.tls.is_some() { "https" } else { "http" };
            info!(%addr, listener = name, scheme, max_connections = self.limits.max_connections, "listening");
        }
        loop {
            let permit = tokio::select! {
                permit = connections.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
                () = &mut shutdown => break,
            };
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Usually EMFILE; back off instead of spinning.
                        warn!(listener = name, error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let watcher = graceful.watcher();
            let service = TowerToHyperService::new(router.clone());
            let this = self.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let (tcp, activity) = Activity::track(tcp);
                let Some(tls) = this.tls.clone() else {
                    let conn = serve_connection(&this.limits, tcp, service);
                    this.until_idle(watcher.watch(conn), &activity, peer).await;
                    return;
                };
                let acceptor = match tls() {
                    Ok(a) => a,
                    Err(e) => {
                        warn!(listener = name, error = %e, "TLS configuration unusable; dropping the connection");
                        return;
                    }
                };
                let stream = match tokio::time::timeout(this.limits.handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        this.handshake_failed();
                        debug!(listener = name, %peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        this.handshake_failed();
                        debug!(listener = name, %peer, "TLS handshake timed out");
                        return;
                    }
                };
                let conn = serve_connection(&this.limits, stream, service);
                this.until_idle(watcher.watch(conn), &activity, peer).await;
            });
        }
        drop(listener);
        info!(listener = name, "shutting down; draining connections");
        tokio::select! {
            () = graceful.shutdown() => {}
            () = tokio::time::sleep(self.limits.drain_timeout) => warn!(listener = name, "connections still open after the drain timeout"),
        }
    }

    fn handshake_failed(&self) {
        if let Some(hook) = &self.on_handshake_failed {
            hook();
        }
    }

    /// Runs `conn` to completion, or drops it (closing the socket) once it has been idle for
    /// `idle_timeout`.
    async fn until_idle<E: std::fmt::Display>(
        &self,
        conn: impl Future<Output = Result<(), E>>,
        activity: &Activity,
        peer: std::net::SocketAddr,
    ) {
        tokio::select! {
            result = conn => if let Err(e) = result {
                debug!(listener = self.name, %peer, error = %e, "connection ended with an error");
            },
            () = activity.idle_for(self.limits.idle_timeout) => {
                debug!(listener = self.name, %peer, "closing idle connection");
            }
        }
    }
}

fn serve_connection<I>(
    limits: &Limits,
    io: I,
    service: TowerToHyperService<Router>,
) -> hyper::server::conn::http1::Connection<TokioIo<I>, TowerToHyperService<Router>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder.serve_connection(TokioIo::new(io), service)
}
