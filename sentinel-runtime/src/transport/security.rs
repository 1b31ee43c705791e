//! Who may use the command server: the bind policy, the token, and the checks against browsers.
//!
//! - Bound to a loopback address (the default), only processes of this machine reach it. Every request must
//!   then name a loopback host (`127.0.0.1`, `localhost`, `[::1]`): a web page whose domain resolves to
//!   127.0.0.1 (DNS rebinding) is refused.
//! - Bound anywhere else, the server refuses to start without a token.
//! - With a token, every write command (and, if asked, every read) needs `Authorization: Bearer <token>`;
//!   the comparison takes the same time wherever the tokens differ.
//! - With an allow list, only the peers it names reach the server at all (`403` for the others); a trusted
//!   peer (the Sentinel Dashboard's address: it cannot send a token) needs no token.
//! - A write that a browser sends from another site (its `Origin` is not this server, or `Sec-Fetch-Site`
//!   says cross-site) is refused, so a page the user visits cannot change rules through the user's browser.

use std::net::IpAddr;

use hyper::header::{HeaderMap, AUTHORIZATION, HOST, ORIGIN};
use subtle::ConstantTimeEq;

/// The header a token travels in.
pub const TOKEN_HEADER: &str = "Authorization";

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No token, or the wrong one (401).
    Unauthorized { write: bool },
    /// A loopback server asked for under a name that is not loopback (403).
    ForeignHost(String),
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
            Denied::ForeignHost(h) => format!(
                "Forbidden: this command center listens on loopback only and does not answer for host `{h}` \
                 (use 127.0.0.1, localhost or [::1])"
            ),
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
}

impl Access {
    pub(crate) fn new(token: Option<String>, reads_need_token: bool, loopback: bool) -> Self {
        Access {
            token: token.map(|t| t.into_bytes().into_boxed_slice()),
            reads_need_token,
            loopback,
            allowed: Vec::new(),
            trusted: Vec::new(),
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

    /// Checks that a loopback server is asked for under a loopback name.
    pub(crate) fn check_host(&self, headers: &HeaderMap) -> Result<(), Denied> {
        if self.loopback {
            if let Some(host) = headers.get(HOST).and_then(|h| h.to_str().ok()) {
                if !is_loopback_host(host) {
                    return Err(Denied::ForeignHost(host.chars().take(100).collect()));
                }
            }
        }
        Ok(())
    }

    /// Checks a request for a command from `peer` (`write`: it changes something).
    pub(crate) fn check(&self, headers: &HeaderMap, peer: IpAddr, write: bool) -> Result<(), Denied> {
        self.check_peer(peer)?;
        self.check_host(headers)?;
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

/// Whether `host` (a `Host` header: name or address, optional port) names this machine's loopback.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [v6]:port
        match rest.split_once(']') {
            Some((addr, _)) => addr,
            None => return false,
        }
    } else {
        host.rsplit_once(':').map_or(host, |(h, port)| if port.bytes().all(|b| b.is_ascii_digit()) { h } else { host })
    };
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn is_cross_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if !matches!(site, "same-origin" | "none") {
            return true;
        }
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
        assert_eq!(access.check(&headers(&[]), LOCAL, false), Err(Denied::NotAllowed(LOCAL)));
        assert_eq!(access.check(&headers(&[]), dashboard, true), Ok(()), "trusted: no token needed");
        let mapped: IpAddr = "::ffff:10.0.0.9".parse().unwrap();
        assert_eq!(access.check(&headers(&[]), mapped, true), Ok(()), "an IPv4 peer on a v6 socket");
        let open = Access::new(Some("token-token-token".into()), false, false);
        assert_eq!(open.check(&headers(&[]), LOCAL, true), Err(Denied::Unauthorized { write: true }));
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
            access.check(&headers(&[("host", "rebound.example:8719")]), LOCAL, false),
            Err(Denied::ForeignHost(_))
        ));
        assert_eq!(access.check(&headers(&[("host", "127.0.0.1:8719")]), LOCAL, true), Ok(()));
    }

    #[test]
    fn the_token_is_needed_for_writes_and_optionally_for_reads() {
        let access = Access::new(Some("s3cret-token".into()), false, false);
        assert_eq!(access.check(&headers(&[]), LOCAL, false), Ok(()));
        assert_eq!(access.check(&headers(&[]), LOCAL, true), Err(Denied::Unauthorized { write: true }));
        assert_eq!(
            access.check(&headers(&[("authorization", "Bearer wrong")]), LOCAL, true),
            Err(Denied::Unauthorized { write: true })
        );
        assert_eq!(access.check(&headers(&[("authorization", "Bearer s3cret-token")]), LOCAL, true), Ok(()));
        assert_eq!(
            access.check(&headers(&[("authorization", "s3cret-token")]), LOCAL, true),
            Err(Denied::Unauthorized { write: true })
        );
        let strict = Access::new(Some("t".into()), true, false);
        assert_eq!(strict.check(&headers(&[]), LOCAL, false), Err(Denied::Unauthorized { write: false }));
    }

    #[test]
    fn writes_from_other_sites_are_refused() {
        let access = Access::new(None, false, true);
        let same = headers(&[
            ("host", "127.0.0.1:8719"),
            ("origin", "http://127.0.0.1:8719"),
            ("sec-fetch-site", "same-origin"),
        ]);
        assert_eq!(access.check(&same, LOCAL, true), Ok(()));
        let other = headers(&[("host", "127.0.0.1:8719"), ("origin", "https://evil.example")]);
        assert_eq!(access.check(&other, LOCAL, true), Err(Denied::CrossSite));
        assert_eq!(access.check(&other, LOCAL, false), Ok(()), "reads are not refused for it");
        let fetch = headers(&[("host", "127.0.0.1:8719"), ("sec-fetch-site", "cross-site")]);
        assert_eq!(access.check(&fetch, LOCAL, true), Err(Denied::CrossSite));
        assert_eq!(
            access.check(&headers(&[("host", "127.0.0.1:8719")]), LOCAL, true),
            Ok(()),
            "curl and the dashboard"
        );
    }
}
