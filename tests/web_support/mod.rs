//! Shared helpers of the web layer's tests: an isolated engine on a manual clock, a real axum server on
//! 127.0.0.1:0, a real HTTP client, and a bound on how long a test may hang.
#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::{NodeStats, Sentinel};

/// 1_700_000_000_000 ms: a bucket boundary of the 500 ms windows.
pub const T0: u64 = 1_700_000_000_000;

/// An isolated engine whose clock starts `offset_ms` after [`T0`].
pub fn engine_at(offset_ms: u64) -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(T0 + offset_ms);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    engine.set_system_readings(None, None);
    (engine, clock)
}

/// Serves `app` on a fresh loopback port (with the peer address as `ConnectInfo`) until the runtime ends.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await;
    });
    addr
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().expect("an HTTP client")
}

/// The resource's numbers (it must exist).
pub fn stats(engine: &Sentinel, resource: &str) -> NodeStats {
    engine
        .cluster_stats(resource)
        .unwrap_or_else(|| panic!("no resource `{resource}`; have {:?}", engine.resource_names()))
}

/// Fails the test instead of hanging when `f` does not finish in 20 s of real time (it normally takes
/// milliseconds; nothing in the tests waits for time to pass).
pub async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f).await.expect("the test hung for 20 s")
}

/// Waits until `cond` holds (an event on the server side: a timer registered, a connection closed), checking
/// it after every yield to the runtime; fails after 20 s of real time.
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "never happened in 20 s: {what}");
        tokio::task::yield_now().await;
        if !cond() {
            // Let the IO driver run even on a busy runtime.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}
