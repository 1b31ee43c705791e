//! The client's address: the peer, or the address a trusted proxy forwarded in `X-Forwarded-For`.

use std::net::IpAddr;

use ipnet::IpNet;

use super::request::RequestView;

/// At most this many `X-Forwarded-For` hops are examined (a hostile header costs bounded time).
const MAX_HOPS: usize = 32;

/// The proxies whose `X-Forwarded-For` header the layer believes, as networks (`10.0.0.0/8`) or addresses.
///
/// Without trusted proxies the client is the peer of the connection, whatever the request says. When the
/// peer is trusted, the client is the first address, from the right of `X-Forwarded-For`, that is not a
/// trusted proxy (each proxy appends the address it received the request from), so a client cannot spoof
/// its address by sending its own header.
///
/// ```
/// use sentinel_runtime::web::TrustedProxies;
/// let proxies = TrustedProxies::new(["10.0.0.0/8", "::1"]).unwrap();
/// assert!(proxies.contains("10.1.2.3".parse().unwrap()));
/// assert!(TrustedProxies::new(["10.0.0.0/33"]).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

/// A trusted proxy that is neither an address nor a network.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("trusted proxy `{value}` is neither an IP address nor a network (`10.0.0.0/8`, `fd00::/8`); fix or remove it")]
pub struct InvalidProxy {
    /// The value as given.
    pub value: String,
}

impl TrustedProxies {
    /// No trusted proxies: the client is always the peer.
    pub fn none() -> Self {
        TrustedProxies::default()
    }

    /// Proxies from text: each an address (`192.0.2.7`, `::1`) or a network (`10.0.0.0/8`).
    pub fn new<I, S>(proxies: I) -> Result<Self, InvalidProxy>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nets = proxies
            .into_iter()
            .map(|p| {
                let p = p.as_ref().trim();
                p.parse::<IpNet>()
                    .or_else(|_| p.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| InvalidProxy { value: p.to_string() })
            })
            .collect::<Result<_, _>>()?;
        Ok(TrustedProxies { nets })
    }

    /// Proxies as networks.
    pub fn from_networks(nets: impl IntoIterator<Item = IpNet>) -> Self {
        TrustedProxies { nets: nets.into_iter().collect() }
    }

    /// Loopback and the private networks (`127.0.0.0/8`, `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`,
    /// `::1`, `fc00::/7`): a service behind a load balancer inside its own network.
    pub fn private_networks() -> Self {
        let nets = ["127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "::1/128", "fc00::/7"];
        TrustedProxies { nets: nets.iter().filter_map(|n| n.parse().ok()).collect() }
    }

    /// Whether `ip` is a trusted proxy.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.nets.iter().any(|n| n.contains(&ip))
    }

    /// The client's address for `req` (see the type's docs); `None` when the peer address is unknown.
    pub fn client_ip(&self, req: &RequestView<'_>) -> Option<IpAddr> {
        let peer = canonical(req.peer_addr()?.ip());
        if self.nets.is_empty() || !self.contains(peer) {
            return Some(peer);
        }
        let mut nearest = peer;
        let hops = req.headers().get_all("x-forwarded-for").iter().rev().flat_map(|v| {
            // A header that is not visible ASCII ends the walk (as a malformed hop does).
            let s = v.to_str().unwrap_or("\u{0}");
            s.rsplit(',')
        });
        for hop in hops.take(MAX_HOPS) {
            let Some(ip) = parse_hop(hop) else {
                // A malformed hop: nothing to its left can be believed.
                return Some(nearest);
            };
            if !self.contains(ip) {
                return Some(ip);
            }
            nearest = ip;
        }
        Some(nearest)
    }
}

/// An IPv4 address mapped into IPv6 (`::ffff:a.b.c.d`) is the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// One `X-Forwarded-For` hop: an address, possibly with a port (`1.2.3.4:80`, `[::1]:80`).
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    hop.parse::<IpAddr>().ok().or_else(|| hop.parse::<std::net::SocketAddr>().ok().map(|a| a.ip())).map(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::web::PeerAddr;
    use http::Request;

    fn client(proxies: &TrustedProxies, peer: &str, xff: &[&str]) -> Option<IpAddr> {
        let mut b = Request::get("/");
        for v in xff {
            b = b.header("x-forwarded-for", *v);
        }
        let mut req = b.body(()).unwrap();
        req.extensions_mut().insert(PeerAddr(format!("{peer}:4000").parse().unwrap()));
        proxies.client_ip(&RequestView::new(&req))
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
        let p = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
        assert_eq!(client(&p, "203.0.113.9", &["1.1.1.1"]), ip("203.0.113.9"));
        assert_eq!(client(&TrustedProxies::none(), "10.0.0.1", &["1.1.1.1"]), ip("10.0.0.1"));
    }

    #[test]
    fn behind_trusted_proxies_the_rightmost_untrusted_hop_is_the_client() {
        let p = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
        // The client put a fake address first; the proxies appended the real one and each other.
        assert_eq!(client(&p, "10.0.0.2", &["6.6.6.6, 198.51.100.4, 10.0.0.1"]), ip("198.51.100.4"));
        // Several header lines count as one list, in order.
        assert_eq!(client(&p, "10.0.0.2", &["6.6.6.6", "198.51.100.4:5555"]), ip("198.51.100.4"));
        // Only trusted hops: the leftmost one.
        assert_eq!(client(&p, "10.0.0.2", &["10.9.9.9, 10.0.0.1"]), ip("10.9.9.9"));
        // No header: the proxy itself.
        assert_eq!(client(&p, "10.0.0.2", &[]), ip("10.0.0.2"));
    }

    #[test]
    fn a_malformed_hop_stops_the_walk_at_the_nearest_trusted_address() {
        let p = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
        assert_eq!(client(&p, "10.0.0.2", &["1.1.1.1, garbage, 10.0.0.1"]), ip("10.0.0.1"));
        let long = vec!["10.0.0.3"; 100].join(",");
        assert_eq!(client(&p, "10.0.0.2", &[&long]), ip("10.0.0.3"));
    }

    #[test]
    fn ipv4_mapped_ipv6_peers_are_ipv4() {
        let p = TrustedProxies::new(["127.0.0.1"]).unwrap();
        assert!(p.contains("::ffff:127.0.0.1".parse().unwrap()));
        assert_eq!(client(&p, "[::ffff:127.0.0.1]", &["192.0.2.1"]), ip("192.0.2.1"));
    }

    #[test]
    fn invalid_proxies_are_named_in_the_error() {
        let e = TrustedProxies::new(["10.0.0.0/8", "proxy.local"]).unwrap_err();
        assert_eq!(e.value, "proxy.local");
        assert!(e.to_string().contains("proxy.local"));
    }
}
