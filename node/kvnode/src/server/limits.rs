//! Limits under load for the gRPC ports: a cap on open connections per
//! port (extra connections are accepted and closed at once), a deadline for
//! a new connection to start talking (slow-loris), HTTP/2 stream and
//! keepalive settings, a handler timeout, and one in-flight cap across the
//! client port that answers RESOURCE_EXHAUSTED instead of queueing.
//!
//! The node builds its servers with [`client_server`] / [`peer_server`] and
//! wraps its listeners with [`incoming`]; the kv service's own per-request
//! limits (key, value, entry, scan page) live in [`crate::server::convert`],
//! [`crate::raft::batcher`] and [`crate::server::kv`], and [`crate::node::disk`] adds
//! the free-space watermark.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_stream::Stream;
use tonic::codegen::http;
use tonic::transport::Server;
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};
use tower::layer::util::Stack;
use tower::{Layer, Service};

use crate::raft::batcher::ENTRY_SIZE_BYTES_MAX;
use crate::server::convert::{KEY_SIZE_BYTES_MAX, VALUE_SIZE_BYTES_MAX};
use crate::server::kv::CLIENT_MESSAGE_BYTES_MAX;

/// Default cap on open connections to the client port
/// (`--max-connections`); more are accepted and closed at once.
pub const CLIENT_CONNECTIONS_MAX_DEFAULT: usize = 1024;
/// Cap on open connections to the peer port: members hold one channel to
/// each other member, so this only stops a flood.
pub const PEER_CONNECTIONS_MAX: usize = 256;
/// Default cap on requests being handled at once across the whole client
/// port (`--max-inflight`); one more is answered RESOURCE_EXHAUSTED.
pub const CLIENT_INFLIGHT_MAX_DEFAULT: usize = 4096;
/// Default cap on concurrent HTTP/2 streams (requests in flight) per client
/// connection (`--max-streams-per-connection`); the client's HTTP/2 stack
/// waits for a free stream instead of the server queueing.
pub const CLIENT_STREAMS_PER_CONNECTION_MAX_DEFAULT: u32 = 256;
/// Concurrent HTTP/2 streams per peer connection (Raft traffic: appends,
/// votes, read-index rounds, snapshot chunks).
pub const PEER_STREAMS_PER_CONNECTION_MAX: u32 = 1024;
/// Default deadline for a new connection to send its first
/// [`HANDSHAKE_BYTES`] bytes (`--handshake-timeout-ms`); a connection that
/// stays silent is closed, so idle sockets cannot hold the connection cap.
pub const HANDSHAKE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Bytes a new connection must send before [`Limits::handshake_timeout`]:
/// the HTTP/2 client preface is 24 bytes (a TLS ClientHello is longer).
pub const HANDSHAKE_BYTES: usize = 24;
/// Deadline of one client request handler (a slow or stuck request is
/// answered CANCELLED). Above every wait the handlers do themselves
/// (write outcome 10 s, `min_index` 5 s, a snapshot build 60 s, a new
/// member's catch-up plus the membership change 150 s).
pub const CLIENT_REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// HTTP/2 keepalive ping interval on both ports: a dead peer's connection
/// is found and closed.
pub const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// How long a keepalive ping may go unanswered before the connection is
/// closed.
pub const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// TCP keepalive on accepted connections.
pub const TCP_KEEPALIVE: Duration = Duration::from_secs(60);
/// Largest HTTP/2 header list a client may send, in bytes (hyper's own
/// default, set here so it is named; metadata such as a bearer token fits
/// easily).
pub const HEADER_LIST_BYTES_MAX: u32 = 16 * 1024;
/// The `LimitExceeded` name of the in-flight cap in RESOURCE_EXHAUSTED
/// answers (kvclient retries those: nothing was applied).
pub const INFLIGHT_LIMIT: &str = "CLIENT_INFLIGHT_MAX";
/// Refused connections handled in one poll of the accept loop before it
/// yields to other tasks (a flood must not starve the runtime).
const REFUSALS_PER_POLL_MAX: usize = 64;

// A client message must hold the largest legal value with its key and
// framing, and a whole entry's worth of batch; the kv service's decoding
// limit is the one the client sees.
const _: () = assert!(CLIENT_MESSAGE_BYTES_MAX >= VALUE_SIZE_BYTES_MAX + KEY_SIZE_BYTES_MAX + 1024);
const _: () = assert!(CLIENT_MESSAGE_BYTES_MAX >= ENTRY_SIZE_BYTES_MAX);
// The handler timeout must not cut a wait a handler does on purpose.
const _: () = assert!(
    CLIENT_REQUEST_TIMEOUT.as_secs()
        > crate::raft::membership::CATCH_UP_WAIT.as_secs()
            + crate::raft::membership::CHANGE_WAIT.as_secs()
);
const _: () = assert!(
    CLIENT_REQUEST_TIMEOUT.as_secs() > crate::server::cluster::SNAPSHOT_BUILD_WAIT.as_secs()
);

/// The load limits of one member (flags `--max-connections`,
/// `--max-inflight`, `--max-streams-per-connection`,
/// `--handshake-timeout-ms`, `--disk-free-min-bytes`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Open connections to the client port at most.
    pub client_connections_max: usize,
    /// Open connections to the peer port at most.
    pub peer_connections_max: usize,
    /// Requests being handled at once on the client port at most.
    pub client_inflight_max: usize,
    /// HTTP/2 streams per client connection at most.
    pub client_streams_per_connection_max: u32,
    /// How long a new connection may stay silent.
    pub handshake_timeout: Duration,
    /// Free bytes the data directory must keep: below, writes are refused
    /// with RESOURCE_EXHAUSTED (0 = no watermark). See [`crate::node::disk`].
    pub disk_free_min_bytes: u64,
    /// Open connections to the Redis port at most
    /// ([`crate::server::redis::REDIS_CONNECTIONS_MAX`] by default).
    pub redis_connections_max: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            client_connections_max: CLIENT_CONNECTIONS_MAX_DEFAULT,
            peer_connections_max: PEER_CONNECTIONS_MAX,
            client_inflight_max: CLIENT_INFLIGHT_MAX_DEFAULT,
            client_streams_per_connection_max: CLIENT_STREAMS_PER_CONNECTION_MAX_DEFAULT,
            handshake_timeout: HANDSHAKE_TIMEOUT_DEFAULT,
            disk_free_min_bytes: crate::node::disk::DISK_FREE_MIN_BYTES_DEFAULT,
            redis_connections_max: crate::server::redis::REDIS_CONNECTIONS_MAX,
        }
    }
}

impl Limits {
    /// Checks the values: every cap at least 1.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("--max-connections", self.client_connections_max as u64),
            ("peer connections max", self.peer_connections_max as u64),
            ("--max-inflight", self.client_inflight_max as u64),
            (
                "--max-streams-per-connection",
                u64::from(self.client_streams_per_connection_max),
            ),
            (
                "--handshake-timeout-ms",
                self.handshake_timeout.as_millis() as u64,
            ),
            ("redis connections max", self.redis_connections_max as u64),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        if self.client_inflight_max > Semaphore::MAX_PERMITS {
            return Err(format!(
                "--max-inflight is {}; at most {} is supported",
                self.client_inflight_max,
                Semaphore::MAX_PERMITS
            ));
        }
        Ok(())
    }
}

/// Settings both ports share: keepalives and header size.
fn common<L>(builder: Server<L>) -> Server<L> {
    builder
        .http2_keepalive_interval(Some(HTTP2_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(HTTP2_KEEPALIVE_TIMEOUT))
        .tcp_keepalive(Some(TCP_KEEPALIVE))
        .http2_max_header_list_size(HEADER_LIST_BYTES_MAX)
}

/// The client port's server: [`common`] settings, streams per connection,
/// the handler timeout, and the port-wide in-flight cap.
///
/// `unbounded`: request paths that wait on purpose for as long as their
/// client does (etcd's `Lock` and `Campaign`): counted and timed like any
/// call until the handler calls [`AdmissionRelease::release`] (once its
/// request is decoded and its own limit taken), neither after.
pub fn client_server<L>(
    builder: Server<L>,
    limits: &Limits,
    unbounded: &'static [&'static str],
) -> Server<Stack<InflightLimitLayer, L>> {
    common(builder)
        .max_concurrent_streams(limits.client_streams_per_connection_max)
        .layer(
            InflightLimitLayer::new(limits.client_inflight_max)
                .with_timeout(CLIENT_REQUEST_TIMEOUT)
                .unbounded(unbounded),
        )
}

/// The peer port's server: [`common`] settings and streams per connection.
/// No in-flight shedding or handler timeout: Raft traffic is never refused,
/// and snapshot transfers have their own deadlines.
pub fn peer_server<L>(builder: Server<L>) -> Server<L> {
    common(builder).max_concurrent_streams(PEER_STREAMS_PER_CONNECTION_MAX)
}

/// Counts of what the limits refused, for logs and tests.
#[derive(Clone, Debug, Default)]
pub struct Refusals {
    connections: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
}

impl Refusals {
    /// Connections closed because the port was at its cap.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Requests answered RESOURCE_EXHAUSTED by the in-flight cap.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

/// Wraps a listener so at most `max` connections are open at once (one
/// more is accepted and closed at once) and each must send
/// [`HANDSHAKE_BYTES`] within `handshake_timeout`.
pub fn incoming(
    port: &'static str,
    listener: TcpIncoming,
    max: usize,
    handshake_timeout: Duration,
) -> LimitedIncoming {
    LimitedIncoming {
        port,
        inner: listener,
        permits: Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))),
        max,
        handshake_timeout,
        refused: Refusals::default(),
    }
}

/// A listener with a connection cap (see [`incoming`]).
#[derive(Debug)]
pub struct LimitedIncoming {
    port: &'static str,
    inner: TcpIncoming,
    permits: Arc<Semaphore>,
    max: usize,
    handshake_timeout: Duration,
    refused: Refusals,
}

impl LimitedIncoming {
    /// What this listener refused so far.
    pub fn refusals(&self) -> Refusals {
        self.refused.clone()
    }
}

impl Stream for LimitedIncoming {
    type Item = io::Result<LimitedConn>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        for _ in 0..REFUSALS_PER_POLL_MAX {
            let stream = match Pin::new(&mut self.inner).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(Err(err))) => return Poll::Ready(Some(Err(err))),
                Poll::Ready(Some(Ok(stream))) => stream,
            };
            match self.permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    let deadline = Box::pin(tokio::time::sleep(self.handshake_timeout));
                    return Poll::Ready(Some(Ok(LimitedConn {
                        stream,
                        _permit: permit,
                        handshake: Some((deadline, 0)),
                    })));
                }
                Err(_) => {
                    // Dropping the stream closes it: the client sees a reset
                    // at once instead of hanging in the backlog.
                    let refused = self.refused.connections.fetch_add(1, Ordering::Relaxed);
                    if refused.is_power_of_two() || refused == 0 {
                        tracing::warn!(
                            port = self.port,
                            limit = self.max,
                            refused = refused + 1,
                            "connection refused: the port has its maximum of open connections \
                             (--max-connections)"
                        );
                    }
                }
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// The body of an `AsyncWrite` impl that passes every write to the
/// `Unpin` field named `$field` as it is (connection wrappers that only
/// look at what is read).
macro_rules! delegate_async_write {
    ($field:ident) => {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::pin::Pin::new(&mut self.$field).poll_write(cx, buf)
        }

        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.$field).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.$field).poll_shutdown(cx)
        }

        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::pin::Pin::new(&mut self.$field).poll_write_vectored(cx, bufs)
        }

        fn is_write_vectored(&self) -> bool {
            self.$field.is_write_vectored()
        }
    };
}
pub(crate) use delegate_async_write;

/// One accepted connection holding a slot of its port's cap until it
/// closes.
#[derive(Debug)]
pub struct LimitedConn {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    /// Until the first [`HANDSHAKE_BYTES`] arrived: the deadline and the
    /// bytes seen so far.
    handshake: Option<(Pin<Box<tokio::time::Sleep>>, usize)>,
}

impl Connected for LimitedConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for LimitedConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        let Some((deadline, seen)) = &mut this.handshake else {
            return polled;
        };
        if let Poll::Ready(Ok(())) = &polled {
            *seen += buf.filled().len() - before;
            if *seen >= HANDSHAKE_BYTES {
                this.handshake = None;
            }
            return polled;
        }
        if polled.is_pending() && deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the connection sent {seen} bytes, fewer than HANDSHAKE_BYTES \
                     {HANDSHAKE_BYTES}, within the handshake timeout (--handshake-timeout-ms)"
                ),
            )));
        }
        polled
    }
}

impl AsyncWrite for LimitedConn {
    delegate_async_write!(stream);
}

/// Found in the request extensions of a call on one of the layer's
/// unbounded paths ([`client_server`]): [`AdmissionRelease::release`]
/// gives back the call's in-flight slot and takes it out of the handler
/// timeout, for the wait the handler bounds itself (etcd's Lock waiting
/// for the lock, under `RECIPE_WAITERS_MAX`).
#[derive(Clone, Debug)]
pub struct AdmissionRelease(Arc<watch::Sender<bool>>);

impl AdmissionRelease {
    /// Leaves the in-flight count and the handler timeout.
    pub fn release(&self) {
        self.0.send_replace(true);
    }
}

/// The port-wide in-flight cap and the handler timeout as a tower layer
/// (see [`client_server`]). The timeout is tonic's own error (CANCELLED,
/// "Timeout expired"), as tonic's server timeout answers; a client's
/// `grpc-timeout` is still honoured by tonic's own timeout layer, outside this one.
#[derive(Clone, Debug)]
pub struct InflightLimitLayer {
    permits: Arc<Semaphore>,
    max: usize,
    refused: Refusals,
    timeout: Option<Duration>,
    unbounded: &'static [&'static str],
}

impl InflightLimitLayer {
    /// At most `max` requests handled at once, no handler timeout.
    pub fn new(max: usize) -> InflightLimitLayer {
        InflightLimitLayer {
            permits: Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))),
            max,
            refused: Refusals::default(),
            timeout: None,
            unbounded: &[],
        }
    }

    /// Cancels a handler whose response is not ready within `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> InflightLimitLayer {
        self.timeout = Some(timeout);
        self
    }

    /// Request paths whose handlers may leave the count and the timeout
    /// (see [`client_server`]).
    pub fn unbounded(mut self, paths: &'static [&'static str]) -> InflightLimitLayer {
        self.unbounded = paths;
        self
    }
}

impl<S> Layer<S> for InflightLimitLayer {
    type Service = InflightLimit<S>;

    fn layer(&self, inner: S) -> InflightLimit<S> {
        InflightLimit {
            inner,
            permits: self.permits.clone(),
            max: self.max,
            refused: self.refused.clone(),
            timeout: self.timeout,
            unbounded: self.unbounded,
        }
    }
}

/// A service whose requests each hold one permit of a shared semaphore
/// until their response (headers) is ready; with none left, the request is
/// answered RESOURCE_EXHAUSTED at once.
#[derive(Clone, Debug)]
pub struct InflightLimit<S> {
    inner: S,
    permits: Arc<Semaphore>,
    max: usize,
    refused: Refusals,
    timeout: Option<Duration>,
    unbounded: &'static [&'static str],
}

/// The boxed error of the limited service (tonic turns a [`tonic::Status`] in it
/// into the answer).
type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B> Service<http::Request<B>> for InflightLimit<S>
where
    S: Service<http::Request<B>>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                // An unbounded path's handler is handed the way to leave
                // the count and the timeout once its wait begins; until
                // then (its body read and decoded, its checks made) it is
                // counted and timed like any request.
                let released = self.unbounded.contains(&request.uri().path()).then(|| {
                    let (release, released) = watch::channel(false);
                    request
                        .extensions_mut()
                        .insert(AdmissionRelease(Arc::new(release)));
                    released
                });
                let response = self.inner.call(request);
                let timeout = self.timeout;
                Box::pin(async move {
                    let response = async move { response.await.map_err(Into::<BoxError>::into) };
                    let mut response = std::pin::pin!(response);
                    // `None`: the handler released its admission.
                    let admitted = async {
                        match released {
                            Some(mut released) => tokio::select! {
                                answer = &mut response => Some(answer),
                                waited = async {
                                    released.wait_for(|released| *released).await.is_ok()
                                } => {
                                    if waited {
                                        None
                                    } else {
                                        // Dropped unreleased: a bounded call.
                                        Some((&mut response).await)
                                    }
                                }
                            },
                            None => Some((&mut response).await),
                        }
                    };
                    let admitted = match timeout {
                        Some(timeout) => match tokio::time::timeout(timeout, admitted).await {
                            Ok(admitted) => admitted,
                            Err(_) => return Err(Box::new(tonic::TimeoutExpired(())) as BoxError),
                        },
                        None => admitted.await,
                    };
                    drop(permit);
                    match admitted {
                        Some(answer) => answer,
                        None => response.await,
                    }
                })
            }
            Err(_) => {
                let refused = self.refused.requests.fetch_add(1, Ordering::Relaxed);
                if refused.is_power_of_two() || refused == 0 {
                    tracing::warn!(
                        limit = self.max,
                        refused = refused + 1,
                        "request refused: the client port has its maximum of requests in flight \
                         (--max-inflight)"
                    );
                }
                let status = crate::server::convert::status_with_detail(
                    tonic::Code::ResourceExhausted,
                    format!(
                        "overloaded: {INFLIGHT_LIMIT} (--max-inflight) is {} requests in flight \
                         on this member; nothing was applied, retry with backoff",
                        self.max
                    ),
                    kvproto::kv::v1::error_detail::Detail::LimitExceeded(
                        kvproto::kv::v1::LimitExceeded {
                            limit: INFLIGHT_LIMIT.to_string(),
                            limit_value: self.max as u64,
                            actual_value: self.max as u64 + 1,
                        },
                    ),
                );
                Box::pin(std::future::ready(Err(Box::new(status) as BoxError)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A service whose requests never answer; on "/slow" it first
    /// releases its admission (as a waiting Lock does), on others not.
    #[derive(Clone)]
    struct Never;

    impl Service<http::Request<()>> for Never {
        type Response = ();
        type Error = BoxError;
        type Future = std::future::Pending<Result<(), BoxError>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<()>) -> Self::Future {
            if request.uri().path() == "/slow"
                && let Some(admission) = request.extensions().get::<AdmissionRelease>()
            {
                admission.release();
            }
            std::future::pending()
        }
    }

    fn request(path: &str) -> http::Request<()> {
        http::Request::builder()
            .uri(path)
            .body(())
            .expect("a request")
    }

    fn refused(answer: Result<(), BoxError>) -> bool {
        answer.is_err_and(|err| {
            tonic::Status::from_error(err).code() == tonic::Code::ResourceExhausted
        })
    }

    /// A call on an unbounded path is counted and timed until its handler
    /// releases its admission, neither after; any other call is counted
    /// while it runs and cut by the timeout.
    #[tokio::test]
    async fn unbounded_paths_leave_the_count_and_the_timeout_once_released() {
        let timeout = Duration::from_millis(200);
        let layer = InflightLimitLayer::new(1)
            .with_timeout(timeout)
            .unbounded(&["/slow", "/held"]);
        let mut service = layer.layer(Never);
        // Not released: it holds the one slot and is cut by the timeout.
        let held = service.call(request("/held"));
        assert!(refused(service.call(request("/other")).await));
        let cut = held.await.expect_err("cut by the timeout");
        assert!(cut.is::<tonic::TimeoutExpired>(), "{cut:?}");
        // Released: each gives its slot back, and still waits past the
        // timeout.
        let mut waiters = Vec::new();
        for _ in 0..3 {
            waiters.push(tokio::spawn(service.call(request("/slow"))));
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while layer.permits.available_permits() == 0 {
                assert!(std::time::Instant::now() < deadline, "the slot came back");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let other = service.call(request("/other"));
        assert!(refused(service.call(request("/other2")).await));
        let cut = other.await.expect_err("cut by the timeout");
        assert!(cut.is::<tonic::TimeoutExpired>(), "{cut:?}");
        for waiter in waiters {
            assert!(
                tokio::time::timeout(timeout * 3, waiter).await.is_err(),
                "a released call is still waiting after three times the timeout"
            );
        }
    }

    #[test]
    fn defaults_validate_and_zero_caps_are_named() {
        assert_eq!(Limits::default().validate(), Ok(()));
        let zero = Limits {
            client_inflight_max: 0,
            ..Limits::default()
        };
        assert!(zero.validate().unwrap_err().contains("--max-inflight"));
        let zero = Limits {
            client_connections_max: 0,
            ..Limits::default()
        };
        assert!(zero.validate().unwrap_err().contains("--max-connections"));
    }
}
