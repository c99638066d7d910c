//! The admin HTTP port of one member (HTTP/1.1, axum): `/metrics`
//! (Prometheus / OpenMetrics text), `/health` and `/ready`. Answers are
//! described in `METRICS.md`.
//!
//! - `/health`: 200 `ok member <id>` while the process serves and openraft
//!   runs; 503 with the reason once openraft has stopped on a fatal error.
//! - `/ready`: 200 when a leader is known AND this member has applied up to
//!   the commit index it knows (read from the Raft core's own state, which
//!   openraft's metrics do not carry); 503 with a one-line reason otherwise.
//! - `/metrics`: the counters and histograms of [`Metrics`], with the Raft
//!   and engine gauges filled at scrape time.
//!
//! With TLS on (the member's `--tls-*` flags) the port speaks HTTPS
//! through a rustls acceptor in front of axum, client certificates
//! demanded when `--admin-client-cert-auth` is set; handshakes run
//! concurrently, each bounded by [`TLS_HANDSHAKE_TIMEOUT`], and hold a
//! connection slot while they run.
//!
//! Connections are capped ([`ADMIN_CONNECTIONS_MAX`]) and closed when idle
//! ([`ADMIN_IDLE_TIMEOUT`]); the server stops
//! accepting when the node's shutdown signal fires and finishes the
//! requests in flight.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::raft::types::NodeRaft;
use crate::raft::watch::MetricsWatch;
use crate::server::metrics::{EngineView, HistoryView, METRICS_CONTENT_TYPE, Metrics, ScrapeView};
use crate::server::security::TLS_HANDSHAKE_TIMEOUT;
use crate::state_machine::StateMachine;

/// Admin connections open at once at most; further ones wait in the
/// kernel's accept queue. Scrapers and probes need a handful.
pub const ADMIN_CONNECTIONS_MAX: usize = 64;
/// How long `/ready` and `/metrics` wait for the Raft core to report its
/// commit index (it answers between its own steps).
pub const RAFT_QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// An admin connection with no read or write progress for this long is
/// closed, so idle keep-alive or stalled clients give their slot back.
pub const ADMIN_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause after a failed `accept` (for example out of file descriptors)
/// before trying again.
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// What the admin handlers read: the member's Raft, state machine and
/// metrics.
#[derive(Clone)]
pub struct AdminState {
    id: u64,
    raft: NodeRaft,
    state_machine: StateMachine,
    metrics: Metrics,
}

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminState")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl AdminState {
    /// The admin state of member `id`.
    pub fn new(
        id: u64,
        raft: NodeRaft,
        state_machine: StateMachine,
        metrics: Metrics,
    ) -> AdminState {
        AdminState {
            id,
            raft,
            state_machine,
            metrics,
        }
    }

    /// The commit index the Raft core knows (0 = nothing committed).
    async fn commit_index(&self) -> Result<u64, String> {
        let query = self
            .raft
            .with_raft_state(|state| state.local_committed().map_or(0, |log_id| log_id.index));
        match tokio::time::timeout(RAFT_QUERY_TIMEOUT, query).await {
            Err(_) => Err(format!(
                "the raft core did not report its commit index within RAFT_QUERY_TIMEOUT ({} ms)",
                RAFT_QUERY_TIMEOUT.as_millis()
            )),
            Ok(Err(fatal)) => Err(format!("raft stopped: {fatal}")),
            Ok(Ok(index)) => Ok(index),
        }
    }

    /// The index of the last entry the state machine applied (0 = none).
    fn applied_index(&self) -> u64 {
        self.state_machine
            .applied()
            .0
            .map_or(0, |log_id| log_id.index)
    }

    /// Everything a scrape reports.
    async fn scrape_view(&self) -> ScrapeView {
        let commit_index = self.commit_index().await.ok();
        let (term, leader, last_log_index) = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            (m.current_term, m.current_leader, m.last_log_index)
        };
        let engine = self.state_machine.engine();
        // stats() walks the file list under the engine's locks: off the
        // async workers.
        let engine = tokio::task::spawn_blocking(move || {
            let stats = engine.stats();
            EngineView {
                keys: stats.keys,
                live_bytes: stats.live_bytes,
                dead_bytes: stats.dead_bytes,
            }
        })
        .await
        .ok();
        ScrapeView {
            term,
            is_leader: leader == Some(self.id),
            leader_id: leader.unwrap_or(0),
            last_log_index: last_log_index.unwrap_or(0),
            applied_index: self.applied_index(),
            commit_index,
            engine,
            leases: {
                let (leases, keys, expired, revoked) = self.state_machine.lease_counts();
                crate::server::metrics::LeaseView {
                    leases,
                    keys,
                    expired,
                    revoked,
                }
            },
            history: self.state_machine.history().try_read().ok().map(|history| {
                let (records, bytes) = history.records();
                HistoryView {
                    compact_revision: history.compact_revision(),
                    revision: history.revision(),
                    records: records as u64,
                    bytes,
                }
            }),
        }
    }
}

async fn metrics(State(admin): State<AdminState>) -> impl IntoResponse {
    let view = admin.scrape_view().await;
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        admin.metrics.encode(&view),
    )
}

async fn health(State(admin): State<AdminState>) -> (StatusCode, String) {
    let running = admin.raft.metrics().borrow().running_state.clone();
    match running {
        Ok(()) => (StatusCode::OK, format!("ok member {}\n", admin.id)),
        Err(fatal) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("member {}: raft stopped: {fatal}\n", admin.id),
        ),
    }
}

async fn ready(State(admin): State<AdminState>) -> (StatusCode, String) {
    let unavailable = |reason: String| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        )
    };
    let (running, leader) = {
        let metrics = admin.raft.metrics();
        let m = metrics.borrow();
        (m.running_state.clone(), m.current_leader)
    };
    if let Err(fatal) = running {
        return unavailable(format!("raft stopped: {fatal}"));
    }
    let Some(leader) = leader else {
        return unavailable("no known leader".to_string());
    };
    // Commit index first, applied second: applied only grows, so a member
    // that has caught up is never reported behind.
    let commit = match admin.commit_index().await {
        Ok(commit) => commit,
        Err(reason) => return unavailable(reason),
    };
    let applied = admin.applied_index();
    if applied < commit {
        return unavailable(format!(
            "applied index {applied} is behind the known commit index {commit}"
        ));
    }
    (
        StatusCode::OK,
        format!(
            "ready: member {}, leader {leader}, applied {applied}, commit {commit}\n",
            admin.id
        ),
    )
}

/// The admin routes.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .with_state(state)
}

/// Serves the admin port until `stop` turns true (or its sender is gone);
/// HTTPS when `tls` is given.
pub async fn serve(
    listener: TcpListener,
    state: AdminState,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut stop: watch::Receiver<bool>,
) {
    let listener = CappedListener {
        listener,
        permits: Arc::new(Semaphore::new(ADMIN_CONNECTIONS_MAX)),
        tls: tls.map(tokio_rustls::TlsAcceptor::from),
        handshakes: tokio::task::JoinSet::new(),
    };
    let result = axum::serve(listener, router(state))
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|stopping| *stopping).await;
        })
        .await;
    if let Err(err) = result {
        tracing::error!(error = %err, "admin server failed");
    }
}

/// A listener that holds a permit per open connection, so at most
/// [`ADMIN_CONNECTIONS_MAX`] are served (or in their TLS handshake) at
/// once.
struct CappedListener {
    listener: TcpListener,
    permits: Arc<Semaphore>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// TLS handshakes under way; each ends in a connection or nothing.
    handshakes: tokio::task::JoinSet<Option<(CappedStream, std::net::SocketAddr)>>,
}

/// Waits for room, then accepts a TCP connection (retrying accept
/// errors); cancel-safe.
async fn accept_tcp(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
) -> (TcpStream, std::net::SocketAddr, OwnedSemaphorePermit) {
    // The semaphore is never closed, so acquiring fails only if it
    // were.
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            continue;
        };
        match listener.accept().await {
            Ok((stream, addr)) => {
                let _ = stream.set_nodelay(true);
                return (stream, addr, permit);
            }
            Err(err) => {
                tracing::warn!(error = %err, "admin port: accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
}

impl axum::serve::Listener for CappedListener {
    type Io = CappedStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (CappedStream, std::net::SocketAddr) {
        let CappedListener {
            listener,
            permits,
            tls,
            handshakes,
        } = self;
        loop {
            tokio::select! {
                Some(done) = handshakes.join_next(), if !handshakes.is_empty() => {
                    if let Ok(Some(connection)) = done {
                        return connection;
                    }
                }
                (stream, addr, permit) = accept_tcp(listener, permits) => {
                    let Some(acceptor) = tls.clone() else {
                        return (CappedStream::new(Box::new(stream), permit), addr);
                    };
                    handshakes.spawn(async move {
                        match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                            Ok(Ok(tls)) => Some((CappedStream::new(Box::new(tls), permit), addr)),
                            Ok(Err(err)) => {
                                tracing::debug!(error = %err, %addr, "admin port: TLS handshake failed");
                                None
                            }
                            Err(_) => {
                                tracing::debug!(%addr, "admin port: TLS handshake timed out");
                                None
                            }
                        }
                    });
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }
}

/// A byte stream an admin connection runs on: plain TCP or TLS over it.
trait AdminIo: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> AdminIo for T {}

/// An admin connection; its permit returns when it closes. Reads and
/// writes fail with `TimedOut` once nothing moved for
/// [`ADMIN_IDLE_TIMEOUT`], which makes the server drop the connection.
struct CappedStream {
    stream: Box<dyn AdminIo>,
    idle: Pin<Box<tokio::time::Sleep>>,
    _permit: OwnedSemaphorePermit,
}

impl CappedStream {
    fn new(stream: Box<dyn AdminIo>, permit: OwnedSemaphorePermit) -> CappedStream {
        CappedStream {
            stream,
            idle: Box::pin(tokio::time::sleep(ADMIN_IDLE_TIMEOUT)),
            _permit: permit,
        }
    }

    /// Passes a ready result through (restarting the idle clock), or, while
    /// pending, fails once the connection has been idle too long.
    fn track<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match poll {
            Poll::Ready(result) => {
                self.idle
                    .as_mut()
                    .reset(tokio::time::Instant::now() + ADMIN_IDLE_TIMEOUT);
                Poll::Ready(result)
            }
            Poll::Pending => match self.idle.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "admin connection idle for ADMIN_IDLE_TIMEOUT ({} s)",
                        ADMIN_IDLE_TIMEOUT.as_secs()
                    ),
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncRead for CappedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.stream).poll_read(cx, buf);
        self.track(cx, poll)
    }
}

impl AsyncWrite for CappedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.track(cx, poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.track(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
