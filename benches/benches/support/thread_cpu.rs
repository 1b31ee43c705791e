//! A criterion measurement of the benchmark thread's CPU time: time spent descheduled on a busy machine does
//! not inflate it (shared by the benches that report both wall and CPU time).

use criterion::measurement::{Measurement, ValueFormatter, WallTime};

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`).
pub struct ThreadCpuTime;

fn thread_cpu_nanos() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

static WALL: WallTime = WallTime;

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_nanos()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_nanos().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        WALL.formatter()
    }
}
