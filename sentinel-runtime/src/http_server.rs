//! The one small HTTP server the integrations that serve HTTP run on (hyper 1 + axum 0.8 on tokio).
//!
//! It serves an axum [`Router`] with the limits a server reachable from outside needs, and nothing else:
//!
//! - **connections**: at most [`Limits::max_connections`] at once; one more is answered `503` and closed at
//!   once, so a flood of idle sockets cannot pile up;
//! - **headers**: read within [`Limits::header_read_timeout`] (a client that sends one byte a second is
//!   dropped), at most 64 KiB;
//! - **bodies**: at most [`Limits::max_body_bytes`] (`413`: announced by `Content-Length`, or found while
//!   reading), and the whole request (body included) handled within [`Limits::request_timeout`] (`408`);
//! - one request per connection (`Connection: close`, as Sentinel's own command server does), so no idle
//!   keep-alive connection holds a slot;
//! - **shutdown** when the [`HttpServer`] is dropped: the listener closes at once, requests in flight get
//!   [`Limits::shutdown_grace`] to finish.
//!
//! It runs either on a thread of its own with a current-thread runtime (the application needs no tokio
//! runtime, and nothing it serves competes with the application's tasks) or as tasks on the application's
//! runtime. The port bound is known before [`HttpServer::start`] returns (bind to port 0 for any free port).
//! Handlers see the peer address as axum's `ConnectInfo<SocketAddr>`.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use http_body_util::Limited;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{watch, Semaphore};
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
    /// Time a client has to send the request line and headers.
    pub(crate) header_read_timeout: Duration,
    /// Time a request (reading its body included) may take.
    pub(crate) request_timeout: Duration,
    /// Time requests in flight get to finish when the server stops.
    pub(crate) shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 1 << 20,
            max_connections: 64,
            header_read_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(1),
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
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
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
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Over the connection cap: a short answer, never a queue.
            let _ =
                stream.try_write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            continue;
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
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            let _ = conn.await;
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
    match tokio::time::timeout(limits.request_timeout, router.call(req)).await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(never)) => match never {},
        Err(_) => Ok(plain(
            StatusCode::REQUEST_TIMEOUT,
            format!("Request not completed within {} ms", limits.request_timeout.as_millis()),
        )),
    }
}

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
