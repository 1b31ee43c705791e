//! Rules from a file in Sentinel's JSON format, hot-reloaded when the file changes.
//!
//! Run: `cargo run --example rules_from_file`
//!
//! The example copies `examples/rules/sentinel-rules.json` to a temporary directory, loads it, shows the
//! flow limit of `GET:/orders` at work, then edits the file itself (limit 5 → 2) and shows the watcher
//! applying the new limit. It also shows a broken edit being rejected while the rules in force stay.

use std::error::Error;
use std::sync::mpsc;
use std::time::Duration;

use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::datasource::{FileDataSource, Format, Reloaded, RuleSet};
use sentinel_runtime::Sentinel;

const SAMPLE: &str = include_str!("rules/sentinel-rules.json");
const RESOURCE: &str = "GET:/orders";

/// Calls the resource 10 times within one second of the engine's clock; returns how many passed.
fn burst(engine: &Sentinel, clock: &ManualClock) -> usize {
    clock.advance_millis(1000);
    let orders = engine.resource(RESOURCE);
    (0..10).filter(|_| orders.enter().is_ok()).count()
}

/// Waits (up to a generous deadline) for the watcher to report a reload.
fn next_reload(rx: &mpsc::Receiver<Result<Reloaded, String>>) -> Result<Result<Reloaded, String>, Box<dyn Error>> {
    Ok(rx.recv_timeout(Duration::from_secs(10))?)
}

fn main() -> Result<(), Box<dyn Error>> {
    // A fresh private directory: a name under the shared temporary directory that others can guess could be
    // theirs, with their rules in it.
    let dir = tempfile::Builder::new().prefix("sentinel-rules-example-").tempdir()?;
    let path = dir.path().join("sentinel-rules.json");
    std::fs::write(&path, SAMPLE)?;

    // The engine's time is driven by the example, so the bursts below are exact; the file watcher is real.
    let clock = ManualClock::at_millis(1_700_000_000_000);
    let engine = Sentinel::builder().manual_clock(clock.clone()).app_name("rules-example").build();

    let source = FileDataSource::new(&engine, &path);
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    source.on_reload(move |result| {
        if let Ok(tx) = tx.lock() {
            let _ = tx.send(result.clone().map_err(|e| e.to_string()));
        }
    });
    let first = source.reload_now()?;
    let _ = rx.try_recv(); // the initial load's report
    println!("loaded {}: {first:?}", path.display());
    for r in engine.flow_rules() {
        println!("  flow rule: {} {:?} limit {} ({:?})", r.resource, r.grade, r.count, r.control_behavior);
    }
    let sample = RuleSet::parse(SAMPLE, Format::Json)?;
    println!(
        "  + {} degrade, {} system, {} authority, {} param-flow rule(s) in the file",
        sample.degrade.map_or(0, |v| v.len()),
        sample.system.map_or(0, |v| v.len()),
        sample.authority.map_or(0, |v| v.len()),
        sample.param_flow.map_or(0, |v| v.len())
    );
    println!("{RESOURCE}: {} of 10 calls passed in one second", burst(&engine, &clock));

    let _watcher = source.watch(Duration::from_millis(100))?;

    // Edit the file: lower the limit of GET:/orders from 5 to 2.
    let mut set = RuleSet::parse(&std::fs::read_to_string(&path)?, Format::Json)?;
    if let Some(flow) = set.flow.as_mut() {
        for r in flow.iter_mut().filter(|r| r.resource == RESOURCE) {
            r.count = 2.0;
        }
    }
    std::fs::write(&path, set.to_string(Format::Json)?)?;
    println!("edited the file: {RESOURCE} limit 5 -> 2");
    loop {
        match next_reload(&rx)? {
            Ok(Reloaded::Applied { kinds }) => {
                println!("watcher reloaded {kinds:?}");
                break;
            }
            other => println!("watcher: {other:?}"),
        }
    }
    println!("{RESOURCE}: {} of 10 calls passed in one second", burst(&engine, &clock));

    // A broken edit (a half-written file) is rejected and the rules in force stay.
    std::fs::write(&path, "{\"flowRules\": [{\"resource\": \"GET:/orders\", \"cou")?;
    loop {
        match next_reload(&rx)? {
            Err(e) => {
                println!("watcher rejected the file: {e}");
                break;
            }
            other => println!("watcher: {other:?}"),
        }
    }
    println!("{RESOURCE}: {} of 10 calls passed in one second (the good rules stayed)", burst(&engine, &clock));

    dir.close()?;
    Ok(())
}
