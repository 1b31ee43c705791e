//! The one small HTTP server the integrations that serve HTTP run on (hyper 1 + axum 0.8 on tokio).
//!
//! It serves an axum [`Router`] with the limits a server reachable from outside needs, and nothing else:
//!
//! - **peers**: [`Limits::peers`] decides from the peer's address alone, before anything is read, whether it
//!   is served: a refused peer gets a short `403` and the connection is closed at once, holding no slot;
//! - **connections**: at most [`Limits::max_connections`] at once, at most
//!   [`Limits::max_connections_per_peer`] from one peer (an IPv4 address, or an IPv6 /64), and the last
//!   [`Limits::reserved_for_trusted`] slots only for trusted peers; one more is answered `503` and closed at
//!   once, so a flood of idle sockets cannot pile up nor one peer take every slot;
//! - **headers**: read within [`Limits::header_read_timeout`] (a client that sends one byte a second is
//!   dropped), at most 64 KiB;
//! - **bodies**: at most [`Limits::max_body_bytes`] (`413`: announced by `Content-Length`, or found while
//!   reading), and the whole request (body included) handled within [`Limits::request_timeout`] (`408`);
//! - **answers**: written within [`Limits::write_timeout`] from their first byte (a client that does not read
//!   its answer is dropped), and the whole connection lasts at most the three timeouts added up, so no client
//!   holds a slot longer, whatever it does;
//! - one request per connection (`Connection: close`, as Sentinel's own command server does), so no idle
//!   keep-alive connection holds a slot;
//! - **shutdown** when the [`HttpServer`] is dropped: the listener closes at once, requests in flight get
//!   [`Limits::shutdown_grace`] to finish.
//!
//! It runs either on a thread of its own with a current-thread runtime (the application needs no tokio
//! runtime, and nothing it serves competes with the application's tasks) or as tasks on the application's
//! runtime. The port bound is known before [`HttpServer::start`] returns (bind to port 0 for any free port).
//! Handlers see the peer address as axum's `ConnectInfo<SocketAddr>`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use http_body_util::Limited;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tower_service::Service;

/// A task run beside the server (on its runtime) until the server stops.
pub(crate) type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// What a server accepts.
#[derive(Clone, Debug)]
pub(crate) struct Limits {
    /// Largest request body, in bytes.
    pub(crate) max_body_bytes: usize,
    /// Most connections served at once.
    pub(crate) max_connections: usize,
    /// Most connections served at once for one peer (an IPv4 address or an IPv6 /64); `None`: a quarter of
    /// `max_connections` (at least 1).
    pub(crate) max_connections_per_peer: Option<usize>,
    /// Slots only trusted peers may take (the others are served while fewer than `max_connections` minus
    /// this are open).
    pub(crate) reserved_for_trusted: usize,
    /// Which peers are served, decided before anything is read from them.
    pub(crate) peers: PeerPolicy,
    /// Time a client has to send the request line and headers.
    pub(crate) header_read_timeout: Duration,
    /// Time a request (reading its body included) may take.
    pub(crate) request_timeout: Duration,
    /// Time a client has to take the whole answer, from its first byte.
    pub(crate) write_timeout: Duration,
    /// Time requests in flight get to finish when the server stops.
    pub(crate) shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 1 << 20,
            max_connections: 64,
            max_connections_per_peer: None,
            reserved_for_trusted: 0,
            peers: PeerPolicy::default(),
            header_read_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(1),
        }
    }
}

impl Limits {
    /// The cap on one peer's connections in force.
    pub(crate) fn per_peer(&self) -> usize {
        let max = self.max_connections.max(1);
        self.max_connections_per_peer.unwrap_or(max / 4).clamp(1, max)
    }

    /// The longest a connection may last: headers, handling and answer, each within its own timeout.
    pub(crate) fn connection_deadline(&self) -> Duration {
        self.header_read_timeout.saturating_add(self.request_timeout).saturating_add(self.write_timeout)
    }
}

/// How the server treats a peer, decided from its address alone before anything is read from it.
#[derive(Clone, Debug, PartialEq, Eq)]
// Only the command center refuses or trusts peers; the exporter alone admits everyone.
#[cfg_attr(not(feature = "transport"), allow(dead_code))]
pub(crate) enum PeerClass {
    /// Answered `403` with this reason and closed at once: it takes no connection slot.
    Refused(String),
    /// Served within the caps, outside the reserved slots.
    Admitted,
    /// Served within the caps, and may take the reserved slots (the dashboard).
    Trusted,
}

/// Sorts peers at accept time (every peer is [`PeerClass::Admitted`] by default).
#[derive(Clone, Default)]
pub(crate) struct PeerPolicy(Option<Arc<dyn Fn(IpAddr) -> PeerClass + Send + Sync>>);

impl PeerPolicy {
    /// A policy that asks `classify`.
    #[cfg_attr(not(feature = "transport"), allow(dead_code))]
    pub(crate) fn new(classify: impl Fn(IpAddr) -> PeerClass + Send + Sync + 'static) -> Self {
        PeerPolicy(Some(Arc::new(classify)))
    }

    fn classify(&self, peer: IpAddr) -> PeerClass {
        self.0.as_ref().map_or(PeerClass::Admitted, |f| f(peer))
    }
}

impl std::fmt::Debug for PeerPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "PeerPolicy(custom)" } else { "PeerPolicy(everyone)" })
    }
}

/// What counts as one peer for the per-peer cap: an IPv4 address (IPv4-mapped IPv6 included), or the /64
/// of an IPv6 address (one host usually holds a whole /64, so counting addresses would cap nothing).
fn peer_key(peer: IpAddr) -> IpAddr {
    match peer.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        v4 => v4,
    }
}

/// The connection slots: how many are open in all and per peer.
struct Slots {
    max: usize,
    per_peer: usize,
    reserved: usize,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    total: usize,
    /// Open connections per peer key; a key leaves when its last connection closes, so the map holds at
    /// most `max` entries.
    by_peer: HashMap<IpAddr, usize>,
}

/// Why no slot was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Full {
    /// Every slot open to this peer is taken.
    Server,
    /// This peer holds its share already.
    Peer,
}

impl Slots {
    fn new(limits: &Limits) -> Self {
        let max = limits.max_connections.max(1);
        Slots {
            max,
            per_peer: limits.per_peer(),
            reserved: limits.reserved_for_trusted.min(max - 1),
            open: Mutex::new(Open::default()),
        }
    }

    /// A slot for `peer`, released when the returned guard drops.
    fn take(self: &Arc<Self>, peer: IpAddr, trusted: bool) -> Result<Slot, Full> {
        let key = peer_key(peer);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let cap = if trusted { self.max } else { self.max - self.reserved };
        if open.total >= cap {
            return Err(Full::Server);
        }
        let mine = open.by_peer.entry(key).or_insert(0);
        if *mine >= self.per_peer {
            return Err(Full::Peer);
        }
        *mine += 1;
        open.total += 1;
        Ok(Slot { slots: self.clone(), key })
    }
}

/// One open connection's slot.
struct Slot {
    slots: Arc<Slots>,
    key: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(|e| e.into_inner());
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_peer.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.by_peer.remove(&self.key);
            }
        }
    }
}

/// A connection's socket with a deadline on writing the answer: from the first byte written, the client must
/// take the whole answer within `timeout`, or every later write fails with `TimedOut` (and the connection,
/// with its slot, is dropped). Reads pass through.
///
/// Its close lingers: after the answer and the end of the write side, what the client still sends (the rest
/// of a body refused with `413`, say) is read and dropped until the client closes, at most [`LINGER_BYTES`]
/// within [`LINGER_TIME`], so that the client reads its answer rather than a connection reset.
struct WriteDeadline<T> {
    io: T,
    timeout: Duration,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Set once the write side is shut: the end of the linger and the bytes it may still read.
    linger: Option<(Pin<Box<tokio::time::Sleep>>, usize)>,
}

/// At most this much is read and dropped after the answer (see [`WriteDeadline`]).
const LINGER_BYTES: usize = 16 << 20;
/// For at most this long.
const LINGER_TIME: Duration = Duration::from_secs(2);

impl<T> WriteDeadline<T> {
    fn new(io: T, timeout: Duration) -> Self {
        WriteDeadline { io, timeout, deadline: None, linger: None }
    }

    /// Whether the deadline has passed; `start` arms it (the first byte of the answer). A pending deadline
    /// registers the task's waker, so a write stuck on a full socket buffer is woken when it passes.
    fn passed(&mut self, cx: &mut Context<'_>, start: bool) -> Option<io::Error> {
        if self.deadline.is_none() && start {
            self.deadline = Some(Box::pin(tokio::time::sleep(self.timeout)));
        }
        let deadline = self.deadline.as_mut()?;
        deadline.as_mut().poll(cx).is_ready().then(|| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client did not take its answer within {} ms", self.timeout.as_millis()),
            )
        })
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteDeadline<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncRead + Unpin> WriteDeadline<T> {
    /// Reads and drops what the client still sends until it closes, the linger's bytes are read or its
    /// time is over (whichever first); `Ready` then.
    fn poll_linger(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some((end, left)) = self.linger.as_mut() else { return Poll::Ready(()) };
        let mut sink = [0u8; 8192];
        while *left > 0 {
            let mut buf = ReadBuf::new(&mut sink);
            match Pin::new(&mut self.io).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if !buf.filled().is_empty() => *left = left.saturating_sub(buf.filled().len()),
                Poll::Ready(_) => return Poll::Ready(()), // closed by the client, or an error
                Poll::Pending => return end.as_mut().poll(cx),
            }
        }
        Poll::Ready(())
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WriteDeadline<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if let Some(e) = self.passed(cx, !buf.is_empty()) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.passed(cx, bufs.iter().any(|b| !b.is_empty())) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(e) = self.passed(cx, false) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.linger.is_none() {
            if let Some(e) = self.passed(cx, false) {
                return Poll::Ready(Err(e));
            }
            std::task::ready!(Pin::new(&mut self.io).poll_shutdown(cx))?;
            self.linger = Some((Box::pin(tokio::time::sleep(LINGER_TIME)), LINGER_BYTES));
        }
        self.poll_linger(cx).map(Ok)
    }
}

/// Answers a connection that is not served (`status` is the status line's code and reason) with `reason` and
/// closes it, without waiting for anything: what the peer sent so far is read and dropped first, so the close
/// is a clean one and the peer reads the answer.
fn turn_away(stream: &tokio::net::TcpStream, status: &str, reason: &str) {
    let answer = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reason}",
        reason.len()
    );
    let _ = stream.try_write(answer.as_bytes());
    let mut sink = [0u8; 4096];
    // Bounded: a peer that keeps sending gets at most 64 KiB read before the close.
    for _ in 0..16 {
        match stream.try_read(&mut sink) {
            Ok(n) if n > 0 => continue,
            _ => break,
        }
    }
}

/// Where the server runs.
#[derive(Clone, Debug)]
pub(crate) enum Runtime {
    /// A thread of its own (named so), with a current-thread runtime.
    OwnThread(String),
    /// The application's runtime.
    #[cfg_attr(not(feature = "transport"), allow(dead_code))]
    Handle(tokio::runtime::Handle),
}

/// A running server; dropping it stops it.
pub(crate) struct HttpServer {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for HttpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServer").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl HttpServer {
    /// Serves `router` on `listener` (already bound), with `tasks` running beside it until it stops.
    pub(crate) fn start(
        listener: std::net::TcpListener,
        router: Router,
        limits: Limits,
        runtime: Runtime,
        tasks: Vec<Task>,
    ) -> io::Result<HttpServer> {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let (stop, stopped) = watch::channel(false);
        let run = move |listener: tokio::net::TcpListener| async move {
            for task in tasks {
                let mut stopped = stopped.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = task => {}
                        _ = stop_signal(&mut stopped) => {}
                    }
                });
            }
            serve(listener, router, limits, stopped).await;
        };
        let thread = match runtime {
            Runtime::OwnThread(name) => {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                let listener = {
                    let _in_runtime = rt.enter();
                    tokio::net::TcpListener::from_std(listener)?
                };
                Some(std::thread::Builder::new().name(name).spawn(move || rt.block_on(run(listener)))?)
            }
            Runtime::Handle(handle) => {
                let listener = {
                    let _in_runtime = handle.enter();
                    tokio::net::TcpListener::from_std(listener)?
                };
                handle.spawn(run(listener));
                None
            }
        };
        Ok(HttpServer { addr, stop, thread })
    }

    /// The address bound (with the port actually bound).
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for HttpServer {
    /// Stops accepting at once; requests in flight get the grace period. On a thread of its own, waits for
    /// it to end; on the application's runtime, does not wait (it may be running on that runtime).
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Completes when the server is told to stop (or its handle is gone).
async fn stop_signal(stopped: &mut watch::Receiver<bool>) {
    loop {
        let stop = *stopped.borrow_and_update();
        if stop || stopped.changed().await.is_err() {
            return;
        }
    }
}

async fn serve(listener: tokio::net::TcpListener, router: Router, limits: Limits, mut stopped: watch::Receiver<bool>) {
    let slots = Arc::new(Slots::new(&limits));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let limits = Arc::new(limits);
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop_signal(&mut stopped) => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Refused peers are turned away before they can hold anything: no slot, no read.
        let trusted = match limits.peers.classify(peer.ip()) {
            PeerClass::Refused(reason) => {
                turn_away(&stream, "403 Forbidden", &reason);
                continue;
            }
            PeerClass::Admitted => false,
            PeerClass::Trusted => true,
        };
        let slot = match slots.take(peer.ip(), trusted) {
            Ok(slot) => slot,
            // Over a connection cap: a short answer, never a queue.
            Err(Full::Server) => {
                turn_away(&stream, "503 Service Unavailable", "Too many connections: try again shortly");
                continue;
            }
            Err(Full::Peer) => {
                turn_away(&stream, "503 Service Unavailable", "Too many connections from your address");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = {
            let router = router.clone();
            let limits = limits.clone();
            hyper::service::service_fn(move |req: Request<Incoming>| handle(router.clone(), limits.clone(), peer, req))
        };
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .max_buf_size(64 * 1024)
            .keep_alive(false);
        let io = TokioIo::new(WriteDeadline::new(stream, limits.write_timeout));
        let conn = graceful.watch(http.serve_connection(io, service));
        let deadline = limits.connection_deadline();
        tokio::spawn(async move {
            // Each phase has its own timeout; this bounds the whole, whatever hyper does between them.
            let _ = tokio::time::timeout(deadline, conn).await;
            drop(slot);
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(limits.shutdown_grace) => {}
    }
}

async fn handle(
    mut router: Router,
    limits: Arc<Limits>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<axum::body::Body>, Infallible> {
    let announced = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if announced.is_some_and(|n| n > limits.max_body_bytes as u64) {
        return Ok(plain(StatusCode::PAYLOAD_TOO_LARGE, too_large(limits.max_body_bytes)));
    }
    let mut req = req.map(|body| Limited::new(body, limits.max_body_bytes));
    req.extensions_mut().insert(ConnectInfo(peer));
    req.extensions_mut().insert(RequestStarted(std::time::Instant::now()));
    match tokio::time::timeout(limits.request_timeout, router.call(req)).await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(never)) => match never {},
        Err(_) => Ok(plain(
            StatusCode::REQUEST_TIMEOUT,
            format!("Request not completed within {} ms", limits.request_timeout.as_millis()),
        )),
    }
}

/// When the server began to handle a request (its headers read): the start of its
/// [`Limits::request_timeout`].
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "transport"), allow(dead_code))] // Read by the command center's handlers.
pub(crate) struct RequestStarted(pub(crate) std::time::Instant);

/// The message of a `413`.
pub(crate) fn too_large(max: usize) -> String {
    format!("Request body too large: at most {max} bytes are accepted")
}

/// A plain-text response that closes the connection.
pub(crate) fn plain(status: StatusCode, text: String) -> Response<axum::body::Body> {
    let mut r = Response::new(axum::body::Body::from(text));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(max: usize, per_peer: Option<usize>, reserved: usize) -> Arc<Slots> {
        let limits = Limits {
            max_connections: max,
            max_connections_per_peer: per_peer,
            reserved_for_trusted: reserved,
            ..Limits::default()
        };
        Arc::new(Slots::new(&limits))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn one_peer_cannot_take_every_slot() {
        let slots = slots(8, None, 0);
        let held: Vec<Slot> = (0..2).map(|_| slots.take(ip("10.0.0.1"), false).unwrap()).collect();
        assert_eq!(slots.take(ip("10.0.0.1"), false).err(), Some(Full::Peer), "a quarter of 8");
        assert_eq!(slots.take(ip("::ffff:10.0.0.1"), false).err(), Some(Full::Peer), "the same peer on a v6 socket");
        let others: Vec<Slot> = (2..8).map(|k| slots.take(ip(&format!("10.0.0.{k}")), false).unwrap()).collect();
        assert_eq!(slots.take(ip("10.0.0.99"), false).err(), Some(Full::Server), "8 in all");
        drop(held);
        assert!(slots.take(ip("10.0.0.1"), false).is_ok(), "its slots came back when they closed");
        drop(others);
        assert!(slots.open.lock().unwrap().by_peer.len() <= 1, "closed peers leave the map");
    }

    #[test]
    fn an_ipv6_slash_64_counts_as_one_peer() {
        let slots = slots(64, Some(3), 0);
        let _held: Vec<Slot> =
            (1..=3).map(|k| slots.take(ip(&format!("2001:db8:0:1::{k:x}")), false).unwrap()).collect();
        assert_eq!(slots.take(ip("2001:db8:0:1:ffff::1"), false).err(), Some(Full::Peer), "same /64");
        assert!(slots.take(ip("2001:db8:0:2::1"), false).is_ok(), "another /64");
    }

    #[test]
    fn slots_reserved_for_trusted_peers_stay_free_for_them() {
        let slots = slots(8, Some(8), 2);
        let _others: Vec<Slot> = (0..6).map(|k| slots.take(ip(&format!("10.0.0.{k}")), false).unwrap()).collect();
        assert_eq!(slots.take(ip("10.0.0.50"), false).err(), Some(Full::Server), "6 of 8 for the others");
        let _dashboard: Vec<Slot> = (0..2).map(|_| slots.take(ip("10.0.0.9"), true).unwrap()).collect();
        assert_eq!(slots.take(ip("10.0.0.9"), true).err(), Some(Full::Server), "8 in all");
    }

    #[test]
    fn the_connection_deadline_adds_up_the_three_timeouts() {
        let limits = Limits::default();
        assert_eq!(limits.connection_deadline(), Duration::from_secs(25));
        assert_eq!(limits.per_peer(), 16);
        assert_eq!(Limits { max_connections: 2, ..Limits::default() }.per_peer(), 1);
        assert_eq!(Limits { max_connections_per_peer: Some(100), ..Limits::default() }.per_peer(), 64);
    }

    /// A socket whose peer never reads: every write waits.
    struct Stalled;

    impl AsyncRead for Stalled {
        fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, _: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncWrite for Stalled {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
            Poll::Pending
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Pending
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_the_client_does_not_take_fails_at_the_deadline() {
        use tokio::io::AsyncWriteExt;
        let mut io = WriteDeadline::new(Stalled, Duration::from_secs(10));
        // Flushing before any answer does not start the clock.
        assert!(tokio::time::timeout(Duration::from_secs(60), io.flush()).await.is_err(), "no deadline yet");
        let started = tokio::time::Instant::now();
        let e = io.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(10), "on the paused clock: exactly the timeout");
        assert_eq!(io.flush().await.unwrap_err().kind(), io::ErrorKind::TimedOut, "and every later write");
    }
}
