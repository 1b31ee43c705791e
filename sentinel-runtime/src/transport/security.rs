//! Who may use the command server: the bind policy, the token, and the checks against browsers.
//!
//! - Bound to a loopback address (the default), only processes of this machine reach it. Every request must
//!   then name a loopback host (`127.0.0.1`, `localhost`, `[::1]`): a web page whose domain resolves to
//!   127.0.0.1 (DNS rebinding) is refused.
//! - Bound anywhere else, the server refuses to start without a token, and every request (reads too) must
//!   name the server by an IP address, `localhost`, the machine's host name or a name the application
//!   lists: a page of another domain that resolves to this server's address (DNS rebinding) is refused.
//! - With a token, every write command (and, if asked, every read) needs `Authorization: Bearer <token>`;
//!   the comparison takes the same time wherever the tokens differ.
//! - With an allow list, only the peers it names reach the server at all (`403` for the others, before any
//!   of their bytes is read); a trusted peer (the Sentinel Dashboard's address: it cannot send a token)
//!   needs no token.
//! - Write commands are taken by `POST` only (`405` otherwise): a browser sends a `GET` for an `<img>` or a
//!   link of any page, with no `Origin` in browsers without Fetch Metadata. Dashboards older than 1.6 write
//!   by `GET`; an application that must serve them opts in (`GET` writes then pass the other checks).
//! - A write that a browser sends from another site (its `Origin` is not this server, or `Sec-Fetch-Site`
//!   says cross-site) is refused, so a page the user visits cannot change rules through the user's browser.

use std::net::IpAddr;

use hyper::header::{HeaderMap, AUTHORIZATION, HOST, ORIGIN};
use hyper::Method;
use subtle::ConstantTimeEq;

use crate::http_server::PeerClass;

/// The header a token travels in.
pub const TOKEN_HEADER: &str = "Authorization";

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No token, or the wrong one (401).
    Unauthorized { write: bool },
    /// The server asked for under a name it does not answer for (403): not loopback on a loopback bind; on
    /// any other, not an IP address, `localhost`, the host name or a listed name.
    ForeignHost { host: String, loopback: bool },
    /// A write command by another method than `POST` (405), `GET` included unless allowed.
    WriteNeedsPost { method: String, get_allowed: bool },
    /// A write sent by a browser from another site (403).
    CrossSite,
    /// A peer the allow list does not name (403).
    NotAllowed(IpAddr),
}

impl Denied {
    pub(crate) fn message(&self) -> String {
        match self {
            Denied::Unauthorized { write: true } => {
                "Unauthorized: this command changes the application and needs the command center's token \
                 (header `Authorization: Bearer <token>`)"
                    .to_string()
            }
            Denied::Unauthorized { write: false } => {
                "Unauthorized: this command center needs its token for every command \
                 (header `Authorization: Bearer <token>`)"
                    .to_string()
            }
            Denied::ForeignHost { host, loopback: true } => format!(
                "Forbidden: this command center listens on loopback only and does not answer for host `{host}` \
                 (use 127.0.0.1, localhost or [::1])"
            ),
            Denied::ForeignHost { host, loopback: false } => format!(
                "Forbidden: this command center does not answer for host `{host}` (a page of another domain \
                 may resolve to this address): use its IP address, or list the name with \
                 CommandCenterBuilder::allow_host (SENTINEL_COMMAND_HOSTS)"
            ),
            Denied::WriteNeedsPost { method, get_allowed } => {
                let get = if *get_allowed { " or GET" } else { "" };
                let hint = if *get_allowed {
                    ""
                } else {
                    " (dashboards older than 1.6 write by GET: allow it with \
                     CommandCenterBuilder::allow_get_writes or SENTINEL_COMMAND_GET_WRITES=true)"
                };
                format!(
                    "Method Not Allowed: this command changes the application and is taken by POST{get} only, \
                     with its parameters form-encoded; not by {method}{hint}"
                )
            }
            Denied::NotAllowed(ip) => {
                format!("Forbidden: {ip} is not on this command center's allow list")
            }
            Denied::CrossSite => {
                "Forbidden: a write command was sent by a web page of another site; open the console on this \
                 server or use a command-line client"
                    .to_string()
            }
        }
    }
}

/// The access policy of one server.
pub(crate) struct Access {
    token: Option<Box<[u8]>>,
    reads_need_token: bool,
    loopback: bool,
    /// Peers allowed to connect (empty: any peer that reaches the address).
    allowed: Vec<IpAddr>,
    /// Peers that need no token.
    trusted: Vec<IpAddr>,
    /// Whether write commands may come by `GET` (dashboards older than 1.6).
    get_writes: bool,
    /// Host names a non-loopback server answers for, besides IP addresses and `localhost` (lower case).
    hosts: Vec<String>,
}

impl Access {
    pub(crate) fn new(token: Option<String>, reads_need_token: bool, loopback: bool) -> Self {
        Access {
            token: token.map(|t| t.into_bytes().into_boxed_slice()),
            reads_need_token,
            loopback,
            allowed: Vec::new(),
            trusted: Vec::new(),
            get_writes: false,
            hosts: Vec::new(),
        }
    }

    /// Lets write commands come by `GET` too.
    pub(crate) fn with_get_writes(mut self, on: bool) -> Self {
        self.get_writes = on;
        self
    }

    /// The host names a non-loopback server answers for, besides IP addresses and `localhost`.
    pub(crate) fn with_hosts(mut self, hosts: impl IntoIterator<Item = String>) -> Self {
        self.hosts = hosts.into_iter().map(|h| h.trim().to_ascii_lowercase()).filter(|h| !h.is_empty()).collect();
        self
    }

    /// How the server treats `peer` before reading anything from it: refused off the allow list, trusted
    /// (it may take the slots kept for the dashboard), or served.
    pub(crate) fn classify(&self, peer: IpAddr) -> PeerClass {
        match self.check_peer(peer) {
            Err(denied) => PeerClass::Refused(denied.message()),
            Ok(()) if self.trusted.contains(&peer.to_canonical()) => PeerClass::Trusted,
            Ok(()) => PeerClass::Admitted,
        }
    }

    /// Only `allowed` peers may connect; `trusted` ones need no token.
    pub(crate) fn with_peers(mut self, allowed: Vec<IpAddr>, trusted: Vec<IpAddr>) -> Self {
        self.allowed = allowed.into_iter().map(|ip| ip.to_canonical()).collect();
        self.trusted = trusted.into_iter().map(|ip| ip.to_canonical()).collect();
        self
    }

    /// Checks the peer against the allow list (an IPv4 peer of a v6 socket is compared as IPv4).
    pub(crate) fn check_peer(&self, peer: IpAddr) -> Result<(), Denied> {
        let peer = peer.to_canonical();
        if self.allowed.is_empty() || self.allowed.contains(&peer) {
            Ok(())
        } else {
            Err(Denied::NotAllowed(peer))
        }
    }

    /// Checks that the server is asked for under a name it answers for (DNS rebinding): a loopback server
    /// under a loopback name; any other under an IP address, `localhost`, the machine's host name or a
    /// listed name. Reads and writes alike, the console's files too.
    pub(crate) fn check_host(&self, headers: &HeaderMap) -> Result<(), Denied> {
        let Some(host) = headers.get(HOST) else { return Ok(()) };
        let host = host.to_str().unwrap_or("\u{fffd}");
        let answers = if self.loopback { is_loopback_host(host) } else { self.is_own_host(host) };
        if answers {
            Ok(())
        } else {
            Err(Denied::ForeignHost { host: host.chars().take(100).collect(), loopback: self.loopback })
        }
    }

    /// Whether a non-loopback server answers for `host` (a `Host` header: name or address, optional port).
    fn is_own_host(&self, host: &str) -> bool {
        let Some(name) = host_name(host) else { return false };
        if name.parse::<IpAddr>().is_ok() || name.eq_ignore_ascii_case("localhost") {
            // No rebinding through an address: a page is only ever asked for by its own origin's name.
            return true;
        }
        let name = name.to_ascii_lowercase();
        self.hosts.contains(&name)
            || gethostname::gethostname().to_str().is_some_and(|own| !own.is_empty() && own.eq_ignore_ascii_case(&name))
    }

    /// Checks a request for a command from `peer` by `method` (`write`: it changes something).
    pub(crate) fn check(&self, headers: &HeaderMap, peer: IpAddr, method: &Method, write: bool) -> Result<(), Denied> {
        self.check_peer(peer)?;
        self.check_host(headers)?;
        if write && method != Method::POST && !(self.get_writes && method == Method::GET) {
            return Err(Denied::WriteNeedsPost {
                method: method.as_str().chars().take(20).collect(),
                get_allowed: self.get_writes,
            });
        }
        if write && is_cross_site(headers) {
            return Err(Denied::CrossSite);
        }
        if let Some(token) = &self.token {
            let trusted = self.trusted.contains(&peer.to_canonical());
            if (write || self.reads_need_token) && !trusted && !token_matches(headers, token) {
                return Err(Denied::Unauthorized { write });
            }
        }
        Ok(())
    }
}

fn token_matches(headers: &HeaderMap, token: &[u8]) -> bool {
    let Some(given) = headers.get(AUTHORIZATION).map(|v| v.as_bytes()) else { return false };
    let Some(given) = given.strip_prefix(b"Bearer ").or_else(|| given.strip_prefix(b"bearer ")) else {
        return false;
    };
    let given = given.trim_ascii();
    // `ct_eq` on slices of different lengths is false without comparing contents; equal lengths are compared
    // in constant time.
    bool::from(given.ct_eq(token))
}

/// The name or address of a `Host` header, without its port (`None` for a malformed `[v6`).
fn host_name(host: &str) -> Option<&str> {
    if let Some(rest) = host.strip_prefix('[') {
        // [v6]:port
        return rest.split_once(']').map(|(addr, _)| addr);
    }
    Some(
        host.rsplit_once(':').map_or(host, |(h, port)| if port.bytes().all(|b| b.is_ascii_digit()) { h } else { host }),
    )
}

/// Whether `host` (a `Host` header: name or address, optional port) names this machine's loopback.
fn is_loopback_host(host: &str) -> bool {
    let Some(name) = host_name(host) else { return false };
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn is_cross_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && !matches!(site, "same-origin" | "none")
    {
        return true;
    }
    match (headers.get(ORIGIN).and_then(|v| v.to_str().ok()), headers.get(HOST).and_then(|v| v.to_str().ok())) {
        (Some("null"), _) => true,
        (Some(origin), Some(host)) => {
            let authority = origin.split_once("://").map_or(origin, |(_, a)| a);
            !authority.eq_ignore_ascii_case(host)
        }
        (Some(_), None) => true,
        (None, _) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn the_allow_list_and_trusted_peers() {
        let dashboard: IpAddr = "10.0.0.9".parse().unwrap();
        let access =
            Access::new(Some("token-token-token".into()), false, false).with_peers(vec![dashboard], vec![dashboard]);
        assert_eq!(access.check(&headers(&[]), LOCAL, &Method::GET, false), Err(Denied::NotAllowed(LOCAL)));
        assert_eq!(access.check(&headers(&[]), dashboard, &Method::POST, true), Ok(()), "trusted: no token needed");
        let mapped: IpAddr = "::ffff:10.0.0.9".parse().unwrap();
        assert_eq!(access.check(&headers(&[]), mapped, &Method::POST, true), Ok(()), "an IPv4 peer on a v6 socket");
        let open = Access::new(Some("token-token-token".into()), false, false);
        assert_eq!(open.check(&headers(&[]), LOCAL, &Method::POST, true), Err(Denied::Unauthorized { write: true }));
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn loopback_hosts_are_recognised_and_others_refused() {
        for ok in ["127.0.0.1", "127.0.0.1:8719", "localhost:8719", "LOCALHOST", "[::1]:8719", "[::1]", "127.1.2.3"] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in ["evil.example:8719", "10.0.0.1:8719", "[fe80::1]:1", "localhost.evil.example", "[::1"] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
        let access = Access::new(None, false, true);
        assert!(matches!(
            access.check(&headers(&[("host", "rebound.example:8719")]), LOCAL, &Method::GET, false),
            Err(Denied::ForeignHost { loopback: true, .. })
        ));
        assert_eq!(access.check(&headers(&[("host", "127.0.0.1:8719")]), LOCAL, &Method::POST, true), Ok(()));
    }

    #[test]
    fn the_token_is_needed_for_writes_and_optionally_for_reads() {
        let access = Access::new(Some("s3cret-token".into()), false, false);
        assert_eq!(access.check(&headers(&[]), LOCAL, &Method::GET, false), Ok(()));
        assert_eq!(access.check(&headers(&[]), LOCAL, &Method::POST, true), Err(Denied::Unauthorized { write: true }));
        assert_eq!(
            access.check(&headers(&[("authorization", "Bearer wrong")]), LOCAL, &Method::POST, true),
            Err(Denied::Unauthorized { write: true })
        );
        assert_eq!(
            access.check(&headers(&[("authorization", "Bearer s3cret-token")]), LOCAL, &Method::POST, true),
            Ok(())
        );
        assert_eq!(
            access.check(&headers(&[("authorization", "s3cret-token")]), LOCAL, &Method::POST, true),
            Err(Denied::Unauthorized { write: true })
        );
        let strict = Access::new(Some("t".into()), true, false);
        assert_eq!(strict.check(&headers(&[]), LOCAL, &Method::GET, false), Err(Denied::Unauthorized { write: false }));
    }

    #[test]
    fn writes_from_other_sites_are_refused() {
        let access = Access::new(None, false, true);
        let same = headers(&[
            ("host", "127.0.0.1:8719"),
            ("origin", "http://127.0.0.1:8719"),
            ("sec-fetch-site", "same-origin"),
        ]);
        assert_eq!(access.check(&same, LOCAL, &Method::POST, true), Ok(()));
        let other = headers(&[("host", "127.0.0.1:8719"), ("origin", "https://evil.example")]);
        assert_eq!(access.check(&other, LOCAL, &Method::POST, true), Err(Denied::CrossSite));
        assert_eq!(access.check(&other, LOCAL, &Method::GET, false), Ok(()), "reads are not refused for it");
        let fetch = headers(&[("host", "127.0.0.1:8719"), ("sec-fetch-site", "cross-site")]);
        assert_eq!(access.check(&fetch, LOCAL, &Method::POST, true), Err(Denied::CrossSite));
        assert_eq!(
            access.check(&headers(&[("host", "127.0.0.1:8719")]), LOCAL, &Method::POST, true),
            Ok(()),
            "curl and the dashboard"
        );
    }

    #[test]
    fn writes_by_any_method_but_post_are_refused_unless_get_writes_are_allowed() {
        let strict = Access::new(None, false, true);
        let h = headers(&[("host", "127.0.0.1:8719")]);
        for method in [Method::GET, Method::HEAD, Method::PUT, Method::DELETE, Method::OPTIONS, Method::PATCH] {
            assert!(
                matches!(
                    strict.check(&h, LOCAL, &method, true),
                    Err(Denied::WriteNeedsPost { get_allowed: false, .. })
                ),
                "{method}"
            );
            if method == Method::GET || method == Method::HEAD {
                assert_eq!(strict.check(&h, LOCAL, &method, false), Ok(()), "reads by {method} are fine");
            }
        }
        assert_eq!(strict.check(&h, LOCAL, &Method::POST, true), Ok(()));
        let old_dashboards = Access::new(None, false, true).with_get_writes(true);
        assert_eq!(old_dashboards.check(&h, LOCAL, &Method::GET, true), Ok(()));
        assert!(matches!(
            old_dashboards.check(&h, LOCAL, &Method::PUT, true),
            Err(Denied::WriteNeedsPost { get_allowed: true, .. })
        ));
        let cross = headers(&[("host", "127.0.0.1:8719"), ("sec-fetch-site", "cross-site")]);
        assert_eq!(
            old_dashboards.check(&cross, LOCAL, &Method::GET, true),
            Err(Denied::CrossSite),
            "an allowed GET write still passes the other checks"
        );
        let message = Denied::WriteNeedsPost { method: "GET".into(), get_allowed: false }.message();
        assert!(message.contains("POST") && message.contains("allow_get_writes"), "{message}");
    }

    #[test]
    fn a_server_bound_beyond_loopback_answers_only_for_addresses_and_listed_names_reads_included() {
        let access = Access::new(Some("a-long-enough-secret-token".into()), false, false)
            .with_hosts(["Sentinel.Internal".to_string()]);
        for ok in ["10.0.0.5:8719", "10.0.0.5", "[fe80::1]:8719", "localhost:8719", "sentinel.internal:8719"] {
            assert_eq!(access.check(&headers(&[("host", ok)]), LOCAL, &Method::GET, false), Ok(()), "{ok}");
        }
        for bad in ["rebind.example:8719", "10.0.0.5.nip.io:8719", "sentinel.internal.evil.example", "[fe80::1"] {
            for (method, write) in [(Method::GET, false), (Method::HEAD, false), (Method::POST, true)] {
                assert!(
                    matches!(
                        access.check(&headers(&[("host", bad)]), LOCAL, &method, write),
                        Err(Denied::ForeignHost { loopback: false, .. })
                    ),
                    "{bad} by {method}"
                );
            }
            assert!(access.check_host(&headers(&[("host", bad)])).is_err(), "the console's files: {bad}");
        }
        let own = gethostname::gethostname().to_string_lossy().into_owned();
        if !own.is_empty() {
            let mut h = HeaderMap::new();
            h.insert(HOST, own.to_ascii_uppercase().parse().unwrap());
            assert_eq!(access.check_host(&h), Ok(()), "{own}");
        }
        let message = access.check_host(&headers(&[("host", "rebind.example")])).unwrap_err().message();
        assert!(message.contains("allow_host"), "{message}");
    }

    #[test]
    fn peers_are_sorted_before_anything_is_read() {
        let dashboard: IpAddr = "10.0.0.9".parse().unwrap();
        let access = Access::new(Some("token-token-token".into()), false, false)
            .with_peers(vec![dashboard, LOCAL], vec![dashboard]);
        assert_eq!(access.classify(dashboard), PeerClass::Trusted);
        assert_eq!(access.classify("::ffff:10.0.0.9".parse().unwrap()), PeerClass::Trusted);
        assert_eq!(access.classify(LOCAL), PeerClass::Admitted);
        let stranger: IpAddr = "10.0.0.10".parse().unwrap();
        assert!(matches!(access.classify(stranger), PeerClass::Refused(m) if m.contains("allow list")));
        assert_eq!(Access::new(None, false, true).classify(stranger), PeerClass::Admitted, "no allow list");
    }
}
