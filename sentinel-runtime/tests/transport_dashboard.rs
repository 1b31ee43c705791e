//! A replay of the Sentinel Dashboard against the command center: the requests its `SentinelApiClient` and
//! `MetricFetcher` send (methods, content types, parameters; the POST form of dashboards for clients ≥ 1.6.0
//! and the GET form of older ones), the answers parsed the way the dashboard parses them; and a fake dashboard
//! that receives heartbeats.
#![cfg(feature = "transport")]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use sentinel_runtime::circuit_breaker::DegradeGrade;
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::datasource::FileDataSource;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::transport::{CommandCenter, WRITE_DATA_SOURCE_FAILED};
use sentinel_runtime::Sentinel;
use sentinel_testkit::http::{form_encode, get, raw_request, RawResponse};

const T0: u64 = 1_700_000_000_000;

fn engine(app: &str) -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(T0 + 300);
    (Sentinel::builder().manual_clock(clock.clone()).app_name(app).build(), clock)
}

fn start(engine: &Sentinel) -> CommandCenter {
    CommandCenter::builder(engine).port(0).start().expect("start the command center")
}

/// Java's `MetricNode.fromThinString`.
#[derive(Debug, PartialEq)]
struct MetricNode {
    timestamp: u64,
    resource: String,
    pass: u64,
    block: u64,
    success: u64,
    exception: u64,
    rt: u64,
    occupied: u64,
    concurrency: u64,
    classification: i32,
}

fn from_thin_string(line: &str) -> MetricNode {
    let s: Vec<&str> = line.split('|').collect();
    assert_eq!(s.len(), 10, "ten fields: {line}");
    let n = |i: usize| s[i].parse::<u64>().unwrap_or_else(|_| panic!("field {i} of {line}"));
    MetricNode {
        timestamp: n(0),
        resource: s[1].to_string(),
        pass: n(2),
        block: n(3),
        success: n(4),
        exception: n(5),
        rt: n(6),
        occupied: n(7),
        concurrency: n(8),
        classification: s[9].parse().unwrap(),
    }
}

/// What `MetricFetcher.handleResponse` does with an answer: 200 only, split on `\n`, parse each line.
fn fetch_metrics(center: &CommandCenter, start: u64, end: u64) -> Vec<MetricNode> {
    // MetricFetcher: "http://ip:port/metric?startTime=..&endTime=..&refetch=false", Connection: close.
    let req = format!(
        "GET /metric?startTime={start}&endTime={end}&refetch=false HTTP/1.1\r\nConnection: close\r\nHost: {}\r\nUser-Agent: Apache-HttpAsyncClient/4.1.4 (Java/1.8.0_292)\r\n\r\n",
        center.local_addr()
    );
    let r = raw_request(center.local_addr(), req.as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
    r.body.split('\n').filter(|l| !l.is_empty()).map(from_thin_string).collect()
}

#[test]
fn metric_answers_complete_seconds_in_the_dashboards_line_format() {
    let (engine, clock) = engine("shop");
    engine.load_flow_rules([FlowRule::new("api").count(2.0)]).unwrap();
    let api = engine.resource("api");
    for _ in 0..5 {
        if let Ok(e) = api.enter() {
            clock.advance_millis(10);
            drop(e);
        }
    }
    let mut failing = engine.enter("pay|card").unwrap();
    failing.set_error();
    drop(failing);
    clock.advance_millis(1000); // second T0 is complete; T0+1000 is in progress
    drop(api.enter());
    let center = start(&engine);

    // The dashboard's first window: [now - 15 s, now - 15 s + 6 s] ... here one that covers both seconds.
    let lines = fetch_metrics(&center, T0 - 15_000, T0 + 5_000);
    let api_line = lines.iter().find(|l| l.resource == "api").expect("a line for api");
    assert_eq!(
        (api_line.timestamp, api_line.pass, api_line.block, api_line.success, api_line.exception, api_line.rt),
        (T0, 2, 3, 2, 0, 10)
    );
    assert_eq!((api_line.occupied, api_line.concurrency, api_line.classification), (0, 0, 0));
    let pay = lines.iter().find(|l| l.resource == "pay_card").expect("`|` in a name becomes `_`");
    assert_eq!((pay.pass, pay.success, pay.exception), (1, 1, 1));
    assert!(lines.iter().all(|l| l.timestamp < T0 + 1000), "the second in progress is never answered: {lines:?}");

    clock.advance_millis(1000);
    let next = fetch_metrics(&center, T0 + 1000, T0 + 6000);
    assert_eq!(next.len(), 1);
    assert_eq!((next[0].timestamp, next[0].resource.as_str(), next[0].pass), (T0 + 1000, "api", 1));

    // identity filters one resource; without endTime, maxLines caps the lines; no startTime: nothing.
    let addr = center.local_addr();
    let one = get(addr, &format!("/metric?startTime={T0}&endTime={}&identity=pay%7Ccard", T0 + 9000), &[]);
    assert_eq!(one.body.lines().count(), 1, "identity is matched against the real name, `|` included");
    let one = get(addr, &format!("/metric?startTime={T0}&endTime={}&identity=api", T0 + 9000), &[]);
    assert_eq!(one.body.lines().count(), 2);
    // (As Java: the last second begun comes whole.)
    let capped = get(addr, &format!("/metric?startTime={T0}&maxLines=1"), &[]);
    let first_second = get(addr, &format!("/metric?startTime={T0}&endTime={T0}"), &[]);
    assert_eq!(capped.body, first_second.body);
    assert!(capped.body.lines().all(|l| l.starts_with(&format!("{T0}|"))), "{}", capped.body);
    assert_eq!(get(addr, "/metric", &[]).body, "");
    let bad = get(addr, "/metric?startTime=yesterday", &[]);
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("startTime"), "{}", bad.body);
}

#[test]
fn metric_keeps_five_minutes_beyond_the_engines_minute() {
    let (engine, clock) = engine("shop");
    let center = CommandCenter::builder(&engine).port(0).start().unwrap();
    let api = engine.resource("api");
    for s in 0..330u64 {
        for _ in 0..(s % 5 + 1) {
            drop(api.enter().unwrap());
        }
        clock.advance_millis(1000);
        if s % 20 == 0 {
            // The dashboard polls every second; every 20 s here is enough (the engine holds a minute).
            fetch_metrics(&center, T0 + s * 1000, T0 + s * 1000);
        }
    }
    let lines = fetch_metrics(&center, T0, T0 + 400_000);
    assert_eq!(lines.len(), 300, "exactly the 5 minutes kept");
    assert_eq!(lines[0].timestamp, T0 + 30_000);
    assert!(lines.iter().all(|l| l.pass == ((l.timestamp - T0) / 1000) % 5 + 1));
}

fn json(r: &RawResponse) -> serde_json::Value {
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.body))
}

const NODE_VO_FIELDS: [&str; 13] = [
    "resource",
    "threadNum",
    "passQps",
    "blockQps",
    "totalQps",
    "averageRt",
    "successQps",
    "exceptionQps",
    "oneMinutePass",
    "oneMinuteBlock",
    "oneMinuteException",
    "oneMinuteTotal",
    "timestamp",
];

#[test]
fn json_tree_and_cluster_node_parse_as_node_vo() {
    let (engine, clock) = engine("shop");
    // Entered more than a minute ago: a cluster node with no request in the last minute.
    drop(engine.enter("idle").unwrap());
    clock.advance_millis(61_000);
    engine.load_flow_rules([FlowRule::new("api").count(1.0)]).unwrap();
    drop(engine.enter("api"));
    drop(engine.enter("api"));
    {
        let _ctx = engine.enter_context("web", "").unwrap();
        drop(engine.resource("nested").enter().unwrap());
    }
    let center = start(&engine);
    let addr = center.local_addr();

    // SentinelApiClient.fetchResourceOfMachine: GET jsonTree?type=root (the type is ignored).
    let tree = json(&get(addr, "/jsonTree?type=root", &[]));
    let nodes = tree.as_array().unwrap();
    assert_eq!(nodes[0]["resource"], "machine-root");
    assert!(nodes[0].get("parentId").is_none(), "fastjson leaves nulls out");
    let root_id = nodes[0]["id"].as_str().unwrap();
    let default_ctx = nodes.iter().find(|n| n["resource"] == "sentinel_default_context").unwrap();
    assert_eq!(default_ctx["parentId"], root_id);
    let api = nodes.iter().find(|n| n["resource"] == "api").unwrap();
    assert_eq!(api["parentId"], default_ctx["id"], "preorder with parent links");
    for f in NODE_VO_FIELDS {
        assert!(api.get(f).is_some(), "NodeVo field {f} in {api}");
    }
    assert_eq!(
        (api["passQps"].as_u64(), api["blockQps"].as_u64(), api["oneMinuteTotal"].as_u64()),
        (Some(1), Some(1), Some(2))
    );
    let web = nodes.iter().find(|n| n["resource"] == "web").unwrap();
    let nested = nodes.iter().find(|n| n["resource"] == "nested").unwrap();
    assert_eq!(nested["parentId"], web["id"]);
    let ids: std::collections::HashSet<&str> = nodes.iter().map(|n| n["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), nodes.len(), "ids are unique");

    // fetchClusterNodeOfMachine: type=notZero leaves out resources without requests in the last minute.
    let all = json(&get(addr, "/clusterNode?type=zero", &[]));
    let busy = json(&get(addr, "/clusterNode?type=notZero", &[]));
    let names = |v: &serde_json::Value| -> Vec<String> {
        v.as_array().unwrap().iter().map(|n| n["resource"].as_str().unwrap().to_string()).collect()
    };
    assert!(names(&all).contains(&"idle".to_string()));
    assert!(!names(&busy).contains(&"idle".to_string()));
    assert!(names(&busy).contains(&"api".to_string()));
    assert!(busy[0].get("id").is_none());
}

/// The data of `setRules` as the dashboard writes it: fastjson output of `FlowRuleEntity.toRule()`
/// (alphabetical keys, nulls left out).
fn dashboard_flow_rules(resource: &str, count: f64) -> String {
    let resource = serde_json::to_string(resource).unwrap();
    format!(
        r#"[{{"clusterConfig":{{"acquireRefuseStrategy":0,"clientOfflineTime":2000,"fallbackToLocalWhenFail":true,"resourceTimeout":2000,"resourceTimeoutStrategy":0,"sampleCount":10,"strategy":0,"thresholdType":0,"windowIntervalMs":1000}},"clusterMode":false,"controlBehavior":0,"count":{count:?},"grade":1,"limitApp":"default","maxQueueingTimeMs":500,"regex":false,"resource":{resource},"strategy":0,"warmUpPeriodSec":10}}]"#
    )
}

/// `SentinelApiClient.postRequest` for a client ≥ 1.7.1: `UrlEncodedFormEntity` (UTF-8), its own
/// `application/x-www-form-urlencoded; charset=UTF-8` content type.
fn dashboard_post(center: &CommandCenter, command: &str, params: &[(&str, &str)]) -> RawResponse {
    let body: Vec<String> = params.iter().map(|(k, v)| format!("{k}={}", form_encode(v))).collect();
    let body = body.join("&");
    let req = format!(
        "POST /{command} HTTP/1.1\r\nContent-Length: {}\r\nContent-Type: application/x-www-form-urlencoded; charset=UTF-8\r\nHost: {}\r\nConnection: Keep-Alive\r\nUser-Agent: Apache-HttpAsyncClient/4.1.4 (Java/1.8.0_292)\r\n\r\n{body}",
        body.len(),
        center.local_addr()
    );
    raw_request(center.local_addr(), req.as_bytes())
}

fn passes(engine: &Sentinel, clock: &ManualClock, resource: &str, tries: usize) -> usize {
    clock.advance_millis(1000);
    let r = engine.resource(resource);
    (0..tries).filter(|_| r.enter().is_ok()).count()
}

#[test]
fn set_rules_by_post_is_in_force_at_once_and_in_the_file_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.json");
    std::fs::write(&file, r#"{"flowRules": [{"resource": "api", "count": 1}], "degradeRules": []}"#).unwrap();
    let (engine, clock) = engine("shop");
    let source = FileDataSource::new(&engine, &file);
    source.reload_now().unwrap();
    let center = CommandCenter::builder(&engine).port(0).data_source(source.clone()).start().unwrap();

    let r = dashboard_post(&center, "setRules", &[("type", "flow"), ("data", &dashboard_flow_rules("api", 3.0))]);
    assert_eq!((r.status, r.body.trim()), (200, "success"), "the flow page needs a trimmed `success`");
    assert_eq!(passes(&engine, &clock, "api", 10), 3, "in force at once");

    // The other kinds, as their pages send them.
    let degrade = r#"[{"count":0.5,"grade":1,"limitApp":"default","minRequestAmount":5,"regex":false,"resource":"db","slowRatioThreshold":1.0,"statIntervalMs":1000,"timeWindow":10}]"#;
    assert_eq!(dashboard_post(&center, "setRules", &[("type", "degrade"), ("data", degrade)]).body, "success");
    let system =
        r#"[{"avgRt":-1,"highestCpuUsage":-1.0,"highestSystemLoad":-1.0,"maxThread":-1,"qps":100.0,"regex":false}]"#;
    assert_eq!(dashboard_post(&center, "setRules", &[("type", "system"), ("data", system)]).body, "success");
    let authority = r#"[{"limitApp":"appA,appB","regex":false,"resource":"api","strategy":0}]"#;
    assert_eq!(dashboard_post(&center, "setRules", &[("type", "AUTHORITY"), ("data", authority)]).body, "success");
    let param = r#"[{"burstCount":0,"clusterConfig":{"fallbackToLocalWhenFail":true,"sampleCount":10,"thresholdType":0,"windowIntervalMs":1000},"clusterMode":false,"controlBehavior":0,"count":5.0,"durationInSec":1,"grade":1,"limitApp":"default","maxQueueingTimeMs":0,"paramFlowItemList":[{"classType":"int","count":10,"object":"7"}],"paramIdx":0,"regex":false,"resource":"hot"}]"#;
    assert_eq!(dashboard_post(&center, "setParamFlowRules", &[("data", param)]).body, "success");
    assert_eq!(engine.degrade_rules()[0].grade, DegradeGrade::ErrorRatio);
    assert_eq!(engine.system_rules()[0].qps, Some(100.0));
    assert_eq!(engine.authority_rules()[0].limit_app, "appA,appB");
    assert_eq!(engine.param_flow_rules()[0].items.len(), 1);

    // The rule pages read back what they pushed (fetchFlowRuleOfMachine: GET getRules?type=flow).
    let flow = json(&get(center.local_addr(), "/getRules?type=flow", &[]));
    assert_eq!(
        (flow[0]["resource"].as_str(), flow[0]["count"].as_f64(), flow[0]["grade"].as_i64()),
        (Some("api"), Some(3.0), Some(1))
    );
    let params = json(&get(center.local_addr(), "/getParamFlowRules", &[]));
    assert_eq!(params[0]["paramFlowItemList"][0]["object"], "7");

    // A restart: a new engine loads the file, which holds every pushed kind.
    drop(center);
    let (restarted, clock2) = self::engine("shop");
    FileDataSource::new(&restarted, &file).reload_now().unwrap();
    assert_eq!(passes(&restarted, &clock2, "api", 10), 3);
    assert_eq!(restarted.degrade_rules().len(), 1);
    assert_eq!(restarted.system_rules().len(), 1);
    assert_eq!(restarted.authority_rules().len(), 1);
    assert_eq!(restarted.param_flow_rules().len(), 1);
}

/// The hot-parameter page lists the items it pushed with their classes (Java gives `classType` back as
/// pushed; an item re-added as `int` would be another item there), and the data source is written the same.
#[test]
fn param_items_keep_their_class_in_get_param_flow_rules_and_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.json");
    std::fs::write(&file, r#"{"paramFlowRules": []}"#).unwrap();
    let (engine, _clock) = engine("shop");
    let source = FileDataSource::new(&engine, &file);
    source.reload_now().unwrap();
    let center = CommandCenter::builder(&engine).port(0).data_source(source.clone()).start().unwrap();
    let param = r#"[{"controlBehavior":0,"count":5.0,"durationInSec":1,"grade":1,"limitApp":"default","paramFlowItemList":[{"classType":"long","count":10,"object":"7"},{"classType":"short","count":3,"object":"8"},{"classType":"byte","count":2,"object":"9"},{"classType":"float","count":1,"object":"2.5"}],"paramIdx":0,"resource":"hot"}]"#;
    assert_eq!(dashboard_post(&center, "setParamFlowRules", &[("data", param)]).body, "success");
    let expected = [("7", "long"), ("8", "short"), ("9", "byte"), ("2.5", "float")];
    let classes = |v: &serde_json::Value| -> Vec<(String, String)> {
        v[0]["paramFlowItemList"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| (i["object"].as_str().unwrap().to_string(), i["classType"].as_str().unwrap().to_string()))
            .collect()
    };
    let want: Vec<(String, String)> = expected.iter().map(|(o, c)| (o.to_string(), c.to_string())).collect();
    assert_eq!(classes(&json(&get(center.local_addr(), "/getParamFlowRules", &[]))), want);
    let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(classes(&written["paramFlowRules"]), want, "{written}");
}

#[test]
fn old_dashboards_get_form_is_decoded_once_when_get_writes_are_allowed() {
    // Dashboards talking to clients < 1.6.0 put the JSON in the query string (URLEncoder). Java decodes
    // `data` a second time and corrupts `+` and `%` in names: a name with both survives here.
    let (engine, clock) = engine("shop");
    let name = "GET /orders?a=1+2&b=100%";
    let query = format!("type=flow&data={}", form_encode(&dashboard_flow_rules(name, 2.0)));
    let strict = start(&engine);
    let req = format!("GET /setRules?{query} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", strict.local_addr());
    let r = raw_request(strict.local_addr(), req.as_bytes());
    assert_eq!(r.status, 405, "by default writes come by POST: {}", r.body);
    assert_eq!(r.header("allow"), Some("POST"));
    assert!(r.body.contains("allow_get_writes"), "the answer says how to serve an old dashboard: {}", r.body);
    assert!(engine.flow_rules().is_empty());

    let center = CommandCenter::builder(&engine).port(0).allow_get_writes(true).start().unwrap();
    let req = format!("GET /setRules?{query} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", center.local_addr());
    let r = raw_request(center.local_addr(), req.as_bytes());
    assert_eq!((r.status, r.body.as_str()), (200, "success"));
    assert_eq!(engine.flow_rules()[0].resource, name);
    assert_eq!(passes(&engine, &clock, name, 5), 2);
}

#[test]
fn an_invalid_push_is_refused_and_changes_neither_the_engine_nor_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flow-rules.json");
    std::fs::write(&file, r#"[{"resource": "api", "count": 4}]"#).unwrap();
    let before = std::fs::read_to_string(&file).unwrap();
    let (engine, clock) = engine("shop");
    let source = FileDataSource::new(&engine, &file);
    source.reload_now().unwrap();
    let center = CommandCenter::builder(&engine).port(0).data_source(source).start().unwrap();

    let negative = dashboard_flow_rules("api", -1.0);
    let r = dashboard_post(&center, "setRules", &[("type", "flow"), ("data", &negative)]);
    assert_eq!(r.status, 400);
    assert!(r.body.contains("count") && r.body.contains("api"), "the engine's typed error: {}", r.body);
    let r =
        dashboard_post(&center, "setRules", &[("type", "flow"), ("data", "[{\"resource\": \"api\", \"grade\": 7}]")]);
    assert_eq!(r.status, 400);
    assert!(r.body.contains("grade"), "{}", r.body);
    let r = dashboard_post(&center, "setRules", &[("type", "flow"), ("data", "{ not json")]);
    assert_eq!(r.status, 400);
    let r = dashboard_post(&center, "setRules", &[("type", "nonsense"), ("data", "[]")]);
    assert_eq!(r.status, 400);
    assert!(r.body.contains("invalid type"), "{}", r.body);
    assert_eq!(dashboard_post(&center, "setRules", &[("type", "flow")]).status, 400, "no data");

    assert_eq!(passes(&engine, &clock, "api", 10), 4, "the rules in force stay");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before, "the file is untouched");
}

#[test]
fn partial_success_when_the_rules_took_effect_but_the_file_could_not_be_written() {
    let dir = tempfile::tempdir().unwrap();
    // A single-kind file for flow rules cannot hold degrade rules: the write-back fails.
    let file = dir.path().join("flow-rules.json");
    let (engine, _clock) = engine("shop");
    let center =
        CommandCenter::builder(&engine).port(0).data_source(FileDataSource::new(&engine, &file)).start().unwrap();
    let degrade = r#"[{"count":2,"grade":2,"resource":"db","timeWindow":10}]"#;
    let r = dashboard_post(&center, "setRules", &[("type", "degrade"), ("data", degrade)]);
    assert_eq!((r.status, r.body.as_str()), (200, WRITE_DATA_SOURCE_FAILED));
    assert!(r.header("x-sentinel-write-error").is_some_and(|e| e.contains("flow-rules.json")), "{:?}", r.headers);
    assert_eq!(engine.degrade_rules().len(), 1, "in force all the same");
}

#[test]
fn cluster_switch_and_the_commands_for_people() {
    let (engine, _clock) = engine("shop");
    let center = start(&engine);
    let addr = center.local_addr();
    let mode = json(&get(addr, "/getClusterMode", &[]));
    assert_eq!(mode["mode"], -1, "the dashboard shows `not started`");
    assert_eq!((mode["clientAvailable"].as_bool(), mode["serverAvailable"].as_bool()), (Some(false), Some(false)));
    // The Java dashboard's cluster page sends this one by GET: refused unless GET writes are allowed.
    assert_eq!(get(addr, "/setClusterMode?mode=0", &[]).status, 405);
    let set = dashboard_post(&center, "setClusterMode", &[("mode", "0")]);
    assert_eq!(set.status, 400);
    // The cluster pages mark a feature unsupported on `Unknown command`.
    let unknown = get(addr, "/cluster/server/info", &[]);
    assert_eq!((unknown.status, unknown.body.as_str()), (400, "Unknown command `cluster/server/info`"));

    assert_eq!(get(addr, "/getSwitch", &[]).body, "Sentinel switch value: true");
    assert_eq!(dashboard_post(&center, "setSwitch", &[("value", "false")]).body, "Sentinel set switch value: false");
    assert!(!engine.is_enabled());
    let typo = dashboard_post(&center, "setSwitch", &[("value", "flase")]);
    assert_eq!(typo.status, 400, "Java would turn Sentinel off on a typo");
    assert!(!engine.is_enabled());
    dashboard_post(&center, "setSwitch", &[("value", "TRUE")]);
    assert!(engine.is_enabled());

    let version = get(addr, "/version", &[]).body;
    assert!(version.starts_with("1.8.9-"), "{version}");
    let info = json(&get(addr, "/basicInfo", &[]));
    assert_eq!(info["ip"], "127.0.0.1");
    assert!(info["machine"].is_string());
    let status = json(&get(addr, "/systemStatus", &[]));
    for k in ["rqps", "qps", "b", "r", "t"] {
        assert!(status.get(k).is_some(), "{k}");
    }
    let api = json(&get(addr, "/api", &[]));
    let urls: Vec<&str> = api.as_array().unwrap().iter().map(|c| c["url"].as_str().unwrap()).collect();
    for c in ["/metric", "/jsonTree", "/clusterNode", "/getRules", "/setRules", "/getParamFlowRules", "/getClusterMode"]
    {
        assert!(urls.contains(&c), "{c} in {urls:?}");
    }
    drop(engine.enter("api").unwrap());
    let d = get(addr, "/diagnose?resource=api", &[]);
    assert_eq!(d.status, 200);
    assert!(d.body.contains("api"), "{}", d.body);
}

/// A fake dashboard: accepts heartbeats on 127.0.0.1 and hands over each one's method, path and form.
struct FakeDashboard {
    listener: TcpListener,
}

struct Beat {
    method: String,
    path: String,
    content_type: String,
    form: HashMap<String, String>,
}

impl FakeDashboard {
    fn new() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        FakeDashboard { listener }
    }

    fn addr(&self) -> std::net::SocketAddr {
        self.listener.local_addr().unwrap()
    }

    /// The next heartbeat, answered with `reply` (the dashboard's `Result` JSON).
    fn next(&self, reply: &str) -> Beat {
        self.listener.set_nonblocking(true).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut s = loop {
            match self.listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(std::time::Instant::now() < deadline, "no heartbeat within 30 s");
                    std::thread::sleep(Duration::from_millis(5)); // polls for the connection
                }
                Err(e) => panic!("accept: {e}"),
            }
        };
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut reader = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let mut parts = line.split(' ');
        let method = parts.next().unwrap().to_string();
        let path = parts.next().unwrap().to_string();
        let mut headers = HashMap::new();
        loop {
            let mut h = String::new();
            reader.read_line(&mut h).unwrap();
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap();
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
        let len: usize = headers.get("content-length").map_or(0, |l| l.parse().unwrap());
        let mut body = vec![0; len];
        reader.read_exact(&mut body).unwrap();
        let form = form_urlencoded_parse(&String::from_utf8(body).unwrap());
        write!(s, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}", reply.len()).unwrap();
        Beat { method, path, content_type: headers.get("content-type").cloned().unwrap_or_default(), form }
    }
}

fn form_urlencoded_parse(s: &str) -> HashMap<String, String> {
    s.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| {
            let decode = |x: &str| {
                let x = x.replace('+', " ");
                let bytes = x.as_bytes();
                let mut out = Vec::new();
                let mut i = 0;
                while i < bytes.len() {
                    if bytes[i] == b'%' {
                        out.push(u8::from_str_radix(&x[i + 1..i + 3], 16).unwrap());
                        i += 3;
                    } else {
                        out.push(bytes[i]);
                        i += 1;
                    }
                }
                String::from_utf8(out).unwrap()
            };
            (decode(k), decode(v))
        })
        .collect()
}

/// `VersionUtils.parseVersion(v).greaterOrEqual(1.6.0)`: the dashboard then pushes rules by POST.
fn dashboard_would_post(v: &str) -> bool {
    let core = v.split('-').next().unwrap();
    let mut parts = core.split('.').map(|p| p.parse::<u32>().unwrap());
    let (a, b, c) = (parts.next().unwrap(), parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (a, b, c) >= (1, 6, 0)
}

#[test]
fn heartbeats_reach_the_dashboard_with_the_bound_port_and_a_version_that_makes_it_post() {
    let dashboard = FakeDashboard::new();
    let (engine, _clock) = engine("com.shop.orders");
    let center = CommandCenter::builder(&engine)
        .port(0)
        .dashboard(format!("http://{}", dashboard.addr()))
        .heartbeat_interval(Duration::from_millis(20))
        .start()
        .unwrap();
    let beat = dashboard.next(r#"{"success":true,"code":0,"msg":"success"}"#);
    assert_eq!((beat.method.as_str(), beat.path.as_str()), ("POST", "/registry/machine"));
    assert!(beat.content_type.starts_with("application/x-www-form-urlencoded"));
    let f = &beat.form;
    assert_eq!(f["app"], "com.shop.orders");
    assert_eq!(f["app_type"], "0");
    assert_eq!(f["port"], center.local_addr().port().to_string(), "the port actually bound");
    assert_eq!(f["ip"], "127.0.0.1", "bound to loopback: that is the address to reach it on");
    assert!(f["ip"].parse::<std::net::IpAddr>().is_ok(), "the dashboard wants a literal address");
    assert!(!f["hostname"].is_empty());
    assert!(dashboard_would_post(&f["v"]), "v = {}", f["v"]);
    assert!(f["version"].parse::<u64>().unwrap() > 1_600_000_000_000, "the time in ms");

    // A refusal (200 with success=false, as the dashboard answers a bad ip) counts as a failure.
    let _ = dashboard.next(r#"{"success":false,"code":-1,"msg":"invalid ip: x"}"#);
    let _ = dashboard.next(r#"{"success":true,"code":0,"msg":"success"}"#); // after the backoff
    let status = center.heartbeat_status();
    assert!(status.sent >= 1 && status.failed >= 1, "{status:?}");
    assert!(status.last_error.as_deref().is_some_and(|e| e.contains("invalid ip")), "{status:?}");
}

#[test]
fn an_advertised_ip_is_what_the_dashboard_is_told() {
    let dashboard = FakeDashboard::new();
    let (engine, _clock) = engine("shop");
    let center = CommandCenter::builder(&engine)
        .port(0)
        .dashboard(dashboard.addr().to_string())
        .advertise_ip("10.20.30.40".parse().unwrap())
        .start()
        .unwrap();
    let beat = dashboard.next(r#"{"success":true}"#);
    assert_eq!(beat.form["ip"], "10.20.30.40");
    assert_eq!(center.advertised_ip(), "10.20.30.40");
}

#[test]
fn a_dashboard_that_is_down_never_affects_the_application() {
    // Nothing listens on this port: every beat fails, and is retried with a backoff.
    let port = sentinel_testkit::free_port();
    let (engine, clock) = engine("shop");
    engine.load_flow_rules([FlowRule::new("api").count(3.0)]).unwrap();
    let center = CommandCenter::builder(&engine)
        .port(0)
        .dashboard(format!("127.0.0.1:{port}"))
        .heartbeat_interval(Duration::from_millis(10))
        .start()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while center.heartbeat_status().failed == 0 {
        assert!(std::time::Instant::now() < deadline, "no failed beat reported within 30 s");
        std::thread::sleep(Duration::from_millis(5)); // polls for the condition; asserts no timing
    }
    assert!(center.heartbeat_status().last_error.unwrap().contains(&port.to_string()));
    assert_eq!(passes(&engine, &clock, "api", 10), 3, "the application's calls are checked as always");
    assert_eq!(get(center.local_addr(), "/getSwitch", &[]).status, 200, "the command server still answers");
}

#[cfg(feature = "logs")]
#[test]
fn metric_answers_older_seconds_from_the_metric_log() {
    use sentinel_runtime::log::MetricLogWriter;
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at_millis(T0);
    let mut config = sentinel_runtime::Config::default();
    config.app_name = "logged".into();
    config.log_dir = dir.path().to_path_buf();
    let engine = Sentinel::builder().config(config).manual_clock(clock.clone()).build();
    let writer = MetricLogWriter::new(&engine, dir.path(), 1 << 20, 6).unwrap();
    let api = engine.resource("api");
    // Ten minutes of traffic logged before the command center started: its memory holds none of it.
    for s in 0..600u64 {
        for _ in 0..(s % 4 + 1) {
            drop(api.enter().unwrap());
        }
        clock.advance_millis(1000);
        if s % 30 == 0 {
            writer.flush_once(clock.now_millis()).unwrap();
        }
    }
    writer.flush_once(clock.now_millis()).unwrap();
    let center = start(&engine);
    let old = fetch_metrics(&center, T0 + 10_000, T0 + 19_000);
    let got: Vec<(u64, u64)> = old.iter().filter(|l| l.resource == "api").map(|l| (l.timestamp, l.pass)).collect();
    let want: Vec<(u64, u64)> = (10..20).map(|s| (T0 + s * 1000, s % 4 + 1)).collect();
    assert_eq!(got, want, "from the log, in the same format");
    // Across the boundary: log lines, then memory, no second twice.
    let recent = fetch_metrics(&center, T0 + 500_000, T0 + 600_000);
    let seconds: Vec<u64> = recent.iter().filter(|l| l.resource == "api").map(|l| l.timestamp).collect();
    let mut unique = seconds.clone();
    unique.dedup();
    assert_eq!(seconds, unique, "no second twice");
    assert_eq!(seconds.len(), 100, "every second from 500 s to 599 s");
}

#[cfg(feature = "logs")]
#[test]
fn metric_from_the_log_answers_at_most_its_line_bound_and_stops_at_a_second() {
    use sentinel_runtime::log::MetricLogWriter;
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at_millis(T0);
    let mut config = sentinel_runtime::Config::default();
    config.app_name = "bounded".into();
    config.log_dir = dir.path().to_path_buf();
    let engine = Sentinel::builder().config(config).manual_clock(clock.clone()).build();
    let writer = MetricLogWriter::new(&engine, dir.path(), 1 << 30, 6).unwrap();
    // 600 seconds of 25 resources (15,000 lines) logged before the command center started; one name holds a
    // newline and a forged line.
    let names: Vec<String> = (0..24).map(|i| format!("res.{i}")).chain(["x\n1|forged|9".to_string()]).collect();
    for _ in 0..600u64 {
        for n in &names {
            drop(engine.enter(n).unwrap());
        }
        clock.advance_millis(1000);
        writer.flush_once(clock.now_millis()).unwrap();
    }
    let center = start(&engine);
    let body = |q: &str| {
        let r = get(center.local_addr(), &format!("/metric?{q}"), &[]);
        assert_eq!(r.status, 200, "{}", r.body);
        r.body
    };
    // 25 lines a second: the lines asked for and the rest of their last second (Java's `MetricsReader`).
    for (n, lines) in [(1, 25), (7, 25), (25, 25), (26, 50), (100, 100)] {
        let answer = body(&format!("startTime=0&maxLines={n}"));
        assert_eq!(answer.lines().count(), lines, "maxLines={n}");
    }
    // With an end, as the dashboard asks: at most 12,000 lines, in time order, from the first second on.
    let all = fetch_metrics(&center, T0, T0 + 599_000);
    assert!(all.len() <= 12_000 && all.len() >= 11_000, "{}", all.len());
    assert_eq!(all[0].timestamp, T0);
    assert!(all.windows(2).all(|w| w[0].timestamp <= w[1].timestamp));
    // The name with a newline is one line per second, shown with `_`, and nothing is forged.
    assert!(all.iter().all(|l| l.resource != "forged"));
    let odd: Vec<_> = all.iter().filter(|l| l.resource.starts_with("x_")).collect();
    assert_eq!(odd.len(), all.len() / 25, "{:?}", odd.first());
    assert_eq!(odd[0].resource, "x_1_forged_9");
}

#[test]
fn the_server_can_run_on_the_applications_runtime() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (engine, _clock) = engine("shop");
    let center = CommandCenter::builder(&engine).port(0).runtime(runtime.handle().clone()).start().unwrap();
    assert_eq!(get(center.local_addr(), "/getSwitch", &[]).body, "Sentinel switch value: true");
    let addr = center.local_addr();
    drop(center);
    // Stopped: the listener is closed once the runtime has run the shutdown.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_ok() {
        assert!(std::time::Instant::now() < deadline, "still listening 30 s after the drop");
        std::thread::sleep(Duration::from_millis(5)); // polls for the condition
    }
}

#[test]
fn a_command_center_can_be_kept_in_a_static_or_moved_to_another_thread() {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<CommandCenter>();
    let (engine, _clock) = engine("shop");
    let center = start(&engine);
    let addr = center.local_addr();
    std::thread::spawn(move || drop(center)).join().unwrap();
    assert!(std::net::TcpStream::connect(addr).is_err(), "stopped when dropped (on a thread of its own: at once)");
}

/// With the `prometheus` feature, Prometheus can scrape the command port itself.
#[cfg(feature = "prometheus")]
#[test]
fn the_command_port_serves_prometheus_metrics() {
    let (engine, _clock) = engine("shop");
    drop(engine.enter("checkout").unwrap());
    let center = start(&engine);
    let r = get(center.local_addr(), "/metrics", &[]);
    assert_eq!(r.status, 200);
    let content_type = r.headers.iter().find(|(k, _)| k == "content-type").map(|(_, v)| v.as_str());
    assert_eq!(content_type, Some(sentinel_runtime::exporter::CONTENT_TYPE));
    assert!(r.body.contains("# TYPE sentinel_pass_total counter"), "{}", r.body);
    assert!(r.body.contains("resource=\"checkout\""), "{}", r.body);
}

/// Java's `MetricsReader.readMetricsInOneFile` (behind `metric` without `endTime`) stops at `maxLines` only
/// where the second changes: the lines of the last second it started are all answered, so a client that asks
/// again from the next second misses nothing. Here the answer is cut inside a second: of the two resources
/// of second T0, one is answered, and the next fetch (from T0 + 1000) never sees the other.
#[test]
fn metric_max_lines_never_cuts_a_second_in_the_middle() {
    let (engine, clock) = engine("shop");
    drop(engine.enter("a").unwrap());
    drop(engine.enter("b").unwrap());
    clock.advance_millis(1000);
    let center = start(&engine);
    let capped = get(center.local_addr(), &format!("/metric?startTime={T0}&maxLines=1"), &[]);
    assert_eq!(capped.status, 200, "{}", capped.body);
    let names: Vec<&str> = capped.body.lines().filter_map(|l| l.split('|').nth(1)).collect();
    assert_eq!(names, ["a", "b"], "both lines of second T0: {}", capped.body);
}

/// `console/history?after=` takes any u64, and `History::series` rounds it up to the next second with
/// `a - a % 1000 + 1000`, which overflows near `u64::MAX`: the command panics (debug builds, where the
/// answer is a 500; release builds wrap silently). A time far in the future should answer an empty series.
#[test]
fn console_history_after_far_in_the_future_answers_nothing_rather_than_overflowing() {
    let (engine, clock) = engine("shop");
    drop(engine.enter("api").unwrap());
    clock.advance_millis(1000);
    let center = start(&engine);
    let r = get(center.local_addr(), &format!("/console/history?after={}", u64::MAX), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["count"], 0, "{}", r.body);
}

#[cfg(feature = "logs")]
#[test]
fn metric_from_the_log_takes_the_second_a_start_time_falls_in() {
    // Java's `MetricSearcher` starts at `startTime / 1000` (the second the time falls in), as the in-memory
    // history does: an answer does not depend on whether its seconds come from memory or from the log.
    use sentinel_runtime::log::MetricLogWriter;
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at_millis(T0);
    let mut config = sentinel_runtime::Config::default();
    config.app_name = "unaligned".into();
    config.log_dir = dir.path().to_path_buf();
    let engine = Sentinel::builder().config(config).manual_clock(clock.clone()).build();
    let writer = MetricLogWriter::new(&engine, dir.path(), 1 << 20, 6).unwrap();
    for _ in 0..3 {
        drop(engine.enter("api").unwrap());
    }
    clock.advance_millis(1000);
    writer.flush_once(clock.now_millis()).unwrap();
    // Long enough ago that the command center's memory never held it.
    clock.advance_millis(300_000);
    let center = start(&engine);
    let lines = fetch_metrics(&center, T0 + 500, T0 + 5_000);
    let got: Vec<(u64, &str, u64)> = lines.iter().map(|l| (l.timestamp, l.resource.as_str(), l.pass)).collect();
    assert_eq!(got, [(T0, "api", 3)]);
}

/// `api` entered in context `ctx` by `appA` (10 ms), then twice in the default context: once passed (0 ms), once
/// blocked by a limit of 2.
fn traffic_for_the_people_commands() -> (Sentinel, ManualClock) {
    let (engine, clock) = engine("people");
    engine.load_flow_rules([FlowRule::new("api").count(2.0)]).unwrap();
    let api = engine.resource("api");
    {
        let _ctx = engine.enter_context("ctx", "appA").unwrap();
        let e = api.enter().unwrap();
        clock.advance_millis(10);
        drop(e);
    }
    drop(api.enter().unwrap());
    assert!(api.enter().is_err());
    (engine, clock)
}

#[test]
fn the_node_commands_people_use_answer_in_javas_formats() {
    let (engine, _clock) = traffic_for_the_people_commands();
    let center = start(&engine);
    let addr = center.local_addr();
    // clusterNodeById (FetchClusterNodeByIdCommandHandler): a NodeVo without id and parent, or `{}`.
    let vo = json(&get(addr, "/clusterNodeById?id=api", &[]));
    assert_eq!(vo["resource"], "api");
    assert!(vo.get("id").is_none() && vo.get("parentId").is_none(), "{vo}");
    let numbers: Vec<u64> = ["threadNum", "passQps", "blockQps", "totalQps", "averageRt", "successQps", "exceptionQps"]
        .iter()
        .chain(&["oneMinutePass", "oneMinuteBlock", "oneMinuteException", "oneMinuteTotal"])
        .map(|f| vo[*f].as_u64().unwrap_or_else(|| panic!("{f} in {vo}")))
        .collect();
    assert_eq!(numbers, [0, 2, 1, 3, 5, 2, 0, 2, 1, 0, 3]);
    assert_eq!(get(addr, "/clusterNodeById?id=nope", &[]).body, "{}");
    assert_eq!(get(addr, "/clusterNodeById", &[]).status, 400);

    // cnode (FetchClusterNodeHumanCommandHandler): a table of the cluster nodes whose name contains `id`, the
    // name column as wide as the longest name plus one; rates printed as Java prints doubles.
    let cnode = get(addr, "/cnode?id=ap", &[]);
    assert_eq!(cnode.status, 200, "{}", cnode.body);
    let row = |c: [&str; 12]| {
        format!(
            "{:<4}{:<4}{:<10}{:<10}{:<10}{:<11}{:<9}{:<6}{:<10}{:<11}{:<9}{:<11}\n",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11]
        )
    };
    let want = row([
        "idx",
        "id",
        "thread",
        "pass",
        "blocked",
        "success",
        "total",
        "aRt",
        "1m-pass",
        "1m-block",
        "1m-all",
        "exception",
    ]) + &row(["1", "api", "0", "2.0", "1.0", "2.0", "3.0", "5.0", "2", "1", "3", "0.0"]);
    assert_eq!(cnode.body, want);
    assert_eq!(get(addr, "/cnode", &[]).status, 400);

    // tree (FetchTreeCommandHandler): the call tree from an entrance, a dash per level, then the legend.
    let legend = "\r\n\r\nt:threadNum  pq:passQps  bq:blockQps  tq:totalQps  rt:averageRt  prq: passRequestQps 1mp:1m-pass 1mb:1m-block 1mt:1m-total\r\n";
    let tree = get(addr, "/tree?id=ctx", &[]);
    assert_eq!(tree.status, 200, "{}", tree.body);
    assert_eq!(
        tree.body,
        "EntranceNode: ctx(t:0 pq:1.0 bq:0.0 tq:1.0 rt:10.0 prq:1.0 1mp:1 1mb:0 1mt:1)\n\
         -api(t:0 pq:1.0 bq:0.0 tq:1.0 rt:10.0 prq:1.0 1mp:1 1mb:0 1mt:1)\n"
            .to_string()
            + legend
    );
    let whole = get(addr, "/tree", &[]).body;
    assert!(whole.starts_with("EntranceNode: machine-root(t:0 pq:2.0 bq:1.0 tq:3.0 "), "{whole}");
    assert!(
        whole.contains("\n-EntranceNode: ctx(t:0 pq:1.0 bq:0.0 tq:1.0 rt:10.0 prq:1.0 1mp:1 1mb:0 1mt:1)\n--api("),
        "{whole}"
    );
    assert!(whole.contains("\n-EntranceNode: sentinel_default_context(t:0 pq:1.0 bq:1.0 tq:2.0 "), "{whole}");
    assert!(whole.ends_with(legend));

    // origin (FetchOriginCommandHandler): the origins of a cluster node.
    let origin = get(addr, "/origin?id=api", &[]);
    assert_eq!(origin.status, 200, "{}", origin.body);
    let row = |c: [&str; 10]| {
        format!(
            "{:<4}{:<5}{:<10}{:<10}{:<11}{:<9}{:<6}{:<10}{:<11}{:<9}\n",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9]
        )
    };
    let want = "id: api\n\n".to_string()
        + &row([
            "idx",
            "origin",
            "threadNum",
            "passQps",
            "blockQps",
            "totalQps",
            "aRt",
            "1m-pass",
            "1m-block",
            "1m-total",
        ])
        + &row(["1", "appA", "0", "1.0", "0.0", "1.0", "10.0", "1", "0", "1"]);
    assert_eq!(origin.body, want);
    assert_eq!(get(addr, "/origin?id=nope", &[]).body, "Not find cNode with id nope");
}

#[test]
fn metric_without_identity_ends_with_the_system_load_and_cpu_lines() {
    // Java's `SendMetricCommandHandler.addCpuUsageAndLoad`: with no `identity`, the load and the cpu usage
    // (when above 0), times 10,000 and truncated, as the pass count of the current second.
    let (engine, clock) = engine("sys");
    drop(engine.enter("api").unwrap());
    clock.advance_millis(1000);
    engine.set_system_readings(Some(2.5), Some(0.25));
    let center = start(&engine);
    let lines = fetch_metrics(&center, T0, T0 + 5000);
    let got: Vec<(u64, &str, u64)> = lines.iter().map(|l| (l.timestamp, l.resource.as_str(), l.pass)).collect();
    assert_eq!(got, [(T0, "api", 1), (T0 + 1000, "__system_load__", 25_000), (T0 + 1000, "__cpu_usage__", 2_500)]);
    assert!(lines[1..]
        .iter()
        .all(|l| (l.block, l.success, l.exception, l.rt, l.occupied, l.concurrency) == (0, 0, 0, 0, 0, 0)));
    // Not with an identity, nor when a reading is missing or 0.
    let one = get(center.local_addr(), &format!("/metric?startTime={T0}&endTime={}&identity=api", T0 + 5000), &[]);
    assert_eq!(one.body.lines().count(), 1, "{}", one.body);
    engine.set_system_readings(None, Some(0.0));
    assert_eq!(fetch_metrics(&center, T0, T0 + 5000).len(), 1);
}

#[test]
fn the_default_context_shows_in_the_tree_once_a_call_runs_in_it() {
    // Java's `ContextUtil` makes a context's entrance node when the context is first entered: the default
    // context's with the first call made outside any context.
    let (engine, _clock) = engine("ctx");
    {
        let _ctx = engine.enter_context("web", "").unwrap();
        drop(engine.enter("api").unwrap());
    }
    let center = start(&engine);
    let names = |tree: &serde_json::Value| -> Vec<String> {
        tree.as_array().unwrap().iter().map(|n| n["resource"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(names(&json(&get(center.local_addr(), "/jsonTree", &[]))), ["machine-root", "web", "api"]);
    drop(engine.enter("plain").unwrap());
    let tree = names(&json(&get(center.local_addr(), "/jsonTree", &[])));
    assert!(tree.windows(2).any(|w| w == ["sentinel_default_context", "plain"]), "{tree:?}");
}

/// Java's cluster node of a resource is made by its first entry: before it, `clusterNode`, `clusterNodeById`,
/// `cnode` and `origin` do not show it, whether the resource has rules or a handle.
#[test]
fn the_node_commands_leave_out_a_resource_never_entered() {
    let (engine, _clock) = engine("never");
    engine.load_flow_rules([FlowRule::new("ruled").count(2.0)]).unwrap();
    let _handle = engine.resource("handled");
    drop(engine.enter("entered").unwrap());
    let center = start(&engine);
    let addr = center.local_addr();
    for id in ["ruled", "handled"] {
        assert_eq!(get(addr, &format!("/clusterNodeById?id={id}"), &[]).body, "{}", "{id}");
    }
    let cnode = get(addr, "/cnode?id=ed", &[]).body;
    assert!(cnode.contains("entered"), "{cnode}");
    assert!(!cnode.contains("ruled") && !cnode.contains("handled"), "{cnode}");
    let nodes = get(addr, "/clusterNode", &[]).body;
    assert!(nodes.contains("entered") && !nodes.contains("handled"), "{nodes}");
    assert_eq!(get(addr, "/origin?id=handled", &[]).body, "Not find cNode with id handled");
}

#[test]
fn set_cluster_mode_not_started_is_success_when_no_cluster_service_runs() {
    // The dashboard's cluster page unbinds a machine with `setClusterMode?mode=-1` (by GET:
    // `ClusterAssignServiceImpl.modifyToNonStarted`) and counts anything but `success` as a failure. Java
    // applies it (stopping the client or server, or nothing when not started) and answers `success`.
    let (engine, _clock) = engine("shop");
    let center = CommandCenter::builder(&engine).port(0).allow_get_writes(true).start().unwrap();
    let addr = center.local_addr();
    let r = get(addr, "/setClusterMode?mode=-1", &[]);
    assert_eq!((r.status, r.body.as_str()), (200, "success"));
    let mode = json(&get(addr, "/getClusterMode", &[]));
    assert_eq!(mode["mode"], -1, "still not started");
    // Unchanged: the modes this application cannot take are refused.
    assert_eq!(dashboard_post(&center, "setClusterMode", &[("mode", "1")]).status, 400);
    assert_eq!(dashboard_post(&center, "setClusterMode", &[("mode", "0")]).status, 400);
}
