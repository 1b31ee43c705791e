//! Behaviour of `#[sentinel_resource]` on synchronous functions: every dispatch path of SPEC §1, exits on every
//! return path and on panic, nested call trees, methods, generics, origin/context and the registry.

mod common;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use common::{blocked_at, engine, engine_with_limits, stats, AppError, NestedError, PlainError};
use sentinel_runtime::{sentinel_resource, BlockError, EntryType, Sentinel};

// ---- dispatch paths ------------------------------------------------------------------------------------------

#[sentinel_resource(name = "sync.plain", block_handler = plain_blocked)]
fn plain(x: u32) -> String {
    format!("ok {x}")
}

fn plain_blocked(x: u32, b: BlockError) -> String {
    format!("blocked {x} by {}", b.kind_name())
}

#[test]
fn pass_returns_the_body_value_and_is_counted() {
    let (engine, _clock) = engine();
    let out = engine.scoped(|| plain(7));
    assert_eq!(out, "ok 7");
    let s = stats(engine, "sync.plain");
    assert_eq!((s.minute_pass, s.minute_block, s.minute_success, s.threads), (1, 0, 1, 0));
}

#[test]
fn block_calls_the_block_handler_with_the_arguments() {
    let (engine, _clock) = engine_with_limits(&["sync.plain"], 1.0);
    let out: Vec<String> = engine.scoped(|| (0..3).map(plain).collect());
    assert_eq!(out, ["ok 0", "blocked 1 by FlowException", "blocked 2 by FlowException"]);
    let s = stats(engine, "sync.plain");
    assert_eq!((s.minute_pass, s.minute_block, s.minute_exception, s.threads), (1, 2, 0, 0));
}

#[sentinel_resource(name = "sync.fallback_from_block", fallback = find_fallback)]
fn find_with_fallback(id: u64, label: String) -> Result<String, AppError> {
    if id == 0 {
        return Err(AppError::NotFound(id));
    }
    Ok(format!("{label}-{id}"))
}

fn find_fallback(id: u64, label: String, e: AppError) -> Result<String, AppError> {
    Ok(format!("fallback {label}-{id}: {e:?}"))
}

#[test]
fn block_goes_to_the_fallback_through_from_block_error() {
    let (engine, _clock) = engine_with_limits(&["sync.fallback_from_block"], 1.0);
    let (a, b) = engine.scoped(|| (find_with_fallback(1, "a".into()), find_with_fallback(2, "b".into())));
    assert_eq!(a, Ok("a-1".to_string()));
    assert_eq!(b, Ok("fallback b-2: Blocked(\"sync.fallback_from_block\")".to_string()));
    let s = stats(engine, "sync.fallback_from_block");
    // A block is never traced as an error.
    assert_eq!((s.minute_pass, s.minute_block, s.minute_exception), (1, 1, 0));
}

#[test]
fn error_goes_to_the_fallback_with_the_arguments_and_is_traced() {
    let (engine, _clock) = engine();
    let out = engine.scoped(|| find_with_fallback(0, "x".into()));
    assert_eq!(out, Ok("fallback x-0: NotFound(0)".to_string()));
    let s = stats(engine, "sync.fallback_from_block");
    assert_eq!((s.minute_pass, s.minute_exception, s.threads), (1, 1, 0));
}

#[sentinel_resource(name = "sync.no_handlers")]
fn no_handlers(id: u64) -> Result<u64, AppError> {
    Ok(id * 2)
}

#[test]
fn block_without_handlers_returns_err_from_block_error() {
    let (engine, _clock) = engine_with_limits(&["sync.no_handlers"], 1.0);
    let (a, b) = engine.scoped(|| (no_handlers(1), no_handlers(2)));
    assert_eq!(a, Ok(2));
    assert_eq!(b, Err(AppError::Blocked("sync.no_handlers".into())));
}

#[sentinel_resource(name = "sync.default_fallback", default_fallback = shared_default)]
fn with_default_fallback(id: u64) -> Result<u64, AppError> {
    if id == 0 {
        Err(AppError::Timeout)
    } else {
        Ok(id)
    }
}

fn shared_default(e: AppError) -> Result<u64, AppError> {
    match e {
        AppError::Timeout => Ok(999),
        AppError::Blocked(_) => Ok(555),
        other => Err(other),
    }
}

#[test]
fn error_and_block_go_to_the_default_fallback() {
    let (engine, _clock) = engine_with_limits(&["sync.default_fallback"], 2.0);
    let out = engine.scoped(|| [with_default_fallback(0), with_default_fallback(1), with_default_fallback(2)]);
    assert_eq!(out, [Ok(999), Ok(1), Ok(555)]);
    let s = stats(engine, "sync.default_fallback");
    assert_eq!((s.minute_pass, s.minute_block, s.minute_exception), (2, 1, 1));
}

#[sentinel_resource(
    name = "sync.ignore",
    fallback = ignore_fallback,
    exceptions_to_ignore = [AppError::NotFound(_), AppError::Invalid(..)]
)]
fn with_ignored(e: AppError) -> Result<(), AppError> {
    Err(e)
}

fn ignore_fallback(_e: AppError, err: AppError) -> Result<(), AppError> {
    Err(AppError::Invalid(format!("fallback saw {err:?}")))
}

#[test]
fn ignored_error_is_returned_untouched_and_not_counted() {
    let (engine, _clock) = engine();
    let out = engine.scoped(|| with_ignored(AppError::NotFound(3)));
    assert_eq!(out, Err(AppError::NotFound(3)));
    let s = stats(engine, "sync.ignore");
    assert_eq!((s.minute_pass, s.minute_exception, s.threads), (1, 0, 0));
    // A non-ignored error goes to the fallback and counts.
    let out = engine.scoped(|| with_ignored(AppError::Timeout));
    assert_eq!(out, Err(AppError::Invalid("fallback saw Timeout".into())));
    assert_eq!(stats(engine, "sync.ignore").minute_exception, 1);
}

fn is_timeout(e: &AppError) -> bool {
    matches!(e, AppError::Timeout)
}

#[sentinel_resource(name = "sync.trace_predicate", exceptions_to_trace = is_timeout, default_fallback = trace_default)]
fn with_traced(e: AppError) -> Result<(), AppError> {
    Err(e)
}

fn trace_default(e: AppError) -> Result<(), AppError> {
    Err(AppError::Invalid(format!("default saw {e:?}")))
}

#[sentinel_resource(name = "sync.trace_patterns", exceptions_to_trace = [AppError::Timeout])]
fn with_traced_patterns(e: AppError) -> Result<(), AppError> {
    Err(e)
}

#[test]
fn only_errors_in_the_trace_list_are_traced_and_reach_the_fallback() {
    let (engine, _clock) = engine();
    let out = engine.scoped(|| [with_traced(AppError::Timeout), with_traced(AppError::NotFound(1))]);
    assert_eq!(out, [Err(AppError::Invalid("default saw Timeout".into())), Err(AppError::NotFound(1))]);
    assert_eq!(stats(engine, "sync.trace_predicate").minute_exception, 1);

    let out = engine.scoped(|| [with_traced_patterns(AppError::Timeout), with_traced_patterns(AppError::NotFound(1))]);
    assert_eq!(out, [Err(AppError::Timeout), Err(AppError::NotFound(1))]);
    let s = stats(engine, "sync.trace_patterns");
    assert_eq!((s.minute_pass, s.minute_exception), (2, 1));
}

// ---- exit on every path ----------------------------------------------------------------------------------------

#[sentinel_resource(name = "sync.early")]
fn early_return_and_question_mark(step: u8) -> Result<u8, AppError> {
    if step == 0 {
        return Ok(0);
    }
    let parsed: u8 =
        "x".parse()
            .map_err(|_| AppError::Invalid("parse".into()))
            .or_else(|e| if step == 1 { Err(e) } else { Ok(2) })?;
    Ok(parsed)
}

#[test]
fn early_return_and_question_mark_exit_the_entry() {
    let (engine, _clock) = engine();
    let out = engine.scoped(|| {
        [early_return_and_question_mark(0), early_return_and_question_mark(1), early_return_and_question_mark(2)]
    });
    assert_eq!(out, [Ok(0), Err(AppError::Invalid("parse".into())), Ok(2)]);
    let s = stats(engine, "sync.early");
    assert_eq!((s.minute_pass, s.minute_success, s.minute_exception, s.threads), (3, 3, 1, 0));
}

#[sentinel_resource(name = "sync.panics", block_handler = panics_blocked)]
fn panics(really: bool) -> u32 {
    if really {
        panic!("boom");
    }
    1
}

fn panics_blocked(_really: bool, _b: BlockError) -> u32 {
    0
}

#[test]
fn panic_exits_the_entry_counts_an_exception_and_resumes() {
    let (engine, _clock) = engine();
    let caught = engine.scoped(|| std::panic::catch_unwind(AssertUnwindSafe(|| panics(true))));
    let payload = caught.expect_err("the panic resumes");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom"));
    let s = stats(engine, "sync.panics");
    assert_eq!((s.minute_pass, s.minute_exception, s.threads), (1, 1, 0));
    // The thread's context is clean afterwards: the next call is a root again.
    assert_eq!(engine.scoped(|| panics(false)), 1);
    assert_eq!(engine.current_context(), None);
}

/// Calls an annotated function when dropped: cleanup that runs while its thread unwinds from a panic elsewhere.
struct CallsOnDrop(&'static Sentinel);

impl Drop for CallsOnDrop {
    fn drop(&mut self) {
        assert_eq!(self.0.scoped(|| panics(false)), 1);
    }
}

#[test]
fn a_call_that_completes_while_its_thread_unwinds_is_not_an_exception() {
    let (engine, _clock) = engine();
    let caught = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let _cleanup = CallsOnDrop(engine);
        panic!("elsewhere");
    }));
    assert!(caught.is_err());
    let s = stats(engine, "sync.panics");
    // The call began and ended during the unwinding, and returned: not an exception of this resource.
    assert_eq!((s.minute_pass, s.minute_success, s.minute_exception, s.threads), (1, 1, 0, 0));
}

#[sentinel_resource(name = "sync.nested_inner")]
fn nested_inner() -> Result<u32, NestedError> {
    Ok(1)
}

#[sentinel_resource(name = "sync.nested_outer", block_handler = nested_outer_blocked)]
fn nested_outer() -> Result<u32, NestedError> {
    Ok(nested_inner()? + 1)
}

fn nested_outer_blocked(b: BlockError) -> Result<u32, NestedError> {
    assert_eq!(b.resource(), "sync.nested_inner", "the inner call's block");
    Ok(0)
}

#[test]
fn a_nested_block_that_escapes_the_body_is_a_block_of_the_outer_call_as_in_java() {
    let (engine, _clock) = engine_with_limits(&["sync.nested_inner"], 0.0);
    let out = engine.scoped(nested_outer);
    assert_eq!(out, Ok(0), "Java: the inner BlockException reaches the outer's block handler");
    let s = stats(engine, "sync.nested_outer");
    assert_eq!((s.minute_pass, s.minute_exception), (1, 0), "not an exception of the outer call");
    assert_eq!((s.minute_block, s.minute_success), (0, 1), "the outer call passed its own rules, and returned");
}

// An error type that cannot say it is a block (no `AsBlockError`): its `Err` is the outer call's failure.
#[sentinel_resource(name = "sync.nested_inner_opaque")]
fn nested_inner_opaque() -> Result<u32, AppError> {
    Ok(1)
}

#[sentinel_resource(name = "sync.nested_outer_opaque", block_handler = nested_outer_opaque_blocked)]
fn nested_outer_opaque() -> Result<u32, AppError> {
    Ok(nested_inner_opaque()? + 1)
}

fn nested_outer_opaque_blocked(_b: BlockError) -> Result<u32, AppError> {
    Ok(0)
}

#[test]
fn a_nested_block_in_an_error_type_that_does_not_say_so_is_a_failure_of_the_outer_call() {
    let (engine, _clock) = engine_with_limits(&["sync.nested_inner_opaque"], 0.0);
    let out = engine.scoped(nested_outer_opaque);
    assert_eq!(out, Err(AppError::Blocked("sync.nested_inner_opaque".into())));
    let s = stats(engine, "sync.nested_outer_opaque");
    assert_eq!((s.minute_pass, s.minute_exception), (1, 1));
}

// The body catches the inner call's block and fails with an error of its own: Java's aspect sees that error.
#[sentinel_resource(name = "sync.nested_outer_replaces", block_handler = replaced_blocked, fallback = replaced_fallback)]
fn nested_outer_replaces(label: String) -> Result<u32, NestedError> {
    let _ = label;
    nested_inner().map_err(|_| NestedError::Failed("replaced"))
}

fn replaced_blocked(_label: String, _b: BlockError) -> Result<u32, NestedError> {
    Ok(0)
}

fn replaced_fallback(_label: String, e: NestedError) -> Result<u32, NestedError> {
    Err(e)
}

#[test]
fn a_nested_block_the_body_replaces_with_an_error_of_its_own_is_a_failure_of_the_outer_call() {
    let (engine, _clock) = engine_with_limits(&["sync.nested_inner"], 0.0);
    let out = engine.scoped(|| nested_outer_replaces("x".into()));
    assert_eq!(out, Err(NestedError::Failed("replaced")), "through the fallback");
    let s = stats(engine, "sync.nested_outer_replaces");
    assert_eq!((s.minute_pass, s.minute_exception), (1, 1));
}

// `anyhow::Result<T>` (feature `anyhow` of sentinel-runtime): a nested block converted by `?`, with or without
// context, reaches the outer call's block handler; another error is a failure.
#[sentinel_resource(name = "sync.anyhow_inner")]
fn anyhow_inner() -> Result<u32, BlockError> {
    Ok(1)
}

// Only shared references as arguments: the block handler has them after the body.
#[sentinel_resource(name = "sync.anyhow_outer", block_handler = anyhow_outer_blocked)]
fn anyhow_outer(how: &str) -> anyhow::Result<u32> {
    let inner = match how {
        "context" => anyhow::Context::context(anyhow_inner(), "reading the stock")?,
        "fail" => anyhow::bail!("the order failed"),
        _ => anyhow_inner()?,
    };
    Ok(inner + 1)
}

fn anyhow_outer_blocked(_how: &str, b: BlockError) -> anyhow::Result<u32> {
    assert_eq!(b.resource(), "sync.anyhow_inner", "the inner call's block");
    Ok(0)
}

#[test]
fn a_nested_block_in_an_anyhow_error_is_a_block_of_the_outer_call() {
    let (engine, _clock) = engine_with_limits(&["sync.anyhow_inner"], 0.0);
    assert_eq!(engine.scoped(|| anyhow_outer("plain")).unwrap(), 0, "to the block handler");
    assert_eq!(engine.scoped(|| anyhow_outer("context")).unwrap(), 0, "with context too");
    assert!(engine.scoped(|| anyhow_outer("fail")).is_err(), "a failure is returned");
    let s = stats(engine, "sync.anyhow_outer");
    assert_eq!((s.minute_pass, s.minute_block, s.minute_exception), (3, 0, 1), "only the failure is an exception");
}

// The block handler needs the arguments again: it has them when the fallback's clones are made.
#[sentinel_resource(name = "sync.nested_with_args", block_handler = with_args_blocked, fallback = with_args_fallback)]
fn nested_with_args(label: String, id: u64) -> Result<String, NestedError> {
    Ok(format!("{label}{}", nested_inner()? + id as u32))
}

fn with_args_blocked(label: String, id: u64, b: BlockError) -> Result<String, NestedError> {
    Ok(format!("{label}{id} blocked by {}", b.resource()))
}

fn with_args_fallback(_label: String, _id: u64, e: NestedError) -> Result<String, NestedError> {
    Ok(format!("fallback: {e:?}"))
}

// Without a fallback, only shared references are still at hand after the body.
#[sentinel_resource(name = "sync.nested_with_refs", block_handler = with_refs_blocked)]
fn nested_with_refs(label: &str, id: &u64) -> Result<String, NestedError> {
    Ok(format!("{label}{}", nested_inner()? + *id as u32))
}

fn with_refs_blocked(label: &str, id: &u64, b: BlockError) -> Result<String, NestedError> {
    Ok(format!("{label}{id} blocked by {}", b.resource()))
}

// An argument the body consumed and no fallback: the block goes where a block goes without a block handler.
#[sentinel_resource(name = "sync.nested_consumed", block_handler = consumed_blocked)]
fn nested_consumed(label: String) -> Result<String, NestedError> {
    Ok(format!("{label}{}", nested_inner()?))
}

fn consumed_blocked(_label: String, _b: BlockError) -> Result<String, NestedError> {
    Ok("block handler".into())
}

// No block handler: the fallback receives the block, untraced, past the ignore list.
#[sentinel_resource(
    name = "sync.nested_to_fallback",
    fallback = to_fallback_fallback,
    exceptions_to_ignore = [NestedError::Blocked(_)]
)]
fn nested_to_fallback(label: String) -> Result<String, NestedError> {
    Ok(format!("{label}{}", nested_inner()?))
}

fn to_fallback_fallback(label: String, e: NestedError) -> Result<String, NestedError> {
    match e {
        NestedError::Blocked(b) => Ok(format!("{label} fallback: blocked by {}", b.resource())),
        other => Err(other),
    }
}

#[test]
fn a_nested_block_goes_where_a_block_of_the_outer_call_goes_and_is_never_traced() {
    let (engine, _clock) = engine_with_limits(&["sync.nested_inner"], 0.0);
    let out = engine.scoped(|| {
        (
            nested_with_args("a".into(), 1),
            nested_with_refs("b", &2),
            nested_consumed("c".into()),
            nested_to_fallback("d".into()),
        )
    });
    assert_eq!(out.0, Ok("a1 blocked by sync.nested_inner".to_string()));
    assert_eq!(out.1, Ok("b2 blocked by sync.nested_inner".to_string()));
    assert_eq!(out.2, Err(blocked_at("sync.nested_inner")), "returned as it is");
    assert_eq!(out.3, Ok("d fallback: blocked by sync.nested_inner".to_string()));
    for name in ["sync.nested_with_args", "sync.nested_with_refs", "sync.nested_consumed", "sync.nested_to_fallback"] {
        let s = stats(engine, name);
        assert_eq!((s.minute_pass, s.minute_block, s.minute_exception, s.minute_success), (1, 0, 0, 1), "{name}");
    }
}

// A boxed error that holds the `BlockError` itself is one too.
type Boxed = Box<dyn std::error::Error + Send + Sync>;

#[sentinel_resource(name = "sync.nested_inner_boxed")]
fn nested_inner_boxed() -> Result<u32, Boxed> {
    Ok(1)
}

#[sentinel_resource(name = "sync.nested_outer_boxed", default_fallback = boxed_default)]
fn nested_outer_boxed() -> Result<u32, Boxed> {
    Ok(nested_inner_boxed()? + 1)
}

fn boxed_default(e: Boxed) -> Result<u32, Boxed> {
    match e.downcast_ref::<BlockError>() {
        Some(b) if b.resource() == "sync.nested_inner_boxed" => Ok(0),
        _ => Err(e),
    }
}

#[test]
fn a_nested_block_in_a_boxed_error_is_a_block_of_the_outer_call() {
    let (engine, _clock) = engine_with_limits(&["sync.nested_inner_boxed"], 0.0);
    assert_eq!(engine.scoped(nested_outer_boxed).ok(), Some(0));
    let s = stats(engine, "sync.nested_outer_boxed");
    assert_eq!((s.minute_pass, s.minute_exception), (1, 0));
}

// ---- call tree ---------------------------------------------------------------------------------------------------

#[sentinel_resource(name = "sync.outer", block_handler = outer_blocked)]
fn outer() -> u32 {
    inner() + inner()
}

fn outer_blocked(_b: BlockError) -> u32 {
    0
}

#[sentinel_resource(name = "sync.inner", block_handler = inner_blocked)]
fn inner() -> u32 {
    1
}

fn inner_blocked(_b: BlockError) -> u32 {
    0
}

#[test]
fn nested_calls_form_the_call_tree() {
    let (engine, _clock) = engine();
    assert_eq!(engine.scoped(outer), 2);
    let tree = engine.tree();
    let default = tree.iter().find(|t| t.name == sentinel_runtime::DEFAULT_CONTEXT_NAME).unwrap();
    assert_eq!(default.children.len(), 1);
    let o = &default.children[0];
    assert_eq!(o.name, "sync.outer");
    assert_eq!(o.children.len(), 1);
    assert_eq!(o.children[0].name, "sync.inner");
    assert_eq!(o.children[0].stats.minute_pass, 2);
    assert_eq!(stats(engine, "sync.outer").threads, 0);
}

// ---- methods, generics, arguments ---------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Repo {
    prefix: String,
    calls: u32,
}

impl Repo {
    #[sentinel_resource(name = "sync.repo.get", block_handler = Self::get_blocked)]
    fn get(&self, id: u64) -> String {
        format!("{}{id}", self.prefix)
    }

    fn get_blocked(&self, id: u64, _b: BlockError) -> String {
        format!("{}blocked{id}", self.prefix)
    }

    #[sentinel_resource(name = "sync.repo.bump", fallback = Self::bump_fallback)]
    fn bump(&mut self, by: u32) -> Result<u32, AppError> {
        self.calls += by;
        if by == 0 {
            return Err(AppError::Invalid("zero".into()));
        }
        Ok(self.calls)
    }

    fn bump_fallback(&mut self, _by: u32, _e: AppError) -> Result<u32, AppError> {
        self.calls += 100;
        Ok(self.calls)
    }

    #[sentinel_resource(name = "sync.repo.into_prefix", fallback = Self::into_fallback)]
    fn into_prefix(self, fail: bool) -> Result<String, AppError> {
        if fail {
            Err(AppError::Timeout)
        } else {
            Ok(self.prefix)
        }
    }

    fn into_fallback(self, _fail: bool, _e: AppError) -> Result<String, AppError> {
        Ok(format!("fallback {}", self.prefix))
    }

    #[sentinel_resource(name = "sync.repo.shared", block_handler = Self::shared_blocked)]
    fn shared(self: Arc<Self>) -> usize {
        Arc::strong_count(&self)
    }

    fn shared_blocked(self: Arc<Self>, _b: BlockError) -> usize {
        0
    }
}

#[test]
fn methods_with_every_receiver() {
    let (engine, _clock) = engine_with_limits(&["sync.repo.get"], 1.0);
    engine.scoped(|| {
        let mut repo = Repo { prefix: "r".into(), calls: 0 };
        assert_eq!(repo.get(1), "r1");
        assert_eq!(repo.get(2), "rblocked2");
        assert_eq!(repo.bump(2), Ok(2));
        assert_eq!(repo.bump(0), Ok(102)); // the body's change and the fallback's both apply
        assert_eq!(repo.clone().into_prefix(false), Ok("r".to_string()));
        assert_eq!(repo.clone().into_prefix(true), Ok("fallback r".to_string()));
        assert_eq!(Arc::new(repo).shared(), 1);
    });
    assert_eq!(stats(engine, "sync.repo.bump").minute_exception, 1);
    assert_eq!(stats(engine, "sync.repo.shared").minute_pass, 1);
}

#[sentinel_resource(name = "sync.generic", block_handler = generic_blocked)]
fn largest<'a, T>(items: &'a [T], fallback_item: &'a T) -> &'a T
where
    T: PartialOrd,
{
    items.iter().fold(fallback_item, |m, x| if x > m { x } else { m })
}

fn generic_blocked<'a, T: PartialOrd>(_items: &'a [T], fallback_item: &'a T, _b: BlockError) -> &'a T {
    fallback_item
}

#[sentinel_resource(name = "sync.impl_trait", block_handler = describe_blocked)]
fn describe(x: impl std::fmt::Display, mut acc: Vec<String>) -> impl std::fmt::Display {
    acc.push(x.to_string());
    acc.join(",")
}

fn describe_blocked(_x: impl std::fmt::Display, _acc: Vec<String>, _b: BlockError) -> String {
    "blocked".to_string()
}

#[sentinel_resource(name = "sync.patterns", fallback = pattern_fallback)]
fn pattern_args((a, b): (u32, u32), _: &str, out: &mut Vec<u32>) -> Result<u32, AppError> {
    out.push(a);
    out.push(b);
    if a == b {
        return Err(AppError::Invalid("same".into()));
    }
    Ok(a + b)
}

fn pattern_fallback(pair: (u32, u32), label: &str, out: &mut Vec<u32>, _e: AppError) -> Result<u32, AppError> {
    out.push(pair.0 * 100);
    Ok(label.len() as u32)
}

#[test]
fn generics_lifetimes_impl_trait_and_patterns() {
    let (engine, _clock) = engine_with_limits(&["sync.generic", "sync.impl_trait"], 1.0);
    engine.scoped(|| {
        assert_eq!(*largest(&[3, 9, 4], &0), 9);
        assert_eq!(*largest(&[3, 9, 4], &0), 0);
        assert_eq!(describe(5, vec!["a".into()]).to_string(), "a,5");
        assert_eq!(describe(5, vec![]).to_string(), "blocked");
        let mut out = Vec::new();
        assert_eq!(pattern_args((1, 2), "x", &mut out), Ok(3));
        assert_eq!(pattern_args((4, 4), "four", &mut out), Ok(4));
        assert_eq!(out, [1, 2, 4, 4, 400]);
    });
}

// ---- origin, context, entry type ----------------------------------------------------------------------------------

#[sentinel_resource(name = "sync.with_origin", entry_type = In, origin = caller, context = "sync-entrance")]
fn with_origin(caller: &str) -> Result<String, AppError> {
    Ok(caller.to_uppercase())
}

#[test]
fn origin_context_and_entry_type_apply() {
    let (engine, _clock) = engine();
    assert_eq!(engine.scoped(|| with_origin("appA")), Ok("APPA".to_string()));
    assert_eq!(engine.origin_stats("sync.with_origin", "appA").unwrap().minute_pass, 1);
    assert_eq!(engine.context_stats("sync.with_origin", "sync-entrance").unwrap().minute_pass, 1);
    assert_eq!(engine.inbound_stats().minute_pass, 1);
}

#[sentinel_resource(params = [common::Key(user), common::Key(count as u64)])]
fn default_named(user: u64, item: String, count: usize) -> Result<usize, AppError> {
    Ok(item.len() * count + user as usize)
}

#[test]
fn the_default_name_is_module_path_and_function() {
    let (engine, _clock) = engine();
    assert_eq!(engine.scoped(|| default_named(1, "ab".into(), 3)), Ok(7));
    assert_eq!(stats(engine, "macro_sync::default_named").minute_pass, 1);
}

// ---- registry -----------------------------------------------------------------------------------------------------

#[test]
fn annotated_functions_are_registered_with_their_location() {
    let all = Sentinel::registered_resources();
    let d = all.iter().find(|d| d.name == "sync.plain").expect("registered");
    assert_eq!(d.function, "plain");
    assert_eq!(d.module_path, "macro_sync");
    assert!(d.file.ends_with("macro_sync.rs"), "{}", d.file);
    assert!(d.line > 0);
    assert!(d.has_block_handler && !d.has_fallback && !d.is_async);
    assert_eq!(d.entry_type, EntryType::Out);
    let o = all.iter().find(|d| d.name == "sync.with_origin").unwrap();
    assert_eq!(o.entry_type, EntryType::In);
    assert!(all.iter().any(|d| d.name == "macro_sync::default_named"));
    assert!(all.iter().any(|d| d.name == "sync.repo.bump" && d.has_fallback));
}

#[test]
fn a_rule_for_a_misspelled_resource_names_the_registered_one() {
    let (engine, _clock) = engine();
    engine.load_flow_rules(vec![sentinel_runtime::flow::FlowRule::new("sync.fallback_from_blok").count(1.0)]).unwrap();
    let unknown = engine.unknown_rule_resources();
    assert_eq!(unknown.len(), 1);
    assert_eq!(unknown[0].suggestion.as_deref(), Some("sync.fallback_from_block"));
    // A registered name is known even before its first call in this engine.
    engine.load_flow_rules(vec![sentinel_runtime::flow::FlowRule::new("sync.inner").count(1.0)]).unwrap();
    assert!(engine.unknown_rule_resources().is_empty());
}

#[allow(dead_code)]
fn _plain_error_is_fine_with_a_block_handler() -> Result<(), PlainError> {
    #[sentinel_resource(name = "sync.plain_error", block_handler = pe_blocked)]
    fn inner_fn() -> Result<(), PlainError> {
        Err(PlainError("x"))
    }
    fn pe_blocked(_b: BlockError) -> Result<(), PlainError> {
        Err(PlainError("blocked"))
    }
    inner_fn()
}
