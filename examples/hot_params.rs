//! Per-user limiting with a hot-parameter rule: each user id gets its own budget of calls per second,
//! a VIP user a larger one, and a thread-grade rule caps each region's calls in flight.
//!
//! The annotated function hands its arguments to the rules with `params = [...]` (by reference, no clone).
//!
//! Run: `cargo run --example hot_params`

use std::time::{Duration, Instant};

use sentinel_runtime::flow::FlowGrade;
use sentinel_runtime::param_flow::{ParamFlowRule, ParamItemValue};
use sentinel_runtime::{sentinel_resource, BlockError, Sentinel};

/// The guarded operation: hot parameter 0 is the user id, 1 the region.
#[sentinel_resource(name = "getProfile", params = [user_id, region])]
fn get_profile(user_id: u64, region: &str) -> Result<String, BlockError> {
    Ok(format!("profile of user {user_id} ({region})"))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Sentinel::global();
    engine.load_param_flow_rules(vec![
        // 5 calls per second per user id; user 42 is a VIP with 20.
        ParamFlowRule::new("getProfile", 0).count(5.0).item(ParamItemValue::Int(42), 20.0),
        // At most 2 calls in flight per region (argument 1, or -1: the last one).
        ParamFlowRule::new("getProfile", -1).grade(FlowGrade::Thread).count(2.0),
    ])?;

    let users = [7u64, 42, 1001];
    for second in 1..=3 {
        let started = Instant::now();
        for user in users {
            let (mut ok, mut blocked, mut last) = (0, 0, None);
            for _ in 0..25 {
                match get_profile(user, "eu-west") {
                    Ok(_) => ok += 1,
                    Err(e) => {
                        blocked += 1;
                        last = Some(e);
                    }
                }
            }
            println!("second {second}: user {user:>4}: {ok:>2} passed, {blocked:>2} blocked");
            if let Some(BlockError::ParamFlow { value, .. }) = &last {
                assert_eq!(value, &user.to_string(), "the block names the value over its limit");
            }
            let expected = if user == 42 { 20 } else { 5 };
            assert_eq!(ok, expected, "each user gets exactly its own budget per second");
        }
        // Let the per-value buckets refill (strictly more than one second).
        std::thread::sleep(Duration::from_millis(1050).saturating_sub(started.elapsed()));
    }

    // The thread-grade rule: a third concurrent call from the same region is blocked while two are in flight.
    // Manual entries take the same hot parameters with `args`.
    let resource = engine.resource("getProfile");
    let a = resource.entry().args(&[&1u64, &"us-east"]).enter()?;
    let b = resource.entry().args(&[&2u64, &"us-east"]).enter()?;
    match resource.entry().args(&[&3u64, &"us-east"]).enter() {
        Err(e) => println!("third concurrent call from us-east: {e}"),
        Ok(_) => panic!("the region's concurrency limit should have blocked"),
    }
    drop((a, b));
    assert!(resource.entry().args(&[&3u64, &"us-east"]).enter().is_ok());
    println!("after the first two exited, us-east is admitted again");
    Ok(())
}
