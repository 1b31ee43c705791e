//! The slot chain: one ordered table of the built-in slots ([`BuiltIn`]) and the one loop that runs it.
//!
//! Every path runs this table: the general path ([`run`]), with the user's slots interleaved by their order
//! or without any, and the fast path ([`run_fast`], the same table specialised to the kinds that can be on
//! it, at compile time, and to the rules present, by the flags the engine computed when the rules changed).
//! A call that a slot blocks (or a slot that panics) gives back what every slot it entered took through one
//! mechanism ([`give_back`]); a call that passed exits through [`exit`] and [`exit_reading_rules`].
//!
//! Each kind implements the contract ([`crate::slot::contract::RuleSlot`]) in its own module and
//! knows no engine; this file says where the engine keeps each kind's rules, state and held state
//! ([`InChain`]).

use crate::adaptive::slot::{AdaptiveHeld, AdaptiveSlot};
use crate::authority::AuthoritySlot;
use crate::circuit_breaker::BreakerSlot;
use crate::engine::shared::Shared;
use crate::error::BlockError;
use crate::flow::check::FlowSlot;
use crate::param_flow::ParamSlot;
use crate::rules::ResourceRules;
use crate::slot::contract::{CheckCx, ExitCx, FastCall, RuleSlot, Verdict};
use crate::slot::{CustomSlots, SlotEntry};
use crate::system::SystemSlot;
use crate::{circuit_breaker, flow, param_flow};

/// The built-in slots in the order they run (Java's order: see [`crate::slot`]). Statistics (-7000) wraps
/// the chain in the entry path; the node selector, cluster builder and log slots are the entry path's own
/// steps. A user slot runs before the first built-in slot of a higher order.
///
/// To add a rule kind: implement [`RuleSlot`] in the kind's module, say where its rules live ([`InChain`],
/// below), and add one line here at its order.
pub(crate) type BuiltIn = (
    AuthoritySlot, // -6000, authority/mod.rs
    (
        SystemSlot, // -5000, system/mod.rs (inbound calls, while a system rule is loaded)
        (
            ParamSlot, // -3000, param_flow/mod.rs
            (
                FlowSlot, // -2000, flow/mod.rs
                (
                    BreakerSlot<true>, // -1500, circuit_breaker/mod.rs: the `"*"` breakers, for a resource with none
                    (
                        BreakerSlot<false>, // -1000, circuit_breaker/mod.rs: the resource's own breakers
                        (
                            AdaptiveSlot, // -500, adaptive/slot.rs: last, so a place is taken only for a call every other rule let through
                            TestOnly,
                        ),
                    ),
                ),
            ),
        ),
    ),
);

/// The end of the table: in the crate's own tests, a test-only kind that proves the contract (a slot that
/// denies every n-th call, slot/every_nth.rs).
#[cfg(test)]
type TestOnly = (crate::slot::every_nth::EveryNthSlot, ());
#[cfg(not(test))]
type TestOnly = ();

/// What a passed call holds until it exits, one field per kind that holds anything, borrowed from where it
/// lives ([`Decided`] while deciding, the entry afterwards). The states themselves stay fields of those
/// structs, so that dropping them is inlined with the rest.
pub(crate) struct Held<'h> {
    pub(crate) flow: &'h mut flow::EntryState,
    pub(crate) param: &'h mut param_flow::EntryState,
    pub(crate) breakers: &'h mut circuit_breaker::EntryState,
    pub(crate) adaptive: &'h mut AdaptiveHeld,
    /// For kinds that hold nothing.
    pub(crate) nothing: (),
}

/// What the checks took while deciding, kept only if the call passes.
#[derive(Default)]
pub(crate) struct Taken {
    pub(crate) flow: flow::Scratch,
    pub(crate) param: param_flow::Scratch,
    /// For kinds that take nothing.
    pub(crate) nothing: (),
}

/// What the fast path's checks took, likewise.
#[derive(Default)]
pub(crate) struct FastTaken {
    pub(crate) flow: flow::FastTaken,
    /// The hot-parameter check takes nothing it gives back on the fast path.
    pub(crate) param: (),
    /// For kinds that take nothing.
    pub(crate) nothing: (),
}

/// A built-in slot as the engine runs it: where its rules, its state and what a call holds of it live.
pub(crate) trait InChain: RuleSlot {
    /// The slot's rules for the call, if it applies (`inbound`: the call is inbound).
    fn rules<'a>(rules: &'a ResourceRules, shared: &'a Shared, inbound: bool) -> Option<&'a Self::Rules>;
    /// The kind's state in the engine.
    fn state(shared: &Shared) -> &Self::State;
    /// Its part of what a call holds.
    fn held<'a>(held: &'a mut Held<'_>) -> &'a mut Self::Held;
    /// Its part of what the checks took.
    fn taken(taken: &mut Taken) -> &mut Self::Taken;
    /// Its part of what the fast path's checks took.
    fn fast_taken(taken: &mut FastTaken) -> &mut Self::FastTaken;
}

/// Says where the engine keeps one kind ([`InChain`]): `rules` finds the kind's rules for a call
/// (`|rules, shared, inbound|`), `state` its state in the engine (`|shared|`), `held` and `taken` its parts of
/// [`Held`] and [`Taken`].
macro_rules! in_chain {
    ($(#[$attr:meta])* $slot:ty {
        rules: |$r:pat_param, $s:pat_param, $i:pat_param| $rules:expr,
        state: |$ss:pat_param| $state:expr,
        held: |$h:ident| $held:expr,
        taken: |$t:ident| $taken:expr $(,)?
    }) => {
        $(#[$attr])*
        impl InChain for $slot {
            #[inline(always)]
            fn rules<'a>($r: &'a ResourceRules, $s: &'a Shared, $i: bool) -> Option<&'a Self::Rules> {
                $rules
            }
            #[inline(always)]
            fn state($ss: &Shared) -> &Self::State {
                $state
            }
            #[inline(always)]
            fn held<'a>($h: &'a mut Held<'_>) -> &'a mut Self::Held {
                $held
            }
            #[inline(always)]
            fn taken($t: &mut Taken) -> &mut Self::Taken {
                $taken
            }
            #[inline(always)]
            fn fast_taken($t: &mut FastTaken) -> &mut Self::FastTaken {
                $taken
            }
        }
    };
}

in_chain!(AuthoritySlot {
    rules: |rules, _, _| rules.authority.as_deref(),
    state: |_| &(),
    held: |h| &mut h.nothing,
    taken: |t| &mut t.nothing,
});

in_chain!(SystemSlot {
    rules: |_, shared, inbound| (inbound && shared.system.active()).then_some(&shared.system),
    state: |shared| &shared.inbound,
    held: |h| &mut h.nothing,
    taken: |t| &mut t.nothing,
});

in_chain!(ParamSlot {
    rules: |rules, _, _| rules.param.as_deref(),
    state: |_| &(),
    held: |h| h.param,
    taken: |t| &mut t.param,
});

in_chain!(FlowSlot {
    rules: |rules, _, _| rules.flow.as_deref(),
    // Relate rules read other resources' nodes, found by name the first time.
    state: |shared| shared,
    held: |h| h.flow,
    taken: |t| &mut t.flow,
});

in_chain!(BreakerSlot<true> {
    rules: |rules, _, _| rules.default_degrade.as_ref(),
    state: |shared| &shared.degrade.observers,
    held: |h| h.breakers,
    taken: |t| &mut t.nothing,
});

in_chain!(BreakerSlot<false> {
    rules: |rules, _, _| rules.degrade.as_ref(),
    state: |shared| &shared.degrade.observers,
    held: |h| h.breakers,
    taken: |t| &mut t.nothing,
});

in_chain!(AdaptiveSlot {
    rules: |rules, _, _| rules.adaptive.as_ref(),
    state: |_| &(),
    held: |h| h.adaptive,
    taken: |t| &mut t.nothing,
});

in_chain!(
    #[cfg(test)]
    crate::slot::every_nth::EveryNthSlot {
        rules: |rules, _, _| rules.every_nth.as_deref(),
        state: |_| &(),
        held: |h| &mut h.nothing,
        taken: |t| &mut t.nothing,
    }
);

/// What the checks decided and what they hold until exit.
///
/// Laid out so that the 16-byte states sit at 16-byte offsets: they are zeroed with 16-byte stores and copied
/// into the entry with 16-byte loads, and a load that straddles two stores still in flight stalls.
#[derive(Default)]
#[repr(C, align(16))]
pub(crate) struct Decided {
    pub(crate) param: param_flow::EntryState,
    pub(crate) breakers: circuit_breaker::EntryState,
    pub(crate) tally: Tally,
    pub(crate) adaptive: AdaptiveHeld,
    pub(crate) flow: flow::EntryState,
}

impl Decided {
    /// What the call holds, and the rest of the decision.
    #[inline(always)]
    pub(crate) fn split(&mut self) -> (Held<'_>, &mut Tally) {
        let held = Held {
            flow: &mut self.flow,
            param: &mut self.param,
            breakers: &mut self.breakers,
            adaptive: &mut self.adaptive,
            nothing: (),
        };
        (held, &mut self.tally)
    }
}

/// What the checks decided besides what the call holds.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) wait_nanos: u64,
    /// Bit i set: the user slot with id i passed (its exit hook runs).
    pub(crate) slots_passed: u32,
    /// A prioritized call admitted by borrowing a later window.
    pub(crate) occupied: bool,
    /// The entry path's [`Wait::mode`](crate::flow::token_service::Wait::mode) of the call (0, the default:
    /// it may block its thread), kept here so that `enter` stores nothing for it.
    pub(crate) wait_mode: u8,
}

/// User slots whose exit hooks an entry runs: the first 32 added.
pub(crate) const MAX_SLOT_EXITS: usize = 32;

/// The user slots the general path interleaves with the built-in ones.
pub(crate) trait UserSlots {
    /// Runs the user slots ordered before `order`.
    fn before(&mut self, order: i32, cx: &CheckCx<'_>, tally: &mut Tally) -> Result<(), BlockError>;
}

/// No user slot: the chain compiles to the built-in slots alone.
pub(crate) struct NoUserSlots;

impl UserSlots for NoUserSlots {
    #[inline(always)]
    fn before(&mut self, _: i32, _: &CheckCx<'_>, _: &mut Tally) -> Result<(), BlockError> {
        Ok(())
    }
}

/// The user slots, sorted by order, and the next to run.
pub(crate) struct Interleaved<'s> {
    slots: &'s CustomSlots,
    next: usize,
}

impl UserSlots for Interleaved<'_> {
    fn before(&mut self, order: i32, cx: &CheckCx<'_>, tally: &mut Tally) -> Result<(), BlockError> {
        while let Some((o, id, slot)) = self.slots.slots.get(self.next) {
            if *o >= order {
                break;
            }
            let e = SlotEntry {
                resource: cx.resource.as_str(),
                entry_type: cx.entry_type,
                context: cx.context_name,
                origin: cx.origin.as_str(),
                acquire: cx.acquire,
                now_ms: cx.now_ms,
            };
            if let Err(reason) = slot.entry(&e) {
                return Err(BlockError::Custom {
                    resource: cx.resource.share(),
                    slot: slot.name(),
                    reason: reason.into(),
                    origin: cx.origin.share(),
                });
            }
            if (*id as usize) < MAX_SLOT_EXITS {
                tally.slots_passed |= 1 << id;
            }
            self.next += 1;
        }
        Ok(())
    }
}

/// The chain as a list of slots: `(first, rest)`, ending with `()`.
#[allow(clippy::too_many_arguments)] // what one call of the chain sees, passed apart so that borrows stay split
pub(crate) trait Chain {
    /// How many slots the list holds (the first slot's bit in the entered mask is `1 << (LEN - 1)`).
    const LEN: u32;
    /// Whether a slot of the list checks anything on the fast path.
    const CHECKS_FAST: bool;
    /// Whether a slot of the list checks on the fast path beside the kinds that hold before it, where no
    /// [`FAST_PATH_APART`](RuleSlot::FAST_PATH_APART) kind has rules beside them (the common case).
    const CHECKS_FAST_BESIDE: bool;

    /// Runs the slots in order; `entered` gets the bit of every slot whose check ran. `Ok(true)`: a
    /// prioritized call borrowed a later window, and passed without the user slots and the breakers after
    /// that ([`Verdict::Occupied`]).
    fn run<U: UserSlots>(
        rules: &ResourceRules,
        shared: &Shared,
        cx: &CheckCx<'_>,
        held: &mut Held<'_>,
        tally: &mut Tally,
        taken: &mut Taken,
        entered: &mut u32,
        users: &mut U,
    ) -> Result<bool, BlockError>;

    /// Gives back what every slot in `entered` took and holds.
    fn give_back(
        rules: &ResourceRules,
        shared: &Shared,
        cx: &CheckCx<'_>,
        held: &mut Held<'_>,
        taken: &mut Taken,
        entered: u32,
    );

    /// Whether every slot with rules admits the fast path now.
    fn admits_fast(rules: &ResourceRules, shared: &Shared, now_ms: u64) -> bool;

    /// Whether a slot that cannot be on the fast path has rules for the resource (outbound calls).
    fn has_slow_rules(rules: &ResourceRules, shared: &Shared) -> bool;

    /// Whether a [`FAST_PATH_APART`](RuleSlot::FAST_PATH_APART) slot of the list has rules for the resource
    /// after a slot that holds on the fast path had some (`held_before`): the holders then keep what they
    /// take, for an undo.
    fn apart_beside_holders(rules: &ResourceRules, shared: &Shared, held_before: bool) -> bool;

    /// The fast path's checks (`SYSTEM`: with the system rules, for an inbound call while one is loaded): the
    /// wait they ask for adds to `wait`; what they take goes to `taken` (given back by the kinds before a check
    /// that refuses).
    fn fast<'c, const APART: bool, const SYSTEM: bool>(
        rules: &ResourceRules,
        shared: &Shared,
        call: &impl FastCall<'c>,
        wait: &mut u64,
        held: &mut Held<'_>,
        taken: Option<&mut FastTaken>,
    ) -> Result<(), BlockError>;

    /// The exits of the slots that do not read the rules.
    fn exit(shared: &Shared, cx: &ExitCx, held: &mut Held<'_>);

    /// The exits of the slots that read the rules.
    fn exit_reading_rules(rules: &ResourceRules, shared: &Shared, cx: &ExitCx, held: &mut Held<'_>);
}

#[allow(clippy::too_many_arguments)]
impl Chain for () {
    const LEN: u32 = 0;
    const CHECKS_FAST: bool = false;
    const CHECKS_FAST_BESIDE: bool = false;
    #[inline(always)]
    fn run<U: UserSlots>(
        _: &ResourceRules,
        _: &Shared,
        cx: &CheckCx<'_>,
        _: &mut Held<'_>,
        tally: &mut Tally,
        _: &mut Taken,
        _: &mut u32,
        users: &mut U,
    ) -> Result<bool, BlockError> {
        if tally.occupied {
            return Ok(true);
        }
        users.before(i32::MAX, cx, tally).map(|()| false)
    }
    #[inline(always)]
    fn give_back(_: &ResourceRules, _: &Shared, _: &CheckCx<'_>, _: &mut Held<'_>, _: &mut Taken, _: u32) {}
    #[inline(always)]
    fn admits_fast(_: &ResourceRules, _: &Shared, _: u64) -> bool {
        true
    }
    fn has_slow_rules(_: &ResourceRules, _: &Shared) -> bool {
        false
    }
    fn apart_beside_holders(_: &ResourceRules, _: &Shared, _: bool) -> bool {
        false
    }
    #[inline(always)]
    fn fast<'c, const APART: bool, const SYSTEM: bool>(
        _: &ResourceRules,
        _: &Shared,
        _: &impl FastCall<'c>,
        _: &mut u64,
        _: &mut Held<'_>,
        _: Option<&mut FastTaken>,
    ) -> Result<(), BlockError> {
        Ok(())
    }
    #[inline(always)]
    fn exit(_: &Shared, _: &ExitCx, _: &mut Held<'_>) {}
    #[inline(always)]
    fn exit_reading_rules(_: &ResourceRules, _: &Shared, _: &ExitCx, _: &mut Held<'_>) {}
}

#[allow(clippy::too_many_arguments)]
impl<S: InChain, R: Chain> Chain for (S, R) {
    const LEN: u32 = R::LEN + 1;
    const CHECKS_FAST: bool = (S::ON_FAST_PATH && S::CHECKS_ON_FAST_PATH) || R::CHECKS_FAST;
    const CHECKS_FAST_BESIDE: bool =
        (S::ON_FAST_PATH && S::CHECKS_ON_FAST_PATH && !S::FAST_PATH_APART) || R::CHECKS_FAST_BESIDE;

    #[inline(always)]
    fn run<U: UserSlots>(
        rules: &ResourceRules,
        shared: &Shared,
        cx: &CheckCx<'_>,
        held: &mut Held<'_>,
        tally: &mut Tally,
        taken: &mut Taken,
        entered: &mut u32,
        users: &mut U,
    ) -> Result<bool, BlockError> {
        // A call that borrowed a later window (`tally.occupied`) skips the user slots and the slots that say
        // so (the breakers), not the ones that bound the calls in flight.
        if !tally.occupied {
            users.before(S::ORDER, cx, tally)?;
        }
        if S::SKIPPED_WHEN_OCCUPIED && tally.occupied {
            return R::run(rules, shared, cx, held, tally, taken, entered, users);
        }
        if let Some(r) = S::rules(rules, shared, cx.entry_type == crate::slot::EntryType::In) {
            *entered |= 1 << R::LEN;
            match S::check(r, S::state(shared), cx, S::held(held), S::taken(taken))? {
                Verdict::Pass { wait_nanos } => tally.wait_nanos += wait_nanos,
                Verdict::Occupied { wait_nanos } => {
                    tally.wait_nanos += wait_nanos;
                    tally.occupied = true;
                }
            }
            cx.waited_nanos.set(tally.wait_nanos);
        }
        R::run(rules, shared, cx, held, tally, taken, entered, users)
    }

    #[inline(always)]
    fn give_back(
        rules: &ResourceRules,
        shared: &Shared,
        cx: &CheckCx<'_>,
        held: &mut Held<'_>,
        taken: &mut Taken,
        entered: u32,
    ) {
        if entered & (1 << R::LEN) != 0
            && let Some(r) = S::rules(rules, shared, cx.entry_type == crate::slot::EntryType::In)
        {
            S::give_back(r, S::state(shared), cx, S::held(held), S::taken(taken));
        }
        R::give_back(rules, shared, cx, held, taken, entered)
    }

    #[inline(always)]
    fn admits_fast(rules: &ResourceRules, shared: &Shared, now_ms: u64) -> bool {
        if S::ON_FAST_PATH
            && let Some(r) = S::rules(rules, shared, false)
            && !S::admits_fast(r, now_ms)
        {
            return false;
        }
        R::admits_fast(rules, shared, now_ms)
    }

    fn has_slow_rules(rules: &ResourceRules, shared: &Shared) -> bool {
        (!S::ON_FAST_PATH && S::rules(rules, shared, false).is_some()) || R::has_slow_rules(rules, shared)
    }

    fn apart_beside_holders(rules: &ResourceRules, shared: &Shared, held_before: bool) -> bool {
        let has = S::ON_FAST_PATH && S::rules(rules, shared, false).is_some();
        (S::FAST_PATH_APART && has && held_before)
            || R::apart_beside_holders(rules, shared, held_before || (has && S::HOLDS_ON_FAST_PATH))
    }

    #[inline(always)]
    fn fast<'c, const APART: bool, const SYSTEM: bool>(
        rules: &ResourceRules,
        shared: &Shared,
        call: &impl FastCall<'c>,
        wait: &mut u64,
        held: &mut Held<'_>,
        mut taken: Option<&mut FastTaken>,
    ) -> Result<(), BlockError> {
        // The fast path's one undo: a check that may hold (or take) gives it back when a later check refuses,
        // unless it is the path's last that can refuse beside it. In the common copy (`!APART`), an apart kind
        // has no rules where a kind before it holds (the engine's flag picks the copy), so it is not "beside".
        let later = if APART { R::CHECKS_FAST } else { R::CHECKS_FAST_BESIDE };
        const {
            assert!(
                !S::HOLDS_ON_FAST_PATH || !R::CHECKS_FAST || S::UNDOES_ON_FAST_PATH,
                "a check that holds on the fast path must be its last, or undo"
            )
        };
        if S::ON_FAST_PATH && S::CHECKS_ON_FAST_PATH {
            // `SYSTEM` stands for an inbound call: only the system slot's rules depend on it, and its copy
            // without them compiles as if the slot were not there.
            if let Some(r) = S::rules(rules, shared, SYSTEM) {
                if !later && (S::HOLDS_ON_FAST_PATH || !R::CHECKS_FAST) {
                    // The last check of the fast path for these rules: its answer is the path's, built in the
                    // caller's slot (what it took is spent: nothing is kept for an undo).
                    return S::check_fast(r, S::state(shared), call, wait, S::held(held), None);
                }
                let keep = taken.as_deref_mut().map(S::fast_taken);
                S::check_fast(r, S::state(shared), call, wait, S::held(held), keep)?;
                if !S::HOLDS_ON_FAST_PATH {
                    return R::fast::<APART, SYSTEM>(rules, shared, call, wait, held, taken);
                }
                return match R::fast::<APART, SYSTEM>(rules, shared, call, wait, held, taken.as_deref_mut()) {
                    Ok(()) => Ok(()),
                    Err(block) => {
                        S::undo_fast(r, S::state(shared), call, S::held(held), taken.map(S::fast_taken));
                        Err(block)
                    }
                };
            }
        }
        R::fast::<APART, SYSTEM>(rules, shared, call, wait, held, taken)
    }

    #[inline(always)]
    fn exit(shared: &Shared, cx: &ExitCx, held: &mut Held<'_>) {
        if !S::EXIT_READS_RULES {
            let h = S::held(held);
            if S::holds(h) {
                S::exit(None, S::state(shared), cx, h);
            }
        }
        R::exit(shared, cx, held)
    }

    #[inline(always)]
    fn exit_reading_rules(rules: &ResourceRules, shared: &Shared, cx: &ExitCx, held: &mut Held<'_>) {
        if S::EXIT_READS_RULES
            && let Some(r) = S::rules(rules, shared, false)
        {
            S::exit(Some(r), S::state(shared), cx, S::held(held));
        }
        R::exit_reading_rules(rules, shared, cx, held)
    }
}

/// The general path: every slot of the table in order, the user slots interleaved when there are any. A
/// block gives back what the slots entered took (and forgets the user slots passed); a panic in a slot does
/// too, then goes on.
#[inline(never)]
pub(crate) fn run(
    rules: &ResourceRules,
    shared: &Shared,
    cx: &CheckCx<'_>,
    decided: &mut Decided,
    taken: &mut Taken,
) -> Result<(), BlockError> {
    let mut entered = 0u32;
    // User code runs in the checks (slots, `HotParam` impls): if it panics, what the earlier checks took
    // (thread permits, reserved tokens, per-value permits, a half-open probe) goes back before the panic goes
    // on, or the resource would stay blocked.
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (mut held, tally) = decided.split();
        if shared.has_custom_slots.load(std::sync::atomic::Ordering::Acquire) {
            run_interleaved(rules, shared, cx, &mut held, tally, taken, &mut entered)
        } else {
            <BuiltIn as Chain>::run(rules, shared, cx, &mut held, tally, taken, &mut entered, &mut NoUserSlots)
        }
    }));
    match ran {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(block)) => {
            give_back(rules, shared, cx, decided, taken, entered);
            Err(block)
        }
        Err(panic) => {
            give_back(rules, shared, cx, decided, taken, entered);
            // No wait is left behind for a later entry on this thread.
            let _ = crate::wait::take_pending();
            std::panic::resume_unwind(panic)
        }
    }
}

/// The general path with the user slots interleaved.
#[cold]
fn run_interleaved(
    rules: &ResourceRules,
    shared: &Shared,
    cx: &CheckCx<'_>,
    held: &mut Held<'_>,
    tally: &mut Tally,
    taken: &mut Taken,
    entered: &mut u32,
) -> Result<bool, BlockError> {
    let custom = shared.custom_slots.load_full();
    let mut users = Interleaved { slots: &custom, next: 0 };
    <BuiltIn as Chain>::run(rules, shared, cx, held, tally, taken, entered, &mut users)
}

/// The one undo: what every slot the call entered took and holds goes back, and no user slot's exit hook
/// will run.
#[cold]
fn give_back(
    rules: &ResourceRules,
    shared: &Shared,
    cx: &CheckCx<'_>,
    decided: &mut Decided,
    taken: &mut Taken,
    entered: u32,
) {
    let (mut held, tally) = decided.split();
    <BuiltIn as Chain>::give_back(rules, shared, cx, &mut held, taken, entered);
    tally.slots_passed = 0;
}

/// Whether the slots' state lets the fast path decide a call on `rules` now (every breaker closed); the
/// engine's flags say whether the rules do.
#[inline(always)]
pub(crate) fn admits_fast(rules: &ResourceRules, shared: &Shared, now_ms: u64) -> bool {
    <BuiltIn as Chain>::admits_fast(rules, shared, now_ms)
}

/// Whether the fast path cannot take `rules`: a kind that cannot be on it has rules (the resource's rules
/// only: the system rules, which apply to every inbound call, are checked on the fast path's copy with them,
/// `run_fast`'s `SYSTEM`, which the entry path takes per call).
pub(crate) fn has_slow_rules(rules: &ResourceRules, shared: &Shared) -> bool {
    <BuiltIn as Chain>::has_slow_rules(rules, shared)
}

/// The fast path: the table's slots that can be on it, on the rules the engine flagged for it. What a check
/// takes is spent when the call passes, as on the general path. Compiled twice: `APART` for rules where a
/// [`FAST_PATH_APART`](RuleSlot::FAST_PATH_APART) kind has rules beside a kind before it that holds
/// ([`FastPath::Apart`](crate::rules::FastPath::Apart)), in which the kinds that hold keep what they take while
/// the later checks run and give it back if one refuses; the common case's copy (`!APART`) compiles as if the
/// apart kinds were not there, and keeps nothing. `SYSTEM`: the copy with the system rules, for an inbound call
/// while one is loaded (the other copies compile as if the system slot were not there).
#[inline(always)]
pub(crate) fn run_fast<'c, const APART: bool, const SYSTEM: bool>(
    rules: &ResourceRules,
    shared: &Shared,
    call: &impl FastCall<'c>,
    wait: &mut u64,
    held: &mut Held<'_>,
) -> Result<(), BlockError> {
    let mut taken = FastTaken::default();
    <BuiltIn as Chain>::fast::<APART, SYSTEM>(rules, shared, call, wait, held, APART.then_some(&mut taken))
}

/// Whether a kind that is on the fast path apart has rules in `rules` beside a kind before it that holds (see
/// [`run_fast`]).
pub(crate) fn fast_path_apart(rules: &ResourceRules, shared: &Shared) -> bool {
    <BuiltIn as Chain>::apart_beside_holders(rules, shared, false)
}

/// The exit of a call that passed, for the slots that do not read the rules.
#[inline(always)]
pub(crate) fn exit(shared: &Shared, cx: &ExitCx, held: &mut Held<'_>) {
    <BuiltIn as Chain>::exit(shared, cx, held)
}

/// The exit of a call that passed, for the slots that read the rules (`rules`, read once for them all).
#[inline(always)]
pub(crate) fn exit_reading_rules(rules: &ResourceRules, shared: &Shared, cx: &ExitCx, held: &mut Held<'_>) {
    <BuiltIn as Chain>::exit_reading_rules(rules, shared, cx, held)
}
