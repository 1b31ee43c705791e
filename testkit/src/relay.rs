//! A TCP relay on 127.0.0.1 in front of a server that can hold the server's replies back: a network that
//! delivers every request at once and its reply late (or never, to a client that gave up), so a test can
//! make a client time out on a request the server did run.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often a pump holding replies looks whether it may deliver them.
const POLL: Duration = Duration::from_millis(5);

/// A relay to one server: every connection made to [`Relay::addr`] is one to the server.
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct State {
    hold: AtomicBool,
    stop: AtomicBool,
    /// Both ends of every connection relayed, shut down when the relay stops.
    streams: Mutex<Vec<TcpStream>>,
    pumps: Mutex<Vec<JoinHandle<()>>>,
}

impl Relay {
    /// Starts relaying connections to `target`.
    pub fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let addr = listener.local_addr().expect("the relay's address");
        let state = Arc::new(State::default());
        let s = state.clone();
        let accept = std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(target) else { continue };
                s.relay(client, server);
            }
        });
        Relay { addr, state, accept: Some(accept) }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From now on, what the server sends is kept back (requests still reach it).
    pub fn hold_replies(&self) {
        self.state.hold.store(true, Ordering::SeqCst);
    }

    /// Delivers what was kept back, and what comes next at once.
    pub fn release_replies(&self) {
        self.state.hold.store(false, Ordering::SeqCst);
    }
}

impl State {
    fn relay(self: &Arc<Self>, client: TcpStream, server: TcpStream) {
        let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { return };
        let (Ok(c3), Ok(s3)) = (client.try_clone(), server.try_clone()) else { return };
        self.streams.lock().unwrap_or_else(|e| e.into_inner()).extend([c3, s3]);
        let up = std::thread::spawn(move || pump(client, server));
        let me = self.clone();
        let down = std::thread::spawn(move || me.pump_replies(s2, c2));
        self.pumps.lock().unwrap_or_else(|e| e.into_inner()).extend([up, down]);
    }

    /// Server to client, keeping bytes back while replies are held.
    fn pump_replies(&self, mut server: TcpStream, mut client: TcpStream) {
        let _ = server.set_read_timeout(Some(POLL));
        let mut kept: Vec<u8> = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            if !self.hold.load(Ordering::SeqCst) && !kept.is_empty() {
                if client.write_all(&kept).is_err() {
                    break;
                }
                kept.clear();
            }
            match server.read(&mut buf) {
                Ok(0) => break,
                Ok(n) if self.hold.load(Ordering::SeqCst) || !kept.is_empty() => kept.extend_from_slice(&buf[..n]),
                Ok(n) => {
                    if client.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    if self.stop.load(Ordering::SeqCst) {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        let _ = client.shutdown(Shutdown::Both);
        let _ = server.shutdown(Shutdown::Both);
    }
}

/// Client to server, as it comes.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        // Wake the accepting thread with a connection of our own.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for s in self.state.streams.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        let pumps: Vec<JoinHandle<()>> = self.state.pumps.lock().unwrap_or_else(|e| e.into_inner()).drain(..).collect();
        for t in pumps {
            let _ = t.join();
        }
    }
}
