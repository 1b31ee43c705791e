//! The web layer's cost in instructions, the one figure that does not move between runs on a shared machine
//! (`scripts/callgrind-web` runs it under valgrind's callgrind and prints instructions per request).
//!
//! `cargo run --release -p sentinel-benches --example web_instructions -- VARIANT [REQUESTS]`
//!
//! Sends `REQUESTS` (default 10,000) `GET /hello` requests through an axum `Router` on the calling thread:
//! each builds the request, waits for the router to be ready, calls it and completes the response future,
//! as a server does per request minus the network and hyper. The `*-proxied` variants' requests also carry
//! `X-Forwarded-For: 198.51.100.4`, as from a proxy (the peer, 10.0.0.7, is on a private network).
//! Callgrind counts only `measured`, which runs after a warm-up of the same length. The variants are those
//! of `web_bench_server` (`benches/examples/support/web_variants.rs`), but for `ratelimit`.
//!
//! The `part-*` variants measure one part of a request's work instead, with nothing around it:
//! - `part-governor-check`: tower-governor's decision alone (the `governor` variant's limiter, checked for the
//!   global key);
//! - `part-governor-direct`: a bare governor rate limiter's `check()` (`RateLimiter::direct`, never limits);
//! - `part-failsafe`: a call through failsafe's circuit breaker (default configuration, closed);
//! - `part-stats`: the statistics an inbound Sentinel entry must keep, through `StatNode`'s public API: two
//!   clock reads, a pass and a completion (response time, success) on the resource's node and on the global
//!   inbound node, and one compare-and-swap standing for the flow rule's exact pass counter;
//! - `part-stats-one`: the same on the resource's node alone (what an outbound entry in the default context
//!   must keep: the floor under `part-entry-flow-pass`);
//! - `part-engine-floor`: a model, written by hand, of the least an engine must do for an entry and its exit
//!   with one passing QPS rule in the default context (`benches/benches/support/engine_floor.rs` says
//!   what it keeps and what it leaves out): `part-stats-one`'s records, the rules read in a read section, the
//!   rule's exact admission, the thread's context, and an entry the caller holds and drops;
//! - `part-entry`: the engine's owned inbound entry and its exit, one passing flow rule, no web layer, on a
//!   leaked engine (the entry holds nothing); `part-entry-held`: the same on an engine that can be dropped
//!   (the entry holds its state: `engine::keep`); `part-entry-system`: `part-entry` with a system rule
//!   besides (a QPS limit on every inbound call that never limits);
//! - `part-client-bare`, `part-client-guard`, `part-client-guard-breaker`: one outbound call through a tower
//!   `service_fn` client that answers at once, bare, behind `outbound::SentinelClientLayer` with a passing flow
//!   rule on its resource (`GET:inventory.svc/items/{id}`, the id folded by the path cleaner), and with a
//!   closed slow-ratio breaker as well. Each call builds its request (`http://inventory.svc/items/{n}`), so
//!   the guard's own cost is the difference from `part-client-bare`.
//! - `part-entry-*`: one entry and its exit through `Resource::enter` (the slot chain's cost, no web layer):
//!   `none` (no rule), `flow-pass` (one flow rule that passes), `flow-block` (one flow rule that blocks every
//!   call), `flow-breaker` (a passing flow rule and a closed slow-ratio breaker), `flow-error-ratio` (a passing
//!   flow rule and a closed error-ratio breaker), `flow-breaker-thread` (the same with a thread-grade flow rule
//!   besides), `two-limits` (two passing QPS rules with different limits: the second reserves in the node's
//!   second window), `param` (a hot-parameter rule that passes, one value), `param-million` (the same rule, each
//!   call another of 10^6 values in turn: every call a miss and an eviction), `param-thousand` (the same
//!   rule, each call another of 1,000 values in turn, all tracked: every call a hit), `param-thread` (a thread-grade
//!   hot-parameter rule, one value, which a call holds until it exits), `adaptive` (an adaptive
//!   concurrency rule with a limit of 1,000) and `thread` (a thread-grade flow rule with the same limit: the
//!   cost the adaptive rule is held to), `flow-adaptive` (the adaptive rule beside a passing flow rule),
//!   `param-adaptive` (the adaptive rule beside the hot-parameter rule of `param`), `authority` (an authority
//!   black list and a passing flow rule, called with an origin the list does not name), `rate-limiter` (a flow
//!   rule that spaces calls, never reached), `nested` (`flow-pass` inside an entry of another resource held
//!   around the loop: the entry joins an active context rather than starting one), `origin-only` (`flow-pass`
//!   called with an origin), `origin-limit` (the same with a second rule, for the caller's origin: Java's
//!   `limitApp`), `origin-threads` (the same with a thread-grade rule for the caller's origin, limit 1,000),
//!   `origin-two` (a limit for every caller, and a QPS rule and a thread-grade rule for the caller's origin),
//!   `three-limits` (three passing QPS rules: the fast path's check for more than two rules for every caller),
//!   `five-limits` (five: the general path), `relate` (a limit for every caller and a rule relating the
//!   resource to another one, entered once), `chain` (a limit for every caller and a rule for calls from one
//!   entrance, called in that entrance's context);
//! - `part-macro-sync`, `part-macro-async`, `part-macro-async-timeout`: a call of a `#[sentinel_resource]`
//!   function, sync, async and async with `timeout_ms = 200` (the future polled once, with no executor), on
//!   the global engine with one passing flow rule; `part-plain-sync`, `part-plain-async`: the same functions
//!   without the attribute, called the same way (what calling and polling cost without the macro: the macro's
//!   own cost is the difference).

use std::error::Error;
use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use futures::FutureExt;
use http::Request;
use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::clock::{Clock, SystemClock};
use sentinel_runtime::flow::{FlowGrade, FlowRule};
use sentinel_runtime::outbound::SentinelClientLayer;
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::stat::StatNode;
use sentinel_runtime::system::SystemRule;
use sentinel_runtime::{sentinel_resource, BlockError, EntryType, Sentinel};
use tower::{Layer, Service, ServiceExt};

#[path = "support/web_variants.rs"]
mod web_variants;

#[path = "../benches/support/engine_floor.rs"]
mod engine_floor;

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

/// The measured run of a `part-*` variant: `n` calls of `part` (callgrind's `--toggle-collect` names it).
#[inline(never)]
fn measured_part(part: &mut impl FnMut(), n: usize) {
    for _ in 0..n {
        part();
    }
}

/// Runs `part` `n` times as a warm-up, then `n` times measured.
fn run_part(mut part: impl FnMut(), n: usize) {
    for _ in 0..n {
        part();
    }
    measured_part(&mut part, n);
}

/// A client that answers every call at once: 200 with an empty body.
fn client() -> impl Service<Request<()>, Response = http::Response<Body>, Error = std::convert::Infallible> + Clone {
    tower::service_fn(|_req: Request<()>| std::future::ready(Ok(http::Response::new(Body::empty()))))
}

/// One outbound call per run through `svc`: builds the request, waits until ready, completes the call.
fn client_calls<S>(mut svc: S) -> impl FnMut()
where
    S: Service<Request<()>>,
    S::Error: std::fmt::Debug,
{
    let mut id = 0u64;
    move || {
        id += 1;
        let request = Request::get(format!("http://inventory.svc/items/{id}")).body(()).expect("a request");
        let ready = svc.ready().now_or_never().expect("ready at once").expect("no error");
        assert!(black_box(ready.call(request).now_or_never().expect("answered at once")).is_ok());
    }
}

/// The annotated sync function of `part-macro-sync`.
#[inline(never)]
#[sentinel_resource(name = "part.macro-sync")]
fn annotated(x: u64) -> Result<u64, BlockError> {
    Ok(black_box(x) + 1)
}

/// The annotated async function of `part-macro-async`.
#[inline(never)]
#[sentinel_resource(name = "part.macro-async")]
async fn annotated_async(x: u64) -> Result<u64, BlockError> {
    Ok(black_box(x) + 1)
}

/// `annotated` without the attribute (`part-plain-sync`).
#[inline(never)]
fn plain(x: u64) -> Result<u64, BlockError> {
    Ok(black_box(x) + 1)
}

/// `annotated_async` without the attribute (`part-plain-async`).
#[inline(never)]
async fn plain_async(x: u64) -> Result<u64, BlockError> {
    Ok(black_box(x) + 1)
}

/// The error of `part-macro-async-timeout`'s function.
#[derive(Debug)]
enum TimedError {
    Blocked,
    TimedOut,
}

impl From<BlockError> for TimedError {
    fn from(_: BlockError) -> Self {
        TimedError::Blocked
    }
}

impl From<sentinel_runtime::Timeout> for TimedError {
    fn from(_: sentinel_runtime::Timeout) -> Self {
        TimedError::TimedOut
    }
}

/// The annotated async function of `part-macro-async-timeout`: `part-macro-async`'s with a time limit.
#[inline(never)]
#[sentinel_resource(name = "part.macro-async-timeout", timeout_ms = 200)]
async fn annotated_async_timeout(x: u64) -> Result<u64, TimedError> {
    Ok(black_box(x) + 1)
}

/// One entry and exit per run on `resource` of a fresh engine with `setup`'s rules; `blocks`: every call is
/// expected to be blocked.
fn entries(
    setup: impl FnOnce(&Sentinel) -> Result<(), Box<dyn Error>>,
    blocks: bool,
    n: usize,
) -> Result<(), Box<dyn Error>> {
    let engine = Sentinel::builder().build().leak();
    setup(engine)?;
    let resource = engine.resource("part");
    run_part(|| assert_eq!(black_box(resource.enter()).is_err(), blocks), n);
    Ok(())
}

/// The `part-*` variants (see the top of this file).
fn parts(variant: &str, n: usize) -> Result<(), Box<dyn Error>> {
    match variant {
        "part-governor-check" => {
            let mut never = tower_governor::governor::GovernorConfigBuilder::default();
            never.per_nanosecond(1).burst_size(u32::MAX);
            let config = never.key_extractor(tower_governor::key_extractor::GlobalKeyExtractor).finish();
            let limiter = config.ok_or("governor config")?.limiter().clone();
            run_part(|| assert!(black_box(limiter.check_key(&())).is_ok()), n);
        }
        "part-governor-direct" => {
            let limiter = governor::RateLimiter::direct(governor::Quota::per_second(std::num::NonZeroU32::MAX));
            run_part(|| assert!(black_box(limiter.check()).is_ok()), n);
        }
        "part-failsafe" => {
            let breaker = failsafe::Config::new().build();
            run_part(
                || assert!(black_box(failsafe::CircuitBreaker::call(&breaker, || Ok::<u64, ()>(black_box(1)))).is_ok()),
                n,
            );
        }
        "part-engine-floor" => {
            let engine = engine_floor::FloorEngine::leaked(1_000_000_000);
            run_part(|| assert!(black_box(engine.enter()).is_some()), n);
        }
        "part-stats" | "part-stats-one" => {
            let (clock, resource, inbound) = (SystemClock::new(), StatNode::new(), StatNode::new());
            let inbound = (variant == "part-stats").then_some(&inbound);
            let passed = AtomicU64::new(0);
            run_part(
                || {
                    let start = clock.now_nanos();
                    let ms = start / 1_000_000;
                    let p = passed.load(Ordering::Relaxed);
                    let admitted = passed.compare_exchange(p, p + 1, Ordering::AcqRel, Ordering::Relaxed).is_ok();
                    assert!(black_box(admitted));
                    resource.on_pass(ms, 1);
                    if let Some(inbound) = inbound {
                        inbound.on_pass(ms, 1);
                    }
                    let end = clock.now_nanos();
                    let rt_micros = end.saturating_sub(start) / 1000;
                    resource.on_complete(end / 1_000_000, rt_micros, 1, false);
                    if let Some(inbound) = inbound {
                        inbound.on_complete(end / 1_000_000, rt_micros, 1, false);
                    }
                },
                n,
            );
        }
        "part-entry" | "part-entry-held" | "part-entry-system" => {
            // `part-entry-held`: on an engine that can be dropped, whose owned entries hold its state.
            let kept;
            let engine = if variant == "part-entry-held" {
                kept = Sentinel::builder().build();
                &kept
            } else {
                Sentinel::builder().build().leak()
            };
            engine.load_flow_rules([FlowRule::new("part").count(1e12)])?;
            if variant == "part-entry-system" {
                engine.load_system_rules([SystemRule::new().qps(1e12)])?;
            }
            let resource = engine.resource("part");
            run_part(
                || {
                    let entry = resource.entry_owned().entry_type(EntryType::In).decide();
                    assert!(black_box(&entry).is_ok());
                },
                n,
            );
        }
        "part-entry-none" => entries(|_| Ok(()), false, n)?,
        "part-entry-flow-pass" => entries(|e| Ok(e.load_flow_rules([FlowRule::new("part").count(1e12)])?), false, n)?,
        "part-entry-flow-block" => entries(|e| Ok(e.load_flow_rules([FlowRule::new("part").count(0.0)])?), true, n)?,
        "part-entry-nested" => {
            let engine = Sentinel::builder().build().leak();
            engine.load_flow_rules([FlowRule::new("part").count(1e12)])?;
            let (outer, resource) = (engine.resource("outer"), engine.resource("part"));
            let _outer = outer.enter()?;
            run_part(|| assert!(black_box(resource.enter()).is_ok()), n);
        }
        "part-entry-two-limits" => entries(
            |e| Ok(e.load_flow_rules([FlowRule::new("part").count(1e12), FlowRule::new("part").count(1e11)])?),
            false,
            n,
        )?,
        "part-entry-flow-breaker" => entries(
            |e| {
                e.load_flow_rules([FlowRule::new("part").count(1e12)])?;
                e.load_degrade_rules([DegradeRule::new("part", DegradeGrade::SlowRequestRatio)
                    .count(1_000.0)
                    .slow_ratio_threshold(0.5)
                    .time_window_sec(10)])?;
                Ok(())
            },
            false,
            n,
        )?,
        "part-entry-adaptive" => entries(
            |e| {
                Ok(e.load_adaptive_rules([
                    sentinel_runtime::adaptive::AdaptiveRule::new("part").limits(1_000, 1_000, 1_000)
                ])?)
            },
            false,
            n,
        )?,
        "part-entry-flow-adaptive" => entries(
            |e| {
                e.load_flow_rules([FlowRule::new("part").count(1e12)])?;
                Ok(e.load_adaptive_rules([
                    sentinel_runtime::adaptive::AdaptiveRule::new("part").limits(1_000, 1_000, 1_000)
                ])?)
            },
            false,
            n,
        )?,
        "part-entry-flow-error-ratio" | "part-entry-flow-breaker-thread" => entries(
            |e| {
                let mut flow = vec![FlowRule::new("part").count(1e12)];
                if variant.ends_with("thread") {
                    flow.push(FlowRule::new("part").grade(FlowGrade::Thread).count(1e9));
                }
                e.load_flow_rules(flow)?;
                e.load_degrade_rules([DegradeRule::new("part", DegradeGrade::ErrorRatio)
                    .count(0.5)
                    .min_request_amount(5)
                    .time_window_sec(10)])?;
                Ok(())
            },
            false,
            n,
        )?,
        "part-entry-authority" => {
            // A black list and a flow rule, called with an origin that is not listed.
            let engine = Sentinel::builder().build().leak();
            engine.load_authority_rules([sentinel_runtime::authority::AuthorityRule::new(
                "part",
                "crawler",
                sentinel_runtime::authority::AuthorityStrategy::Black,
            )])?;
            engine.load_flow_rules([FlowRule::new("part").count(1e12)])?;
            let resource = engine.resource("part");
            run_part(|| assert!(black_box(resource.entry().origin("shop").enter()).is_ok()), n);
        }
        "part-entry-origin-limit" => {
            // A limit for every caller and one for the caller's origin (Java's `limitApp`).
            let engine = Sentinel::builder().build().leak();
            engine.load_flow_rules([
                FlowRule::new("part").count(1e12),
                FlowRule::new("part").count(1e11).limit_app("shop"),
            ])?;
            let resource = engine.resource("part");
            run_part(|| assert!(black_box(resource.entry().origin("shop").enter()).is_ok()), n);
        }
        "part-entry-origin-threads" => {
            // A limit for every caller and a thread-grade rule for the caller's origin.
            let engine = Sentinel::builder().build().leak();
            let threads = FlowRule::new("part").grade(sentinel_runtime::flow::FlowGrade::Thread).count(1_000.0);
            engine.load_flow_rules([FlowRule::new("part").count(1e12), threads.limit_app("shop")])?;
            let resource = engine.resource("part");
            run_part(|| assert!(black_box(resource.entry().origin("shop").enter()).is_ok()), n);
        }
        "part-entry-origin-two" => {
            // A limit for every caller, and two rules for the caller's origin: a QPS limit and a thread-grade one.
            let engine = Sentinel::builder().build().leak();
            let threads = FlowRule::new("part").grade(sentinel_runtime::flow::FlowGrade::Thread).count(1_000.0);
            let qps = FlowRule::new("part").count(1e11);
            engine.load_flow_rules([
                FlowRule::new("part").count(1e12),
                qps.limit_app("shop"),
                threads.limit_app("shop"),
            ])?;
            let resource = engine.resource("part");
            run_part(|| assert!(black_box(resource.entry().origin("shop").enter()).is_ok()), n);
        }
        "part-entry-origin-only" => {
            // One limit for every caller, called with an origin.
            let engine = Sentinel::builder().build().leak();
            engine.load_flow_rules([FlowRule::new("part").count(1e12)])?;
            let resource = engine.resource("part");
            run_part(|| assert!(black_box(resource.entry().origin("shop").enter()).is_ok()), n);
        }
        "part-entry-three-limits" => entries(
            |e| {
                Ok(e.load_flow_rules([
                    FlowRule::new("part").count(1e12),
                    FlowRule::new("part").count(1e11),
                    FlowRule::new("part").count(1e10),
                ])?)
            },
            false,
            n,
        )?,
        "part-entry-five-limits" => entries(
            |e| Ok(e.load_flow_rules((0..5).map(|i| FlowRule::new("part").count(1e12 / 10f64.powi(i))))?),
            false,
            n,
        )?,
        "part-entry-relate" => {
            // A limit for every caller and a limit on the resource while another ("orders", entered once)
            // is busy: Java's `RELATE` strategy.
            let engine = Sentinel::builder().build().leak();
            drop(engine.resource("orders").enter()?);
            engine.load_flow_rules([
                FlowRule::new("part").count(1e12),
                FlowRule::new("part").count(1e12).relate("orders"),
            ])?;
            let resource = engine.resource("part");
            run_part(|| assert!(black_box(resource.enter()).is_ok()), n);
        }
        "part-entry-chain" => {
            // A limit for every caller and a limit on calls from one entrance (Java's `CHAIN` strategy),
            // called in that entrance's context, held around the loop.
            let engine = Sentinel::builder().build().leak();
            engine.load_flow_rules([
                FlowRule::new("part").count(1e12),
                FlowRule::new("part").count(1e12).chain("entrance"),
            ])?;
            let _entrance = engine.enter_context("entrance", "")?;
            let resource = engine.resource("part");
            run_part(|| assert!(black_box(resource.enter()).is_ok()), n);
        }
        "part-entry-rate-limiter" => entries(
            |e| {
                Ok(e.load_flow_rules([FlowRule::new("part")
                    .count(1e12)
                    .control_behavior(sentinel_runtime::flow::ControlBehavior::RateLimiter)])?)
            },
            false,
            n,
        )?,
        "part-entry-thread" => entries(
            |e| {
                Ok(e.load_flow_rules([FlowRule::new("part")
                    .grade(sentinel_runtime::flow::FlowGrade::Thread)
                    .count(1_000.0)])?)
            },
            false,
            n,
        )?,
        "part-entry-param"
        | "part-entry-param-thousand"
        | "part-entry-param-million"
        | "part-entry-param-thread"
        | "part-entry-param-adaptive" => {
            let engine = Sentinel::builder().build().leak();
            let rule = ParamFlowRule::new("part", 0).count(1e12);
            let rule = if variant.ends_with("thread") { rule.grade(FlowGrade::Thread).count(1_000.0) } else { rule };
            engine.load_param_flow_rules([rule])?;
            if variant.ends_with("adaptive") {
                engine.load_adaptive_rules([
                    sentinel_runtime::adaptive::AdaptiveRule::new("part").limits(1_000, 1_000, 1_000)
                ])?;
            }
            let resource = engine.resource("part");
            // One value; each call the next of 1,000 (all tracked, after a round that brings them in: every
            // call a hit, in whichever cell of its set its value took); or each call the next of 10^6 (far
            // beyond the rule's 4,000 tracked values), after 10,000 calls that fill the rule's table, so that
            // every measured call replaces a value.
            let (values, fill) = match variant {
                "part-entry-param-million" => (1_000_000, 10_000),
                "part-entry-param-thousand" => (1_000, 1_000),
                _ => (1, 0),
            };
            let mut next = 0u64;
            let mut call = || {
                next = (next + 1) % values;
                assert!(black_box(resource.entry().args(&[&next]).enter()).is_ok());
            };
            (0..fill).for_each(|_| call());
            run_part(call, n);
        }
        "part-macro-sync" => {
            Sentinel::global().load_flow_rules([FlowRule::new("part.macro-sync").count(1e12)])?;
            run_part(|| assert!(black_box(annotated(black_box(7))).is_ok()), n);
        }
        "part-macro-async" => {
            Sentinel::global().load_flow_rules([FlowRule::new("part.macro-async").count(1e12)])?;
            run_part(|| assert!(black_box(annotated_async(black_box(7)).now_or_never()).is_some_and(|r| r.is_ok())), n);
        }
        "part-plain-sync" => run_part(|| assert!(black_box(plain(black_box(7))).is_ok()), n),
        "part-plain-async" => {
            run_part(|| assert!(black_box(plain_async(black_box(7)).now_or_never()).is_some_and(|r| r.is_ok())), n)
        }
        "part-macro-async-timeout" => {
            Sentinel::global().load_flow_rules([FlowRule::new("part.macro-async-timeout").count(1e12)])?;
            run_part(
                || assert!(black_box(annotated_async_timeout(black_box(7)).now_or_never()).is_some_and(|r| r.is_ok())),
                n,
            );
        }
        "part-client-bare" => run_part(client_calls(client()), n),
        "part-client-guard" | "part-client-guard-breaker" => {
            let engine = Sentinel::builder().build().leak();
            let resource = "GET:inventory.svc/items/{id}";
            engine.load_flow_rules([FlowRule::new(resource).count(1e12)])?;
            if variant.ends_with("breaker") {
                engine.load_degrade_rules([DegradeRule::new(resource, DegradeGrade::SlowRequestRatio)
                    .count(1_000.0)
                    .slow_ratio_threshold(0.5)
                    .time_window_sec(10)])?;
            }
            run_part(client_calls(SentinelClientLayer::new(engine).layer(client())), n);
        }
        other => return Err(format!("unknown variant `{other}`").into()),
    }
    println!("{variant}: {n} calls");
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let variant = args.next().ok_or("usage: web_instructions VARIANT [REQUESTS]")?;
    let n: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(10_000);
    if variant.starts_with("part-") {
        return parts(&variant, n);
    }
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
