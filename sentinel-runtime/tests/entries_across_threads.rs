//! Entries that leave the thread they were entered on (issue 10 §3): an owned entry joins the active context
//! but never changes a thread's context, so it may move anywhere, exit there with exact statistics, and leave
//! both threads' contexts as they would be without it. `Entry::in_scope` and `Entry::instrument` run work
//! with it as the innermost entry.

use std::sync::mpsc;

use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::{Sentinel, TreeNode, DEFAULT_CONTEXT_NAME};

const T0: u64 = 1_700_000_000_000;

fn engine() -> Sentinel {
    Sentinel::builder().manual_clock(ManualClock::at_millis(T0)).build()
}

fn depth(nodes: &[TreeNode]) -> usize {
    nodes.iter().map(|n| 1 + depth(&n.children)).max().unwrap_or(0)
}

#[test]
fn an_owned_entry_dropped_on_another_thread_leaves_no_origin_on_the_first_thread() {
    let engine = engine();
    let r = engine.resource("api");
    let (tx, rx) = mpsc::channel();
    let (dropped_tx, dropped_rx) = mpsc::channel::<()>();
    let (r2, eng) = (r.clone(), engine.clone());
    let first = std::thread::spawn(move || {
        let e = r2.entry_owned().origin("good").enter().unwrap();
        let during = eng.current_context();
        tx.send(e).unwrap();
        // The entry is gone from this thread: an origin-less call here runs in a fresh default context,
        // before and after the other thread dropped it.
        let before = r2.enter().unwrap().origin().to_string();
        dropped_rx.recv().unwrap();
        let after = r2.enter().unwrap().origin().to_string();
        (during, before, after, eng.current_context())
    });
    let e = rx.recv().unwrap();
    drop(e);
    dropped_tx.send(()).unwrap();
    let (during, before, after, ctx) = first.join().unwrap();
    assert_eq!(during, None, "an owned entry never installs itself");
    assert_eq!((before.as_str(), after.as_str()), ("", ""));
    assert_eq!(ctx, None, "no context is left on the first thread");
}

#[test]
fn after_an_owned_entry_moves_away_an_origin_specific_rule_still_applies_on_the_first_thread() {
    let engine = engine();
    engine.load_authority_rules([AuthorityRule::new("api", "evil", AuthorityStrategy::Black)]).unwrap();
    engine.load_flow_rules([FlowRule::new("api").limit_app("appB").count(0.0)]).unwrap();
    let r = engine.resource("api");
    let (tx, rx) = mpsc::channel();
    let r2 = r.clone();
    let first = std::thread::spawn(move || {
        let e = r2.entry_owned().origin("good").enter().unwrap();
        tx.send(e).unwrap();
        let evil = r2.entry().origin("evil").enter().map(drop);
        let app_b = r2.entry().origin("appB").enter().map(drop);
        let good = r2.entry().origin("good").enter().map(drop);
        (evil.is_err(), app_b.is_err(), good.is_ok())
    });
    drop(rx.recv().unwrap());
    assert_eq!(first.join().unwrap(), (true, true, true), "each call is checked with its own origin");
}

#[test]
fn an_owned_entry_of_one_caller_moved_away_does_not_make_a_black_list_block_unrelated_calls() {
    let engine = engine();
    engine.load_authority_rules([AuthorityRule::new("api", "evil", AuthorityStrategy::Black)]).unwrap();
    let (tx, rx) = mpsc::channel();
    let eng = engine.clone();
    let first = std::thread::spawn(move || {
        let e = eng.resource("other").entry_owned().origin("evil").enter().unwrap();
        tx.send(e).unwrap();
        (0..1000).filter(|_| eng.resource("api").enter().is_ok()).count()
    });
    let e = rx.recv().unwrap();
    assert_eq!(first.join().unwrap(), 1000, "no origin-less call inherits the moved entry's origin");
    drop(e);
}

#[test]
fn owned_entries_moved_away_never_nest_later_calls_under_themselves() {
    let engine = engine();
    let r = engine.resource("a");
    let (tx, rx) = mpsc::channel();
    let (r2, eng) = (r.clone(), engine.clone());
    let first = std::thread::spawn(move || {
        for _ in 0..5 {
            tx.send(r2.entry_owned().enter().unwrap()).unwrap();
        }
        drop(r2.enter().unwrap());
        eng.tree()
    });
    let moved: Vec<_> = (0..5).map(|_| rx.recv().unwrap()).collect();
    let tree = first.join().unwrap();
    drop(moved);
    let default = tree.iter().find(|t| t.name == DEFAULT_CONTEXT_NAME).unwrap();
    assert_eq!(depth(&default.children), 1, "resource `a` is not nested under itself: {tree:?}");
}

#[test]
fn an_owned_entry_exits_with_exact_statistics_wherever_it_is_dropped() {
    let engine = engine();
    let r = engine.resource("moved");
    let entries: Vec<_> = (0..10).map(|_| r.entry_owned().origin("appA").enter().unwrap()).collect();
    assert_eq!(engine.cluster_stats("moved").unwrap().threads, 10);
    std::thread::scope(|s| {
        for (i, mut e) in entries.into_iter().enumerate() {
            s.spawn(move || {
                if i % 2 == 0 {
                    e.set_error();
                }
                drop(e);
            });
        }
    });
    let stats = engine.cluster_stats("moved").unwrap();
    assert_eq!((stats.threads, stats.pass_qps, stats.success_qps, stats.exception_qps), (0, 10.0, 10.0, 5.0));
    let origin = engine.origin_stats("moved", "appA").unwrap();
    assert_eq!((origin.threads, origin.pass_qps), (0, 10.0));
    assert_eq!(engine.current_context(), None, "the entering thread keeps no context");
}

#[test]
fn an_owned_entry_joins_the_active_context_without_changing_it() {
    let engine = engine();
    let outer = engine.resource("outer");
    let _ctx = engine.enter_context("web", "appA").unwrap();
    let parent = outer.enter().unwrap();
    let owned = engine.resource("async-child").entry_owned().enter().unwrap();
    assert_eq!(owned.origin(), "appA", "it inherits the context's origin");
    assert_eq!(owned.context_name(), "web");
    // The thread's innermost entry is still `outer`: a borrowed entry made now is outer's child, not owned's.
    let sibling_res = engine.resource("sibling");
    let sibling = sibling_res.enter().unwrap();
    drop(sibling);
    drop(owned);
    drop(parent);
    let tree = engine.tree();
    let web = tree.iter().find(|t| t.name == "web").unwrap();
    let outer_node = &web.children[0];
    let mut children: Vec<&str> = outer_node.children.iter().map(|c| c.name.as_str()).collect();
    children.sort();
    assert_eq!(children, ["async-child", "sibling"]);
    assert!(outer_node.children.iter().all(|c| c.children.is_empty()));
}

#[test]
fn in_scope_makes_an_owned_entry_the_innermost_entry_and_puts_the_context_back_even_on_panic() {
    let engine = engine();
    let request = engine.resource("GET:/orders").entry_owned().origin("appA").enter().unwrap();
    assert_eq!(engine.current_context(), None);
    let db_res = engine.resource("db");
    let inner_origin = request.in_scope(|| {
        let db = db_res.enter().unwrap();
        let o = db.origin().to_string();
        drop(db);
        o
    });
    assert_eq!(inner_origin, "appA");
    assert_eq!(engine.current_context(), None);
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        request.in_scope(|| {
            let _db = db_res.enter().unwrap();
            panic!("handler panics");
        })
    }));
    assert!(res.is_err());
    assert_eq!(engine.current_context(), None, "the scope was undone by the unwind");
    drop(request);
    let tree = engine.tree();
    let default = tree.iter().find(|t| t.name == DEFAULT_CONTEXT_NAME).unwrap();
    let req = default.children.iter().find(|n| n.name == "GET:/orders").unwrap();
    assert_eq!(req.children.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["db"]);
    assert_eq!(engine.cluster_stats("db").unwrap().threads, 0);
}

#[test]
fn instrument_runs_a_future_on_other_threads_with_the_entry_installed() {
    let engine = engine();
    let request = engine.resource("GET:/users").entry_owned().origin("appB").enter().unwrap();
    let eng = engine.clone();
    let fut = request.instrument(async move {
        let db_res = eng.resource("users-db");
        let db = db_res.enter().unwrap();
        (db.origin().to_string(), db.context_name().to_string())
    });
    // Polled on another thread than the one that made the entry.
    let ((origin, context), entry) = std::thread::spawn(move || futures::executor::block_on(fut)).join().unwrap();
    assert_eq!((origin.as_str(), context.as_str()), ("appB", DEFAULT_CONTEXT_NAME));
    assert_eq!(engine.cluster_stats("GET:/users").unwrap().threads, 1, "the entry is alive until dropped");
    drop(entry);
    assert_eq!(engine.cluster_stats("GET:/users").unwrap().threads, 0);
    assert_eq!(engine.current_context(), None);
}

#[test]
fn enter_async_never_changes_the_context_of_the_thread_that_built_its_future() {
    let engine = engine();
    engine.load_authority_rules([AuthorityRule::new("api", "evil", AuthorityStrategy::Black)]).unwrap();
    let r = engine.resource("other");
    // Built here (the checks run now), polled on another thread.
    let fut = r.entry_owned().origin("evil").enter_async();
    assert_eq!(engine.current_context(), None, "building the future installs nothing");
    assert!(engine.resource("api").enter().is_ok(), "an origin-less call here is not `evil`");
    let entry = std::thread::spawn(move || futures::executor::block_on(fut)).join().unwrap().unwrap();
    assert_eq!(entry.origin(), "evil");
    drop(entry);
    assert_eq!(engine.cluster_stats("other").unwrap().threads, 0);
}

#[test]
fn borrowed_entries_still_nest_on_their_own_thread() {
    let engine = engine();
    let (a, b) = (engine.resource("a"), engine.resource("b"));
    let ea = a.entry().origin("appA").enter().unwrap();
    let eb = b.enter().unwrap();
    assert_eq!(eb.origin(), "appA");
    drop(eb);
    drop(ea);
    assert_eq!(engine.current_context(), None);
    let tree = engine.tree();
    let default = tree.iter().find(|t| t.name == DEFAULT_CONTEXT_NAME).unwrap();
    assert_eq!(depth(&default.children), 2);
}

#[test]
fn handles_and_entries_that_outlive_the_engine_handle_still_exit_cleanly() {
    let engine = Sentinel::builder().build();
    engine.load_flow_rules([FlowRule::new("a").count(1e9)]).unwrap();
    let ctx_engine = engine.clone();
    let ctx = ctx_engine.enter_context("ctx", "orig").unwrap();
    let e1 = engine.enter("a").unwrap();
    let r = engine.resource("a");
    let e2 = r.entry_owned().enter().unwrap();
    drop(ctx);
    drop(ctx_engine);
    drop(engine);
    // The engine handle is gone; the resource handle and the owned entries keep its state alive.
    let e3 = r.enter().unwrap();
    drop(e1);
    std::thread::spawn(move || drop(e2)).join().unwrap();
    drop(e3);
    let e4 = r.enter().unwrap();
    assert_eq!(e4.resource(), "a");
}

#[test]
fn a_borrowed_entry_exited_on_another_thread_does_not_leave_its_thread_inside_it() {
    let engine = engine();
    let (r, x) = (engine.resource("r"), engine.resource("x"));
    let e = r.enter().unwrap();
    std::thread::scope(|s| {
        s.spawn(move || drop(e));
    });
    // Java: the exit pops the thread's (shared) `Context`, so the next call here starts at the entrance.
    let ex = x.enter().unwrap();
    drop(ex);
    let tree = engine.tree();
    let default = tree.iter().find(|t| t.name == DEFAULT_CONTEXT_NAME).unwrap();
    let names: Vec<&str> = default.children.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, vec!["r", "x"], "x is entered at the entrance, not below r");
    assert_eq!(engine.current_context(), None);
}

/// An entry that exits after an entry nested in it exited on another thread (a borrowed entry held across an
/// await) has no entry nested in it left: its exit is an ordinary one, with nothing to unwind and nothing to
/// report (the nested entry's exit is waiting in the thread's mailbox).
#[test]
fn an_entry_exiting_after_its_nested_entry_exited_on_another_thread_reports_nothing() {
    use sentinel_testkit::logs::{Logged, OnEvent};
    use std::sync::{Arc, Mutex};
    let engine = engine();
    let (outer, inner, x) = (engine.resource("outer"), engine.resource("inner"), engine.resource("x"));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = errors.clone();
    let subscriber = OnEvent(move |e: Logged| {
        if e.level <= tracing::Level::WARN {
            seen.lock().unwrap().push(e.message);
        }
    });
    tracing::subscriber::with_default(subscriber, || {
        let o = outer.enter().unwrap();
        let i = inner.enter().unwrap();
        std::thread::scope(|s| {
            s.spawn(move || drop(i));
        });
        drop(o);
        assert_eq!(engine.current_context(), None);
        drop(x.enter().unwrap());
    });
    assert_eq!(*errors.lock().unwrap(), Vec::<String>::new());
    let tree = engine.tree();
    let default = tree.iter().find(|t| t.name == DEFAULT_CONTEXT_NAME).unwrap();
    let names: Vec<&str> = default.children.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, vec!["outer", "x"], "x is entered at the entrance");
}

#[test]
fn a_borrowed_entry_exited_on_another_thread_leaves_no_origin_on_its_thread() {
    // An `async fn` holding `resource.entry().origin(..).enter()` across an await, resumed on another worker.
    let engine = engine();
    let (r, x) = (engine.resource("r"), engine.resource("x"));
    let e = r.entry().origin("evil").enter().unwrap();
    std::thread::scope(|s| {
        s.spawn(move || drop(e));
    });
    assert_eq!(x.enter().unwrap().origin(), "", "the moved entry's caller stays on this thread");
}

#[test]
fn a_context_guard_dropped_after_its_borrowed_entry_exited_on_another_thread_exits_the_context() {
    let engine = engine();
    let r = engine.resource("r");
    let guard = engine.enter_context("web", "appA").unwrap();
    let e = r.enter().unwrap();
    std::thread::scope(|s| {
        s.spawn(move || drop(e));
    });
    drop(guard);
    assert_eq!(engine.current_context(), None);
}

/// The children of `name` in the default context's tree, by name.
fn children_of(engine: &Sentinel, path: &[&str]) -> Vec<String> {
    let tree = engine.tree();
    let mut nodes = &tree.iter().find(|t| t.name == DEFAULT_CONTEXT_NAME).unwrap().children;
    for name in path {
        nodes = &nodes.iter().find(|n| n.name == *name).unwrap_or_else(|| panic!("{name} in {path:?}")).children;
    }
    nodes.iter().map(|n| n.name.clone()).collect()
}

#[test]
fn a_borrowed_entry_exited_on_another_thread_leaves_that_threads_own_context_as_it_was() {
    // The other thread is inside entries of its own in the same (default) context, deeper than the moved
    // entry: the exit must not unwind them.
    let engine = engine();
    let (r, y, z, w) = (engine.resource("r"), engine.resource("y"), engine.resource("z"), engine.resource("w"));
    let e = r.enter().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let ey = y.enter().unwrap();
            let ez = z.enter().unwrap();
            drop(e);
            let ew = w.enter().unwrap();
            assert_eq!(ew.origin(), "");
            drop((ew, ez, ey));
            assert_eq!(engine.current_context(), None);
        });
    });
    assert_eq!(children_of(&engine, &["y", "z"]), vec!["w"], "w nests under the other thread's own z");
    assert_eq!(engine.current_context(), None, "and this thread is out of r");
}

#[test]
fn a_context_guard_dropped_before_its_entry_exits_on_another_thread_ends_the_context_at_that_exit() {
    let engine = engine();
    let (r, x) = (engine.resource("r"), engine.resource("x"));
    let guard = engine.enter_context("web", "appA").unwrap();
    let e = r.enter().unwrap();
    drop(guard);
    assert_eq!(engine.current_context(), Some(("web".into(), "appA".into())), "r is still in flight in it");
    std::thread::scope(|s| {
        s.spawn(move || drop(e));
    });
    assert_eq!(engine.current_context(), None);
    let ex = x.enter().unwrap();
    assert_eq!((ex.context_name(), ex.origin()), (DEFAULT_CONTEXT_NAME, ""));
}

#[test]
fn a_borrowed_entry_whose_thread_ended_exits_anywhere_with_exact_statistics() {
    let engine = engine();
    let r = engine.resource("r");
    for _ in 0..50 {
        // Made on a thread that ends before the entry exits: its exit has no thread to tell.
        let e = std::thread::scope(|s| s.spawn(|| r.enter().unwrap()).join().unwrap());
        drop(e);
    }
    assert_eq!(engine.cluster_stats("r").unwrap().threads, 0);
    assert_eq!(engine.current_context(), None);
}

#[test]
fn many_threads_each_moving_their_entries_to_another_see_their_contexts_end_every_time() {
    // Threads come and go (their mailboxes are recycled), each making borrowed entries, nested or not, that
    // another thread exits; every time, the maker's next call starts at the entrance with no origin.
    let engine = engine();
    let (r, inner, x) = (engine.resource("r"), engine.resource("inner"), engine.resource("x"));
    let (tx, rx) = mpsc::channel::<(Vec<sentinel_runtime::Entry<'_>>, mpsc::Sender<()>)>();
    std::thread::scope(|s| {
        s.spawn(move || {
            for (entries, done) in rx {
                drop(entries);
                done.send(()).unwrap();
            }
        });
        for round in 0..8 {
            let tx = tx.clone();
            let (r, inner, x, engine) = (&r, &inner, &x, &engine);
            s.spawn(move || {
                for i in 0..100 {
                    let outer = r.entry().origin(&format!("app{round}")).enter().unwrap();
                    let nested = if i % 2 == 0 { vec![inner.enter().unwrap()] } else { vec![] };
                    let (done_tx, done_rx) = mpsc::channel();
                    // The nested entry first when there is one (exits posted in either order).
                    let mut moved = nested;
                    moved.push(outer);
                    if i % 4 == 0 {
                        moved.reverse();
                    }
                    tx.send((moved, done_tx)).unwrap();
                    done_rx.recv().unwrap();
                    assert_eq!(engine.current_context(), None, "round {round}, call {i}");
                    let ex = x.enter().unwrap();
                    assert_eq!(ex.origin(), "", "round {round}, call {i}");
                }
            })
            .join()
            .unwrap();
        }
        drop(tx);
    });
    assert_eq!(children_of(&engine, &[]), vec!["r", "x"]);
    assert_eq!(engine.cluster_stats("r").unwrap().threads, 0);
}

#[test]
fn a_stale_exit_of_a_moved_entry_does_not_pop_a_later_entry_at_the_same_place() {
    // `context::moved`: "a stale mail is dropped, not applied". x is unwound from this thread's context by
    // its outer entry's exit while it is held on another thread; this thread then enters the same resources
    // again, so that y sits where x sat (same installation, depth and node). x's exit must not end y.
    let engine = engine();
    let (o, r, z) = (engine.resource("o"), engine.resource("r"), engine.resource("z"));
    let _guard = engine.enter_context("web", "").unwrap();
    let o1 = o.enter().unwrap();
    let x = r.enter().unwrap();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            go_rx.recv().unwrap();
            drop(x);
            done_tx.send(()).unwrap();
        });
        drop(o1); // unwinds x from this thread's context (x is still in flight on the other thread)
        let o2 = o.enter().unwrap();
        let y = r.enter().unwrap();
        go_tx.send(()).unwrap();
        done_rx.recv().unwrap();
        let ez = z.enter().unwrap(); // reads the context: y is still the innermost entry
        drop((ez, y, o2));
    });
    let tree = engine.tree();
    let web = tree.iter().find(|t| t.name == "web").unwrap();
    let on = web.children.iter().find(|n| n.name == "o").unwrap();
    let names = |ns: &[TreeNode]| ns.iter().map(|n| n.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&on.children), vec!["r"], "z is not entered beside r: {tree:?}");
    let rn = on.children.iter().find(|n| n.name == "r").unwrap();
    assert_eq!(names(&rn.children), vec!["z"], "z nests under y (r)");
}

/// The names of `nodes`.
fn names_of(nodes: &[TreeNode]) -> Vec<String> {
    nodes.iter().map(|n| n.name.clone()).collect()
}

/// The node named `name` among `nodes`.
fn child<'a>(nodes: &'a [TreeNode], name: &str) -> &'a TreeNode {
    nodes.iter().find(|n| n.name == name).unwrap_or_else(|| panic!("no node `{name}` in {nodes:?}"))
}

#[test]
fn a_stale_exit_of_an_entry_a_moved_exit_unwound_does_not_pop_a_later_entry_at_its_place() {
    // x, and w nested in it, are held on two other threads. x's exit, applied here, moves the context out past
    // w while w is still in flight; this thread then enters the same resources again (x2 where x sat, w2
    // where w sat). w's exit, posted after, must not end w2.
    let engine = engine();
    let (o, r, q, z) = (engine.resource("o"), engine.resource("r"), engine.resource("q"), engine.resource("z"));
    let _guard = engine.enter_context("web", "").unwrap();
    let _o = o.enter().unwrap();
    let x = r.enter().unwrap();
    let w = q.enter().unwrap();
    std::thread::scope(|s| s.spawn(move || drop(x)).join().unwrap());
    let x2 = r.enter().unwrap(); // reads x's exit first: the context is back in o, and x2 nests there
    let w2 = q.enter().unwrap();
    std::thread::scope(|s| s.spawn(move || drop(w)).join().unwrap());
    let ez = z.enter().unwrap(); // reads w's exit: w2 is still the innermost entry
    drop((ez, w2, x2));
    let tree = engine.tree();
    let on = child(&child(&tree, "web").children, "o");
    assert_eq!(names_of(&on.children), vec!["r"], "x2 nests in o: {tree:?}");
    let rn = child(&on.children, "r");
    assert_eq!(names_of(&rn.children), vec!["q"], "z is not entered beside w2: {tree:?}");
    assert_eq!(names_of(&child(&rn.children, "q").children), vec!["z"], "z nests in w2: {tree:?}");
}

#[test]
fn entries_left_in_the_context_when_entries_nested_in_them_were_unwound_still_exit_it() {
    // a, o and x (held on another thread): o's exit unwinds x. a, entered before, is still in the context: a
    // b entered now nests in it; a's exit on another thread, applied here, ends the context's a; the context
    // guard dropped while an entry is in flight still waits for that entry's exit.
    let engine = engine();
    let (a, b, c, o, r) =
        (engine.resource("a"), engine.resource("b"), engine.resource("c"), engine.resource("o"), engine.resource("r"));
    let guard = engine.enter_context("web", "").unwrap();
    let ea = a.enter().unwrap();
    let eo = o.enter().unwrap();
    let x = r.enter().unwrap();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let held = s.spawn(move || {
            go_rx.recv().unwrap();
            drop(x);
        });
        drop(eo); // unwinds x, still in flight
        drop(b.enter().unwrap()); // nests in a

        s.spawn(move || drop(ea)).join().unwrap();
        let ec = c.enter().unwrap(); // reads a's exit: c is entered at the context's entrance, beside a
        drop(guard); // c is in flight: the context ends when it exits
        assert_eq!(engine.current_context().map(|c| c.0), Some("web".to_string()));
        drop(ec);
        assert_eq!(engine.current_context(), None, "the context ended with its last entry");
        go_tx.send(()).unwrap();
        held.join().unwrap();
    });
    assert_eq!(engine.current_context(), None, "x's stale exit starts no context");
    let tree = engine.tree();
    let web = child(&tree, "web");
    assert_eq!(names_of(&web.children), vec!["a", "c"], "c beside a: {tree:?}");
    assert_eq!(names_of(&child(&web.children, "a").children), vec!["o", "b"], "{tree:?}");
}

#[test]
fn a_context_put_back_after_another_engines_keeps_the_entries_an_unwind_left_in_it() {
    // Engine a's context unwinds x (held on another thread): its era moves on, and o stays in it. Engine b's
    // context, installed over it by a guard, unwinds an entry of its own; when b's guard drops, a's context is
    // back, and o still exits it.
    let (a, b) = (engine(), engine());
    let (o, p, x) = (a.resource("o"), a.resource("p"), a.resource("x"));
    let (f, g, h) = (b.resource("f"), b.resource("g"), b.resource("h"));
    let guard_a = a.enter_context("web", "").unwrap();
    let eo = o.enter().unwrap();
    let ep = p.enter().unwrap();
    let ex = x.enter().unwrap();
    std::thread::scope(|s| {
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let held = s.spawn(move || {
            go_rx.recv().unwrap();
            drop(ex);
        });
        drop(ep); // unwinds x
        let guard_b = b.enter_context("rpc", "").unwrap();
        let (ef, eg, eh) = (f.enter().unwrap(), g.enter().unwrap(), h.enter().unwrap());
        drop(eg); // unwinds h
        drop((eh, ef));
        drop(guard_b);
        assert_eq!(a.current_context().map(|c| c.0), Some("web".to_string()), "a's context is back");
        drop(a.resource("y").enter().unwrap()); // nests in o
        drop(eo);
        go_tx.send(()).unwrap();
        held.join().unwrap();
    });
    drop(a.resource("z").enter().unwrap()); // at the context's entrance: o exited it
    drop(guard_a);
    assert_eq!(a.current_context(), None);
    let tree = a.tree();
    let web = child(&tree, "web");
    assert_eq!(names_of(&web.children), vec!["o", "z"], "{tree:?}");
    assert_eq!(names_of(&child(&web.children, "o").children), vec!["p", "y"], "{tree:?}");
    let tree_b = b.tree();
    let rpc = child(&tree_b, "rpc");
    assert_eq!(names_of(&rpc.children), vec!["f"], "{tree_b:?}");
}

#[test]
fn borrowed_entries_exiting_in_any_order_on_either_thread_nest_as_a_model_of_the_context_says() {
    // Seeded random runs: this thread enters resources (r0 to r5, each nested only in lower-numbered ones, so
    // that the call tree has no cycle), and exits any entry still held, either here or on another thread
    // (posted, applied at this thread's next read of its context). The model: an exit ends the entry and the
    // entries nested in it when it is still in the context, and does nothing when an earlier exit already
    // unwound it. Every pair (outer, inner) the engine's call tree records must be one the model entered.
    use std::collections::BTreeSet;
    for seed in [0x2545_f491_4f6c_dd1du64, 0x9e37_79b9_7f4a_7c15, 0xd1b5_4a32_d192_ed03] {
        let engine = engine();
        let names: Vec<String> = (0..6).map(|i| format!("r{i}")).collect();
        let resources: Vec<_> = names.iter().map(|n| engine.resource(n)).collect();
        let mut rng = seed;
        let mut next = move |n: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n as u64) as usize
        };
        let mut expected: BTreeSet<(String, String)> = BTreeSet::new();
        let guard = engine.enter_context("web", "").unwrap();
        std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel::<(sentinel_runtime::Entry<'_>, mpsc::Sender<()>)>();
            s.spawn(move || {
                for (entry, done) in rx {
                    drop(entry);
                    done.send(()).unwrap();
                }
            });
            // The entries held (id, resource, entry), and the model's context (id, resource), outermost first.
            let mut held: Vec<(usize, usize, sentinel_runtime::Entry<'_>)> = Vec::new();
            let mut chain: Vec<(usize, usize)> = Vec::new();
            for id in 0..3_000 {
                let lowest = chain.last().map_or(0, |&(_, r)| r + 1);
                if (next(3) == 0 || held.is_empty()) && lowest < names.len() {
                    let r = lowest + next(names.len() - lowest);
                    let outer = chain.last().map_or("web".to_string(), |&(_, o)| names[o].clone());
                    expected.insert((outer, names[r].clone()));
                    held.push((id, r, resources[r].enter().unwrap()));
                    chain.push((id, r));
                    continue;
                }
                if held.is_empty() {
                    continue;
                }
                let (gone, _, entry) = held.remove(next(held.len()));
                if let Some(at) = chain.iter().position(|&(i, _)| i == gone) {
                    chain.truncate(at);
                }
                if next(2) == 0 {
                    drop(entry);
                } else {
                    let (done_tx, done_rx) = mpsc::channel();
                    tx.send((entry, done_tx)).unwrap();
                    done_rx.recv().unwrap();
                }
            }
            drop(held);
            drop(tx);
        });
        assert_eq!(engine.current_context().map(|c| c.0), Some("web".to_string()), "seed {seed:#x}");
        drop(guard);
        assert_eq!(engine.current_context(), None, "seed {seed:#x}");
        fn edges(outer: &str, nodes: &[TreeNode], out: &mut BTreeSet<(String, String)>) {
            for n in nodes {
                out.insert((outer.to_string(), n.name.clone()));
                edges(&n.name, &n.children, out);
            }
        }
        let tree = engine.tree();
        let mut seen = BTreeSet::new();
        edges("web", &child(&tree, "web").children, &mut seen);
        let unexpected: Vec<_> = seen.difference(&expected).collect();
        assert!(unexpected.is_empty(), "seed {seed:#x}: entered in the wrong place: {unexpected:?}");
        let missing: Vec<_> = expected.difference(&seen).collect();
        assert!(missing.is_empty(), "seed {seed:#x}: not in the call tree: {missing:?}");
        for r in &names {
            assert_eq!(engine.cluster_stats(r).map_or(0, |s| s.threads), 0, "seed {seed:#x}: {r}");
        }
    }
}

#[sentinel_runtime::sentinel_resource(name = "suspended-w")]
async fn suspends_once(rx: futures::channel::oneshot::Receiver<()>) -> Result<(), sentinel_runtime::BlockError> {
    let _ = rx.await;
    Ok(())
}

/// An annotated `async fn` called inside `o` suspends; this thread then enters `x` and `x2`, and the call
/// completes (on another thread, or on this one inside those entries): its exit must not unwind them.
fn suspended_call_completes_while_this_thread_is_in_later_entries(on_another_thread: bool) {
    use std::future::Future;
    use std::task::{Context, Poll};
    let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(T0)).build().leak();
    let (o, x, x2, y) = (engine.resource("o"), engine.resource("x"), engine.resource("x2"), engine.resource("y"));
    engine.scoped(|| {
        let outer = o.enter().unwrap();
        let (tx, rx) = futures::channel::oneshot::channel();
        let mut call = Box::pin(suspends_once(rx));
        let waker = futures::task::noop_waker();
        assert!(matches!(call.as_mut().poll(&mut Context::from_waker(&waker)), Poll::Pending));
        let (ex, ex2) = (x.enter().unwrap(), x2.enter().unwrap());
        tx.send(()).unwrap();
        if on_another_thread {
            std::thread::scope(|s| s.spawn(move || futures::executor::block_on(call)).join().unwrap()).unwrap();
        } else {
            futures::executor::block_on(call).unwrap();
        }
        let ey = y.enter().unwrap();
        drop((ey, ex2, ex, outer));
    });
    assert_eq!(children_of(engine, &["o", "x", "x2"]), vec!["y"], "y nests under x2");
    assert_eq!(engine.cluster_stats("suspended-w").unwrap().threads, 0);
    assert_eq!(engine.current_context(), None);
}

#[test]
fn an_annotated_async_fn_completed_on_another_thread_leaves_the_first_threads_context_as_it_is() {
    // The call's entry is decided in the first poll, on this thread, inside `o`; at the suspension this thread
    // gets its context back (the entry is carried in the future).
    suspended_call_completes_while_this_thread_is_in_later_entries(true);
}

#[test]
fn an_annotated_async_fn_resumed_on_its_thread_inside_later_entries_leaves_them_installed() {
    suspended_call_completes_while_this_thread_is_in_later_entries(false);
}

#[test]
fn an_entry_made_in_one_requests_scope_and_exited_in_anothers_leaves_that_scope_as_it_is() {
    // Java: an entry exits its own `Context`; here it was made in request 1's scope and exits while request 2's
    // scope is installed (a task of request 1 finishing on a worker that polls request 2): request 2's entries
    // stay installed.
    let engine = engine();
    let (req, db, a, b, c) = (
        engine.resource("req"),
        engine.resource("db"),
        engine.resource("a"),
        engine.resource("b"),
        engine.resource("c"),
    );
    let first = req.entry_owned().enter().unwrap();
    let held = first.in_scope(|| db.enter().unwrap());
    let second = req.entry_owned().enter().unwrap();
    second.in_scope(|| {
        let (ea, eb) = (a.enter().unwrap(), b.enter().unwrap());
        drop(held);
        let ec = c.enter().unwrap();
        drop((ec, eb, ea));
    });
    drop((first, second));
    assert_eq!(children_of(&engine, &["req", "a", "b"]), vec!["c"], "c nests under b");
    assert_eq!(engine.current_context(), None);
}

#[test]
fn a_moved_entrys_exit_reaches_its_thread_even_when_a_future_carrying_its_context_is_polled_there_first() {
    // The future carries this thread's context (captured inside `o`); `o` moves to another thread and exits
    // there; the future is then polled here, and reads its context inside the poll. This thread's context,
    // put back after the poll, must still learn that `o` exited.
    let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(T0)).build().leak();
    let (o, x, y) = (engine.resource("o"), engine.resource("x"), engine.resource("y"));
    let _guard = engine.enter_context("web", "appA").unwrap();
    let eo = o.enter().unwrap();
    let fut = engine.scoped_future(async { drop(x.enter().unwrap()) });
    std::thread::scope(|s| {
        s.spawn(move || drop(eo));
    });
    futures::executor::block_on(fut);
    let ey = y.enter().unwrap();
    drop(ey);
    let tree = engine.tree();
    let web = tree.iter().find(|t| t.name == "web").unwrap();
    let names: Vec<&str> = web.children.iter().map(|n| n.name.as_str()).collect();
    assert!(names.contains(&"y"), "y is entered at the context's entrance, not inside o: {tree:?}");
}

#[test]
fn a_moved_entrys_exit_reaches_its_thread_even_when_an_entrys_scope_is_installed_there_first() {
    // As above, with an owned entry's scope read first on this thread.
    let engine = engine();
    let (o, req, db, y) = (engine.resource("o"), engine.resource("req"), engine.resource("db"), engine.resource("y"));
    let _guard = engine.enter_context("web", "appA").unwrap();
    let eo = o.enter().unwrap();
    let request = req.entry_owned().enter().unwrap();
    std::thread::scope(|s| {
        s.spawn(move || drop(eo));
    });
    request.in_scope(|| drop(db.enter().unwrap()));
    drop(y.enter().unwrap());
    drop(request);
    let tree = engine.tree();
    let web = tree.iter().find(|t| t.name == "web").unwrap();
    let names: Vec<&str> = web.children.iter().map(|n| n.name.as_str()).collect();
    assert!(names.contains(&"y"), "y is entered at the context's entrance, not inside o: {tree:?}");
}

#[test]
fn a_moved_entrys_exit_reaches_its_thread_even_when_another_engines_context_is_read_there_first() {
    let (one, two) = (engine(), engine());
    let (o, z) = (one.resource("o"), two.resource("z"));
    let eo = o.enter().unwrap();
    let guard = two.enter_context("web", "").unwrap();
    std::thread::scope(|s| {
        s.spawn(move || drop(eo));
    });
    drop(z.enter().unwrap()); // reads the other engine's context, installed over this one's
    drop(guard);
    assert_eq!(one.current_context(), None, "o exited: the context it started is over");
}

#[test]
fn a_context_guard_over_another_engines_context_gives_it_back_when_it_ends() {
    let (one, two) = (engine(), engine());
    let (o, z) = (one.resource("o"), two.resource("z"));
    let eo = o.enter().unwrap();
    let guard = two.enter_context("web", "appB").unwrap();
    let ez = z.enter().unwrap();
    drop(guard);
    drop(ez);
    assert_eq!(two.current_context(), None, "the guard's context is over");
    assert_eq!(one.current_context(), Some((DEFAULT_CONTEXT_NAME.into(), String::new())), "o is still in flight");
    drop(eo);
    assert_eq!(one.current_context(), None);
}

#[test]
fn a_borrowed_entry_exited_inside_a_future_carrying_its_threads_context_leaves_that_thread_out_of_it() {
    // The future carries a copy of this thread's context, made while `r` was its innermost entry; `r` exits
    // inside the future's poll. Java: the exit pops the thread's (shared) `Context`; here the thread's own
    // context must leave `r` too, not only the future's copy of it.
    let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(T0)).build().leak();
    let (r, x) = (engine.resource("r"), engine.resource("x"));
    engine.scoped(|| {
        let e = r.enter().unwrap();
        let fut = engine.scoped_future(async move { drop(e) });
        futures::executor::block_on(fut);
        drop(x.enter().unwrap());
    });
    assert_eq!(children_of(engine, &[]), vec!["r", "x"], "x is entered at the entrance, not below r");
    assert_eq!(engine.current_context(), None);
}

#[test]
fn a_borrowed_entry_exited_inside_a_future_polled_on_another_thread_leaves_its_thread_out_of_it() {
    // As above, the future polled on another thread; and an entry made inside the future, exited there, does
    // not end this thread's own entries.
    let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(T0)).build().leak();
    let (r, w, x) = (engine.resource("r"), engine.resource("w"), engine.resource("x"));
    engine.scoped(|| {
        let e = r.enter().unwrap();
        let fut = engine.scoped_future(async move {
            drop(w.enter().unwrap());
            drop(e);
        });
        std::thread::scope(|s| s.spawn(move || futures::executor::block_on(fut)).join().unwrap());
        drop(x.enter().unwrap());
    });
    assert_eq!(children_of(engine, &[]), vec!["r", "x"], "x is entered at the entrance, not below r");
    assert_eq!(children_of(engine, &["r"]), vec!["w"]);
    assert_eq!(engine.current_context(), None);
}

#[test]
fn a_moved_entrys_exit_read_inside_a_scoped_engine_stays_applied_after_it() {
    let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(T0)).build().leak();
    let (r, x, y) = (engine.resource("r"), engine.resource("x"), engine.resource("y"));
    let e = r.enter().unwrap();
    std::thread::scope(|s| {
        s.spawn(move || drop(e));
    });
    engine.scoped(|| drop(x.enter().unwrap())); // reads the context: r has exited
    drop(y.enter().unwrap());
    assert_eq!(children_of(engine, &[]), vec!["r", "x", "y"], "y is entered at the entrance, not below r");
    assert_eq!(engine.current_context(), None);
}
