//! A raw HTTP/1.1 client for tests that must send exact bytes (a replay of another program's requests) and
//! read the answer as it came: status, headers and body, to the end of the connection.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// An answer.
#[derive(Clone, Debug)]
pub struct RawResponse {
    /// The status code.
    pub status: u16,
    /// Header names (lower case) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body (de-chunked when sent chunked).
    pub body: String,
}

impl RawResponse {
    /// The first header named `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Sends `request` (every byte as given) to `addr` and reads the answer: its `Content-Length` bytes, or
/// until the server closes the connection (10 s timeouts). Panics on an I/O error or an answer that is not
/// HTTP.
pub fn raw_request(addr: SocketAddr, request: &[u8]) -> RawResponse {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.write_all(request).expect("send the request");
    let mut bytes = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = match s.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !bytes.is_empty() => 0,
            Err(e) => panic!("read the answer: {e}"),
        };
        if n == 0 {
            break;
        }
        bytes.extend_from_slice(&buf[..n]);
        if complete(&bytes) {
            break;
        }
    }
    parse_response(&bytes).unwrap_or_else(|| panic!("not an HTTP answer: {:?}", String::from_utf8_lossy(&bytes)))
}

/// A `GET path` with a `Host` header and `Connection: close`, plus `extra` header lines (`"Name: value"`).
pub fn get(addr: SocketAddr, path: &str, extra: &[&str]) -> RawResponse {
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for h in extra {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    raw_request(addr, req.as_bytes())
}

/// A form `POST path` of `fields` (URL-encoded here), with `extra` header lines.
pub fn post_form(addr: SocketAddr, path: &str, fields: &[(&str, &str)], extra: &[&str]) -> RawResponse {
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v))).collect();
    let body = body.join("&");
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/x-www-form-urlencoded; charset=UTF-8\r\nContent-Length: {}\r\n",
        body.len()
    );
    for h in extra {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    req.push_str(&body);
    raw_request(addr, req.as_bytes())
}

/// `application/x-www-form-urlencoded` encoding, as Java's `URLEncoder` and Apache's `URLEncodedUtils` do:
/// letters, digits and `.-*_` stay, a space becomes `+`, everything else is `%XX` of its UTF-8 bytes.
pub fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'*' | b'_' => out.push(b as char),
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Whether `bytes` hold a whole answer with a `Content-Length`.
fn complete(bytes: &[u8]) -> bool {
    let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else { return false };
    let head = String::from_utf8_lossy(&bytes[..end]).to_ascii_lowercase();
    let length =
        head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse::<usize>().ok());
    length.is_some_and(|n| bytes.len() >= end + 4 + n)
}

fn parse_response(bytes: &[u8]) -> Option<RawResponse> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&bytes[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = bytes[end + 4..].to_vec();
    if headers.iter().any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked")) {
        body = dechunk(&body)?;
    }
    Some(RawResponse { status, headers, body: String::from_utf8_lossy(&body).into_owned() })
}

fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = b.windows(2).position(|w| w == b"\r\n")?;
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..line_end]).ok()?.split(';').next()?.trim(), 16).ok()?;
        b = &b[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(..size)?);
        b = b.get(size + 2..)?;
    }
}

/// The address of a server reached by these helpers.
pub fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}
