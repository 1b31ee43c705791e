//! What the command center costs the application's calls: entry + exit of a resource with a passing flow
//! rule, on an engine without a command center, and on one whose command center is running and being read
//! like a console in a browser does (overview and history, every 100 ms, from another thread).
//!
//! Run with `cargo bench -p sentinel-benches --bench transport_overhead`.
//!
//! Each case runs twice: wall time, and the benchmark thread's CPU time (which time spent descheduled on a
//! busy machine does not inflate: on 2 cores the server and the reader compete for the CPU).

use std::hint::black_box;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::measurement::Measurement;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::transport::CommandCenter;
use sentinel_runtime::Sentinel;

#[path = "support/thread_cpu.rs"]
mod thread_cpu;
use thread_cpu::ThreadCpuTime;

fn engine() -> Sentinel {
    let engine = Sentinel::builder().build();
    engine.load_flow_rules(vec![FlowRule::new("res").count(1e12)]).expect("valid flow rule");
    // A few more resources with traffic, so the server has something to read.
    for i in 0..20 {
        drop(engine.enter(&format!("other-{i}")));
    }
    engine
}

/// Reads the console's commands every 100 ms until dropped.
struct Reader {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reader {
    fn start(addr: std::net::SocketAddr) -> Reader {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                for path in ["/console/overview", "/console/history", "/metric?startTime=0"] {
                    if let Ok(mut c) = std::net::TcpStream::connect(addr) {
                        let _ = write!(c, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
                        let mut sink = Vec::new();
                        let _ = c.read_to_end(&mut sink);
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Reader { stop, thread: Some(thread) }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn wall(c: &mut Criterion) {
    overhead(c, "transport_overhead");
}

fn cpu(c: &mut Criterion<ThreadCpuTime>) {
    overhead(c, "transport_overhead_cpu");
}

fn overhead<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));

    let plain = engine();
    let res = plain.resource("res");
    g.bench_function("no_command_center", |b| {
        b.iter(|| {
            let e = res.enter();
            black_box(&e);
        })
    });

    let served = engine();
    let center = CommandCenter::builder(&served).port(0).start().expect("start the command center");
    let reader = Reader::start(center.local_addr());
    let res = served.resource("res");
    g.bench_function("command_center_read_every_100ms", |b| {
        b.iter(|| {
            let e = res.enter();
            black_box(&e);
        })
    });
    drop(reader);
    drop(center);
    g.finish();
}

criterion_group!(wall_benches, wall);
criterion_group! {
    name = cpu_benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = cpu
}
criterion_main!(wall_benches, cpu_benches);
