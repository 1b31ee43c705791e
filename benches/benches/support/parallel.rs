//! Runs work on several threads at once, for the aggregate (2-thread) benchmarks.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Runs `iters` calls of a worker on each of `threads` threads at once (each thread's worker made by
/// `worker`, so it may own a clone of what it calls); returns wall time divided by the thread count, so
/// criterion's per-iteration figure is the aggregate time per call (lower is more throughput).
pub fn parallel<W>(threads: usize, iters: u64, worker: impl Fn() -> W) -> Duration
where
    W: FnMut() + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (barrier, mut call) = (barrier.clone(), worker());
            std::thread::spawn(move || {
                barrier.wait();
                for _ in 0..iters {
                    call();
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for h in handles {
        h.join().expect("a bench thread");
    }
    start.elapsed() / threads as u32
}
