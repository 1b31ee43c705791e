//! The web layer's cost in instructions, the one figure that does not move between runs on a shared machine
//! (`scripts/callgrind-web` runs it under valgrind's callgrind and prints instructions per request).
//!
//! `cargo run --release --example web_instructions -- VARIANT [REQUESTS]`
//!
//! Sends `REQUESTS` (default 10,000) `GET /hello` requests through an axum `Router` on the calling thread:
//! each builds the request, waits for the router to be ready, calls it and completes the response future,
//! as a server does per request minus the network and hyper. The `*-proxied` variants' requests also carry
//! `X-Forwarded-For: 198.51.100.4`, as from a proxy (the peer, 10.0.0.7, is on a private network).
//! Callgrind counts only `measured`, which runs after a warm-up of the same length. The variants are those
//! of `web_bench_server` (`examples/support/web_variants.rs`), but for `ratelimit`.

use std::error::Error;
use std::hint::black_box;
use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use futures::FutureExt;
use http::Request;
use tower::{Service, ServiceExt};

#[path = "support/web_variants.rs"]
mod web_variants;

/// The client of every request.
const PEER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 7)), 40000);

/// The measured run (callgrind's `--toggle-collect` names it): the same loop as the warm-up.
#[inline(never)]
fn measured(router: &mut Router, n: usize, forwarded: bool) -> Result<(), Box<dyn Error>> {
    requests(router, n, forwarded)
}

/// `forwarded`: each request carries the `X-Forwarded-For` of a proxy (the `*-proxied` variants).
fn requests(router: &mut Router, n: usize, forwarded: bool) -> Result<(), Box<dyn Error>> {
    for _ in 0..n {
        let mut req = Request::get("/hello");
        if forwarded {
            req = req.header("x-forwarded-for", "198.51.100.4");
        }
        let mut req = req.body(Body::empty())?;
        // What `into_make_service_with_connect_info` adds to every request (the per-IP variants read it).
        req.extensions_mut().insert(ConnectInfo(PEER));
        let ready = ServiceExt::<Request<Body>>::ready(router).now_or_never().ok_or("not ready at once")??;
        let res = ready.call(req).now_or_never().ok_or("not answered at once")??;
        if !res.status().is_success() {
            return Err(format!("answered {}", res.status()).into());
        }
        black_box(res);
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let variant = args.next().ok_or("usage: web_instructions VARIANT [REQUESTS]")?;
    let n: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(10_000);
    // tower-governor and axum need no reactor for a ready router; a runtime context keeps timers valid.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let _in = rt.enter();
    if variant == "ratelimit" {
        // Its buffer's worker is a task that only a running runtime polls; this loop never yields to one.
        return Err("`ratelimit` needs a running runtime: measure it with scripts/bench-web".into());
    }
    let mut router = web_variants::app(&variant)?.with_state(());
    let forwarded = variant.ends_with("-proxied");
    requests(&mut router, n, forwarded)?;
    measured(&mut router, n, forwarded)?;
    println!("{variant}: {n} requests");
    Ok(())
}
