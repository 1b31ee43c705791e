//! System adaptive protection: limits on the whole process's inbound traffic.
//!
//! Inbound entries (`EntryType::In`) are checked against the global inbound statistics: total qps,
//! calls in flight, average response time, and the machine's load and cpu usage. This example shows a
//! qps limit, a concurrency limit, and the cpu and load (BBR) checks with readings fed by hand (a real
//! service lets the background sampler read them from `/proc`).
//!
//! Run: `cargo run --example system_protection`

use sentinel_runtime::system::SystemRule;
use sentinel_runtime::{BlockError, EntryType, Sentinel, SystemLimit};

fn count_outcomes(engine: &Sentinel, name: &str, calls: usize) -> (usize, Vec<SystemLimit>) {
    let resource = engine.resource_typed(name, EntryType::In);
    let mut passed = 0;
    let mut limits = Vec::new();
    for _ in 0..calls {
        match resource.enter() {
            Ok(_entry) => passed += 1,
            Err(BlockError::System { limit, .. }) => limits.push(limit),
            Err(other) => panic!("unexpected block: {other}"),
        }
    }
    (passed, limits)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Sentinel::builder().app_name("system-protection-example").build();
    // Feed load and cpu readings instead of sampling /proc, so that the example behaves the same anywhere.
    engine.set_system_readings(Some(0.5), Some(0.2));

    // 1. Inbound qps: at most 20 per second over every inbound resource together.
    engine.load_system_rules(vec![SystemRule { qps: Some(20.0), ..Default::default() }])?;
    let (passed, limits) = count_outcomes(&engine, "http:/orders", 30);
    println!("qps limit 20: {passed} passed, {} blocked ({})", limits.len(), limits[0]);
    assert_eq!(passed, 20);
    // Outbound calls are never checked by system rules.
    let db = engine.resource("db:query");
    assert!((0..30).all(|_| db.enter().is_ok()));

    // 2. Concurrency: at most 4 inbound calls in flight (the check reads the count before the call).
    engine.load_system_rules(vec![SystemRule { max_thread: Some(4), ..Default::default() }])?;
    let reports = engine.resource_typed("http:/reports", EntryType::In);
    let mut in_flight = Vec::new();
    let mut refused = None;
    for _ in 0..8 {
        match reports.enter() {
            Ok(entry) => in_flight.push(entry), // still running: it counts as in flight
            Err(e) => refused = Some(e),
        }
    }
    println!(
        "thread limit 4: {} of 8 overlapping calls admitted; then: {}",
        in_flight.len(),
        refused.expect("blocked")
    );
    assert_eq!(in_flight.len(), 5, "threads > 4 blocks: the fifth call still sees 4 in flight");
    drop(in_flight);
    assert!(reports.enter().is_ok(), "admitted again once the calls completed");

    // 3. Cpu usage: over 80% blocks inbound calls.
    engine.load_system_rules(vec![SystemRule { highest_cpu_usage: Some(0.8), ..Default::default() }])?;
    let (passed, _) = count_outcomes(&engine, "http:/search", 3);
    println!("cpu 20% under limit 80%: {passed} of 3 passed");
    engine.set_system_readings(Some(0.5), Some(0.93));
    let (passed, limits) = count_outcomes(&engine, "http:/search", 3);
    println!("cpu 93% over limit 80%: {passed} passed; {}", limits[0]);
    assert_eq!(passed, 0);

    // 4. Load: over the limit, calls are blocked only when BBR judges the process saturated
    //    (more calls in flight than max success qps * min rt allows).
    engine.set_system_readings(Some(12.0), None);
    engine.load_system_rules(vec![SystemRule { highest_system_load: Some(8.0), ..Default::default() }])?;
    let search = engine.resource_typed("http:/search", EntryType::In);
    let mut held = Vec::new();
    let blocked = loop {
        match search.enter() {
            Ok(entry) => held.push(entry),
            Err(e) => break e,
        }
    };
    println!("load 12 over limit 8: {} calls in flight admitted, then: {blocked}", held.len());
    assert!(matches!(blocked, BlockError::System { limit: SystemLimit::Load { .. }, .. }));
    drop(held);

    engine.load_system_rules(vec![])?;
    assert!(search.enter().is_ok());
    println!("rules removed: inbound calls pass again");
    Ok(())
}
