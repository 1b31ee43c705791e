//! The Prometheus exporter against the real tools: `promtool check metrics` accepts the output (every lint
//! passes), and a real Prometheus started by the test scrapes `/metrics` and answers a resource's pass rate
//! through its HTTP API.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::exporter::{self, ExporterConfig, ExporterError, MetricsServer};
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::{Sentinel, Timeout};

/// An engine with every kind of sample: passes, blocks of several kinds, errors, an open breaker, a call in
/// flight, and resource names that need escaping.
fn busy_engine() -> (Sentinel, ManualClock, sentinel_runtime::Entry<'static>) {
    let clock = ManualClock::at_millis(1_700_000_000_000);
    let engine = Sentinel::builder().manual_clock(clock.clone()).app_name("shop \"eu\"").build();
    exporter::attach(&engine, ExporterConfig::default()).unwrap();
    engine.load_flow_rules([FlowRule::new("checkout").count(3.0)]).unwrap();
    engine.load_authority_rules([AuthorityRule::new("admin", "ops", AuthorityStrategy::White)]).unwrap();
    engine
        .load_degrade_rules([DegradeRule::new("pay\\ment\n\"x\"", DegradeGrade::ErrorCount)
            .count(0.0)
            .min_request_amount(1)
            .time_window_sec(10)])
        .unwrap();
    for _ in 0..5 {
        let e = engine.enter("checkout");
        clock.advance_millis(3);
        drop(e);
    }
    assert!(engine.resource("admin").entry().origin("web").enter().is_err());
    let mut failed = engine.enter("pay\\ment\n\"x\"").unwrap();
    failed.set_error();
    drop(failed);
    assert!(engine.enter("pay\\ment\n\"x\"").is_err(), "the breaker is open");
    drop(engine.enter("ünïcode/路径").unwrap());
    let held = engine.enter("held").unwrap();
    (engine, clock, held)
}

fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.parse().ok()))
}

#[test]
fn counters_histogram_and_gauges_follow_the_calls() {
    let (engine, clock, held) = busy_engine();
    let text = exporter::render(&engine);
    let app = r#"app="shop \"eu\"""#;
    let at = |resource: &str, rest: &str| format!("{{{app},resource=\"{resource}\"{rest}}}");
    assert_eq!(sample(&text, &format!("sentinel_pass_total{}", at("checkout", ""))), Some(3.0), "{text}");
    assert_eq!(sample(&text, &format!("sentinel_success_total{}", at("checkout", ""))), Some(3.0));
    assert_eq!(sample(&text, &format!("sentinel_block_total{}", at("checkout", ",kind=\"flow\""))), Some(2.0));
    assert_eq!(sample(&text, &format!("sentinel_block_total{}", at("admin", ",kind=\"authority\""))), Some(1.0));
    let payment = r#"pay\\ment\n\"x\""#;
    assert_eq!(sample(&text, &format!("sentinel_exception_total{}", at(payment, ""))), Some(1.0), "{text}");
    assert_eq!(sample(&text, &format!("sentinel_block_total{}", at(payment, ",kind=\"degrade\""))), Some(1.0));
    assert_eq!(sample(&text, &format!("sentinel_concurrency{}", at("held", ""))), Some(1.0));
    // The three passed calls took 3 ms each: in the 5 ms bucket, not the 2.5 ms one.
    let bucket = |le: &str| sample(&text, &format!("sentinel_response_time_seconds_bucket{}", at("checkout", le)));
    assert_eq!(bucket(",le=\"0.0025\""), Some(0.0));
    assert_eq!(bucket(",le=\"0.005\""), Some(3.0));
    assert_eq!(bucket(",le=\"+Inf\""), Some(3.0));
    assert_eq!(sample(&text, &format!("sentinel_response_time_seconds_count{}", at("checkout", ""))), Some(3.0));
    let sum = sample(&text, &format!("sentinel_response_time_seconds_sum{}", at("checkout", ""))).unwrap();
    assert!((sum - 0.009).abs() < 1e-9, "{sum}");

    // Two minutes later the engine's windows have forgotten those calls; the counters have not.
    drop(held);
    clock.advance_millis(30_000);
    let _ = exporter::render(&engine); // folds the complete seconds in (the background thread does it too)
    clock.advance_millis(90_000);
    assert_eq!(engine.cluster_stats("checkout").unwrap().minute_pass, 0, "the window is empty");
    let later = exporter::render(&engine);
    assert_eq!(sample(&later, &format!("sentinel_pass_total{}", at("checkout", ""))), Some(3.0), "{later}");
    assert_eq!(sample(&later, &format!("sentinel_concurrency{}", at("held", ""))), Some(0.0));
}

#[test]
fn a_counter_never_goes_down_across_the_second_it_is_read_in() {
    let clock = ManualClock::at_millis(1_700_000_000_500);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    let read = || sample(&exporter::render(&engine), r#"sentinel_pass_total{app="sentinel-rs-app",resource="r"}"#);
    let mut last = 0.0;
    for step in 0..40 {
        for _ in 0..(step % 3) {
            drop(engine.enter("r").unwrap());
        }
        let v = read().unwrap_or(0.0);
        assert!(v >= last, "step {step}: {v} after {last}");
        last = v;
        clock.advance_millis(250);
    }
    assert_eq!(last, 39.0, "every pass counted once: 13 steps of 0, 1, 2");
}

#[test]
fn bad_histogram_buckets_are_refused_and_the_first_attach_wins() {
    let engine = Sentinel::builder().build();
    assert_eq!(exporter::attach(&engine, ExporterConfig::default().buckets([])), Err(ExporterError::NoBuckets));
    let e = exporter::attach(&engine, ExporterConfig::default().buckets([0.5, 0.1])).unwrap_err();
    assert!(matches!(e, ExporterError::UnorderedBuckets { index: 1, .. }), "{e}");
    assert!(e.to_string().contains("must increase"), "{e}");
    exporter::attach(&engine, ExporterConfig::default().buckets([0.1, 1.0])).unwrap();
    exporter::attach(&engine, ExporterConfig::default().buckets([0.1, 1.0])).unwrap();
    let e = exporter::attach(&engine, ExporterConfig::default()).unwrap_err();
    assert_eq!(e, ExporterError::AlreadyAttached { in_force: vec![0.1, 1.0] });
    drop(engine.enter("x").unwrap());
    let text = exporter::render(&engine);
    assert!(text.contains(r#"le="0.1""#) && text.contains(r#"le="1""#) && !text.contains(r#"le="0.005""#));
}

#[test]
fn timeouts_count_as_exceptions_with_the_limit_as_response_time() {
    let clock = ManualClock::at_millis(1_700_000_000_000);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    exporter::attach(&engine, ExporterConfig::default()).unwrap();
    let mut e = engine.enter("slow").unwrap();
    e.set_timed_out(Duration::from_millis(200));
    let _: Timeout = e.timeout_error(Duration::from_millis(200));
    drop(e);
    let text = exporter::render(&engine);
    let l = r#"{app="sentinel-rs-app",resource="slow""#;
    assert_eq!(sample(&text, &format!("sentinel_exception_total{l}}}")), Some(1.0));
    assert_eq!(sample(&text, &format!("sentinel_response_time_seconds_bucket{l},le=\"0.1\"}}")), Some(0.0));
    assert_eq!(sample(&text, &format!("sentinel_response_time_seconds_bucket{l},le=\"0.25\"}}")), Some(1.0));
}

#[test]
fn the_output_passes_promtool_check_metrics() {
    let Some(promtool) = sentinel_testkit::require_program("promtool", "the_output_passes_promtool_check_metrics")
    else {
        return;
    };
    let (engine, _clock, _held) = busy_engine();
    let text = exporter::render(&engine);
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool refused the metrics ({}): {said}\n---\n{text}", out.status);
    assert!(said.trim().is_empty(), "promtool lints: {said}");
    // And an engine with no resource at all.
    let empty = exporter::render(&Sentinel::builder().build());
    let mut child = Command::new(sentinel_testkit::find_program("promtool").unwrap())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(empty.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success(), "{empty}");
}

#[test]
fn adaptive_gauges_carry_the_resource_and_partition_labels_in_a_scrape_of_the_endpoint() {
    let clock = ManualClock::at_millis(1_700_000_000_000);
    let engine = Sentinel::builder().manual_clock(clock.clone()).app_name("shop").build();
    exporter::attach(&engine, ExporterConfig::default()).unwrap();
    let mut rule =
        AdaptiveRule::new("db").algorithm(AlgorithmKind::Gradient2).limits(2, 10, 50).partition("mobile", 0.6);
    rule.window.window_ms = 100;
    rule.window.min_samples = 1;
    engine.load_adaptive_rules([rule]).unwrap();
    let db = engine.resource("db");
    // Ten calls of 20 ms each: windows of 100 ms close, each with a 20 ms RTT.
    for _ in 0..10 {
        let e = db.enter().unwrap();
        clock.advance_millis(20);
        drop(e);
    }
    let held = db.entry_owned().origin("mobile").enter().unwrap();
    let metrics = MetricsServer::serve_loopback(&engine, 0).unwrap();
    let text = http_get(metrics.local_addr(), "/metrics").expect("a 200 answer from /metrics");
    let status = engine.adaptive_status().remove(0);
    let at = |name: &str, partition: &str| {
        let series = format!("{name}{{app=\"shop\",resource=\"db\",partition=\"{partition}\"}}");
        sample(&text, &series).unwrap_or_else(|| panic!("no {series} in:\n{text}"))
    };
    assert!((2..=50).contains(&status.limit), "{status:?}");
    assert_eq!(at("sentinel_adaptive_limit", ""), f64::from(status.limit));
    let guarantee = (f64::from(status.limit) * 0.6).ceil();
    assert_eq!(at("sentinel_adaptive_limit", "mobile"), guarantee, "a partition's limit is its guarantee");
    assert_eq!(at("sentinel_adaptive_inflight", ""), 1.0);
    assert_eq!(at("sentinel_adaptive_inflight", "mobile"), 1.0);
    assert!((at("sentinel_adaptive_min_rtt_seconds", "") - 0.020).abs() < 1e-9, "{text}");
    assert!((at("sentinel_adaptive_sample_rtt_seconds", "") - 0.020).abs() < 1e-9, "{text}");
    assert_eq!(at("sentinel_adaptive_baseline_rtt_seconds", ""), status.baseline_rtt.as_secs_f64());
    assert_eq!(at("sentinel_adaptive_gradient", ""), status.gradient);
    assert_eq!(at("sentinel_adaptive_waiting", ""), 0.0);
    for family in ["sentinel_adaptive_limit", "sentinel_adaptive_inflight", "sentinel_adaptive_min_rtt_seconds"] {
        assert!(text.contains(&format!("# TYPE {family} gauge")), "{family} is a gauge");
    }
    drop(held);
    let text = http_get(metrics.local_addr(), "/metrics").unwrap();
    assert_eq!(sample(&text, r#"sentinel_adaptive_inflight{app="shop",resource="db",partition="mobile"}"#), Some(0.0));
}

/// `GET path` on `addr` over HTTP/1.0; the body of a 200 answer.
fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?;
    (status == "200").then(|| body.to_string())
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The first value of an instant query's answer, once Prometheus has one.
fn query(prometheus: SocketAddr, promql: &str) -> Option<f64> {
    let body = http_get(prometheus, &format!("/api/v1/query?query={}", url_encode(promql)))?;
    let json: serde_json::Value = serde_json::from_str(&body).ok()?;
    let value = json.pointer("/data/result/0/value/1")?.as_str()?;
    value.parse().ok()
}

/// Polls `f` every 100 ms until it answers, for at most `limit` (waiting for Prometheus, not for time).
fn poll<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(v) = f() {
            return Some(v);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

#[test]
fn a_real_prometheus_scrapes_the_endpoint_and_answers_a_pass_rate_query() {
    let test = "a_real_prometheus_scrapes_the_endpoint_and_answers_a_pass_rate_query";
    let Some(prometheus) = sentinel_testkit::require_program("prometheus", test) else {
        return;
    };
    let engine = Sentinel::builder().app_name("shop").build();
    exporter::attach(&engine, ExporterConfig::default()).unwrap();
    let checkout = engine.resource("checkout");
    for _ in 0..20 {
        drop(checkout.enter().unwrap());
    }
    let metrics = MetricsServer::serve_loopback(&engine, 0).unwrap();

    let dir = sentinel_testkit::temp_dir();
    let port = sentinel_testkit::free_port();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 250ms\n  evaluation_interval: 250ms\nscrape_configs:\n  - job_name: sentinel\n    \
             static_configs:\n      - targets: ['{}']\n",
            metrics.local_addr()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(prometheus);
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let server = sentinel_testkit::Server::start("prometheus", cmd, dir, addr);

    // The first scrapes see the 20 passes.
    let first = poll(Duration::from_secs(30), || {
        query(addr, r#"sentinel_pass_total{job="sentinel",resource="checkout"}"#).filter(|v| *v >= 20.0)
    });
    assert_eq!(first, Some(20.0), "Prometheus never scraped the 20 passes");
    // More calls: the pass rate over the scrapes is above zero.
    for _ in 0..100 {
        drop(checkout.enter().unwrap());
    }
    let rate = poll(Duration::from_secs(30), || {
        query(addr, r#"rate(sentinel_pass_total{job="sentinel",resource="checkout"}[5s])"#).filter(|v| *v > 0.0)
    });
    assert!(rate.is_some_and(|r| r > 0.0), "no pass rate answered: {rate:?}");
    let total = poll(Duration::from_secs(30), || {
        query(addr, r#"sentinel_pass_total{resource="checkout"}"#).filter(|v| *v >= 120.0)
    });
    assert_eq!(total, Some(120.0), "every pass counted once");
    let observed = poll(Duration::from_secs(30), || {
        query(addr, r#"sentinel_response_time_seconds_count{resource="checkout"}"#).filter(|v| *v >= 120.0)
    });
    assert_eq!(observed, Some(120.0), "the histogram observed every completed call");
    drop(server);
}
