//! What a small push through the gateway commands makes the application hold: measured with a global
//! allocator that counts the bytes live (its own test binary, so nothing else shares the count).
#![cfg(all(feature = "transport", feature = "tower"))]

use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::transport::CommandCenter;
use sentinel_runtime::Sentinel;
use sentinel_testkit::http::post_form;

#[path = "support/live_bytes.rs"]
mod live_bytes;
use live_bytes::{live, MIB};

/// One measurement at a time: the count is over every thread of the binary.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn center() -> (Sentinel, CommandCenter) {
    let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(1_700_000_000_000)).build();
    let center = CommandCenter::builder(&engine).port(0).start().unwrap();
    (engine, center)
}

/// Each gateway rule becomes a hot-parameter rule with a counter table for up to `min(4000 × intervalSec,
/// 200000)` values (7.6 MB for any rule of 50 s or more). Its pages are made as values reach them (Java makes
/// a rule's parameter metric when the resource is first checked): twenty such rules, a push of about 1 KB,
/// held about 150 MB when tables were allocated whole with the rule (review).
#[test]
fn a_one_kilobyte_gateway_rule_push_does_not_hold_hundreds_of_megabytes() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (engine, center) = center();
    let rules: Vec<String> =
        (0..20).map(|i| format!(r#"{{"resource":"route-{i}","count":10,"intervalSec":60}}"#)).collect();
    let data = format!("[{}]", rules.join(","));
    assert!(data.len() < 1200, "{}", data.len());
    let before = live();
    let r = post_form(center.local_addr(), "/gateway/updateRules", &[("data", &data)], &[]);
    assert_eq!((r.status, r.body.as_str()), (200, "success"));
    assert_eq!(engine.gateway_rules().len(), 20);
    let held = live() - before;
    assert!(held < 32 * MIB, "a {} byte push holds {} MiB", data.len(), held / MIB);
}

/// Every regular expression of an API definition is held compiled, each up to the 1 MiB program limit:
/// `.{1000}` is 7 characters and compiles to about 1 MB, so a push of a hundred of them (4.4 KB) held about
/// 100 MB, and the 1 MiB body cap admitted ~25,000 of them (review). A set's regular expressions now hold
/// 16 MiB in all at most: such a push is refused, and the definitions in force stay.
#[test]
fn a_five_kilobyte_api_definition_push_does_not_hold_a_hundred_megabytes_of_regexes() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (engine, center) = center();
    let items: Vec<String> = (0..100).map(|i| format!(r#"{{"pattern":"/{i}/.{{1000}}","matchStrategy":2}}"#)).collect();
    let data = format!(r#"[{{"apiName":"bomb","predicateItems":[{}]}}]"#, items.join(","));
    assert!(data.len() < 4500, "{}", data.len());
    let before = live();
    let r = post_form(center.local_addr(), "/gateway/updateApiDefinitions", &[("data", &data)], &[]);
    assert_ne!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("16 MiB") && r.body.contains("in all"), "{}", r.body);
    assert!(engine.api_definitions().is_empty(), "the definitions in force stay");
    let held = live() - before;
    assert!(held < 32 * MIB, "a {} byte push holds {} MiB", data.len(), held / MIB);
    // Fewer of them fit: ten are taken.
    let items: Vec<String> = (0..10).map(|i| format!(r#"{{"pattern":"/{i}/.{{1000}}","matchStrategy":2}}"#)).collect();
    let data = format!(r#"[{{"apiName":"ten","predicateItems":[{}]}}]"#, items.join(","));
    let r = post_form(center.local_addr(), "/gateway/updateApiDefinitions", &[("data", &data)], &[]);
    assert_eq!((r.status, r.body.as_str()), (200, "success"));
}

/// The same tables behind the ordinary hot-parameter push (`setParamFlowRules`, the dashboard's hot-parameter
/// page): twenty rules of `durationInSec` 60 in about 1.3 KB held about 150 MB when allocated whole.
#[test]
fn a_small_hot_parameter_rule_push_does_not_hold_hundreds_of_megabytes() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (engine, center) = center();
    let rules: Vec<String> =
        (0..20).map(|i| format!(r#"{{"resource":"res-{i}","paramIdx":0,"count":10,"durationInSec":60}}"#)).collect();
    let data = format!("[{}]", rules.join(","));
    assert!(data.len() < 1400, "{}", data.len());
    let before = live();
    let r = post_form(center.local_addr(), "/setParamFlowRules", &[("data", &data)], &[]);
    assert_eq!((r.status, r.body.as_str()), (200, "success"));
    assert_eq!(engine.param_flow_rules().len(), 20);
    let held = live() - before;
    assert!(held < 32 * MIB, "a {} byte push holds {} MiB", data.len(), held / MIB);
}
