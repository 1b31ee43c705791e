//! More threads with contexts at once than there are slots for the exits of entries that move between threads
//! (4,095): the threads past them keep their contexts apart. A test binary of its own, since it takes every
//! slot of the process while it runs.

use std::sync::{mpsc, Arc, Barrier};

use sentinel_runtime::{Sentinel, TreeNode};

/// Threads that each made an installation (and so hold a slot) while they wait: more than there are slots.
const HOLDERS: usize = 4_100;

fn child<'a>(nodes: &'a [TreeNode], name: &str) -> &'a TreeNode {
    nodes.iter().find(|n| n.name == name).unwrap_or_else(|| panic!("no node `{name}` in {nodes:?}"))
}

#[test]
fn an_entry_of_a_thread_past_the_slots_exiting_on_another_such_thread_leaves_that_threads_context_alone() {
    let engine = Sentinel::builder().build();
    let (r, z) = (engine.resource("r"), engine.resource("z"));
    let ready = Arc::new(Barrier::new(HOLDERS + 1));
    let release = Arc::new(Barrier::new(HOLDERS + 1));
    std::thread::scope(|s| {
        for _ in 0..HOLDERS {
            let (ready, release, engine) = (ready.clone(), release.clone(), &engine);
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn_scoped(s, move || {
                    drop(engine.enter_context("hold", "").unwrap());
                    ready.wait();
                    release.wait();
                })
                .unwrap();
        }
        ready.wait();
        // Every slot is taken: the two threads below have none. Each is in `r` in the context `web`, at the
        // same depth and node; a's entry exits on b.
        let (to_b, from_a) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let (r, z, engine) = (&r, &z, &engine);
        s.spawn(move || {
            let _guard = engine.enter_context("web", "").unwrap();
            let xa = r.enter().unwrap();
            to_b.send(xa).unwrap();
            done_rx.recv().unwrap();
        });
        s.spawn(move || {
            let _guard = engine.enter_context("web", "").unwrap();
            let yb = r.enter().unwrap();
            drop(from_a.recv().unwrap());
            let ez = z.enter().unwrap(); // nests in yb: a's entry ended nothing here
            drop((ez, yb));
            done_tx.send(()).unwrap();
        })
        .join()
        .unwrap();
        release.wait();
    });
    let tree = engine.tree();
    let web = child(&tree, "web");
    let names = |ns: &[TreeNode]| ns.iter().map(|n| n.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&web.children), vec!["r"], "z is not entered beside r: {tree:?}");
    assert_eq!(names(&child(&web.children, "r").children), vec!["z"], "z nests in b's entry: {tree:?}");
}
