//! The seed's incident, replayed end to end in a few seconds of real time: an "order" service calls an
//! "inventory" service over reqwest; inventory's latency jumps from 50 ms to 1 s (3 s in the incident,
//! scaled down). Without a guard, the order service's in-flight requests and latency climb with the
//! downstream's; with the outbound guard (a slow-ratio breaker, a limit of 10 calls in flight, and a
//! fallback answer) it keeps answering fast. Both runs print their timeline, side by side.
//!
//! `cargo run --example downstream_breaker`

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::get;
use axum::Router;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::flow::{FlowGrade, FlowRule};
use sentinel_runtime::outbound::SentinelMiddleware;
use sentinel_runtime::Sentinel;

/// When inventory turns slow, and how long a run lasts.
const SLOW_FROM: Duration = Duration::from_millis(1_000);
const RUN: Duration = Duration::from_millis(4_000);
const TICK: Duration = Duration::from_millis(500);
/// One order request every 10 ms (100 a second).
const ARRIVAL: Duration = Duration::from_millis(10);

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Inventory: 50 ms per call, 1 s once `slow` is set.
async fn inventory(slow: Arc<AtomicBool>) -> SocketAddr {
    serve(Router::new().route(
        "/items/{id}",
        get(move || {
            let slow = slow.clone();
            async move {
                let ms = if slow.load(Ordering::Relaxed) { 1_000 } else { 50 };
                tokio::time::sleep(Duration::from_millis(ms)).await;
                "42 in stock"
            }
        }),
    ))
    .await
}

struct Order {
    client: ClientWithMiddleware,
    inventory: SocketAddr,
    in_flight: AtomicUsize,
}

/// Order: asks inventory for the item's stock.
async fn order(State(o): State<Arc<Order>>) -> String {
    o.in_flight.fetch_add(1, Ordering::Relaxed);
    let answer = match o.client.get(format!("http://{}/items/7", o.inventory)).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(e) => format!("error: {e}"),
    };
    o.in_flight.fetch_sub(1, Ordering::Relaxed);
    answer
}

/// One tick of a timeline.
#[derive(Default, Clone, Copy)]
struct Tick {
    in_flight: usize,
    done: u64,
    total_ms: u64,
    max_ms: u64,
}

async fn run(guard: Option<SentinelMiddleware>) -> Vec<Tick> {
    let slow = Arc::new(AtomicBool::new(false));
    let inventory = inventory(slow.clone()).await;
    let plain = reqwest::Client::builder().no_proxy().pool_max_idle_per_host(256).build().expect("a client");
    let client = match guard {
        Some(g) => ClientBuilder::new(plain).with(g).build(),
        None => ClientBuilder::new(plain).build(),
    };
    let state = Arc::new(Order { client, inventory, in_flight: AtomicUsize::new(0) });
    let order_addr = serve(Router::new().route("/order", get(order)).with_state(state.clone())).await;
    let caller = reqwest::Client::builder().no_proxy().pool_max_idle_per_host(1024).build().expect("a client");
    let ticks = (RUN.as_millis() / TICK.as_millis()) as usize;
    let timeline = Arc::new(Mutex::new(vec![Tick::default(); ticks]));
    let start = Instant::now();
    let mut arrivals = tokio::time::interval(ARRIVAL);
    while start.elapsed() < RUN {
        arrivals.tick().await;
        slow.store(start.elapsed() >= SLOW_FROM, Ordering::Relaxed);
        let (caller, shared) = (caller.clone(), timeline.clone());
        let url = format!("http://{order_addr}/order");
        tokio::spawn(async move {
            let sent = Instant::now();
            let _ = caller.get(url).send().await;
            let i = (start.elapsed().as_millis() / TICK.as_millis()) as usize;
            let ms = sent.elapsed().as_millis() as u64;
            if let Some(t) = shared.lock().expect("the timeline").get_mut(i) {
                t.done += 1;
                t.total_ms += ms;
                t.max_ms = t.max_ms.max(ms);
            }
        });
        let i = (start.elapsed().as_millis() / TICK.as_millis()) as usize;
        if let Some(t) = timeline.lock().expect("the timeline").get_mut(i) {
            t.in_flight = t.in_flight.max(state.in_flight.load(Ordering::Relaxed));
        }
    }
    // Let the last calls finish, so the next run starts on a quiet machine.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let out = timeline.lock().expect("the timeline").clone();
    out
}

fn cell(t: &Tick) -> String {
    let avg = t.total_ms.checked_div(t.done).unwrap_or(0);
    format!("{:>9} {:>8} {:>7}", t.in_flight, avg, t.max_ms)
}

#[tokio::main]
async fn main() {
    let bare = run(None).await;

    let engine = Sentinel::builder().build();
    let resource = "GET:inventory/items/{id}";
    // Calls slower than 200 ms are slow; over half of 5 or more in a second opens the breaker for 2 s.
    engine
        .load_degrade_rules([DegradeRule::new(resource, DegradeGrade::SlowRequestRatio)
            .count(200.0)
            .slow_ratio_threshold(0.5)
            .min_request_amount(5)
            .stat_interval_ms(1_000)
            .time_window_sec(2)])
        .expect("a valid breaker");
    engine.load_flow_rules([FlowRule::new(resource).grade(FlowGrade::Thread).count(10.0)]).expect("a valid limit");
    let guard = SentinelMiddleware::new(&engine)
        .resource_name(|_| Some(resource.into()))
        .fallback(|_, _| http::Response::new(Bytes::from_static(b"stock unknown (fallback)")));
    let guarded = run(Some(guard)).await;

    println!(
        "inventory turns slow (50 ms -> 1 s) at {} ms; one order request every {} ms",
        SLOW_FROM.as_millis(),
        ARRIVAL.as_millis()
    );
    println!();
    println!("{:>7} | {:^26} | {:^26}", "", "without the guard", "with the guard");
    println!(
        "{:>7} | {:>9} {:>8} {:>7} | {:>9} {:>8} {:>7}",
        "t (ms)", "in flight", "avg ms", "max ms", "in flight", "avg ms", "max ms"
    );
    for (i, (a, b)) in bare.iter().zip(&guarded).enumerate() {
        println!("{:>7} | {} | {}", i as u128 * TICK.as_millis(), cell(a), cell(b));
    }
    println!();
    println!("(in flight: the order service's requests waiting on inventory, at most, in the tick;");
    println!(" avg/max ms: latency of the order requests that completed in the tick)");
}
