//! Heartbeats to the Sentinel Dashboard: `POST {dashboard}/registry/machine` with the machine's form, every
//! [`DEFAULT_HEARTBEAT_INTERVAL`], so the dashboard lists the machine and knows where to send commands.
//!
//! The form is simple-http's: `hostname`, `ip`, `app`, `app_type`, `port` (the port actually bound), `v`
//! (a version the dashboard reads as 1.8.9, so it pushes rules by POST) and `version` (the time, ms). The
//! first beat goes as soon as the server is bound. A dashboard that is down is retried with a backoff (1 s,
//! 2 s, 4 s, ... up to 60 s) and the next address of the list is tried; nothing of it touches the
//! application's calls. The dashboard answers `200` with `{"success":false,"msg":...}` when it refuses a
//! beat (a bad `ip`, say): that counts as a failure, with its message.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{CONNECTION, CONTENT_TYPE, HOST};
use hyper::Request;
use hyper_util::rt::TokioIo;

use super::handler::{version, MachineInfo};

/// The dashboard's path for heartbeats.
pub const HEARTBEAT_PATH: &str = "/registry/machine";
/// The default time between beats (simple-http's).
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);
/// The longest wait between retries while no dashboard answers.
pub const MAX_HEARTBEAT_BACKOFF: Duration = Duration::from_secs(60);
const TIMEOUT: Duration = Duration::from_secs(3);

/// A dashboard address, from `host[:port]` with an optional `http://`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Dashboard {
    /// `host:port` (a v6 address in brackets).
    pub(crate) authority: String,
}

/// A dashboard address that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad dashboard address `{address}`: {reason}")]
pub struct DashboardAddressError {
    /// The address as given.
    pub address: String,
    /// Why.
    pub reason: String,
}

/// Parses a comma-separated list of dashboard addresses (`SENTINEL_DASHBOARD_SERVER`).
pub(crate) fn parse_dashboards(list: &str) -> Result<Vec<Dashboard>, DashboardAddressError> {
    let mut out = Vec::new();
    for raw in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let bad = |reason: &str| DashboardAddressError { address: raw.to_string(), reason: reason.to_string() };
        let lower = raw.to_ascii_lowercase();
        let rest = if lower.starts_with("https://") {
            return Err(bad(
                "https is not supported by the heartbeat sender; use http:// (or a local proxy that adds TLS)",
            ));
        } else if lower.starts_with("http://") {
            &raw[7..]
        } else {
            raw
        };
        let rest = rest.trim_end_matches('/');
        if rest.is_empty() || rest.contains('/') || rest.contains('@') || rest.contains(char::is_whitespace) {
            return Err(bad("expected host[:port], e.g. 127.0.0.1:8080"));
        }
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let Some((addr, tail)) = v6.split_once(']') else { return Err(bad("unclosed `[` in an IPv6 address")) };
            (format!("[{addr}]"), tail.strip_prefix(':'))
        } else if rest.matches(':').count() > 1 {
            (format!("[{rest}]"), None) // a bare IPv6 address
        } else {
            match rest.split_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (rest.to_string(), None),
            }
        };
        let port = match port {
            None => 80,
            Some(p) => match p.parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => return Err(bad("the port must be a number from 1 to 65535")),
            },
        };
        if host.is_empty() || host == "[]" {
            return Err(bad("the host is empty"));
        }
        out.push(Dashboard { authority: format!("{host}:{port}") });
    }
    Ok(out)
}

/// What the heartbeat sender has done so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeartbeatStatus {
    /// Beats a dashboard accepted.
    pub sent: u64,
    /// Beats no dashboard accepted.
    pub failed: u64,
    /// Why the last failed beat failed.
    pub last_error: Option<String>,
    /// The dashboard (`host:port`) that accepted the last beat.
    pub last_dashboard: Option<String>,
}

/// The heartbeat loop's settings.
pub(crate) struct Heartbeat {
    pub(crate) dashboards: Vec<Dashboard>,
    pub(crate) interval: Duration,
    pub(crate) machine: MachineInfo,
    pub(crate) status: Arc<Mutex<HeartbeatStatus>>,
    /// Read at each beat: an application that uses gateway rules reports `app_type=1`.
    pub(crate) engine: crate::Sentinel,
}

/// The type reported: the one configured, or 1 (gateway) for a common application (0) that uses gateway
/// rules or a gateway layer, so that the dashboard shows its gateway pages.
fn app_type(configured: u8, engine: &crate::Sentinel) -> u8 {
    #[cfg(feature = "tower")]
    if configured == 0 && engine.uses_gateway() {
        return 1;
    }
    let _ = engine;
    configured
}

impl Heartbeat {
    fn form(&self) -> String {
        let m = &self.machine;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
        form_urlencoded::Serializer::new(String::new())
            .append_pair("hostname", &m.hostname)
            .append_pair("ip", &m.ip)
            .append_pair("app", &m.app)
            .append_pair("app_type", &app_type(m.app_type, &self.engine).to_string())
            .append_pair("port", &m.port.to_string())
            .append_pair("v", &version())
            .append_pair("version", &now.to_string())
            .finish()
    }

    /// Beats until the server stops.
    pub(crate) async fn run(self) {
        let mut failures: u32 = 0;
        let mut next = 0usize;
        loop {
            let form = self.form();
            let mut last_error = None;
            let mut accepted = None;
            for k in 0..self.dashboards.len() {
                let i = (next + k) % self.dashboards.len();
                match beat(&self.dashboards[i], form.clone()).await {
                    Ok(()) => {
                        accepted = Some(i);
                        break;
                    }
                    Err(e) => last_error = Some(format!("{}: {e}", self.dashboards[i].authority)),
                }
            }
            let delay = {
                let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
                match accepted {
                    Some(i) => {
                        next = i;
                        failures = 0;
                        s.sent += 1;
                        s.last_dashboard = Some(self.dashboards[i].authority.clone());
                        self.interval
                    }
                    None => {
                        failures = failures.saturating_add(1);
                        s.failed += 1;
                        if failures == 1 || failures.is_power_of_two() {
                            tracing::warn!(error = ?last_error, failures, "heartbeat to the Sentinel Dashboard failed");
                        }
                        s.last_error = last_error;
                        let backoff = Duration::from_secs(1u64 << (failures - 1).min(6));
                        backoff.min(MAX_HEARTBEAT_BACKOFF)
                    }
                }
            };
            tokio::time::sleep(delay).await;
        }
    }
}

async fn beat(d: &Dashboard, form: String) -> Result<(), String> {
    let stream = tokio::time::timeout(TIMEOUT, tokio::net::TcpStream::connect(&d.authority))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| format!("cannot connect: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    let conn = tokio::spawn(conn);
    let result = async {
        let req = Request::post(HEARTBEAT_PATH)
            .header(HOST, &d.authority)
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded; charset=UTF-8")
            .header(CONNECTION, "close")
            .body(Full::new(Bytes::from(form)))
            .map_err(|e| e.to_string())?;
        let resp = tokio::time::timeout(TIMEOUT, sender.send_request(req))
            .await
            .map_err(|_| "no answer within 3 s".to_string())?
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = tokio::time::timeout(TIMEOUT, Limited::new(resp.into_body(), 64 * 1024).collect())
            .await
            .map_err(|_| "answer not read within 3 s".to_string())?
            .map_err(|e| e.to_string())?
            .to_bytes();
        if !status.is_success() {
            return Err(format!("answered {status}"));
        }
        // The dashboard's `Result`: `{"success":false,"code":-1,"msg":"invalid ip: ..."}` is a refusal.
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body)
            && v.get("success").and_then(|s| s.as_bool()) == Some(false)
        {
            let msg = v.get("msg").and_then(|m| m.as_str()).unwrap_or("refused");
            return Err(format!("refused: {msg}"));
        }
        Ok(())
    }
    .await;
    conn.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "tower")]
    #[test]
    fn a_common_application_reports_the_gateway_type_once_it_uses_gateway_rules() {
        use crate::web::gateway::GatewayFlowRule;
        let engine = crate::Sentinel::builder().build();
        assert_eq!(app_type(0, &engine), 0);
        engine.load_gateway_rules([GatewayFlowRule::new("route").count(1.0)]).unwrap();
        assert_eq!(app_type(0, &engine), 1, "the dashboard shows its gateway pages for type 1");
        assert_eq!(app_type(12, &engine), 12, "a type set by the application stays");
        let layered = crate::Sentinel::builder().build();
        let _layer = crate::web::SentinelLayer::new(&layered).gateway(crate::web::TrustedProxies::none());
        assert_eq!(app_type(0, &layered), 1, "a gateway layer, before any rule is pushed");
    }

    #[test]
    fn dashboard_addresses_are_parsed_like_java() {
        let got = parse_dashboards(" http://127.0.0.1:8080, dash.example ,[::1]:9000,localhost:8081/ ").unwrap();
        let auth: Vec<&str> = got.iter().map(|d| d.authority.as_str()).collect();
        assert_eq!(auth, ["127.0.0.1:8080", "dash.example:80", "[::1]:9000", "localhost:8081"]);
        assert_eq!(parse_dashboards("").unwrap(), vec![]);
        for bad in ["https://x:1", "x:0", "x:port", "http://a/b", "[::1:80"] {
            let e = parse_dashboards(bad).unwrap_err();
            assert_eq!(e.address, bad, "{e}");
        }
    }
}
