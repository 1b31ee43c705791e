//! A replay of the Sentinel Dashboard's gateway pages against the command center: `gateway/getApiDefinitions`,
//! `gateway/updateApiDefinitions`, `gateway/getRules`, `gateway/updateRules` as its `SentinelApiClient`
//! sends them (the POST form, and the GET form of old dashboards), answers parsed the way its entities
//! read them, invalid pushes refused whole, and the write-back to a rules directory surviving a restart.
#![cfg(all(feature = "transport", feature = "tower"))]

use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::datasource::FileDataSource;
use sentinel_runtime::transport::{CommandCenter, WRITE_DATA_SOURCE_FAILED};
use sentinel_runtime::web::gateway::{ParamMatchStrategy, ParseStrategy, ResourceMode, UrlMatchStrategy};
use sentinel_runtime::Sentinel;
use sentinel_testkit::http::{form_encode, get, raw_request, RawResponse};

fn engine() -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(1_700_000_000_300);
    (Sentinel::builder().manual_clock(clock.clone()).app_name("gateway").build(), clock)
}

/// `SentinelApiClient.postRequest`: a UTF-8 form with its own content type.
fn dashboard_post(center: &CommandCenter, command: &str, data: &str) -> RawResponse {
    let body = format!("data={}", form_encode(data));
    let req = format!(
        "POST /{command} HTTP/1.1\r\nContent-Length: {}\r\nContent-Type: application/x-www-form-urlencoded; charset=UTF-8\r\nHost: {}\r\nConnection: Keep-Alive\r\nUser-Agent: Apache-HttpAsyncClient/4.1.4 (Java/1.8.0_292)\r\n\r\n{body}",
        body.len(),
        center.local_addr()
    );
    raw_request(center.local_addr(), req.as_bytes())
}

fn json(r: &RawResponse) -> serde_json::Value {
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.body))
}

/// fastjson's output of the dashboard's `ApiDefinitionEntity.toApiDefinition()` set (alphabetical keys).
const DASHBOARD_APIS: &str = r#"[{"apiName":"products","predicateItems":[{"matchStrategy":1,"pattern":"/product/**"},{"matchStrategy":2,"pattern":"/item/\\d+"}]},{"apiName":"login","predicateItems":[{"matchStrategy":0,"pattern":"/login"}]}]"#;

/// fastjson's output of `GatewayFlowRuleEntity.toGatewayFlowRule()` (the dashboard's `interval` and
/// `intervalUnit` already folded into `intervalSec`); a regex with `+`, which Java's second decoding breaks.
const DASHBOARD_RULES: &str = r#"[{"burst":0,"controlBehavior":0,"count":5.0,"grade":1,"intervalSec":60,"maxQueueingTimeoutMs":500,"paramItem":{"fieldName":"user","index":0,"matchStrategy":2,"parseStrategy":3,"pattern":"vip-[0-9]+"},"resource":"products","resourceMode":1},{"burst":2,"controlBehavior":0,"count":100.0,"grade":1,"intervalSec":1,"maxQueueingTimeoutMs":500,"resource":"/search","resourceMode":0}]"#;

#[test]
fn the_four_gateway_commands_answer_in_the_dashboards_formats() {
    let (engine, _clock) = engine();
    let center = CommandCenter::builder(&engine).port(0).start().unwrap();
    let r = dashboard_post(&center, "gateway/updateApiDefinitions", DASHBOARD_APIS);
    assert_eq!((r.status, r.body.trim()), (200, "success"));
    let r = dashboard_post(&center, "gateway/updateRules", DASHBOARD_RULES);
    assert_eq!((r.status, r.body.trim()), (200, "success"));

    // `fetchApis`: a JSON array of ApiDefinitionEntity.
    let apis = json(&get(center.local_addr(), "/gateway/getApiDefinitions", &[]));
    assert_eq!(apis[0]["apiName"], "products");
    assert_eq!(apis[0]["predicateItems"][0]["pattern"], "/product/**");
    assert_eq!(apis[0]["predicateItems"][0]["matchStrategy"], UrlMatchStrategy::Prefix.code());
    assert_eq!(apis[0]["predicateItems"][1]["pattern"], r"/item/\d+");
    assert_eq!(apis[1]["predicateItems"][0]["matchStrategy"], 0);

    // `fetchGatewayFlowRules`: a JSON array of GatewayFlowRule.
    let rules = json(&get(center.local_addr(), "/gateway/getRules", &[]));
    assert_eq!(rules.as_array().unwrap().len(), 2);
    assert_eq!(rules[0]["resource"], "products");
    assert_eq!(rules[0]["resourceMode"], ResourceMode::CustomApiName.code());
    assert_eq!(rules[0]["intervalSec"], 60);
    assert_eq!(rules[0]["paramItem"]["parseStrategy"], ParseStrategy::UrlParam.code());
    assert_eq!(rules[0]["paramItem"]["matchStrategy"], ParamMatchStrategy::Regex.code());
    assert_eq!(rules[0]["paramItem"]["pattern"], "vip-[0-9]+", "decoded once: the `+` survives");
    assert_eq!(rules[1]["burst"], 2);
    assert!(rules[1].get("paramItem").is_none_or(|v| v.is_null()));

    // The engine has them, and the heartbeat's reason to say `app_type=1`.
    assert_eq!(engine.gateway_rules().len(), 2);
    assert!(engine.uses_gateway());
    // `api` lists them.
    let api = json(&get(center.local_addr(), "/api", &[]));
    assert!(api.as_array().unwrap().iter().any(|c| c["url"] == "/gateway/updateRules"));
}

#[test]
fn the_old_get_form_is_decoded_once_and_needs_get_writes_allowed() {
    let (engine, _clock) = engine();
    let query = format!("data={}", form_encode(DASHBOARD_RULES));
    let strict = CommandCenter::builder(&engine).port(0).start().unwrap();
    let req = format!(
        "GET /gateway/updateRules?{query} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        strict.local_addr()
    );
    assert_eq!(raw_request(strict.local_addr(), req.as_bytes()).status, 405, "writes come by POST by default");
    assert!(engine.gateway_rules().is_empty());

    let center = CommandCenter::builder(&engine).port(0).allow_get_writes(true).start().unwrap();
    let req = format!(
        "GET /gateway/updateRules?{query} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        center.local_addr()
    );
    let r = raw_request(center.local_addr(), req.as_bytes());
    assert_eq!((r.status, r.body.as_str()), (200, "success"));
    let pattern = engine.gateway_rules()[0].param_item.as_ref().and_then(|i| i.pattern.clone());
    assert_eq!(pattern.as_deref(), Some("vip-[0-9]+"));
}

#[test]
fn an_invalid_gateway_push_is_refused_whole_and_changes_neither_the_engine_nor_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _clock) = engine();
    let source = FileDataSource::new(&engine, dir.path());
    let center = CommandCenter::builder(&engine).port(0).data_source(source).start().unwrap();
    assert_eq!(dashboard_post(&center, "gateway/updateRules", DASHBOARD_RULES).body, "success");
    let file = dir.path().join("gw-flow-rules.json");
    let before = std::fs::read_to_string(&file).unwrap();

    let bad_regex = DASHBOARD_RULES.replace("vip-[0-9]+", "vip-(");
    let negative = DASHBOARD_RULES.replace("\"count\":100.0", "\"count\":-1");
    let unknown_strategy = DASHBOARD_RULES.replace("\"parseStrategy\":3", "\"parseStrategy\":9");
    for (data, says) in [
        (bad_regex.as_str(), "pattern"),
        (negative.as_str(), "count"),
        (unknown_strategy.as_str(), "parseStrategy"),
        ("{ not json", "JSON"),
    ] {
        let r = dashboard_post(&center, "gateway/updateRules", data);
        assert_eq!(r.status, 400, "{data}: {}", r.body);
        assert!(r.body.contains(says), "the reason names `{says}`: {}", r.body);
    }
    let r = dashboard_post(
        &center,
        "gateway/updateApiDefinitions",
        r#"[{"apiName":"a","predicateItems":[{"matchStrategy":2,"pattern":"("}]}]"#,
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(engine.gateway_rules().len(), 2, "the rules in force stay");
    assert!(engine.api_definitions().is_empty());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before, "the file is untouched");
}

#[test]
fn pushed_gateway_rules_and_api_definitions_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("flow-rules.json"), r#"[{"resource": "api", "count": 4}]"#).unwrap();
    let (engine, _clock) = engine();
    let source = FileDataSource::new(&engine, dir.path());
    source.reload_now().unwrap();
    let center = CommandCenter::builder(&engine).port(0).data_source(source.clone()).start().unwrap();
    assert_eq!(dashboard_post(&center, "gateway/updateApiDefinitions", DASHBOARD_APIS).body, "success");
    assert_eq!(dashboard_post(&center, "gateway/updateRules", DASHBOARD_RULES).body, "success");
    assert_eq!(
        source.reload_now().unwrap(),
        sentinel_runtime::datasource::Reloaded::Unchanged,
        "no fight with a watcher"
    );
    drop(center);

    let (restarted, _clock) = self::engine();
    FileDataSource::new(&restarted, dir.path()).reload_now().unwrap();
    assert_eq!(restarted.gateway_rules(), engine.gateway_rules());
    assert_eq!(restarted.api_definitions(), engine.api_definitions());
    assert_eq!(restarted.flow_rules().len(), 1, "the other kinds' files are as they were");
}

#[test]
fn partial_success_when_the_data_source_cannot_store_gateway_rules() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _clock) = engine();
    // A file of one kind's rules (a combined document or a rules directory would hold them).
    let source = FileDataSource::new(&engine, dir.path().join("flow-rules.json"));
    let center = CommandCenter::builder(&engine).port(0).data_source(source).start().unwrap();
    let r = dashboard_post(&center, "gateway/updateRules", DASHBOARD_RULES);
    assert_eq!((r.status, r.body.as_str()), (200, WRITE_DATA_SOURCE_FAILED));
    let names_why = |e: &str| e.contains("flow-rules.json") && e.contains("cannot store the gateway");
    assert!(r.header("x-sentinel-write-error").is_some_and(names_why), "{:?}", r.headers);
    assert_eq!(engine.gateway_rules().len(), 2, "in force all the same");
}

#[test]
fn a_bad_gateway_file_is_a_typed_error_and_the_rules_in_force_stay() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _clock) = engine();
    std::fs::write(dir.path().join("gw-flow-rules.json"), r#"[{"resource": "/search", "count": 3}]"#).unwrap();
    let source = FileDataSource::new(&engine, dir.path());
    source.reload_now().unwrap();
    assert_eq!(engine.gateway_rules()[0].count, 3.0);
    std::fs::write(dir.path().join("gw-flow-rules.json"), r#"[{"resource": "/search", "count": -3}]"#).unwrap();
    let e = source.reload_now().unwrap_err();
    assert!(e.path().ends_with("gw-flow-rules.json") && e.to_string().contains("count"), "{e}");
    std::fs::write(dir.path().join("gw-api-definitions.json"), "[{").unwrap();
    let e = source.reload_now().unwrap_err();
    assert!(e.path().ends_with("gw-api-definitions.json"), "{e}");
    assert_eq!(engine.gateway_rules()[0].count, 3.0, "the rules in force stay");
}

/// The module docs promise "nothing changes on an error". A push whose write-back outlasted the request
/// timeout was answered `408` (the dashboard shows the save as failed), yet its rules were in force (review).
/// Now it is answered `partial success` once it waited three quarters of the timeout.
#[test]
fn a_push_answered_with_an_error_has_changed_nothing() {
    let (engine, _clock) = engine();
    let (release, held) = std::sync::mpsc::channel();
    let (entered, _writing) = std::sync::mpsc::channel();
    let store = SignallingStore { entered: std::sync::Mutex::new(entered), release: std::sync::Mutex::new(held) };
    let center = CommandCenter::builder(&engine)
        .port(0)
        .data_source(store)
        .request_timeout(std::time::Duration::from_millis(200))
        .start()
        .unwrap();
    // The write-back waits until `release` says so, which is only after the answer came: no race.
    let r = dashboard_post(&center, "gateway/updateRules", DASHBOARD_RULES);
    let in_force = engine.gateway_rules().len();
    release.send(()).unwrap();
    if r.status != 200 {
        assert_eq!(in_force, 0, "answered {} ({}) but {in_force} pushed rules are in force", r.status, r.body);
    }
    // The push waited for the store three quarters of the timeout: in force, not written yet, and told so.
    assert_eq!((r.status, r.body.as_str(), in_force), (200, WRITE_DATA_SOURCE_FAILED, 2));
}

/// A store whose writes signal `entered`, then wait until `release` says so (a Redis, etcd or ZooKeeper that
/// answers slowly).
struct SignallingStore {
    entered: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl sentinel_runtime::datasource::WritableDataSource for SignallingStore {
    fn write_rules(
        &self,
        _: &sentinel_runtime::datasource::RuleSet,
    ) -> Result<(), sentinel_runtime::datasource::WriteBackError> {
        let _ = self.entered.lock().unwrap().send(());
        let _ = self.release.lock().unwrap().recv();
        Ok(())
    }
    fn write_gateway(
        &self,
        _: &sentinel_runtime::datasource::GatewayDocuments,
    ) -> Result<(), sentinel_runtime::datasource::WriteBackError> {
        let _ = self.entered.lock().unwrap().send(());
        let _ = self.release.lock().unwrap().recv();
        Ok(())
    }
    fn status(&self) -> sentinel_runtime::datasource::SourceStatus {
        sentinel_runtime::datasource::SourceStatus::new("signalling", "signalling")
    }
}

/// A push waited for the serial lock (held by an earlier push for up to the write-back deadline, three
/// quarters of the timeout) and then for its own write-back (another three quarters): a second push while
/// the store hung needed 1.5 timeouts and was answered `408`, its rules in force all the same (review). The
/// deadline now counts from the request's start.
#[test]
fn a_second_push_while_the_store_hangs_is_not_answered_408_with_its_rules_in_force() {
    let (engine, _clock) = engine();
    let (release, held) = std::sync::mpsc::channel();
    let (entered, writing) = std::sync::mpsc::channel();
    let store = SignallingStore { entered: std::sync::Mutex::new(entered), release: std::sync::Mutex::new(held) };
    let center = CommandCenter::builder(&engine)
        .port(0)
        .data_source(store)
        .request_timeout(std::time::Duration::from_secs(4))
        .start()
        .unwrap();
    std::thread::scope(|s| {
        let first = s.spawn(|| dashboard_post(&center, "gateway/updateRules", DASHBOARD_RULES));
        // The first push holds the serial lock and waits for its write (which never ends until released).
        writing.recv().unwrap();
        let r = dashboard_post(&center, "gateway/updateApiDefinitions", DASHBOARD_APIS);
        let in_force = engine.api_definitions().len();
        for _ in 0..2 {
            release.send(()).unwrap();
        }
        let first = first.join().unwrap();
        assert_eq!((first.status, first.body.as_str()), (200, WRITE_DATA_SOURCE_FAILED));
        if r.status != 200 {
            assert_eq!(
                in_force, 0,
                "answered {} ({}) but {in_force} pushed definitions are in force",
                r.status, r.body
            );
        }
    });
}
