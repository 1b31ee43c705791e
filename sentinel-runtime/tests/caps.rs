//! The engine's caps on resources and contexts: a cap reached never switches a rule off. Names that rules
//! name keep their own resource or context; other new names share an overflow that is still checked.

use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::system::SystemRule;
use sentinel_runtime::{
    BlockError, EntryType, Sentinel, CONTEXT_OVERFLOW, RESOURCE_OVERFLOW, RESOURCE_PATTERNS_OVERFLOW,
};

const T0: u64 = 1_700_000_000_000;

/// An engine whose resource cap (2) is already reached by `f1` and `f2`.
fn full_engine() -> Sentinel {
    let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(T0)).max_resources(2).build();
    let _ = (engine.resource("f1"), engine.resource("f2"));
    engine
}

#[test]
fn a_resource_a_flow_rule_names_is_checked_when_first_used_past_the_resource_cap() {
    let engine = full_engine();
    engine.load_flow_rules([FlowRule::new("admin").count(0.0)]).unwrap();
    let admin = engine.resource("admin");
    assert_eq!(admin.name(), "admin", "a name a rule names gets its own resource past the cap");
    assert!(matches!(admin.enter(), Err(BlockError::Flow { .. })));
    assert!(engine.caps().resource_cap_reached());
}

#[test]
fn a_name_a_regex_rule_matches_gets_its_own_checked_resource_past_the_cap() {
    let engine = full_engine();
    engine.load_flow_rules([FlowRule::new("GET:/admin/.*").regex(true).count(1.0)]).unwrap();
    let users = engine.resource("GET:/admin/users");
    assert_eq!(users.name(), "GET:/admin/users");
    assert!(users.enter().is_ok());
    assert!(users.enter().is_err(), "the regex rule's limit of 1 applies");
    assert_eq!(engine.resource("GET:/public").name(), RESOURCE_OVERFLOW, "a name the pattern misses overflows");
}

#[test]
fn past_the_cap_names_only_regex_rules_match_share_one_resource_per_patterns_and_their_rules_still_apply() {
    // Clients may choose names a pattern matches (a search path): those are capped apart (here at 2), and
    // past the cap share the resource of the first of them with the same patterns, which the rules check.
    let engine = full_engine();
    engine.load_flow_rules([FlowRule::new("GET:/search/.*").regex(true).count(2.0)]).unwrap();
    for own in ["GET:/search/a", "GET:/search/b"] {
        assert_eq!(engine.resource(own).name(), own, "within the cap, its own resource");
    }
    let (c, d) = (engine.resource("GET:/search/c"), engine.resource("GET:/search/d"));
    assert_eq!((c.name(), d.name()), ("GET:/search/c", "GET:/search/c"), "past it, one resource for both");
    let _held = (c.enter().unwrap(), d.enter().unwrap());
    assert!(matches!(engine.resource("GET:/search/e").enter(), Err(BlockError::Flow { .. })), "their limit of 2");
    for i in 0..1_000 {
        drop(engine.resource(&format!("GET:/search/{i}x")));
    }
    assert_eq!(engine.resource_names().len(), 5, "f1, f2, a, b and the shared one");
    // A name that also matches a second pattern shares with the names that match both.
    engine
        .load_flow_rules([
            FlowRule::new("GET:/search/.*").regex(true).count(2.0),
            FlowRule::new(".*/x.*").regex(true).count(5.0),
        ])
        .unwrap();
    let (x1, x2) = (engine.resource("GET:/search/x1"), engine.resource("GET:/search/x2"));
    assert_eq!((x1.name(), x2.name()), ("GET:/search/x1", "GET:/search/x1"));
    assert_eq!(engine.resource("GET:/search/f").name(), "GET:/search/c");
    // The rules change so that the shared resource no longer matches as it did: the next name past the cap
    // starts another.
    engine.load_flow_rules([FlowRule::new("GET:/search/[d-z].*").regex(true).count(2.0)]).unwrap();
    assert_eq!(engine.resource("GET:/search/g").name(), "GET:/search/g");
    assert_eq!(engine.resource("GET:/search/h").name(), "GET:/search/g");
    assert_eq!(engine.resource("GET:/public").name(), RESOURCE_OVERFLOW, "a name no rule targets overflows");
    let notes = engine.diagnose("GET:/search/never").notes.join("\n");
    assert!(notes.contains("shares the resource of the first name past the cap"), "{notes}");
}

#[test]
fn an_authority_black_list_still_refuses_its_origin_past_the_cap() {
    let engine = full_engine();
    engine.load_authority_rules([AuthorityRule::new("POST:/orders", "blocked-app", AuthorityStrategy::Black)]).unwrap();
    let orders = engine.resource_typed("POST:/orders", EntryType::In);
    assert!(matches!(orders.entry().origin("blocked-app").enter(), Err(BlockError::Authority { .. })));
    assert!(orders.entry().origin("good-app").enter().is_ok());
}

#[test]
fn a_relate_rule_reads_a_related_resource_first_used_past_the_cap() {
    let engine = full_engine();
    engine.load_flow_rules([FlowRule::new("f1").count(1.0).relate("db")]).unwrap();
    let db = engine.resource("db");
    assert_eq!(db.name(), "db", "the related resource is named by the rule");
    for _ in 0..3 {
        drop(db.enter().unwrap());
    }
    assert!(engine.resource("f1").enter().is_err(), "f1 is limited by db's 3 calls against a count of 1");
}

#[test]
fn names_past_the_cap_share_the_overflow_resource_which_system_rules_and_its_own_rules_check() {
    let engine = full_engine();
    engine.load_system_rules([SystemRule { qps: Some(2.0), ..SystemRule::default() }]).unwrap();
    let passed = (0..5).filter(|i| engine.resource_typed(&format!("flood-{i}"), EntryType::In).enter().is_ok()).count();
    assert_eq!(passed, 2, "inbound calls past the cap still count towards the system rule");
    assert_eq!(engine.resource("flood-9").name(), RESOURCE_OVERFLOW);
    assert_eq!(engine.resource_names().len(), 3, "f1, f2 and the overflow: the flood made no resources");
    assert_eq!(engine.caps().resources_overflowed, 6);

    let engine = full_engine();
    engine.load_flow_rules([FlowRule::new(RESOURCE_OVERFLOW).count(1.0)]).unwrap();
    assert!(engine.resource("x1").enter().is_ok());
    assert!(engine.resource("x2").enter().is_err(), "a rule on the overflow resource limits every name in it");
    assert_eq!(engine.cluster_stats(RESOURCE_OVERFLOW).unwrap().block_qps, 1.0);
}

#[test]
fn a_handle_taken_after_a_rule_is_loaded_gets_its_own_resource_past_the_cap() {
    let engine = full_engine();
    assert_eq!(engine.resource("late").name(), RESOURCE_OVERFLOW);
    engine.load_flow_rules([FlowRule::new("late").count(0.0)]).unwrap();
    let late = engine.resource("late");
    assert_eq!(late.name(), "late");
    assert!(late.enter().is_err());
}

#[test]
fn a_flood_of_names_past_the_cap_keeps_the_engine_bounded() {
    let engine = full_engine();
    for i in 0..10_000 {
        drop(engine.resource(&format!("n{i}")).enter().unwrap());
    }
    assert_eq!(engine.resource_names().len(), 3);
    assert_eq!(engine.cluster_stats(RESOURCE_OVERFLOW).unwrap().pass_qps, 10_000.0);
}

#[test]
fn entries_in_a_context_past_the_cap_run_in_the_overflow_context_and_are_checked() {
    let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(T0)).max_contexts(3).build();
    engine.load_flow_rules([FlowRule::new("r").count(0.0)]).unwrap();
    let r = engine.resource("r");
    for name in ["c1", "c2", "c3", "c4"] {
        let _g = engine.enter_context(name, "").unwrap();
        let blocked = r.enter();
        assert!(blocked.is_err(), "checked in {name}, past the cap too");
    }
    let _g = engine.enter_context("c5", "").unwrap();
    assert_eq!(engine.current_context().unwrap().0, CONTEXT_OVERFLOW);
    assert!(engine.caps().context_cap_reached());
    assert_eq!(engine.caps().contexts_overflowed, 2, "c4 and c5 (Java: MAX named contexts beside the default one)");
}

#[test]
fn a_context_a_chain_rule_names_is_created_past_the_context_cap() {
    let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(T0)).max_contexts(2).build();
    engine.load_flow_rules([FlowRule::new("r").count(1.0).chain("checkout")]).unwrap();
    drop(engine.enter_context("c1", "").unwrap());
    let r = engine.resource("r");
    let _g = engine.enter_context("checkout", "").unwrap();
    assert_eq!(engine.current_context().unwrap().0, "checkout");
    assert!(r.enter().is_ok());
    assert!(r.enter().is_err(), "the chain rule reads r's node in checkout");
}

#[test]
fn diagnose_shows_the_cap_and_what_a_name_past_it_becomes() {
    let engine = full_engine();
    let d = engine.diagnose("never-seen");
    assert!(d.caps.resource_cap_reached());
    assert!(d.notes.iter().any(|n| n.contains(RESOURCE_OVERFLOW)), "{:?}", d.notes);
    assert!(d.to_string().contains("caps: resources 2/2 (reached)"), "{d}");
    engine.load_flow_rules([FlowRule::new("never-seen").count(1.0)]).unwrap();
    let d = engine.diagnose("never-seen");
    assert!(d.notes.iter().any(|n| n.contains("a rule names this resource")), "{:?}", d.notes);
    let _ = engine.resource("spill");
    let d = engine.diagnose(RESOURCE_OVERFLOW);
    assert!(d.notes.iter().any(|n| n.contains("stands for the new names")), "{:?}", d.notes);
}

/// A name past the cap that two patterns match is checked by each of their rules (whichever is the tighter),
/// and a name only one of them matches by that one alone: what the resources made past the cap keep, within
/// their bound.
#[test]
fn past_the_cap_a_name_two_patterns_match_is_limited_by_each_rule_and_by_no_other() {
    for (search, x, limit) in [(2.0, 100.0, 2), (100.0, 3.0, 3)] {
        let engine = full_engine();
        engine
            .load_flow_rules([
                FlowRule::new("GET:/search/.*").regex(true).count(search),
                FlowRule::new(".*/x.*").regex(true).count(x),
            ])
            .unwrap();
        for own in ["GET:/search/a", "GET:/search/b"] {
            assert_eq!(engine.resource(own).name(), own, "within the cap, its own resource");
        }
        let both = engine.resource("GET:/search/x1");
        let held: Vec<_> = (0..10).map_while(|_| both.enter().ok()).collect();
        assert_eq!(held.len(), limit, "search {search}, x {x}: the tighter rule limits a name both match");
        assert!(matches!(both.enter(), Err(BlockError::Flow { .. })));
        drop(held);
        assert_eq!(engine.resource("GET:/search/x2").name(), "GET:/search/x1", "past the cap, shared");
        let only_x = engine.resource("POST:/x9");
        assert_eq!(only_x.name(), "POST:/x9", "another combination of patterns");
        let passed = (0..200).filter(|_| only_x.enter().is_ok()).count();
        assert_eq!(passed, x as usize, "search {search}, x {x}: only the rule that matches it limits it");
    }
}

/// Past the cap, names only regex rules match share one resource per combination of patterns they match:
/// with a dozen ordinary patterns (a path prefix, a suffix, a method...), client-chosen names pick among
/// 4,096 combinations, which must not make 4,096 resources whatever the cap (here 2).
#[test]
fn past_the_cap_client_chosen_names_make_no_more_resources_than_the_cap_allows() {
    let engine = full_engine();
    let letters: Vec<char> = ('a'..='l').collect();
    engine
        .load_flow_rules(letters.iter().map(|c| FlowRule::new(format!("GET:/search/.*{c}.*")).regex(true).count(1e6)))
        .unwrap();
    for mask in 0u32..(1 << letters.len()) {
        let chosen: String = letters.iter().enumerate().filter(|(i, _)| mask & 1 << i != 0).map(|(_, c)| *c).collect();
        drop(engine.resource(&format!("GET:/search/{chosen}")));
    }
    let made = engine.resource_names().len();
    assert!(made <= 2 + 2 * 2 + letters.len(), "{made} resources with a cap of 2 and {} patterns", letters.len());
}

/// Past the cap and the bound on the resources of combinations of patterns, a name whose combination has none
/// shares one resource that every regex rule checks: held to its own rules and to the others too (stricter,
/// never looser); a combination that has a resource keeps it, and reloaded rules apply there as anywhere.
#[test]
fn past_the_bound_on_combinations_names_share_one_resource_that_every_regex_rule_checks() {
    let engine = full_engine();
    engine
        .load_flow_rules([
            FlowRule::new("GET:/a/.*").regex(true).count(3.0),
            FlowRule::new(".*/b/.*").regex(true).count(5.0),
            FlowRule::new(".*/c/.*").regex(true).count(100.0),
        ])
        .unwrap();
    // The cap on names only patterns match (2), then the bound on the combinations past it (2).
    for own in ["GET:/a/1", "GET:/a/2"] {
        assert_eq!(engine.resource(own).name(), own);
    }
    assert_eq!(engine.resource("GET:/a/3").name(), "GET:/a/3", "{{a}}: the first combination past the cap");
    assert_eq!(engine.resource("PUT:/b/1").name(), "PUT:/b/1", "{{b}}: the second");
    assert_eq!(engine.resource("GET:/a/4").name(), "GET:/a/3", "{{a}} keeps its resource past the bound");
    let caps = engine.caps();
    assert!(caps.matched_cap_reached() && caps.patterns_bound_reached(), "{caps}");
    assert_eq!((caps.matched_resources, caps.shared_by_patterns), (2, 2));
    assert!(caps.to_string().contains("names regex rules match 2/2 (reached), shared by patterns 2/2 (reached)"));
    let notes = engine.diagnose("PUT:/c/1").notes.join("\n");
    assert!(notes.contains(RESOURCE_PATTERNS_OVERFLOW), "{notes}");
    let (c, ab) = (engine.resource("PUT:/c/1"), engine.resource("GET:/a/b/1"));
    assert_eq!((c.name(), ab.name()), (RESOURCE_PATTERNS_OVERFLOW, RESOURCE_PATTERNS_OVERFLOW), "{{c}} and {{a, b}}");
    // Every regex rule checks it: the name only `.*/c/.*` (100) matches is held to 3 as well, with the other.
    let held: Vec<_> = (0..10).map_while(|_| c.enter().ok()).chain(ab.enter().ok()).collect();
    assert_eq!(held.len(), 3, "the tightest regex rule holds every name there, together");
    assert!(matches!(ab.enter(), Err(BlockError::Flow { .. })));
    drop(held);
    let notes = engine.diagnose(RESOURCE_PATTERNS_OVERFLOW).notes.join("\n");
    assert!(notes.contains("every regex rule checks"), "{notes}");
    // Rules reloaded with one more pattern: the combinations keep their resources, a name only the new
    // pattern matches shares the one every regex rule checks, and the new rule checks it too.
    let rules = |extra: Option<FlowRule>| {
        let mut rules = vec![
            FlowRule::new("GET:/a/.*").regex(true).count(3.0),
            FlowRule::new(".*/b/.*").regex(true).count(5.0),
            FlowRule::new(".*/c/.*").regex(true).count(100.0),
        ];
        rules.extend(extra);
        rules
    };
    engine.load_flow_rules(rules(Some(FlowRule::new(".*/d/.*").regex(true).count(1.0)))).unwrap();
    assert_eq!(engine.resource("GET:/a/5").name(), "GET:/a/3");
    assert_eq!(engine.resource("PUT:/d/1").name(), RESOURCE_PATTERNS_OVERFLOW);
    let d = engine.diagnose(RESOURCE_PATTERNS_OVERFLOW);
    let patterns: Vec<_> = d.flow.iter().filter_map(|f| f.pattern.as_deref()).collect();
    assert_eq!(patterns, ["GET:/a/.*", ".*/b/.*", ".*/c/.*", ".*/d/.*"]);
    for i in 0..1_000 {
        drop(engine.resource(&format!("PUT:/a/b/c/d/{i}")));
    }
    assert_eq!(engine.resource_names().len(), 2 + 2 + 2 + 1, "f1, f2, a/1, a/2, the two combinations, the shared one");
    // Rules that no longer match the combinations as they did free the bound: a new combination gets its own.
    engine.load_flow_rules([FlowRule::new("GET:/z/.*").regex(true).count(1.0)]).unwrap();
    assert_eq!(engine.resource("GET:/z/1").name(), "GET:/z/1");
    assert_eq!(engine.resource("GET:/z/2").name(), "GET:/z/1");
}

/// Threads that make names past the cap while another reloads the rules: the bound holds for any interleaving
/// (each reload frees at most the bound's worth of combinations, which then stay as resources), nothing
/// deadlocks (the registry's lock and the combinations' are never held together the other way round), and
/// every handle a thread got is checked by a rule.
#[test]
fn names_made_past_the_cap_while_rules_reload_stay_within_the_bound_per_reload() {
    let engine = full_engine();
    let letters: Vec<char> = ('a'..='h').collect();
    // Two rule sets whose patterns differ by one: a reload from one to the other frees the combinations
    // that matched the pattern it drops.
    let rules = |skip: char| -> Vec<FlowRule> {
        let kept = letters.iter().filter(|c| **c != skip);
        kept.map(|c| FlowRule::new(format!("GET:/s/.*{c}.*")).regex(true).count(1e6)).collect()
    };
    engine.load_flow_rules(rules('-')).unwrap();
    let reloads = 20usize;
    std::thread::scope(|s| {
        for t in 0..3u32 {
            let engine = engine.clone();
            let letters = letters.clone();
            s.spawn(move || {
                for i in 0..2_000u32 {
                    let mask = i.wrapping_mul(2_654_435_761).rotate_left(t * 5) & 0xff;
                    let chosen: String =
                        letters.iter().enumerate().filter(|(j, _)| mask & 1 << j != 0).map(|(_, c)| *c).collect();
                    let r = engine.resource(&format!("GET:/s/{chosen}{t}-{i}"));
                    // A letter past `a` is a pattern in both rule sets: whatever set chose the handle, and
                    // whatever set is in force now, a rule checks it.
                    if chosen.chars().any(|c| c != 'a') {
                        assert!(engine.has_rules_for(r.name()), "{} for {chosen}: checked by a rule", r.name());
                    }
                }
            });
        }
        s.spawn(|| {
            for n in 0..reloads {
                engine.load_flow_rules(rules(if n % 2 == 0 { 'a' } else { '-' })).unwrap();
            }
        });
    });
    // f1, f2, the two names within the cap, at most two combinations at a time and so two more per reload,
    // the resource every pattern matches and the overflow of names no pattern matches.
    let made = engine.resource_names().len();
    assert!(made <= 2 + 2 + 2 * (reloads + 1) + 2, "{made} resources");
    let caps = engine.caps();
    assert!(caps.shared_by_patterns <= 2, "{caps}");
}
