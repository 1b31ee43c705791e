//! Prometheus text exposition of per-resource numbers (feature `prometheus`), and a small HTTP endpoint on
//! loopback serving it (feature `http-exporter`).
//!
//! Every series is labelled with `app` and `resource`. The engine keeps sliding windows, not totals since
//! start, so the numbers are gauges: the per-second rates of the sliding 1 s window, the sums of the last
//! minute, the average response time and the calls in flight (use `avg_over_time`/`max_over_time` rather
//! than `rate()` on them); and the state of every circuit breaker.
//!
//! ```
//! use sentinel_runtime::{Sentinel, exporter};
//! let engine = Sentinel::builder().app_name("shop").build();
//! drop(engine.enter("checkout").unwrap());
//! let text = exporter::render(&engine);
//! assert!(text.contains("sentinel_pass_qps{app=\"shop\",resource=\"checkout\"} 1"));
//! ```

use std::fmt::Write as _;

use crate::circuit_breaker::{BreakerState, DegradeGrade};
use crate::{NodeStats, Sentinel};

struct Family {
    name: &'static str,
    help: &'static str,
    value: fn(&NodeStats) -> f64,
}

const FAMILIES: &[Family] = &[
    Family { name: "sentinel_pass_qps", help: "Passed calls per second (sliding 1 s window).", value: |s| s.pass_qps },
    Family {
        name: "sentinel_block_qps",
        help: "Blocked calls per second (sliding 1 s window).",
        value: |s| s.block_qps,
    },
    Family {
        name: "sentinel_success_qps",
        help: "Completed calls per second (sliding 1 s window).",
        value: |s| s.success_qps,
    },
    Family {
        name: "sentinel_exception_qps",
        help: "Completed calls with a traced error per second (sliding 1 s window).",
        value: |s| s.exception_qps,
    },
    Family {
        name: "sentinel_avg_rt_milliseconds",
        help: "Average response time of completed calls (sliding 1 s window).",
        value: |s| s.avg_rt_ms,
    },
    Family { name: "sentinel_threads", help: "Calls in flight.", value: |s| s.threads as f64 },
    Family {
        name: "sentinel_pass_last_minute",
        help: "Passed calls over the last minute.",
        value: |s| s.minute_pass as f64,
    },
    Family {
        name: "sentinel_block_last_minute",
        help: "Blocked calls over the last minute.",
        value: |s| s.minute_block as f64,
    },
    Family {
        name: "sentinel_success_last_minute",
        help: "Completed calls over the last minute.",
        value: |s| s.minute_success as f64,
    },
    Family {
        name: "sentinel_exception_last_minute",
        help: "Completed calls with a traced error over the last minute.",
        value: |s| s.minute_exception as f64,
    },
];

/// Escapes a label value: backslash, double quote and newline.
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// The engine's per-resource numbers in the Prometheus text format (version 0.0.4), resources sorted by name.
pub fn render(engine: &Sentinel) -> String {
    let app = escape(&engine.config().app_name);
    let mut names = engine.resource_names();
    names.sort();
    let stats: Vec<(String, NodeStats)> =
        names.iter().filter_map(|n| engine.cluster_stats(n).map(|s| (escape(n), s))).collect();
    let mut out = String::new();
    for f in FAMILIES {
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} gauge", f.name);
        for (name, s) in &stats {
            let _ = writeln!(out, "{}{{app=\"{app}\",resource=\"{name}\"}} {}", f.name, number((f.value)(s)));
        }
    }
    render_breakers(engine, &app, &names, &mut out);
    out
}

/// Circuit-breaker states: `sentinel_circuit_breaker_state{app, resource, rule, grade}` = 0 closed, 1 open,
/// 2 half-open; `rule` is the rule's position in [`Sentinel::degrade_rules`].
fn render_breakers(engine: &Sentinel, app: &str, names: &[String], out: &mut String) {
    let rules = engine.degrade_rules();
    let _ =
        writeln!(out, "# HELP sentinel_circuit_breaker_state Circuit breaker state: 0 closed, 1 open, 2 half-open.");
    let _ = writeln!(out, "# TYPE sentinel_circuit_breaker_state gauge");
    for name in names {
        for b in engine.circuit_breakers(name) {
            let index = rules.iter().position(|r| *r == *b.rule).map(|i| i.to_string()).unwrap_or_default();
            let grade = match b.rule.grade {
                DegradeGrade::SlowRequestRatio => "slow_request_ratio",
                DegradeGrade::ErrorRatio => "error_ratio",
                DegradeGrade::ErrorCount => "error_count",
            };
            let state = match b.state {
                BreakerState::Closed => 0,
                BreakerState::Open => 1,
                BreakerState::HalfOpen => 2,
            };
            let _ = writeln!(
                out,
                "sentinel_circuit_breaker_state{{app=\"{app}\",resource=\"{}\",rule=\"{index}\",grade=\"{grade}\"}} {state}",
                escape(name)
            );
        }
    }
}

#[cfg(feature = "http-exporter")]
pub use http::MetricsServer;

#[cfg(feature = "http-exporter")]
mod http {
    use std::io;
    use std::net::{Ipv4Addr, SocketAddr};
    use std::sync::Arc;
    use std::thread::JoinHandle;

    use crate::Sentinel;

    /// Serves `GET /metrics` on a loopback address until dropped.
    pub struct MetricsServer {
        server: Arc<tiny_http::Server>,
        addr: SocketAddr,
        thread: Option<JoinHandle<()>>,
    }

    impl std::fmt::Debug for MetricsServer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("MetricsServer").field("addr", &self.addr).finish_non_exhaustive()
        }
    }

    impl MetricsServer {
        /// Binds `127.0.0.1:port` (0 picks a free port) and serves the engine's metrics at `/metrics`.
        pub fn serve_loopback(engine: &Sentinel, port: u16) -> io::Result<MetricsServer> {
            let server = tiny_http::Server::http(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
                .map_err(|e| io::Error::other(e.to_string()))?;
            let addr = server
                .server_addr()
                .to_ip()
                .ok_or_else(|| io::Error::other("the metrics server is not bound to an IP address"))?;
            let server = Arc::new(server);
            let (s, engine) = (server.clone(), engine.clone());
            let thread = std::thread::Builder::new().name("sentinel-metrics-http".into()).spawn(move || {
                for request in s.incoming_requests() {
                    let path = request.url().split('?').next().unwrap_or("");
                    let response = if *request.method() == tiny_http::Method::Get && path == "/metrics" {
                        let header = tiny_http::Header::from_bytes(
                            &b"Content-Type"[..],
                            &b"text/plain; version=0.0.4; charset=utf-8"[..],
                        );
                        let mut r = tiny_http::Response::from_string(super::render(&engine));
                        if let Ok(h) = header {
                            r = r.with_header(h);
                        }
                        r
                    } else {
                        tiny_http::Response::from_string("not found: use GET /metrics\n").with_status_code(404)
                    };
                    if let Err(e) = request.respond(response) {
                        tracing::debug!(error = %e, "metrics response failed");
                    }
                }
            })?;
            Ok(MetricsServer { server, addr, thread: Some(thread) })
        }

        /// The address bound.
        pub fn local_addr(&self) -> SocketAddr {
            self.addr
        }
    }

    impl Drop for MetricsServer {
        fn drop(&mut self) {
            self.server.unblock();
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::flow::FlowRule;

    fn engine() -> (Sentinel, crate::Entry<'static>) {
        let clock = ManualClock::at_millis(1_700_000_000_000);
        let engine = Sentinel::builder().manual_clock(clock.clone()).app_name("shop").build();
        engine.load_flow_rules(vec![FlowRule::new("pay").count(2.0)]).unwrap();
        for _ in 0..3 {
            let e = engine.enter("pay");
            clock.advance_millis(4);
            drop(e);
        }
        let mut e = engine.enter("quote\"d\\name").unwrap();
        e.set_error();
        clock.advance_millis(10);
        drop(e);
        engine
            .load_degrade_rules(vec![crate::circuit_breaker::DegradeRule::new(
                "quote\"d\\name",
                DegradeGrade::ErrorCount,
            )
            .count(0.0)
            .time_window_sec(5)
            .min_request_amount(1)])
            .unwrap();
        let mut e = engine.enter("quote\"d\\name").unwrap();
        e.set_error();
        drop(e);
        let held = engine.enter("held").unwrap();
        (engine, held)
    }

    #[test]
    fn renders_every_resource_with_help_type_and_escaped_labels() {
        let (engine, _held) = engine();
        let text = render(&engine);
        assert!(text.contains("# TYPE sentinel_pass_qps gauge\n"));
        assert!(text.contains("sentinel_pass_qps{app=\"shop\",resource=\"pay\"} 2\n"), "{text}");
        assert!(text.contains("sentinel_block_qps{app=\"shop\",resource=\"pay\"} 1\n"));
        assert!(text.contains("sentinel_avg_rt_milliseconds{app=\"shop\",resource=\"pay\"} 4\n"), "{text}");
        assert!(
            text.contains("sentinel_exception_last_minute{app=\"shop\",resource=\"quote\\\"d\\\\name\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("sentinel_threads{app=\"shop\",resource=\"held\"} 1\n"));
        assert!(
            text.contains("sentinel_circuit_breaker_state{app=\"shop\",resource=\"quote\\\"d\\\\name\",rule=\"0\",grade=\"error_count\"} 1\n"),
            "{text}"
        );
        // Every sample line is `name{labels} value`.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (series, value) = line.rsplit_once(' ').unwrap();
            assert!(series.starts_with("sentinel_") && series.ends_with('}'), "{line}");
            value.parse::<f64>().unwrap();
        }
    }

    #[cfg(feature = "http-exporter")]
    #[test]
    fn the_endpoint_serves_metrics_over_loopback() {
        use std::io::{Read, Write};
        let (engine, _held) = engine();
        let server = MetricsServer::serve_loopback(&engine, 0).unwrap();
        assert!(server.local_addr().ip().is_loopback());
        let fetch = |path: &str| {
            let mut s = std::net::TcpStream::connect(server.local_addr()).unwrap();
            write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
            let mut body = String::new();
            s.read_to_string(&mut body).unwrap();
            body
        };
        let ok = fetch("/metrics");
        assert!(ok.starts_with("HTTP/1.0 200") || ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("text/plain; version=0.0.4"));
        assert!(ok.contains("sentinel_pass_qps{app=\"shop\",resource=\"pay\"} 2"));
        let missing = fetch("/nope");
        assert!(missing.contains(" 404 "), "{missing}");
    }
}
