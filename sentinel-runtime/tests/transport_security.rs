//! The command center's security defaults and limits, against real sockets.
#![cfg(feature = "transport")]

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::time::{Duration, Instant};

use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::transport::{CommandCenter, StartError, COMMAND_RESOURCE};
use sentinel_runtime::Sentinel;
use sentinel_testkit::http::{get, post_form, raw_request};

const T0: u64 = 1_700_000_000_000;

fn engine() -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(T0);
    (Sentinel::builder().manual_clock(clock.clone()).build(), clock)
}

#[test]
fn a_non_loopback_bind_without_a_token_fails_to_start() {
    let (engine, _) = engine();
    let err = CommandCenter::builder(&engine).bind(IpAddr::V4(Ipv4Addr::UNSPECIFIED)).port(0).start().unwrap_err();
    assert!(matches!(err, StartError::TokenRequired { .. }), "{err}");
    assert!(err.to_string().contains("token"), "{err}");
    let center = CommandCenter::builder(&engine)
        .bind(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
        .port(0)
        .token("a-long-enough-secret-token")
        .start()
        .expect("with a token it starts");
    assert!(center.local_addr().ip().is_unspecified());
}

#[test]
fn writes_without_the_token_get_401_and_change_nothing() {
    let (engine, _) = engine();
    let token = "0123456789abcdef-token";
    let center = CommandCenter::builder(&engine).port(0).token(token).start().unwrap();
    let addr = center.local_addr();
    let r = post_form(addr, "/setSwitch", &[("value", "false")], &[]);
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    assert!(r.body.contains("Authorization: Bearer"), "{}", r.body);
    let r = post_form(addr, "/setRules", &[("type", "flow"), ("data", r#"[{"resource":"a","count":1}]"#)], &[]);
    assert_eq!(r.status, 401);
    let r =
        post_form(addr, "/setSwitch", &[("value", "false")], &["Authorization: Bearer wrong-token-of-other-length"]);
    assert_eq!(r.status, 401);
    let r = post_form(addr, "/setSwitch", &[("value", "false")], &["Authorization: Bearer 0123456789abcdef-tokeX"]);
    assert_eq!(r.status, 401, "same length, one byte off");
    assert!(engine.is_enabled());
    assert!(engine.flow_rules().is_empty());

    assert_eq!(get(addr, "/getRules?type=flow", &[]).status, 200, "reads need no token by default");
    assert_eq!(get(addr, "/", &[]).status, 200, "nor does the console page");
    let auth = format!("Authorization: Bearer {token}");
    assert_eq!(get(addr, "/setSwitch?value=false", &[&auth]).status, 405, "writes by POST only, token or not");
    assert!(engine.is_enabled());
    assert_eq!(post_form(addr, "/setSwitch", &[("value", "false")], &[&auth]).status, 200);
    assert!(!engine.is_enabled());
}

#[test]
fn the_token_can_be_required_for_reads_too() {
    let (engine, _) = engine();
    let center =
        CommandCenter::builder(&engine).port(0).token("reads-too-secret-token").token_for_reads(true).start().unwrap();
    let addr = center.local_addr();
    assert_eq!(get(addr, "/metric?startTime=0", &[]).status, 401);
    assert_eq!(get(addr, "/console/overview", &[]).status, 401, "the console's data needs it");
    assert_eq!(get(addr, "/", &[]).status, 200, "the page itself holds no data: it asks for the token");
    assert_eq!(get(addr, "/getRules?type=flow", &["Authorization: Bearer reads-too-secret-token"]).status, 200);
}

#[test]
fn an_oversize_body_gets_413_announced_or_chunked() {
    let (engine, _) = engine();
    let center = CommandCenter::builder(&engine).port(0).max_body_bytes(1024).start().unwrap();
    let addr = center.local_addr();
    let data = format!(r#"[{{"resource":"{}","count":1}}]"#, "x".repeat(2000));
    let r = post_form(addr, "/setRules", &[("type", "flow"), ("data", &data)], &[]);
    assert_eq!(r.status, 413);
    assert!(r.body.contains("1024"), "{}", r.body);
    let body = format!("type=flow&data={}", "a".repeat(3000));
    let chunked = format!(
        "POST /setRules HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    assert_eq!(raw_request(addr, chunked.as_bytes()).status, 413, "found while reading");
    assert!(engine.flow_rules().is_empty());
    let small = post_form(addr, "/setRules", &[("type", "flow"), ("data", r#"[{"resource":"a","count":1}]"#)], &[]);
    assert_eq!(small.status, 200, "{}", small.body);
}

#[test]
fn a_client_that_sends_a_body_far_over_the_cap_reads_its_413_rather_than_a_reset() {
    // Megabytes more than the socket buffers hold: the server must read (and drop) what the client still
    // sends after refusing it, or the client's writes fail with a reset before it can read the answer.
    let (engine, _) = engine();
    let center = CommandCenter::builder(&engine).port(0).max_body_bytes(1024).start().unwrap();
    let addr = center.local_addr();
    let data = "a".repeat(4 << 20);
    let announced = format!(
        "POST /setRules HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\ntype=flow&data={data}",
        data.len() + 15
    );
    let chunked = format!(
        "POST /setRules HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\ntype=flow&data={data}\r\n0\r\n\r\n",
        data.len() + 15
    );
    for (how, request) in [("announced", announced), ("chunked", chunked)] {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(request.as_bytes()).unwrap_or_else(|e| panic!("{how}: the body could not be sent whole: {e}"));
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).unwrap_or_else(|e| panic!("{how}: no answer: {e}"));
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 413"), "{how}: {}", answer.lines().next().unwrap_or(""));
        assert!(answer.contains("1024"), "{how}: {answer}");
    }
    assert!(engine.flow_rules().is_empty());
    assert_eq!(get(addr, "/getRules?type=flow", &[]).status, 200, "still serving");
}

/// Sends `bytes` one at a time, `gap` apart, until the server closes the connection; returns how many were
/// sent before it did (or all of them).
fn trickle(addr: std::net::SocketAddr, first: &[u8], bytes: &[u8], gap: Duration) -> (usize, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(first).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    let mut answer = Vec::new();
    for (i, b) in bytes.iter().enumerate() {
        if s.write_all(&[*b]).is_err() {
            return (i, answer);
        }
        std::thread::sleep(gap); // the client is slow on purpose: this is its pace, not a wait for time
        let mut buf = [0u8; 512];
        match s.read(&mut buf) {
            Ok(0) => return (i + 1, answer),
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return (i + 1, answer),
        }
    }
    (bytes.len(), answer)
}

#[test]
fn a_client_that_sends_one_byte_at_a_time_is_dropped() {
    let (engine, _) = engine();
    let center = CommandCenter::builder(&engine)
        .port(0)
        .header_read_timeout(Duration::from_millis(300))
        .request_timeout(Duration::from_millis(300))
        .start()
        .unwrap();
    let addr = center.local_addr();
    let request = format!("GET /getSwitch HTTP/1.1\r\nHost: {addr}\r\nX-Padding: {}\r\n\r\n", "p".repeat(200));
    let (sent, _) = trickle(addr, b"", request.as_bytes(), Duration::from_millis(20));
    assert!(sent < request.len(), "dropped before its headers were complete ({sent} of {} bytes)", request.len());

    // A slow body: the headers arrive, the body trickles.
    let slow_body = format!(
        "POST /setSwitch HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 200\r\n\r\nvalue=false&{}",
        "x".repeat(190)
    );
    let head_len = slow_body.find("\r\n\r\n").unwrap() + 4;
    let (head, body) = slow_body.as_bytes().split_at(head_len);
    let (sent, answer) = trickle(addr, head, body, Duration::from_millis(20));
    let answer = String::from_utf8_lossy(&answer);
    assert!(sent < body.len(), "dropped mid-body ({sent} of {} body bytes)", body.len());
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(engine.is_enabled(), "the incomplete request changed nothing");
    assert_eq!(get(addr, "/getSwitch", &[]).status, 200, "others are served");
}

#[test]
fn a_thousand_concurrent_connections_do_not_hold_up_the_applications_calls() {
    let (engine, clock) = engine();
    engine.load_flow_rules([FlowRule::new("api").count(1000.0)]).unwrap();
    let center = CommandCenter::builder(&engine).port(0).header_read_timeout(Duration::from_secs(30)).start().unwrap();
    let addr = center.local_addr();
    let mut idle = Vec::new();
    for _ in 0..1000 {
        idle.push(TcpStream::connect(addr).expect("connect"));
    }
    // While a thousand sockets sit on the server, the application's own calls are checked and counted as
    // always (the server runs on its own thread and only reads statistics).
    let api = engine.resource("api");
    let passed = (0..1500).filter(|_| api.enter().is_ok()).count();
    assert_eq!(passed, 1000, "exactly the rule's count, the server's load notwithstanding");
    clock.advance_millis(1000);
    assert_eq!(engine.cluster_stats("api").unwrap().minute_pass, 1000);
    // The sockets past the connection cap were answered 503 and closed at once.
    let mut refused = 0;
    for s in idle.iter_mut().rev().take(50) {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = String::new();
        let _ = s.read_to_string(&mut buf);
        if buf.starts_with("HTTP/1.1 503") {
            refused += 1;
        }
    }
    assert_eq!(refused, 50, "over the cap: refused, not queued");
    drop(idle);
    // Once they are gone, the server answers again.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = write!(s, "GET /getSwitch HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        let mut buf = String::new();
        let _ = s.read_to_string(&mut buf);
        if buf.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "the server did not recover: {buf}");
        std::thread::sleep(Duration::from_millis(10)); // polls for the condition
    }
}

#[test]
fn malformed_input_gets_400_and_changes_nothing() {
    let (engine, _) = engine();
    engine.load_flow_rules([FlowRule::new("api").count(5.0)]).unwrap();
    let center = CommandCenter::builder(&engine).port(0).start().unwrap();
    let addr = center.local_addr();
    let garbage = raw_request(addr, b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03 not http at all\r\n\r\n");
    assert_eq!(garbage.status, 400);
    let not_utf8 = b"POST /setRules HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 4\r\nConnection: close\r\n\r\n\xff\xfe\xfd\xfc";
    assert_eq!(raw_request(addr, not_utf8).status, 400);
    let json = format!(
        "POST /setRules HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n[]"
    );
    let r = raw_request(addr, json.as_bytes());
    assert_eq!(r.status, 415);
    assert_eq!(r.body, "Only form-encoded post request is supported");
    let unknown = get(addr, "/nope", &[]);
    assert_eq!((unknown.status, unknown.body.as_str()), (400, "Unknown command `nope`"));
    assert_eq!(engine.flow_rules().len(), 1);
    assert_eq!(engine.flow_rules()[0].count, 5.0);
}

#[test]
fn a_page_under_a_foreign_host_name_or_another_sites_write_is_refused() {
    let (engine, _) = engine();
    let center = CommandCenter::builder(&engine).port(0).start().unwrap();
    let addr = center.local_addr();
    // DNS rebinding: a page of rebind.example, whose name now resolves to 127.0.0.1.
    let req = "GET /getRules?type=flow HTTP/1.1\r\nHost: rebind.example:8719\r\nConnection: close\r\n\r\n";
    let r = raw_request(addr, req.as_bytes());
    assert_eq!(r.status, 403);
    assert!(r.body.contains("loopback"), "{}", r.body);
    // A form on another site posting to the loopback port through the user's browser.
    let r = post_form(
        addr,
        "/setSwitch",
        &[("value", "false")],
        &["Origin: https://evil.example", "Sec-Fetch-Site: cross-site"],
    );
    assert_eq!(r.status, 403);
    assert!(engine.is_enabled());
    let own = format!("Origin: http://{addr}");
    assert_eq!(
        post_form(addr, "/setSwitch", &[("value", "false")], &[&own, "Sec-Fetch-Site: same-origin"]).status,
        200
    );
}

#[test]
fn the_command_server_limits_itself_with_a_flow_rule_of_its_own() {
    let (engine, clock) = engine();
    let center = CommandCenter::builder(&engine).port(0).command_qps(3.0).start().unwrap();
    let addr = center.local_addr();
    let statuses: Vec<u16> = (0..5).map(|_| get(addr, "/getSwitch", &[]).status).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    let r = get(addr, "/version", &[]);
    assert!(r.body.contains(COMMAND_RESOURCE), "{}", r.body);
    assert_eq!(r.header("retry-after"), Some("1"));
    clock.advance_millis(1000);
    assert_eq!(get(addr, "/getSwitch", &[]).status, 200, "the next second");
    assert!(engine.resource_names().iter().all(|n| n != COMMAND_RESOURCE), "the application's engine is not touched");
}

#[test]
fn only_allowed_peers_connect_and_a_trusted_peer_writes_without_the_token() {
    let (engine, _) = engine();
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    // The allow list names another address only: this machine's own requests are refused.
    let closed = CommandCenter::builder(&engine).port(0).allow_peer("10.9.9.9".parse().unwrap()).start().unwrap();
    let r = get(closed.local_addr(), "/getSwitch", &[]);
    assert_eq!(r.status, 403);
    assert!(r.body.contains("allow list"), "{}", r.body);
    assert_eq!(get(closed.local_addr(), "/", &[]).status, 403, "the console too");
    // A token is set, and 127.0.0.1 (standing for the dashboard's address) is trusted: it writes without one.
    let trusted = CommandCenter::builder(&engine)
        .port(0)
        .token("trusted-peer-secret-token")
        .allow_peer(loopback)
        .trust_peer(loopback)
        .start()
        .unwrap();
    assert_eq!(post_form(trusted.local_addr(), "/setSwitch", &[("value", "false")], &[]).status, 200);
    assert!(!engine.is_enabled());
}

// ---------------------------------------------------------------------------------------------------------
// Clients that do not read, peers that hold sockets, writes by GET, Host names off loopback.

/// A connection from `src` (any 127.x address reaches a 127.0.0.1 server on Linux) with a small receive
/// buffer, so that a client that does not read stalls the server's writes soon.
fn connect_from(src: IpAddr, addr: std::net::SocketAddr) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let stream = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        socket.bind(std::net::SocketAddr::new(src, 0)).unwrap();
        socket.connect(addr).await.unwrap()
    });
    let stream = stream.into_std().unwrap();
    stream.set_nonblocking(false).unwrap();
    stream
}

/// Everything the server sends on `s` until it closes the connection (a reset after data counts as the end).
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return out,
            Err(e) => panic!("reading the answer: {e} (after {} bytes)", out.len()),
        }
    }
}

/// The `Content-Length` of an answer's head.
fn content_length(answer: &[u8]) -> usize {
    let head = String::from_utf8_lossy(&answer[..answer.len().min(4096)]).to_ascii_lowercase();
    let line = head.lines().find(|l| l.starts_with("content-length:")).unwrap_or_else(|| panic!("{head}"));
    line["content-length:".len()..].trim().parse().unwrap()
}

/// Asks `path` from 127.0.0.1 until the server serves it (each answer comes at once: `503` while the
/// connection slots are held); panics if it never does.
fn served_again(addr: std::net::SocketAddr, path: &str) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = get(addr, path, &[]).status;
        if status != 503 {
            return status;
        }
        assert!(Instant::now() < deadline, "the slots were never freed");
        std::thread::sleep(Duration::from_millis(10)); // polls for the condition
    }
}

/// Names 8 KiB long: 1,200 of them make answers of 10 MB, more than the socket buffers of both ends hold.
fn long_name(k: usize) -> String {
    format!("{k:05}-{}", "n".repeat(8 * 1024))
}

/// A client that asks for `path` and reads only the first bytes of the answer (so the server has begun
/// writing it), then nothing more.
fn stall_on(addr: std::net::SocketAddr, path: &str) -> TcpStream {
    let mut s = connect_from(IpAddr::V4(Ipv4Addr::LOCALHOST), addr);
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut first = [0u8; 12];
    s.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200", "{path}");
    s
}

fn big_engine() -> Sentinel {
    let (engine, _) = engine();
    engine.load_flow_rules((0..1200).map(|k| FlowRule::new(long_name(k)).count(1.0))).unwrap();
    for k in 0..1200 {
        drop(engine.enter(&long_name(k)));
    }
    engine
}

/// A command center with `slots` connection slots (any peer may take them all) and a write timeout of 300 ms.
fn impatient_writer(engine: &Sentinel, slots: usize) -> CommandCenter {
    CommandCenter::builder(engine)
        .port(0)
        .max_connections(slots)
        .max_connections_per_peer(slots)
        .write_timeout(Duration::from_millis(300))
        .request_timeout(Duration::from_secs(300)) // building a 10 MB answer in a debug build takes a while
        .start()
        .unwrap()
}

#[test]
fn a_client_that_does_not_read_its_answer_is_cut_off_at_the_write_timeout_whatever_it_asked() {
    let engine = big_engine();
    let center = impatient_writer(&engine, 1);
    let addr = center.local_addr();
    for command in ["/getRules?type=flow", "/jsonTree", "/clusterNode?type=zero", "/console/overview"] {
        // The only slot is taken by a client that asks for a large answer and stops reading it.
        let mut stalled = stall_on(addr, command);
        assert_eq!(served_again(addr, "/getSwitch"), 200, "{command}: served again once the stalled one is dropped");
        let answer = read_to_close(&mut stalled);
        let head = answer.windows(4).position(|w| w == b"\r\n\r\n").expect("the head was sent") + 4;
        let length = content_length(&[&b"HTTP/1.1 200"[..], &answer].concat());
        assert!(length > 8_000_000, "{command}: a large answer ({length} bytes)");
        assert!(answer.len() - head < length, "{command}: cut short ({} of {length} bytes)", answer.len() - head);
    }
}

#[test]
fn many_clients_that_do_not_read_hold_every_slot_only_until_the_write_timeout() {
    let engine = big_engine();
    let center = impatient_writer(&engine, 8);
    let addr = center.local_addr();
    let paths = ["/getRules?type=flow", "/jsonTree"];
    let stalled: Vec<TcpStream> = (0..8).map(|k| stall_on(addr, paths[k % 2])).collect();
    // Nobody reads, and the answers are larger than every buffer on the way: only the timeout frees a slot.
    assert_eq!(served_again(addr, "/getSwitch"), 200);
    drop(stalled);
}

#[test]
fn a_client_that_reads_its_large_answer_gets_all_of_it() {
    let (engine, _) = engine();
    engine.load_flow_rules((0..1200).map(|k| FlowRule::new(long_name(k)).count(1.0))).unwrap();
    let center = CommandCenter::builder(&engine).port(0).start().unwrap();
    let r = get(center.local_addr(), "/getRules?type=flow", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body.len() > 10_000_000 && r.body.ends_with(']'), "{} bytes", r.body.len());
}

#[test]
fn a_refused_peer_holding_many_sockets_does_not_lock_out_the_allowed_one() {
    let (engine, _) = engine();
    let allowed = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let refused = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
    let center = CommandCenter::builder(&engine)
        .port(0)
        .allow_peer(allowed)
        .header_read_timeout(Duration::from_secs(60))
        .start()
        .unwrap();
    let addr = center.local_addr();
    // Three times the connection cap, each with half a request line, held open.
    let mut held: Vec<TcpStream> = (0..192)
        .map(|_| {
            let mut s = connect_from(refused, addr);
            s.write_all(b"GET /version HTTP/1.1\r\n").unwrap();
            s
        })
        .collect();
    let r = raw_request_from(allowed, addr, "GET /getSwitch HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let body = "value=false";
    let write = format!(
        "POST /setSwitch HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    assert!(raw_request_from(allowed, addr, &write).starts_with("HTTP/1.1 200"));
    assert!(!engine.is_enabled());
    // Each refused socket was answered 403 and closed as soon as it was accepted, without a slot.
    for s in &mut held {
        let answer = String::from_utf8_lossy(&read_to_close(s)).into_owned();
        assert!(answer.starts_with("HTTP/1.1 403") && answer.contains("allow list"), "{answer}");
    }
}

fn raw_request_from(src: IpAddr, addr: std::net::SocketAddr, request: &str) -> String {
    let mut s = connect_from(src, addr);
    s.write_all(request.as_bytes()).unwrap();
    String::from_utf8_lossy(&read_to_close(&mut s)).into_owned()
}

/// Opens `n` idle connections from `src`, then one more, which the server answers `503` at once: the
/// connections before it were accepted (the listener hands them over in order), so they hold their slots.
fn hold_up_to_the_cap(src: IpAddr, addr: std::net::SocketAddr, n: usize) -> Vec<TcpStream> {
    let held: Vec<TcpStream> = (0..n).map(|_| connect_from(src, addr)).collect();
    let mut over = connect_from(src, addr);
    let answer = String::from_utf8_lossy(&read_to_close(&mut over)).into_owned();
    assert!(answer.starts_with("HTTP/1.1 503"), "{src} over its cap: {answer}");
    held
}

#[test]
fn one_peer_cannot_take_every_connection_slot() {
    let (engine, _) = engine();
    let center = CommandCenter::builder(&engine).port(0).header_read_timeout(Duration::from_secs(60)).start().unwrap();
    let addr = center.local_addr();
    let greedy = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
    let _held = hold_up_to_the_cap(greedy, addr, 16);
    let mut over = connect_from(greedy, addr);
    let answer = String::from_utf8_lossy(&read_to_close(&mut over)).into_owned();
    assert!(answer.contains("Too many connections from your address"), "{answer}");
    let other = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let r = raw_request_from(other, addr, "GET /getSwitch HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 200"), "another peer is served: {r}");
}

#[test]
fn slots_are_kept_for_the_trusted_dashboard() {
    let (engine, _) = engine();
    let dashboard = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9));
    let center = CommandCenter::builder(&engine)
        .port(0)
        .token("trusted-dashboard-secret-token")
        .trust_peer(dashboard)
        .max_connections(8)
        .max_connections_per_peer(2)
        .header_read_timeout(Duration::from_secs(60))
        .start()
        .unwrap();
    let addr = center.local_addr();
    // Three peers take 6 of the 8 slots: the other 2 are the dashboard's.
    let _held: Vec<Vec<TcpStream>> =
        (3..6).map(|k| hold_up_to_the_cap(IpAddr::V4(Ipv4Addr::new(127, 0, 0, k)), addr, 2)).collect();
    let get_switch = "GET /getSwitch HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    let r = raw_request_from(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6)), addr, get_switch);
    assert!(r.starts_with("HTTP/1.1 503"), "a fourth peer finds no slot: {r}");
    let r = raw_request_from(dashboard, addr, get_switch);
    assert!(r.starts_with("HTTP/1.1 200"), "the dashboard does: {r}");
}

/// Every write command with parameters that change something, and how to tell it did.
fn writes() -> Vec<(&'static str, Vec<(&'static str, &'static str)>)> {
    vec![
        ("setSwitch", vec![("value", "false")]),
        ("setRules", vec![("type", "flow"), ("data", "[]")]),
        ("setRules", vec![("type", "degrade"), ("data", "[]")]),
        ("setRules", vec![("type", "system"), ("data", "[]")]),
        ("setRules", vec![("type", "authority"), ("data", "[]")]),
        ("setParamFlowRules", vec![("data", "[]")]),
        ("setClusterMode", vec![("mode", "0")]),
    ]
}

fn query(params: &[(&str, &str)]) -> String {
    let pairs: Vec<String> = params
        .iter()
        .map(|(k, v)| format!("{}={}", sentinel_testkit::http::form_encode(k), sentinel_testkit::http::form_encode(v)))
        .collect();
    pairs.join("&")
}

fn engine_with_one_rule_of_each_kind() -> (Sentinel, tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.json");
    std::fs::write(
        &file,
        r#"{"flowRules": [{"resource": "api", "count": 1}],
            "degradeRules": [{"resource": "db", "grade": 2, "count": 2, "timeWindow": 10}],
            "systemRules": [{"qps": 100}],
            "authorityRules": [{"resource": "api", "limitApp": "bad", "strategy": 1}],
            "paramFlowRules": [{"resource": "api", "paramIdx": 0, "count": 5}]}"#,
    )
    .unwrap();
    let (engine, _) = engine();
    sentinel_runtime::datasource::FileDataSource::new(&engine, &file).reload_now().unwrap();
    (engine, dir, file)
}

fn rule_counts(engine: &Sentinel) -> [usize; 5] {
    [
        engine.flow_rules().len(),
        engine.degrade_rules().len(),
        engine.system_rules().len(),
        engine.authority_rules().len(),
        engine.param_flow_rules().len(),
    ]
}

#[test]
fn every_write_command_by_get_or_another_method_than_post_is_refused_and_changes_nothing() {
    let (engine, dir, file) = engine_with_one_rule_of_each_kind();
    let source = sentinel_runtime::datasource::FileDataSource::new(&engine, &file);
    let center = CommandCenter::builder(&engine).port(0).data_source(source).start().unwrap();
    let addr = center.local_addr();
    let before = std::fs::read_to_string(&file).unwrap();
    for (command, params) in writes() {
        let path = format!("/{command}?{}", query(&params));
        // An <img> or a link of another site, in a browser that sends no Origin and no Fetch Metadata.
        let r = get(addr, &path, &["Referer: https://evil.example/"]);
        assert_eq!(r.status, 405, "GET {path}: {}", r.body);
        assert_eq!(r.header("allow"), Some("POST"), "{path}");
        for method in ["HEAD", "PUT", "DELETE", "PATCH", "OPTIONS", "X1"] {
            let req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(req.as_bytes()).unwrap();
            let answer = String::from_utf8_lossy(&read_to_close(&mut s)).into_owned();
            assert!(answer.starts_with("HTTP/1.1 405"), "{method} {path}: {answer}");
        }
    }
    assert!(engine.is_enabled(), "the switch stays on");
    assert_eq!(rule_counts(&engine), [1; 5], "every rule stays in force");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before, "the rules file is untouched");
    drop(dir);
}

#[test]
fn every_write_command_by_post_works() {
    let (engine, dir, file) = engine_with_one_rule_of_each_kind();
    let source = sentinel_runtime::datasource::FileDataSource::new(&engine, &file);
    let center = CommandCenter::builder(&engine).port(0).data_source(source).start().unwrap();
    let addr = center.local_addr();
    for (command, params) in writes() {
        let r = post_form(addr, &format!("/{command}"), &params, &[]);
        // No cluster service runs: setClusterMode explains why it cannot switch, by POST as by GET.
        let expected = if command == "setClusterMode" { 400 } else { 200 };
        assert_eq!(r.status, expected, "POST {command} {params:?}: {}", r.body);
    }
    assert!(!engine.is_enabled());
    assert_eq!(rule_counts(&engine), [0; 5], "every kind emptied by its push");
    drop(dir);
}

#[test]
fn write_commands_by_get_are_taken_when_allowed_for_old_dashboards() {
    let (engine, dir, file) = engine_with_one_rule_of_each_kind();
    let source = sentinel_runtime::datasource::FileDataSource::new(&engine, &file);
    let center = CommandCenter::builder(&engine).port(0).data_source(source).allow_get_writes(true).start().unwrap();
    let addr = center.local_addr();
    for (command, params) in writes() {
        let r = get(addr, &format!("/{command}?{}", query(&params)), &[]);
        let expected = if command == "setClusterMode" { 400 } else { 200 };
        assert_eq!(r.status, expected, "GET {command} {params:?}: {}", r.body);
        let r = raw_request(
            addr,
            format!("PUT /{command} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        );
        assert_eq!((r.status, r.header("allow")), (405, Some("GET, POST")), "{command}: GET and POST only");
    }
    assert!(!engine.is_enabled());
    assert_eq!(rule_counts(&engine), [0; 5]);
    // The other checks still apply to them: another site's page is refused.
    let r = get(addr, "/setSwitch?value=true", &["Sec-Fetch-Site: cross-site"]);
    assert_eq!(r.status, 403);
    assert!(!engine.is_enabled());
    drop(dir);
}

#[test]
fn bound_beyond_loopback_reads_too_need_a_host_name_the_server_answers_for() {
    let (engine, _) = engine();
    let token = "beyond-loopback-secret-token";
    let center = CommandCenter::builder(&engine)
        .bind(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
        .port(0)
        .token(token)
        .allow_host("sentinel.internal")
        .start()
        .unwrap();
    let addr = std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, center.local_addr().port()));
    let port = addr.port();
    let auth = format!("Authorization: Bearer {token}");
    let ask = |path: &str, host: &str, extra: &[&str]| {
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
        for h in extra {
            req.push_str(h);
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        raw_request(addr, req.as_bytes())
    };
    for path in ["/getRules?type=flow", "/metric?startTime=0", "/jsonTree", "/console/overview", "/", "/console.js"] {
        // A page of rebind.example, whose name now resolves to this server's address.
        for host in
            [format!("rebind.example:{port}"), format!("127.0.0.1.nip.io:{port}"), "sentinel.internal.evil".into()]
        {
            let r = ask(path, &host, &[]);
            assert_eq!(r.status, 403, "{path} for {host}: {}", r.body);
            assert!(r.body.contains("allow_host"), "{}", r.body);
            assert_eq!(ask(path, &host, &[&auth]).status, 403, "{path} for {host}, token or not");
        }
        for host in [format!("127.0.0.1:{port}"), format!("10.1.2.3:{port}"), format!("sentinel.internal:{port}")] {
            assert_eq!(ask(path, &host, &[]).status, 200, "{path} for {host}");
        }
    }
    let r = post_form(addr, "/setSwitch", &[("value", "false")], &[&auth]);
    assert_eq!(r.status, 200, "the test's own Host is an address: {}", r.body);
}

#[test]
fn a_post_without_a_body_gets_411_and_changes_nothing() {
    let (engine, _) = engine();
    let center = CommandCenter::builder(&engine).port(0).start().unwrap();
    let addr = center.local_addr();
    // Java's `HttpEventTask` reads a POST's parameters from its form body only, and answers a POST without a
    // legal Content-Length (missing or below 1) with 411, whatever the command; the query string is not enough.
    let requests = [
        format!("POST /setSwitch?value=false HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
        format!(
            "POST /setSwitch?value=false HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nConnection: close\r\n\r\n"
        ),
        format!(
            "POST /setSwitch?value=false HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
        format!("POST /setRules?type=flow&data=%5B%5D HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
        format!("POST /getSwitch HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    ];
    engine.load_flow_rules([FlowRule::new("api").count(5.0)]).unwrap();
    for request in &requests {
        let r = raw_request(addr, request.as_bytes());
        assert_eq!((r.status, r.body.as_str()), (411, "No legal Content-Length"), "{request}");
    }
    assert!(engine.is_enabled(), "the switch stays on");
    assert_eq!(engine.flow_rules().len(), 1, "the rules stay");
    // The dashboard's form POST, and a GET with a query string, still work.
    assert_eq!(post_form(addr, "/setSwitch", &[("value", "false")], &[]).status, 200);
    assert!(!engine.is_enabled());
    assert_eq!(get(addr, "/getSwitch", &[]).status, 200);
}
