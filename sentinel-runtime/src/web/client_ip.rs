//! The client's address: the peer, or the address a trusted proxy forwarded in `X-Forwarded-For`.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

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
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    /// IPv4 networks as (network address, mask), and IPv6 ones likewise: a test is a mask and a compare.
    v4: Vec<(u32, u32)>,
    v6: Vec<(u128, u128)>,
}

/// The header that proxies append the address they received a request from to.
const X_FORWARDED_FOR: http::HeaderName = http::HeaderName::from_static("x-forwarded-for");

impl std::fmt::Debug for TrustedProxies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v4 = self.v4.iter().map(|&(n, m)| IpNet::V4(Ipv4Net::new_assert(n.into(), m.leading_ones() as u8)));
        let v6 = self.v6.iter().map(|&(n, m)| IpNet::V6(Ipv6Net::new_assert(n.into(), m.leading_ones() as u8)));
        f.debug_tuple("TrustedProxies").field(&v4.chain(v6).map(|n| n.to_string()).collect::<Vec<_>>()).finish()
    }
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

    /// Proxies from text: each an address (`192.0.2.7`, `::1`) or a network (`10.0.0.0/8`). An IPv4 address
    /// or network may be given mapped into IPv6 (`::ffff:192.0.2.7`, `::ffff:10.0.0.0/104`): it is the same
    /// proxy, trusted whichever way its peer address is written.
    pub fn new<I, S>(proxies: I) -> Result<Self, InvalidProxy>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nets: Vec<IpNet> = proxies
            .into_iter()
            .map(|p| {
                let p = p.as_ref().trim();
                p.parse::<IpNet>()
                    .or_else(|_| p.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| InvalidProxy { value: p.to_string() })
            })
            .collect::<Result<_, _>>()?;
        Ok(TrustedProxies::of(nets))
    }

    /// Proxies as networks.
    pub fn from_networks(nets: impl IntoIterator<Item = IpNet>) -> Self {
        TrustedProxies::of(nets)
    }

    /// Loopback and the private networks (`127.0.0.0/8`, `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`,
    /// `::1`, `fc00::/7`): a service behind a load balancer inside its own network.
    pub fn private_networks() -> Self {
        let nets = ["127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "::1/128", "fc00::/7"];
        TrustedProxies::of(nets.iter().filter_map(|n| n.parse().ok()))
    }

    /// Networks split by family, each kept as its network address and mask. An address is checked as IPv4
    /// when it is one mapped into IPv6 (`::ffff:a.b.c.d`), so IPv4-mapped networks are kept as the IPv4
    /// networks they are (`::ffff:a.b.c.d/96+n` as `a.b.c.d/n`), and an IPv6 network that holds every mapped
    /// address (`::/0`, `::ffff:0:0/96`) holds every IPv4 address too: either spelling of a proxy trusts it.
    fn of(nets: impl IntoIterator<Item = IpNet>) -> Self {
        let mut proxies = TrustedProxies::default();
        for net in nets {
            match net {
                IpNet::V4(n) => proxies.push_v4(n),
                IpNet::V6(n) => match mapped_v4(n) {
                    Some(n) => proxies.push_v4(n),
                    None => {
                        if n.contains(&Ipv4Addr::UNSPECIFIED.to_ipv6_mapped()) {
                            proxies.push_v4(Ipv4Net::default());
                        }
                        proxies.v6.push((n.network().to_bits(), n.netmask().to_bits()));
                    }
                },
            }
        }
        proxies
    }

    fn push_v4(&mut self, n: Ipv4Net) {
        self.v4.push((n.network().to_bits(), n.netmask().to_bits()));
    }

    /// Whether `ip` is a trusted proxy.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match canonical(ip) {
            IpAddr::V4(a) => self.v4.iter().any(|&(net, mask)| a.to_bits() & mask == net),
            IpAddr::V6(a) => self.v6.iter().any(|&(net, mask)| a.to_bits() & mask == net),
        }
    }

    fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    /// The client's address for `req` (see the type's docs); `None` when the peer address is unknown.
    pub fn client_ip(&self, req: &RequestView<'_>) -> Option<IpAddr> {
        self.client(req).map(|(ip, _)| ip)
    }

    /// The client's address as text, as `Display` writes it: the `X-Forwarded-For` hop itself when it is
    /// written so already (a plain IPv4 address, whose text has one form), so that the common proxied request
    /// costs no allocation; the address written out otherwise.
    pub(crate) fn client_ip_text<'a>(&self, req: &RequestView<'a>) -> Option<Cow<'a, str>> {
        self.client_ip_text_in_place(req).map(ClientIpText::into_cow)
    }

    /// [`client_ip_text`](Self::client_ip_text) without an allocation: an address that is not borrowed from
    /// the request is written on the stack.
    pub(crate) fn client_ip_text_in_place<'a>(&self, req: &RequestView<'a>) -> Option<ClientIpText<'a>> {
        Some(match self.client(req)? {
            (_, Some(text)) => ClientIpText::Hop(text),
            (ip, None) => ClientIpText::Written(IpText::of(ip)),
        })
    }

    /// The client's address as Java's gateway adapters write it (`InetAddress.getHostAddress`): an IPv6
    /// address as its eight groups in hexadecimal, none left out (`0:0:0:0:0:0:0:1`); an IPv4 one as
    /// [`client_ip_text`](Self::client_ip_text) writes it.
    pub(crate) fn client_ip_text_java<'a>(&self, req: &RequestView<'a>) -> Option<Cow<'a, str>> {
        self.client_ip_text_java_in_place(req).map(ClientIpText::into_cow)
    }

    /// [`client_ip_text_java`](Self::client_ip_text_java) without an allocation.
    pub(crate) fn client_ip_text_java_in_place<'a>(&self, req: &RequestView<'a>) -> Option<ClientIpText<'a>> {
        Some(match self.client(req)? {
            (IpAddr::V6(v6), _) => ClientIpText::Written(IpText::java_v6(v6)),
            (_, Some(text)) => ClientIpText::Hop(text),
            (ip, None) => ClientIpText::Written(IpText::of(ip)),
        })
    }

    /// The walk behind [`client_ip`](Self::client_ip): the address, and the hop's text when the address is an
    /// `X-Forwarded-For` hop written as `Display` writes it.
    fn client<'a>(&self, req: &RequestView<'a>) -> Option<(IpAddr, Option<&'a str>)> {
        let peer = canonical(req.peer_addr()?.ip());
        if self.is_empty() || !self.contains(peer) {
            return Some((peer, None));
        }
        let mut nearest = (peer, None);
        let hops = req.headers().get_all(X_FORWARDED_FOR).iter().rev().flat_map(|v| {
            // A header that is not visible ASCII ends the walk (as a malformed hop does).
            let s = v.to_str().unwrap_or("\u{0}");
            s.rsplit(',')
        });
        for hop in hops.take(MAX_HOPS) {
            let Some(found) = parse_hop(hop) else {
                // A malformed hop: nothing to its left can be believed.
                return Some(nearest);
            };
            if !self.contains(found.0) {
                return Some(found);
            }
            nearest = found;
        }
        Some(nearest)
    }
}

/// An IPv6 network inside the IPv4-mapped range (`::ffff:a.b.c.d/96+n`) as the IPv4 network it is
/// (`a.b.c.d/n`); `None` for any other network.
fn mapped_v4(n: Ipv6Net) -> Option<Ipv4Net> {
    let len = n.prefix_len().checked_sub(96)?;
    let v4 = n.network().to_ipv4_mapped()?;
    Ipv4Net::new(v4, len).ok()
}

/// An IPv4 address mapped into IPv6 (`::ffff:a.b.c.d`) is the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// One `X-Forwarded-For` hop: an address, possibly with a port (`1.2.3.4:80`, `[::1]:80`), and the hop's
/// text when it is the address as `Display` writes it. A plain IPv4 literal is: the parser takes exactly
/// four decimal octets without leading zeros, the one form `Display` writes.
fn parse_hop(hop: &str) -> Option<(IpAddr, Option<&str>)> {
    let hop = hop.trim();
    if let Ok(v4) = hop.parse::<Ipv4Addr>() {
        return Some((IpAddr::V4(v4), Some(hop)));
    }
    // Not IPv4: IPv6, or either with a port.
    let ip = hop.parse::<Ipv6Addr>().map(IpAddr::V6).ok().or_else(|| hop.parse::<SocketAddr>().ok().map(|a| a.ip()))?;
    Some((canonical(ip), None))
}

/// The client's address as text: the `X-Forwarded-For` hop as the request wrote it, or the address written
/// out on the stack.
pub(crate) enum ClientIpText<'a> {
    Hop(&'a str),
    Written(IpText),
}

impl<'a> ClientIpText<'a> {
    /// The text, borrowed from the request or owned.
    fn into_cow(self) -> Cow<'a, str> {
        match self {
            ClientIpText::Hop(text) => Cow::Borrowed(text),
            ClientIpText::Written(text) => Cow::Owned(text.as_str().to_owned()),
        }
    }
}

impl ClientIpText<'_> {
    /// The text.
    pub(crate) fn as_str(&self) -> &str {
        match self {
            ClientIpText::Hop(text) => text,
            ClientIpText::Written(text) => text.as_str(),
        }
    }
}

/// An address as text, as `Display` writes it, on the stack (the longest, an IPv6 address with an IPv4 tail,
/// is 45 bytes). IPv4 (the common case) is written without the formatting machinery, which costs several times
/// the rest of a hot-parameter check.
pub(crate) struct IpText {
    bytes: [u8; IP_TEXT_MAX],
    len: u8,
}

const IP_TEXT_MAX: usize = 45;

impl IpText {
    /// Java's `Inet6Address.getHostAddress`: `x:x:x:x:x:x:x:x`, each group in lower-case hexadecimal without
    /// leading zeros (at most 39 bytes).
    fn java_v6(v6: std::net::Ipv6Addr) -> IpText {
        let mut t = IpText { bytes: [0; IP_TEXT_MAX], len: 0 };
        let mut rest: &mut [u8] = &mut t.bytes;
        for (i, g) in v6.segments().into_iter().enumerate() {
            let sep = if i == 0 { "" } else { ":" };
            // 8 groups of at most 4 digits and 7 colons fit in the buffer: nothing is cut.
            let _ = std::io::Write::write_fmt(&mut rest, format_args!("{sep}{g:x}"));
        }
        t.len = (IP_TEXT_MAX - rest.len()) as u8;
        t
    }

    fn of(ip: IpAddr) -> IpText {
        let mut t = IpText { bytes: [0; IP_TEXT_MAX], len: 0 };
        let v4 = match ip {
            IpAddr::V4(v4) => v4,
            IpAddr::V6(v6) => {
                let mut rest: &mut [u8] = &mut t.bytes;
                // `Display` writes an IPv6 address in at most 45 bytes, so the buffer takes all of it; were it
                // to take less, the text would be cut, never overrun.
                let _ = std::io::Write::write_fmt(&mut rest, format_args!("{v6}"));
                let left = rest.len();
                t.len = (IP_TEXT_MAX - left) as u8;
                return t;
            }
        };
        let (buf, mut n) = (&mut t.bytes, 0);
        for (i, octet) in v4.octets().into_iter().enumerate() {
            if i > 0 {
                buf[n] = b'.';
                n += 1;
            }
            if octet >= 100 {
                buf[n] = b'0' + octet / 100;
                n += 1;
            }
            if octet >= 10 {
                buf[n] = b'0' + octet / 10 % 10;
                n += 1;
            }
            buf[n] = b'0' + octet % 10;
            n += 1;
        }
        t.len = n as u8;
        t
    }

    /// The text.
    pub(crate) fn as_str(&self) -> &str {
        // SAFETY: `bytes[..len]` holds only what `of` wrote: the ASCII digits and dots of an IPv4 address, or
        // the ASCII text `Display` writes for an IPv6 address (cut, if ever, between two ASCII bytes), so it is
        // valid UTF-8 (checking it would cost as much as writing it).
        unsafe { std::str::from_utf8_unchecked(&self.bytes[..self.len as usize]) }
    }
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
    fn a_forwarded_ipv4_hop_is_borrowed_as_written_and_other_addresses_are_written_out() {
        let p = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
        let text = |peer: &str, xff: &[&str]| {
            let mut b = Request::get("/");
            for v in xff {
                b = b.header("x-forwarded-for", *v);
            }
            let mut req = b.body(()).unwrap();
            req.extensions_mut().insert(PeerAddr(format!("{peer}:4000").parse().unwrap()));
            let view = RequestView::new(&req);
            let by_address = p.client_ip(&view).map(|ip| ip.to_string());
            let t = p.client_ip_text(&view).map(|t| (matches!(t, Cow::Borrowed(_)), t.into_owned()));
            assert_eq!(t.as_ref().map(|(_, s)| s), by_address.as_ref(), "the text is the address's Display");
            t
        };
        let borrowed = |s: &str| Some((true, s.to_string()));
        let owned = |s: &str| Some((false, s.to_string()));
        assert_eq!(text("10.0.0.2", &["6.6.6.6, 198.51.100.4 , 10.0.0.1"]), borrowed("198.51.100.4"));
        assert_eq!(text("10.0.0.2", &["10.9.9.9, 10.0.0.1"]), borrowed("10.9.9.9"));
        assert_eq!(text("10.0.0.2", &["198.51.100.4:5555"]), owned("198.51.100.4"));
        assert_eq!(text("10.0.0.2", &["2001:DB8::7"]), owned("2001:db8::7"));
        assert_eq!(text("10.0.0.2", &["::ffff:192.0.2.1"]), owned("192.0.2.1"));
        assert_eq!(text("10.0.0.2", &["198.051.100.4"]), owned("10.0.0.2"), "a leading zero is malformed");
        assert_eq!(text("10.0.0.2", &[]), owned("10.0.0.2"));
        assert_eq!(text("203.0.113.9", &["1.1.1.1"]), owned("203.0.113.9"));
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        let mut v4: Vec<Ipv4Addr> = vec![Ipv4Addr::UNSPECIFIED, Ipv4Addr::BROADCAST, Ipv4Addr::LOCALHOST];
        for a in [0u8, 1, 9, 10, 11, 99, 100, 101, 109, 110, 199, 200, 249, 250, 255] {
            v4.push(Ipv4Addr::new(a, 255 - a, a / 2, a.wrapping_mul(7)));
        }
        for ip in v4 {
            assert_eq!(IpText::of(IpAddr::V4(ip)).as_str(), ip.to_string());
        }
        let v6 = [
            "::1",
            "2001:db8::7",
            "::ffff:10.0.0.1",
            "::ffff:255.255.255.255",
            "::255.255.255.255",
            "1:2:3:4:5:6:7:8",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "fe80::ffff:ffff:ffff:ffff",
        ];
        for ip in v6.map(|a| a.parse::<Ipv6Addr>().unwrap()) {
            assert_eq!(IpText::of(IpAddr::V6(ip)).as_str(), ip.to_string());
        }
    }

    #[test]
    fn networks_match_by_prefix_in_their_own_family_and_print_as_given() {
        let p = TrustedProxies::new(["10.1.2.3/8", "192.168.7.7", "fd00::/8", "::1"]).unwrap();
        for yes in ["10.255.0.1", "10.0.0.0", "192.168.7.7", "fd12::1", "::1", "::ffff:10.9.9.9"] {
            assert!(p.contains(yes.parse().unwrap()), "{yes}");
        }
        for no in ["11.0.0.1", "192.168.7.8", "fe00::1", "::2", "9.255.255.255"] {
            assert!(!p.contains(no.parse().unwrap()), "{no}");
        }
        assert_eq!(format!("{p:?}"), r#"TrustedProxies(["10.0.0.0/8", "192.168.7.7/32", "fd00::/8", "::1/128"])"#);
        assert!(!TrustedProxies::none().contains("10.0.0.1".parse().unwrap()));
    }

    #[test]
    fn a_proxy_given_as_an_ipv4_mapped_address_is_trusted() {
        let p = TrustedProxies::new(["::ffff:10.0.0.1", "::ffff:192.168.0.0/112"]).unwrap();
        assert!(p.contains("::ffff:10.0.0.1".parse().unwrap()), "the configured address itself");
        assert!(p.contains("10.0.0.1".parse().unwrap()), "the same peer, as IPv4");
        assert!(p.contains("::ffff:192.168.3.4".parse().unwrap()), "an address of the configured network");
        // Behind that proxy, the client is the forwarded address, not the proxy for every client.
        assert_eq!(client(&p, "[::ffff:10.0.0.1]", &["203.0.113.9"]), ip("203.0.113.9"));
    }

    #[test]
    fn either_spelling_of_an_ipv4_network_trusts_both_spellings_of_its_addresses() {
        let mapped = TrustedProxies::new(["::ffff:10.0.0.0/104", "::FFFF:192.0.2.7/128"]).unwrap();
        assert_eq!(mapped, TrustedProxies::new(["10.0.0.0/8", "192.0.2.7"]).unwrap(), "kept as the IPv4 networks");
        for yes in ["10.1.2.3", "::ffff:10.1.2.3", "192.0.2.7", "::ffff:192.0.2.7"] {
            assert!(mapped.contains(yes.parse().unwrap()), "{yes}");
        }
        for no in ["11.0.0.1", "::ffff:11.0.0.1", "192.0.2.8", "::a00:1", "10::1"] {
            assert!(!mapped.contains(no.parse().unwrap()), "{no}");
        }
        // An IPv6 network that holds the whole mapped range holds every IPv4 address, as either spelling.
        for wide in ["::/0", "::ffff:0:0/96", "::fffe:0:0/95"] {
            let p = TrustedProxies::new([wide]).unwrap();
            for yes in ["8.8.8.8", "::ffff:8.8.8.8"] {
                assert!(p.contains(yes.parse().unwrap()), "{wide} holds {yes}");
            }
        }
        assert!(TrustedProxies::new(["::/0"]).unwrap().contains("2001:db8::1".parse().unwrap()));
        assert!(!TrustedProxies::new(["::ffff:0:0/96"]).unwrap().contains("2001:db8::1".parse().unwrap()));
        for narrow in ["2001:db8::/32", "::/96", "fc00::/7"] {
            assert!(!TrustedProxies::new([narrow]).unwrap().contains("10.0.0.1".parse().unwrap()), "{narrow}");
        }
    }

    #[test]
    fn invalid_proxies_are_named_in_the_error() {
        let e = TrustedProxies::new(["10.0.0.0/8", "proxy.local"]).unwrap_err();
        assert_eq!(e.value, "proxy.local");
        assert!(e.to_string().contains("proxy.local"));
    }
}
