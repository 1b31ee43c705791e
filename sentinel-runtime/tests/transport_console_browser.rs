//! The console in a real headless Chromium, driven over WebDriver (Debian's `chromedriver`): the page loads
//! with no console error, resources appear with their numbers, a chart advances, a rule edited in the page
//! changes what the engine enforces, an invalid rule shows the server's error; adaptive limiters are charted
//! from the served history; API groups and gateway rules are added, edited and deleted through the page.
//! Screenshots are written to `target/console-*.png`.
#![cfg(feature = "transport")]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::transport::CommandCenter;
use sentinel_runtime::Sentinel;
use sentinel_testkit::http::get;
use sentinel_testkit::{free_port, require_program, temp_dir, Server};

const T0: u64 = 1_700_000_000_000;

/// Five minutes of synthetic traffic on a manual clock: a checkout limited by a flow rule, a search with a
/// daily rhythm, an inventory call whose breaker trips and recovers, a quiet report. The history is sampled
/// (through the console's own command) often enough to keep all of it.
fn traffic(engine: &Sentinel, clock: &ManualClock, center: &CommandCenter, seconds: u64) {
    let checkout = engine.resource("POST /checkout");
    let search = engine.resource("GET /search");
    let inventory = engine.resource("inventoryService.reserve");
    let report = engine.resource("reportJob");
    for s in 0..seconds {
        let wave = ((s as f64) / 40.0).sin();
        for _ in 0..(14.0 + 8.0 * wave) as u64 {
            if let Ok(e) = checkout.enter() {
                clock.advance_millis(2);
                drop(e);
            }
        }
        for _ in 0..(30.0 + 18.0 * (s as f64 / 23.0).cos()) as u64 {
            if let Ok(e) = search.enter() {
                clock.advance_millis(1);
                drop(e);
            }
        }
        for i in 0..6 {
            if let Ok(mut e) = inventory.enter() {
                clock.advance_millis(3);
                if (120..150).contains(&s) && i % 2 == 0 {
                    e.set_error();
                }
            }
        }
        if s % 10 == 0 {
            drop(report.enter());
        }
        let used = clock.now_millis() % 1000;
        clock.advance_millis(1000 - used);
        if s % 20 == 0 {
            let _ = get(center.local_addr(), "/console/overview", &[]);
        }
    }
}

/// A headless Chromium session through a chromedriver of its own.
struct Browser {
    c: Client,
    session: String,
    driver_port: u16,
    _driver: Server,
    _dir: tempfile::TempDir,
}

/// Chromedriver started on a port of its own, and a headless Chromium session through it (`None`: the
/// programs are missing and the test skips, as the testkit decides).
async fn start_browser(test: &str) -> Option<Browser> {
    let (Some(chromium), Some(chromedriver)) =
        (require_program("chromium", test), require_program("chromedriver", test))
    else {
        return None;
    };
    let dir = temp_dir();
    let driver_port = free_port();
    let mut cmd = Command::new(&chromedriver);
    cmd.arg(format!("--port={driver_port}"));
    let driver = Server::start("chromedriver", cmd, temp_dir(), ([127, 0, 0, 1], driver_port).into());
    let c = browser(dir.path(), driver_port, &chromium).await;
    let session = c.session_id().await.unwrap().expect("a session id");
    Some(Browser { c, session, driver_port, _driver: driver, _dir: dir })
}

async fn browser(dir: &std::path::Path, driver_port: u16, chromium: &std::path::Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": chromium,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=1440,1000", "--force-device-scale-factor=1", "--hide-scrollbars",
                format!("--user-data-dir={}", dir.join("profile").display()),
            ],
        }),
    );
    caps.insert("goog:loggingPrefs".into(), serde_json::json!({ "browser": "ALL" }));
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{driver_port}"))
        .await
        .expect("a WebDriver session with headless Chromium")
}

/// The page's console messages (chromedriver's log endpoint), as `(level, message)`.
fn console_log(driver_port: u16, session: &str) -> Vec<(String, String)> {
    let body = r#"{"type":"browser"}"#;
    let req = format!(
        "POST /session/{session}/se/log HTTP/1.1\r\nHost: 127.0.0.1:{driver_port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let r = sentinel_testkit::http::raw_request(([127, 0, 0, 1], driver_port).into(), req.as_bytes());
    assert_eq!(r.status, 200, "chromedriver's log endpoint: {}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    v["value"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["level"].as_str().unwrap_or("").to_string(), e["message"].as_str().unwrap_or("").to_string()))
        .collect()
}

async fn wait_for_js(c: &Client, script: &str, what: &str) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let v = c.execute(script, vec![]).await.expect("run a script in the page");
        if !v.is_null() && v != serde_json::Value::Bool(false) {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "the page did not show {what} within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await; // polls the page for the condition
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join("target"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_live_resources_and_edits_rules_in_a_real_browser() {
    let test = "the_console_shows_live_resources_and_edits_rules_in_a_real_browser";
    let clock = ManualClock::at_millis(T0);
    let engine = Sentinel::builder().manual_clock(clock.clone()).app_name("shop-frontend").build();
    engine
        .load_flow_rules([
            FlowRule::new("POST /checkout").count(12.0),
            FlowRule::new("GET /item/.*").regex(true).count(1e6),
        ])
        .unwrap();
    // A name only the regex rule matches: counted against its own cap, which the page shows.
    drop(engine.resource("GET /item/42").enter().unwrap());
    engine
        .load_degrade_rules([DegradeRule::new("inventoryService.reserve", DegradeGrade::ErrorRatio)
            .count(0.3)
            .min_request_amount(5)
            .time_window_sec(8)])
        .unwrap();
    let center = CommandCenter::builder(&engine).port(0).start().unwrap();
    traffic(&engine, &clock, &center, 300);
    let Some(b) = start_browser(test).await else { return };
    let (c, session, driver_port) = (b.c.clone(), b.session.clone(), b.driver_port);

    c.goto(&center.console_url()).await.unwrap();
    c.wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css("[data-resource='POST /checkout']"))
        .await
        .unwrap();
    // The last complete second of the checkout: the flow rule lets 12 of 14-22 calls pass.
    let pass = wait_for_js(
        &c,
        "const d = document.querySelector(\"[data-resource='POST /checkout'] dd.pass\"); return d && d.textContent !== '0' ? d.textContent : null;",
        "the checkout's pass count",
    )
    .await;
    assert_eq!(pass, "12");
    let names = c
        .execute("return [...document.querySelectorAll('[data-resource]')].map(e => e.dataset.resource)", vec![])
        .await
        .unwrap();
    for r in ["GET /search", "POST /checkout", "inventoryService.reserve", "reportJob"] {
        assert!(names.as_array().unwrap().iter().any(|n| n == r), "{r} in {names}");
    }
    let caps = c.execute("return document.querySelector('#caps').textContent", vec![]).await.unwrap();
    assert!(caps.as_str().unwrap().contains("names only regex rules match: 1 of 6000"), "{caps}");

    // The chart advances when a second completes.
    let end_of = "return Number(document.querySelector(\"[data-resource='GET /search'] canvas\").dataset.end || 0)";
    let before = c.execute(end_of, vec![]).await.unwrap().as_u64().unwrap();
    assert!(before > 0, "the chart was drawn");
    traffic(&engine, &clock, &center, 2);
    wait_for_js(&c, &format!("return ({}) > {before}", end_of.trim_start_matches("return ")), "the chart advancing")
        .await;
    let drawn = c
        .execute(
            "const cv = document.querySelector(\"[data-resource='GET /search'] canvas\");\
             const d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;\
             let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n;",
            vec![],
        )
        .await
        .unwrap();
    assert!(drawn.as_u64().unwrap() > 1000, "the chart has lines on it: {drawn} pixels");

    // A screenshot of the resources view for people to look at.
    let png = c.screenshot().await.unwrap();
    let shot = target_dir().join("console-screenshot.png");
    std::fs::create_dir_all(shot.parent().unwrap()).unwrap();
    std::fs::write(&shot, &png).unwrap();

    // Edit the flow rule in the page: the engine enforces the new count.
    c.find(Locator::Css("button[data-tab='rules']")).await.unwrap().click().await.unwrap();
    c.wait().for_element(Locator::Css("#rules-flow tbody tr")).await.unwrap();
    c.find(Locator::Css("#rules-flow button.edit")).await.unwrap().click().await.unwrap();
    let set_rules = |json: &str| {
        format!(
            "const t = document.querySelector('#rules-flow textarea'); t.value = {}; return true;",
            serde_json::to_string(json).unwrap()
        )
    };
    c.execute(&set_rules(r#"[{"resource": "POST /checkout", "grade": 1, "count": 3}]"#), vec![]).await.unwrap();
    c.find(Locator::Css("#rules-flow button.apply")).await.unwrap().click().await.unwrap();
    wait_for_js(&c, "return document.querySelector('#rules-flow .result').textContent === 'Applied'", "`Applied`")
        .await;
    assert_eq!(engine.flow_rules()[0].count, 3.0);
    clock.advance_millis(1000);
    let checkout = engine.resource("POST /checkout");
    assert_eq!((0..10).filter(|_| checkout.enter().is_ok()).count(), 3, "the engine enforces the edited rule");
    let cell = wait_for_js(&c, "const td = document.querySelector('#rules-flow tbody tr td:nth-child(4)'); return td && td.textContent === '3' ? td.textContent : null;", "the new count in the table").await;
    assert_eq!(cell, "3");

    // An invalid rule: the server's typed error appears inline, and nothing changes.
    c.find(Locator::Css("#rules-flow button.edit")).await.unwrap().click().await.unwrap();
    c.execute(&set_rules(r#"[{"resource": "POST /checkout", "grade": 1, "count": -5}]"#), vec![]).await.unwrap();
    c.find(Locator::Css("#rules-flow button.apply")).await.unwrap().click().await.unwrap();
    let error = wait_for_js(
        &c,
        "const e = document.querySelector('#rules-flow .error'); return e && !e.hidden ? e.textContent : null;",
        "the error",
    )
    .await;
    let error = error.as_str().unwrap();
    std::fs::write(target_dir().join("console-rules.png"), c.screenshot().await.unwrap()).unwrap();
    assert!(error.contains("count") && error.contains("POST /checkout"), "{error}");
    assert_eq!(engine.flow_rules()[0].count, 3.0, "the rules in force stay");

    // The global switch.
    c.find(Locator::Css("label.switch")).await.unwrap().click().await.unwrap();
    wait_for_js(&c, "return document.querySelector('#switch-text').textContent === 'Protection off'", "the switch off")
        .await;
    assert!(!engine.is_enabled());
    c.find(Locator::Css("label.switch")).await.unwrap().click().await.unwrap();
    wait_for_js(&c, "return document.querySelector('#switch-text').textContent === 'Protection on'", "the switch on")
        .await;
    assert!(engine.is_enabled());

    // Diagnose at a click.
    c.find(Locator::Css("button[data-tab='resources']")).await.unwrap().click().await.unwrap();
    c.find(Locator::Css("[data-resource='POST /checkout'] button.diagnose")).await.unwrap().click().await.unwrap();
    let diagnosis = wait_for_js(&c, "const d = document.querySelector('#diagnosis'); return d.open ? document.querySelector('#diagnosis-text').textContent : null;", "the diagnosis").await;
    assert!(diagnosis.as_str().unwrap().contains("POST /checkout"), "{diagnosis}");

    // The breakers view shows the inventory breaker's transitions.
    c.execute("document.querySelector('#diagnosis').close(); return true;", vec![]).await.unwrap();
    c.find(Locator::Css("button[data-tab='breakers']")).await.unwrap().click().await.unwrap();
    let transitions = wait_for_js(
        &c,
        "const n = document.querySelectorAll('#transitions li').length; return n > 0 ? n : null;",
        "breaker transitions",
    )
    .await;
    assert!(transitions.as_u64().unwrap() >= 2, "opened and closed again: {transitions}");
    std::fs::write(target_dir().join("console-breakers.png"), c.screenshot().await.unwrap()).unwrap();

    // Chromium logs every 4xx answer as a failed load: the one 400 of the invalid push above is expected
    // (the page showed it); anything else is an error of the page.
    let expected = "/setRules - Failed to load resource: the server responded with a status of 400";
    let errors: Vec<(String, String)> = console_log(driver_port, &session)
        .into_iter()
        .filter(|(level, _)| level == "SEVERE" || level == "WARNING")
        .filter(|(_, message)| !message.contains(expected))
        .collect();
    assert!(errors.is_empty(), "the page logged errors: {errors:?}");
    c.close().await.unwrap();
}

#[cfg(feature = "tower")] // used by the gateway's browser test
/// Waits for the chart of the adaptive resource `db`, then reads its lines and figures and, in the same
/// page, the command's answer: checks that the lines are the served series, one vertex per point. Gives what
/// was read and the number of points.
async fn chart_against_served(c: &Client) -> (serde_json::Value, u64) {
    let drawn = wait_for_js(
        c,
        "const card = document.querySelector(\"[data-adaptive='db']\");\
         const l = card.querySelector('path.limit'), f = card.querySelector('path.inflight');\
         if (!l.dataset.points || l.dataset.points === '0') return null;\
         return fetch('console/adaptive').then(r => r.json()).then(a => ({\
           served: a.resources[0],\
           limit: l.dataset.values, inflight: f.dataset.values,\
           limitVertices: (l.getAttribute('d').match(/[ML]/g) || []).length,\
           inflightVertices: (f.getAttribute('d').match(/[ML]/g) || []).length,\
           figures: [...card.querySelectorAll('dd')].map(d => d.textContent),\
           algorithm: card.querySelector('.badge.algo').textContent,\
           partitions: [...card.querySelectorAll('table.partitions tbody tr td:first-child')].map(t => t.textContent),\
         }));",
        "the adaptive chart",
    )
    .await;
    let values = |key: &str| -> String {
        drawn["served"]["series"][key]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(serde_json::Value::as_u64)
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    assert_eq!(drawn["limit"].as_str().unwrap(), values("limit"), "the limit line is the served series");
    assert_eq!(drawn["inflight"].as_str().unwrap(), values("inflight"), "the in-flight line is the served series");
    let points = values("limit").split(',').count() as u64;
    assert_eq!(drawn["limitVertices"].as_u64(), Some(points), "one vertex per served point");
    assert_eq!(drawn["inflightVertices"].as_u64(), Some(points));
    (drawn, points)
}

#[cfg(feature = "tower")] // gateway rules
/// Fills the open form of a gateway card (`#gw-apis`, `#gw-rules`) by field name, as a person types and
/// chooses (with the change events the page listens to), and saves it.
async fn fill_and_save(c: &Client, card: &str, values: &[(&str, &str)]) {
    let mut js = format!("const f = document.querySelector('{card} form');");
    for (name, value) in values {
        js.push_str(&format!(
            "{{ const i = f.querySelector('[name={name}]'); i.value = {}; i.dispatchEvent(new Event('change')); }}",
            serde_json::to_string(value).unwrap()
        ));
    }
    c.execute(&(js + "return true;"), vec![]).await.unwrap();
    c.find(Locator::Css(&format!("{card} form button.save"))).await.unwrap().click().await.unwrap();
}

#[cfg(feature = "tower")] // gateway rules
/// Waits for the row of `key` in a gateway card's table.
async fn wait_for_row(c: &Client, card: &str, key: &str) {
    let js = format!("return document.querySelector(\"{card} tr[data-key='{key}']\") !== null");
    wait_for_js(c, &js, &format!("the row of {key}")).await;
}

#[cfg(feature = "tower")] // gateway rules
/// Waits for the server's error shown next to `field` of a gateway card's form, and gives its text.
async fn field_error(c: &Client, card: &str, field: &str) -> String {
    let js = format!(
        "const e = document.querySelector(\"{card} [data-field='{field}'] .field-error\"); return e ? e.textContent : null;"
    );
    wait_for_js(c, &js, &format!("the error next to {field}")).await.as_str().unwrap_or_default().to_string()
}

/// Calls `db` holds in second `s` of [`adaptive_traffic`]: `(from no origin, from mobile)`.
fn held_in(s: u64) -> (u64, u64) {
    (s % 12 + 1, s % 5)
}

/// Traffic on an adaptive resource `db`: at the start of each simulated second, [`held_in`] calls enter and
/// the console's command samples them; 300 ms later they complete, then 10 calls of 20 ms each run one
/// after the other (so no moment of the second has more calls in flight than the sampled ones).
fn adaptive_traffic(engine: &Sentinel, clock: &ManualClock, center: &CommandCenter, seconds: u64) {
    let db = engine.resource("db");
    for s in 0..seconds {
        let (plain, mobile) = held_in(s);
        // Owned entries: each in a context of its own, so that each keeps its origin.
        let held: Vec<_> = (0..plain).filter_map(|_| db.entry_owned().enter().ok()).collect();
        let from_mobile: Vec<_> = (0..mobile).filter_map(|_| db.entry_owned().origin("mobile").enter().ok()).collect();
        let _ = get(center.local_addr(), "/console/adaptive", &[]);
        clock.advance_millis(300);
        drop((held, from_mobile));
        for _ in 0..10 {
            if let Ok(e) = db.enter() {
                clock.advance_millis(20);
                drop(e);
            }
        }
        let used = clock.now_millis() % 1000;
        clock.advance_millis(1000 - used);
    }
}

fn adaptive_engine(min: u32, max: u32) -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(T0);
    let engine = Sentinel::builder().manual_clock(clock.clone()).app_name("orders-gateway").build();
    engine
        .load_adaptive_rules([
            AdaptiveRule::new("db")
                .algorithm(AlgorithmKind::Gradient2)
                .limits(min, 20, max)
                .partition("mobile", 0.6)
                .partition("default", 0.4),
            // A pattern no call of these tests matches: its limiter never starts.
            AdaptiveRule::new("inventory-.*").regex(true).limits(5, 10, 50),
        ])
        .unwrap();
    (engine, clock)
}

#[test]
fn console_adaptive_lists_the_rules_whose_limiter_has_not_started() {
    let (engine, _clock) = adaptive_engine(20, 20);
    let center = CommandCenter::builder(&engine).port(0).start().unwrap();
    let waiting = || {
        let r = get(center.local_addr(), "/console/adaptive", &[]);
        assert_eq!(r.status, 200, "{}", r.body);
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        let names: Vec<String> =
            v["resources"].as_array().unwrap().iter().map(|r| r["resource"].as_str().unwrap().to_string()).collect();
        (v["waiting"].clone(), names)
    };
    let pattern = serde_json::json!({
        "resource": "inventory-.*", "regex": true, "algorithm": null, "initialLimit": 10, "minLimit": 5, "maxLimit": 50,
    });
    // Before any call, no limiter runs: both rules are listed, with what their limiters will start from.
    let (w, started) = waiting();
    assert!(started.is_empty(), "{started:?}");
    assert_eq!(
        w,
        serde_json::json!([
            {"resource": "db", "regex": false, "algorithm": "gradient2", "initialLimit": 20, "minLimit": 20, "maxLimit": 20},
            pattern,
        ])
    );
    // The first call of `db` starts its limiter: it leaves the list for a card of its own.
    drop(engine.resource("db").enter().unwrap());
    let (w, started) = waiting();
    assert_eq!(started, ["db"]);
    assert_eq!(w, serde_json::json!([pattern]));
    // A resource the pattern matches starts the pattern's limiter for it.
    drop(engine.resource("inventory-eu").enter().unwrap());
    let (w, started) = waiting();
    assert_eq!(started, ["db", "inventory-eu"]);
    assert_eq!(w, serde_json::json!([]));
    assert!(engine.adaptive_rules_waiting().is_empty());
}

#[test]
fn console_adaptive_serves_every_limiter_now_and_its_limit_and_inflight_per_second() {
    // A limit held at 20, so that every call of the traffic is admitted.
    let (engine, clock) = adaptive_engine(20, 20);
    let center = CommandCenter::builder(&engine).port(0).start().unwrap();
    adaptive_traffic(&engine, &clock, &center, 40);
    // Now: 7 calls held (3 of them from mobile), read by the command at this second.
    let db = engine.resource("db");
    let _held: Vec<_> = (0..4).map(|_| db.entry_owned().enter().unwrap()).collect();
    let _mobile: Vec<_> = (0..3).map(|_| db.entry_owned().origin("mobile").enter().unwrap()).collect();
    let r = get(center.local_addr(), "/console/adaptive", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    let now = engine.now_millis();
    assert_eq!(v["now"], now);
    let count = v["count"].as_u64().unwrap();
    assert_eq!(count, 300, "5 minutes of seconds");
    assert_eq!(v["start"].as_u64().unwrap(), (now / 1000 + 1 - count) * 1000, "the last second is the current one");
    let resources = v["resources"].as_array().unwrap();
    assert_eq!(resources.len(), 1, "{v}");
    let db = &resources[0];
    let status = &engine.adaptive_status()[0];
    assert_eq!(db["resource"], "db");
    assert_eq!(db["algorithm"], "gradient2");
    assert_eq!((db["limit"].as_u64(), db["inflight"].as_u64()), (Some(u64::from(status.limit)), Some(7)));
    assert_eq!((db["minLimit"].as_u64(), db["maxLimit"].as_u64()), (Some(20), Some(20)));
    assert_eq!(db["waiting"], 0);
    // The shortest calls took 20 ms on the manual clock; the average is what the limiter measured.
    assert_eq!(db["minRttMs"].as_f64(), Some(20.0), "{db}");
    assert_eq!(db["sampleRttMs"].as_f64(), Some(status.sample_rtt.as_micros() as f64 / 1000.0), "{db}");
    assert!(db["sampleRttMs"].as_f64().unwrap() > 20.0, "the held calls took 300 ms: {db}");
    assert!(db["gradient"].as_f64().is_some_and(|g| (0.5..=1.0).contains(&g)), "{db}");
    assert_eq!(db["probing"], false);

    let limit = db["series"]["limit"].as_array().unwrap();
    let inflight = db["series"]["inflight"].as_array().unwrap();
    assert_eq!((limit.len(), inflight.len()), (300, 300));
    // 40 seconds sampled, then the current one; the seconds before are gaps.
    let sampled = limit.iter().filter(|p| !p.is_null()).count();
    assert_eq!(sampled, 41, "{limit:?}");
    assert!(limit[..300 - 41].iter().all(serde_json::Value::is_null));
    for k in 0..40 {
        // The peak of each second: the calls held when the command sampled it.
        let s = k as u64;
        let (plain, mobile) = held_in(s);
        assert_eq!(inflight[300 - 41 + k].as_u64(), Some(plain + mobile), "second {s}");
        assert_eq!(limit[300 - 41 + k].as_u64(), Some(20), "second {s}");
    }
    assert_eq!(inflight[299].as_u64(), Some(7), "the current second");
    assert_eq!(limit[299].as_u64(), Some(u64::from(status.limit)));

    let partitions = db["partitions"].as_array().unwrap();
    let mobile = partitions.iter().find(|p| p["origin"] == "mobile").unwrap();
    assert_eq!(mobile["share"].as_f64(), Some(0.6));
    assert_eq!(mobile["guarantee"].as_u64(), Some((f64::from(status.limit) * 0.6).ceil() as u64));
    assert_eq!(mobile["inflight"], 3);
    assert_eq!(mobile["series"]["inflight"][299], 3);
    assert_eq!(mobile["series"]["inflight"][300 - 41 + 3].as_u64(), Some(held_in(3).1));
    assert_eq!(mobile["series"]["limit"][300 - 41 + 3].as_u64(), Some(12), "its guarantee: ceil(20 × 0.6)");
    let default = partitions.iter().find(|p| p["origin"] == "default").unwrap();
    assert_eq!(default["inflight"], 4);

    // Without the rule there is no limiter, and its history goes with it.
    engine.load_adaptive_rules(Vec::new()).unwrap();
    let r = get(center.local_addr(), "/console/adaptive", &[]);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["resources"], serde_json::json!([]), "{v}");
}

#[cfg(feature = "tower")] // gateway rules
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_charts_adaptive_limits_and_edits_the_gateway_in_a_real_browser() {
    let test = "the_console_charts_adaptive_limits_and_edits_the_gateway_in_a_real_browser";
    let (engine, clock) = adaptive_engine(8, 200);
    let center = CommandCenter::builder(&engine).port(0).start().unwrap();
    adaptive_traffic(&engine, &clock, &center, 200);
    let db = engine.resource("db");
    let _held: Vec<_> = (0..5).map(|_| db.entry_owned().enter().unwrap()).collect();
    let Some(b) = start_browser(test).await else { return };
    let c = &b.c;

    // The adaptive chart: one card for `db`, with its figures and the lines of the served series.
    c.goto(&center.console_url()).await.unwrap();
    c.wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css("[data-adaptive='db'] svg path.limit[data-points]"))
        .await
        .unwrap();
    let (drawn, points) = chart_against_served(c).await;
    assert_eq!(points, 201, "200 sampled seconds and the current one");
    // The pattern's rule has no limiter yet (no resource it matches was called): named under the cards.
    let waiting = wait_for_js(
        c,
        "const n = document.querySelector('#adaptive-waiting'); return n && !n.hidden ? n.textContent : null;",
        "the adaptive rules waiting for a first call",
    )
    .await;
    assert_eq!(
        waiting,
        "Starting at the first call: pattern inventory-.* (algorithm by the call's direction, limit 10 between 5 and 50)"
    );
    let served = &drawn["served"];
    let figures = drawn["figures"].as_array().unwrap();
    assert_eq!(figures[0].as_str(), Some(served["limit"].to_string().as_str()), "the limit: {figures:?}");
    assert_eq!(figures[1], "5", "in flight: {figures:?}");
    assert_eq!(figures[3], "20.0 ms", "the min RTT: {figures:?}");
    assert!(figures[4].as_str().unwrap().ends_with(" ms"), "the sample RTT: {figures:?}");
    assert_eq!(drawn["algorithm"], "gradient2");
    assert_eq!(drawn["partitions"], serde_json::json!(["mobile", "default"]));
    let shots = target_dir();
    std::fs::create_dir_all(&shots).unwrap();
    std::fs::write(shots.join("console-adaptive.png"), c.screenshot().await.unwrap()).unwrap();
    // The chart follows: three more seconds of traffic, fetched by the page a few seconds at a time and merged
    // with what it held, and the lines are still the served series, three points longer.
    adaptive_traffic(&engine, &clock, &center, 3);
    let last = clock.now_millis() / 1000 * 1000;
    wait_for_js(
        c,
        &format!("return document.querySelector(\"[data-adaptive='db'] svg\").dataset.end === '{last}'"),
        "the chart advancing",
    )
    .await;
    let (_, points) = chart_against_served(c).await;
    assert_eq!(points, 204);

    // The gateway tab: empty at first, as the application is not a gateway yet.
    c.find(Locator::Css("button[data-tab='gateway']")).await.unwrap().click().await.unwrap();
    wait_for_js(c, "const e = document.querySelector('#gateway-empty'); return e && !e.hidden;", "the empty state")
        .await;
    std::fs::write(shots.join("console-gateway-empty.png"), c.screenshot().await.unwrap()).unwrap();
    // Add an API group with a prefix path.
    c.find(Locator::Css("#gw-apis button.add")).await.unwrap().click().await.unwrap();
    fill_and_save(c, "#gw-apis", &[("apiName", "products"), ("pattern", "/product/**"), ("matchStrategy", "1")]).await;
    wait_for_row(c, "#gw-apis", "products").await;
    let apis = get(center.local_addr(), "/gateway/getApiDefinitions", &[]);
    let apis: serde_json::Value = serde_json::from_str(&apis.body).unwrap();
    assert_eq!(
        apis,
        serde_json::json!([{"apiName": "products", "predicateItems": [{"pattern": "/product/**", "matchStrategy": 1}]}])
    );

    // Add a gateway rule on it, per header value.
    c.find(Locator::Css("#gw-rules button.add")).await.unwrap().click().await.unwrap();
    let rule = [
        ("resource", "products"),
        ("resourceMode", "1"),
        ("count", "5"),
        ("parseStrategy", "2"),
        ("fieldName", "X-Tenant"),
    ];
    fill_and_save(c, "#gw-rules", &rule).await;
    wait_for_row(c, "#gw-rules", "products").await;
    let rules = get(center.local_addr(), "/gateway/getRules", &[]);
    let rules: serde_json::Value = serde_json::from_str(&rules.body).unwrap();
    assert_eq!(rules[0]["resource"], "products");
    assert_eq!((rules[0]["resourceMode"].as_u64(), rules[0]["count"].as_f64()), (Some(1), Some(5.0)));
    assert_eq!(rules[0]["paramItem"]["parseStrategy"], 2);
    assert_eq!(rules[0]["paramItem"]["fieldName"], "X-Tenant");
    assert_eq!(engine.gateway_rules().len(), 1);
    let row = c
        .execute(
            "return Object.fromEntries([...document.querySelectorAll(\"#gw-rules tr[data-key='products'] td[data-col]\")].map(t => [t.dataset.col, t.textContent]))",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        row,
        serde_json::json!({
            "resource": "products", "resourceMode": "API group", "grade": "QPS", "count": "5", "intervalSec": "1 s",
            "controlBehavior": "reject", "burst": "0", "maxQueueingTimeoutMs": "500 ms", "paramItem": "header X-Tenant",
        }),
        "the rule as the table shows it"
    );
    wait_for_js(c, "return document.querySelector('#gateway-empty').hidden", "the empty state gone").await;

    // Edit it: an invalid header name is refused, shown next to the field, and the rule in force stays.
    c.find(Locator::Css("#gw-rules tr[data-key='products'] button.edit")).await.unwrap().click().await.unwrap();
    fill_and_save(c, "#gw-rules", &[("fieldName", "X Tenant")]).await;
    let error = field_error(c, "#gw-rules", "paramItem.fieldName").await;
    assert!(error.contains("header name"), "{error}");
    assert_eq!(engine.gateway_rules()[0].param_item.as_ref().unwrap().field_name.as_deref(), Some("X-Tenant"));
    // A count that is not a number: the server's JSON error, at the count field.
    fill_and_save(c, "#gw-rules", &[("fieldName", "X-Tenant"), ("count", "five")]).await;
    let error = field_error(c, "#gw-rules", "count").await;
    assert!(error.contains("count"), "{error}");
    assert_eq!(engine.gateway_rules()[0].count, 5.0, "the rule in force stays");
    std::fs::write(shots.join("console-gateway.png"), c.screenshot().await.unwrap()).unwrap();
    // Then a valid edit.
    fill_and_save(c, "#gw-rules", &[("count", "8")]).await;
    wait_for_js(c, "return document.querySelector('#gw-rules form') === null", "the form closing").await;
    assert_eq!(engine.gateway_rules()[0].count, 8.0);

    // An invalid API group (a regular expression that does not compile): inline, and the groups stay.
    c.find(Locator::Css("#gw-apis button.add")).await.unwrap().click().await.unwrap();
    fill_and_save(c, "#gw-apis", &[("apiName", "orders"), ("pattern", "/orders/(\\d+"), ("matchStrategy", "2")]).await;
    let error = field_error(c, "#gw-apis", "predicateItems.pattern").await;
    assert!(error.contains("/orders/(\\d+"), "{error}");
    assert_eq!(engine.api_definitions().len(), 1, "the API groups in force stay");
    // A second path left blank: the error is shown at that path, not the first.
    c.find(Locator::Css("#gw-apis form button.add-path")).await.unwrap().click().await.unwrap();
    fill_and_save(c, "#gw-apis", &[("pattern", "/orders/**"), ("matchStrategy", "1")]).await;
    let blank = wait_for_js(
        c,
        "const e = document.querySelector(\"#gw-apis .predicate[data-item='1'] .field-error\"); return e ? e.textContent : null;",
        "the error at the blank path",
    )
    .await;
    assert!(blank.as_str().unwrap().contains("blank"), "{blank}");
    assert!(c.find(Locator::Css("#gw-apis .predicate[data-item='0'] .field-error")).await.is_err(), "not at the first");
    assert_eq!(engine.api_definitions().len(), 1, "the API groups in force stay");

    // Narrow screens: the same views at a phone's width.
    c.set_window_size(390, 844).await.unwrap();
    std::fs::write(shots.join("console-gateway-narrow.png"), c.screenshot().await.unwrap()).unwrap();
    c.find(Locator::Css("#gw-apis form button.cancel")).await.unwrap().click().await.unwrap();
    let tab = c.find(Locator::Css("#tab-gateway")).await.unwrap();
    std::fs::write(shots.join("console-gateway-narrow-lists.png"), tab.screenshot().await.unwrap()).unwrap();
    c.find(Locator::Css("button[data-tab='resources']")).await.unwrap().click().await.unwrap();
    wait_for_js(
        c,
        "return document.querySelector(\"[data-adaptive='db'] path.limit\").dataset.points > 0",
        "the chart",
    )
    .await;
    std::fs::write(shots.join("console-adaptive-narrow.png"), c.screenshot().await.unwrap()).unwrap();
    // (the toast of the last save is let go, and the card's end scrolled into view)
    let js = "document.querySelector('#toast').hidden = true; \
              document.querySelector(\"[data-adaptive='db'] table\").scrollIntoView(false); return true;";
    c.execute(js, vec![]).await.unwrap();
    let card = c.find(Locator::Css("[data-adaptive='db']")).await.unwrap();
    std::fs::write(shots.join("console-adaptive-narrow-card.png"), card.screenshot().await.unwrap()).unwrap();
    c.set_window_size(1440, 1000).await.unwrap();

    // Delete the rule (two clicks: delete, confirm).
    c.find(Locator::Css("button[data-tab='gateway']")).await.unwrap().click().await.unwrap();
    // Clicking the tab reads the lists again, which replaces the rows: click once they have settled.
    wait_for_js(
        c,
        "return !document.querySelector('#gw-rules').hasAttribute('aria-busy') \
         && document.querySelector(\"#gw-rules tr[data-key='products'] button.delete\") !== null",
        "the rule",
    )
    .await;
    for _ in 0..2 {
        c.find(Locator::Css("#gw-rules tr[data-key='products'] button.delete")).await.unwrap().click().await.unwrap();
    }
    wait_for_js(c, "return document.querySelector(\"#gw-rules tr[data-key='products']\") === null", "the rule gone")
        .await;
    assert!(engine.gateway_rules().is_empty());

    // The invalid pushes above are the only 400s; anything else logged is an error of the page.
    let errors: Vec<(String, String)> = console_log(b.driver_port, &b.session)
        .into_iter()
        .filter(|(level, _)| level == "SEVERE" || level == "WARNING")
        .filter(|(_, message)| !message.contains("/gateway/update") || !message.contains("status of 400"))
        .collect();
    assert!(errors.is_empty(), "the page logged errors: {errors:?}");
    b.c.clone().close().await.unwrap();
}
