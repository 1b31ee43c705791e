//! The console in a real headless Chromium, driven over WebDriver (Debian's `chromedriver`): the page loads
//! with no console error, resources appear with their numbers, a chart advances, a rule edited in the page
//! changes what the engine enforces, an invalid rule shows the server's error. The screenshot is written to
//! `target/console-screenshot.png`.
#![cfg(feature = "transport")]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
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
    let (Some(chromium), Some(chromedriver)) =
        (require_program("chromium", test), require_program("chromedriver", test))
    else {
        return;
    };
    let clock = ManualClock::at_millis(T0);
    let engine = Sentinel::builder().manual_clock(clock.clone()).app_name("shop-frontend").build();
    engine.load_flow_rules([FlowRule::new("POST /checkout").count(12.0)]).unwrap();
    engine
        .load_degrade_rules([DegradeRule::new("inventoryService.reserve", DegradeGrade::ErrorRatio)
            .count(0.3)
            .min_request_amount(5)
            .time_window_sec(8)])
        .unwrap();
    let center = CommandCenter::builder(&engine).port(0).start().unwrap();
    traffic(&engine, &clock, &center, 300);

    let dir = temp_dir();
    let driver_port = free_port();
    let mut cmd = Command::new(&chromedriver);
    cmd.arg(format!("--port={driver_port}"));
    let _driver = Server::start("chromedriver", cmd, temp_dir(), ([127, 0, 0, 1], driver_port).into());
    let c = browser(dir.path(), driver_port, &chromium).await;
    let session = c.session_id().await.unwrap().expect("a session id");

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
