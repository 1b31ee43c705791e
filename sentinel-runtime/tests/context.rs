//! Contexts, origins, the call tree and caps (SPEC §2).

use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::{ContextError, Sentinel, DEFAULT_CONTEXT_NAME};

const T0: u64 = 1_700_000_000_000;

fn engine() -> Sentinel {
    Sentinel::builder().manual_clock(ManualClock::at_millis(T0)).build()
}

#[test]
fn nested_entries_form_the_call_tree() {
    let engine = engine();
    let (a, b, c) = (engine.resource("a"), engine.resource("b"), engine.resource("c"));
    {
        let _ctx = engine.enter_context("web", "").unwrap();
        let _ea = a.enter().unwrap();
        {
            let _eb = b.enter().unwrap();
            let _ec = c.enter().unwrap();
        }
        let _ec = c.enter().unwrap();
    }
    let tree = engine.tree();
    let web = tree.iter().find(|t| t.name == "web").unwrap();
    assert_eq!(web.children.len(), 1);
    let a_node = &web.children[0];
    assert_eq!(a_node.name, "a");
    let names: Vec<&str> = a_node.children.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, vec!["b", "c"]);
    assert_eq!(a_node.children[0].children[0].name, "c", "c was also entered below b");
    assert_eq!(web.stats.pass_qps, 1.0, "an entrance sums its direct children");
}

#[test]
fn default_context_is_used_and_cleared_after_the_last_exit() {
    let engine = engine();
    assert_eq!(engine.current_context(), None);
    let x = engine.resource("x");
    let e = x.enter().unwrap();
    assert_eq!(engine.current_context(), Some((DEFAULT_CONTEXT_NAME.to_string(), String::new())));
    assert_eq!(e.context_name(), DEFAULT_CONTEXT_NAME);
    drop(e);
    assert_eq!(engine.current_context(), None);
}

#[test]
fn entering_a_context_when_one_is_active_keeps_the_active_one() {
    let engine = engine();
    let outer = engine.enter_context("outer", "appA").unwrap();
    {
        let _inner = engine.enter_context("inner", "appB").unwrap();
        assert_eq!(engine.current_context(), Some(("outer".into(), "appA".into())));
    }
    assert_eq!(engine.current_context(), Some(("outer".into(), "appA".into())), "the inner guard undid nothing");
    drop(outer);
    assert_eq!(engine.current_context(), None);
}

#[test]
fn the_default_context_name_is_reserved() {
    let engine = engine();
    assert_eq!(engine.enter_context(DEFAULT_CONTEXT_NAME, "").unwrap_err(), ContextError::ReservedName);
    assert_eq!(engine.enter_context("", "").unwrap_err(), ContextError::EmptyName);
}

#[test]
fn an_entry_with_its_own_context_and_origin_exits_it() {
    let engine = engine();
    let r = engine.resource("r");
    let e = r.entry().context("rpc").origin("appA").enter().unwrap();
    assert_eq!((e.context_name(), e.origin()), ("rpc", "appA"));
    drop(e);
    assert_eq!(engine.current_context(), None);
    assert_eq!(engine.entrance_stats("rpc").unwrap().pass_qps, 1.0);
    assert_eq!(engine.origin_stats("r", "appA").unwrap().pass_qps, 1.0);
}

#[test]
fn an_entry_naming_the_default_context_or_none_enters_the_default_context() {
    let engine = engine();
    let r = engine.resource("r");
    for name in [DEFAULT_CONTEXT_NAME, ""] {
        let e = r.entry().context(name).origin("appA").enter().unwrap();
        assert_eq!((e.context_name(), e.origin()), (DEFAULT_CONTEXT_NAME, "appA"), "{name:?}");
        drop(e);
        let e = r.entry().context(name).enter().unwrap();
        assert_eq!((e.context_name(), e.origin()), (DEFAULT_CONTEXT_NAME, ""), "{name:?}");
    }
    assert_eq!(engine.current_context(), None);
    assert_eq!(engine.origin_stats("r", "appA").unwrap().pass_qps, 2.0);
    assert!(engine.entrance_stats("").is_none());
}

#[test]
fn exiting_an_outer_entry_first_unwinds_the_context_and_keeps_counts_exact() {
    let engine = engine();
    let (a, b) = (engine.resource("a"), engine.resource("b"));
    let ea = a.enter().unwrap();
    let eb = b.enter().unwrap();
    drop(ea); // out of order: logged, context unwound to before `a`
    assert_eq!(engine.current_context(), None);
    drop(eb); // still records its own completion, touches no context
    assert_eq!(engine.cluster_stats("a").unwrap().threads, 0);
    assert_eq!(engine.cluster_stats("b").unwrap().threads, 0);
    assert_eq!(engine.cluster_stats("b").unwrap().success_qps, 1.0);
    let e = a.enter().unwrap();
    assert_eq!(e.context_name(), DEFAULT_CONTEXT_NAME);
}

#[test]
fn contexts_of_two_engines_on_one_thread_do_not_mix() {
    let (one, two) = (engine(), engine());
    let _ctx = one.enter_context("web", "appA").unwrap();
    let e = two.enter("x").unwrap();
    assert_eq!(e.context_name(), DEFAULT_CONTEXT_NAME, "engine two does not see engine one's context");
    assert_eq!(e.origin(), "");
    drop(e);
    assert_eq!(one.current_context(), Some(("web".into(), "appA".into())));
}

#[test]
fn a_scoped_engine_stands_in_for_the_global_one() {
    let engine = engine().leak();
    assert!(std::ptr::eq(engine.scoped(Sentinel::current), engine));
    assert!(std::ptr::eq(Sentinel::current(), Sentinel::global()));
}

#[test]
fn the_default_context_node_shows_the_cluster_numbers_until_a_named_context_is_used() {
    let engine = engine();
    let r = engine.resource("shared-node");
    for _ in 0..3 {
        drop(r.enter().unwrap());
    }
    let default_stats = engine.context_stats("shared-node", DEFAULT_CONTEXT_NAME).unwrap();
    assert_eq!(default_stats.pass_qps, 3.0, "all calls so far were in the default context");
    assert_eq!(default_stats, engine.cluster_stats("shared-node").unwrap());

    // A named context: from now on the default context's node counts only its own calls.
    {
        let _ctx = engine.enter_context("web", "").unwrap();
        drop(r.enter().unwrap());
        drop(r.enter().unwrap());
    }
    drop(r.enter().unwrap());
    assert_eq!(engine.cluster_stats("shared-node").unwrap().pass_qps, 6.0);
    assert_eq!(engine.context_stats("shared-node", "web").unwrap().pass_qps, 2.0);
    assert_eq!(engine.context_stats("shared-node", DEFAULT_CONTEXT_NAME).unwrap().pass_qps, 1.0);
    // Thread counts stay balanced on every node.
    let held = r.enter().unwrap();
    assert_eq!(engine.context_stats("shared-node", DEFAULT_CONTEXT_NAME).unwrap().threads, 1);
    drop(held);
    assert_eq!(engine.context_stats("shared-node", DEFAULT_CONTEXT_NAME).unwrap().threads, 0);
    assert_eq!(engine.cluster_stats("shared-node").unwrap().threads, 0);
}

#[test]
fn an_entry_in_flight_across_the_split_exits_on_the_nodes_it_entered() {
    let engine = engine();
    let r = engine.resource("split-in-flight");
    let before = r.enter().unwrap(); // recorded on the cluster node only
    {
        let _ctx = engine.enter_context("rpc", "").unwrap();
        drop(r.enter().unwrap());
    }
    drop(before);
    assert_eq!(engine.context_stats("split-in-flight", DEFAULT_CONTEXT_NAME).unwrap().threads, 0);
    assert_eq!(engine.cluster_stats("split-in-flight").unwrap().threads, 0);
    assert_eq!(engine.cluster_stats("split-in-flight").unwrap().pass_qps, 2.0);
}

#[test]
fn a_chain_rule_on_the_default_context_limits_calls_in_it_only() {
    let engine = engine();
    engine.load_flow_rules([FlowRule::new("chained").count(2.0).chain(DEFAULT_CONTEXT_NAME)]).unwrap();
    let r = engine.resource("chained");
    for _ in 0..2 {
        drop(r.enter().unwrap());
    }
    assert!(r.enter().is_err(), "a third call in the default context in the same window is over the limit");
    {
        let _ctx = engine.enter_context("batch", "").unwrap();
        assert!(r.enter().is_ok(), "the rule does not read other contexts");
    }
    assert_eq!(engine.context_stats("chained", DEFAULT_CONTEXT_NAME).unwrap().pass_qps, 2.0);
    assert_eq!(engine.context_stats("chained", DEFAULT_CONTEXT_NAME).unwrap().block_qps, 1.0);
    assert_eq!(engine.cluster_stats("chained").unwrap().pass_qps, 3.0);
}

#[test]
fn every_origin_of_a_resource_keeps_its_own_node_among_many() {
    let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(T0)).max_origins_per_resource(1000).build();
    let r = engine.resource("many-callers");
    for i in 0..600u32 {
        let origin = format!("caller-{i}");
        for _ in 0..(i % 3 + 1) {
            drop(r.entry().origin(&origin).enter().unwrap());
        }
    }
    assert_eq!(engine.origins_of("many-callers").len(), 600);
    for i in [0u32, 1, 2, 255, 256, 257, 511, 599] {
        let stats = engine.origin_stats("many-callers", &format!("caller-{i}")).unwrap();
        assert_eq!(stats.pass_qps, (i % 3 + 1) as f64, "caller-{i}");
    }
    assert_eq!(engine.cluster_stats("many-callers").unwrap().pass_qps, (0..600).map(|i| i % 3 + 1).sum::<u32>() as f64);
}

#[test]
fn a_context_guard_dropped_while_an_entry_is_in_flight_keeps_the_context_until_the_entry_exits() {
    let engine = engine();
    let (a, b) = (engine.resource("a"), engine.resource("b"));
    let ea = {
        let _ctx = engine.enter_context("web", "appA").unwrap();
        a.enter().unwrap()
    };
    // Java: `ContextUtil.exit()` leaves a context whose current entry has not exited.
    assert_eq!(engine.current_context(), Some(("web".into(), "appA".into())));
    let eb = b.enter().unwrap();
    assert_eq!((eb.context_name(), eb.origin()), ("web", "appA"), "nested under `a`, in `a`'s context");
    drop(eb);
    drop(ea);
    assert_eq!(engine.origin_stats("b", "appA").map(|s| s.pass_qps), Some(1.0));
    assert_eq!(engine.current_context(), None, "the guard's exit takes effect once its last entry exits");
    let e = a.enter().unwrap();
    assert_eq!(e.context_name(), DEFAULT_CONTEXT_NAME);
}

#[test]
fn the_context_cap_admits_as_many_named_contexts_as_it_says() {
    // Java: `contextNameNodeMap.size() > MAX_CONTEXT_NAME_SIZE` refuses; the map starts with the default
    // context, so MAX named contexts are created.
    let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(T0)).max_contexts(3).build();
    for name in ["c1", "c2", "c3"] {
        let _g = engine.enter_context(name, "").unwrap();
        assert_eq!(engine.current_context().unwrap().0, name);
    }
    let _g = engine.enter_context("c4", "").unwrap();
    assert_eq!(engine.current_context().unwrap().0, sentinel_runtime::CONTEXT_OVERFLOW);
}
