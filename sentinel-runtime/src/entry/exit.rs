//! The exit of an entry: completion on its nodes, the slots' exits, the thread's context put back.

use std::sync::atomic::Ordering;

use crate::clock::NANOS_PER_MILLI;
use crate::context::{self, ContextState};
use crate::engine::shared::Shared;
use crate::node::DefaultNode;
use crate::resource::inner::ResourceInner;

use super::path::Nodes;
use super::{Entry, Flags, CARRIED};
use crate::chain::{self, MAX_SLOT_EXITS};
use crate::slot::contract::{CallNodes, ExitCx};
use crate::slot::SlotExit;
use crate::stat::Writer;

impl Entry<'_> {
    /// Puts back the thread's context as it was before this entry, unless it was already unwound.
    #[inline]
    fn restore_context(&self, shared: &Shared, node: &DefaultNode) {
        let cur = context::current();
        if cur.era & context::ERA_MASK != self.era.load(Ordering::Relaxed) {
            // The installation the entry joined is not this thread's context now: unwound already here, or
            // another thread's, which this one cannot write: that thread applies the exit when it next reads
            // its context (`context::moved`). Or it is, under a later era (`context::unwound_to`).
            self.exit_elsewhere(shared, node);
            return;
        }
        self.restore_in(cur, shared, node);
    }

    /// [`restore_context`](Self::restore_context) in `cur`, the thread's current state, a context of the
    /// entry's installation.
    #[inline(always)]
    fn restore_in(&self, cur: ContextState, shared: &Shared, node: &DefaultNode) {
        if cur.engine_id != shared.id {
            return; // an outer entry already unwound this context
        }
        // This entry is the innermost one: its node is this resource's node in the entry's context, which no
        // other context shares, so the context active is the entry's own.
        if std::ptr::eq(cur.cur_node, node) && cur.depth == self.depth {
            if self.flags & Flags::FRESH != 0 {
                context::leave();
            } else {
                // Read again rather than kept: the common case above reads four of the state's fields alone.
                context::set_current(self.outer_of(context::current()));
            }
            return;
        }
        if cur.ctx.is_null() {
            return; // an outer entry already unwound this context
        }
        // SAFETY: `cur` is a state of this entry's engine (its id was compared above, and ids are never reused),
        // whose contexts are freed only with it, and `res` keeps it alive.
        if unsafe { (*cur.ctx).id } != node.context_id {
            return; // another context of the engine is active now
        }
        if cur.depth > self.depth {
            self.exit_over_nested(node);
        }
    }

    /// The exit of an entry that the thread's context shows inside entries nested in it. Those may have exited
    /// on other threads already (their exits wait in this thread's mailbox, read when the thread next reads
    /// its context): read then, this entry may be the innermost one after all. Otherwise it exits before the
    /// entries nested in it, which leave the context with it.
    #[cold]
    #[inline(never)]
    fn exit_over_nested(&self, node: &DefaultNode) {
        let cur = context::current_settled();
        if std::ptr::eq(cur.cur_node, node) && cur.depth == self.depth {
            context::set_current(self.outer_of(cur));
            return;
        }
        if cur.depth > self.depth {
            tracing::error!(
                resource = %self.resource(),
                "entry exited before the entries nested in it; exiting them from the context first"
            );
            // Those entries may be in flight on other threads: their exits must not end later entries made
            // at their places.
            context::set_current(context::unwound_to(self.outer_of(cur)));
        }
    }
}

impl Entry<'_> {
    /// The thread's context as it was before this entry, given `cur`, a context of the entry's engine in which
    /// the entry (or an entry nested in it) is the innermost one.
    #[inline]
    fn outer_of(&self, cur: ContextState) -> ContextState {
        if self.flags & Flags::FRESH != 0 {
            ContextState { override_engine: cur.override_engine, ..ContextState::NONE }
        } else {
            ContextState { cur_node: self.parent, depth: self.depth - 1, ..cur }.closed_if_done()
        }
    }

    /// The exit of an entry whose installation is not this thread's context now: when it is another
    /// thread's, tells that thread that the entry exited here; when it is this thread's own, under a context
    /// that is not (a future's copy of it, an entry's scope), tells this thread's own context.
    #[cold]
    #[inline(never)]
    fn exit_elsewhere(&self, shared: &Shared, node: &DefaultNode) {
        let era = self.era.load(Ordering::Relaxed);
        let cur = context::current();
        // Still in this thread's context, whose era moved on when an exit unwound entries nested in this one.
        if context::continues(era, self.depth, cur.era) && !context::in_foreign() {
            self.restore_in(cur, shared, node);
            let now = context::current();
            if now.engine_id == cur.engine_id && now.depth < cur.depth {
                context::left_continued(now.depth, now.era);
            }
            return;
        }
        // Carried away: its place is in no thread's context any more (the context that had it was carried in
        // a future, and goes with it).
        if era == CARRIED {
            return;
        }
        // This thread's own installation: unwound already, unless the context installed now is not the thread's
        // own (a future's copy of it, an entry's scope) and the thread's own, put back after it, still has the
        // entry: it learns of the exit as another thread's exit would tell it.
        if context::is_this_threads(era) && !context::in_foreign() {
            return;
        }
        context::post_moved_exit(context::MovedExit {
            era,
            engine_id: self.res.shared().id,
            depth: self.depth,
            node: node as *const DefaultNode as usize,
            parent: self.parent as usize,
            fresh: self.flags & Flags::FRESH != 0,
        });
    }

    /// For work of this entry that is suspended (an `async fn`'s body awaiting): what the thread's context
    /// must be put back to, given `cur` (the context the work leaves), when this entry installed itself in the
    /// thread's context; `None` when it did not (it left the thread's context as it found it).
    #[inline]
    pub(crate) fn context_without(&self, cur: ContextState) -> Option<ContextState> {
        let installed = self.flags & Flags::TOUCHES_TLS != 0 && cur.engine_id == self.res.shared().id;
        installed.then(|| self.outer_of(cur))
    }

    /// The suspended work's context, in which this entry is the innermost one, is carried away in its future
    /// (and the thread's context put back to what it was before the entry: [`context_without`]): the entry's
    /// place is then in no thread's context, so its exit, on whichever thread, changes none (a thread that
    /// made it may meanwhile be deeper in entries of its own, in the same installation).
    ///
    /// [`context_without`]: Entry::context_without
    #[inline]
    pub(crate) fn carried_away(&self) {
        // An entry that did not install itself changes no thread's context at its exit anyway (its `era` is
        // its scopes').
        if self.flags & Flags::TOUCHES_TLS != 0 {
            self.era.store(CARRIED, Ordering::Relaxed);
        }
    }
}

impl Drop for Entry<'_> {
    #[inline]
    fn drop(&mut self) {
        let Some(node) = self.node else {
            return; // unchecked
        };
        // A call whose turn never came (its caller gave up while it waited): its pass now, for its completion.
        self.at_turn();
        let shared = self.res.shared();
        let inner = self.res.inner();
        let now_nanos = shared.clock.now_nanos();
        let now_ms = now_nanos / NANOS_PER_MILLI;
        let rt_micros = now_nanos.saturating_sub(self.created_nanos) / 1000;
        // An entry dropped by unwinding: the panic counts as an error, unless the call returned (it ran in
        // cleanup code during the unwinding).
        if self.flags & Flags::RETURNED == 0 && std::thread::panicking() {
            self.error = true;
            self.flags |= Flags::ABANDONED; // it never completed
        }
        let (acquire, error) = (self.acquire, self.error);
        let w = Writer::at(now_ms);
        let (own, inbound) = (self.flags & Flags::OWN != 0, self.flags & Flags::INBOUND != 0);
        let nodes = Nodes::new(node, own, inner, self.origin_node, inbound, shared);
        let overload = self.flags & Flags::OVERLOAD != 0;
        // A call that never completed (given up on, or panicked): no round trip to measure, unless it was
        // marked as an overload (a time limit hit). A call that returned completed, whatever else was marked.
        let abandoned = self.flags & (Flags::ABANDONED | Flags::OVERLOAD | Flags::RETURNED) == Flags::ABANDONED;
        let waited_nanos = self.wait_nanos;
        // The nodes the checks saw (`CheckCx`): the resource's, the context's and the origin's.
        // Made only for a call that holds thread-grade permits on them (read by the flow slot's exit).
        let call_nodes =
            self.flow.is_active().then(|| CallNodes::new(&inner.cluster.stat, Some(node.stats()), nodes.origin()));
        // The permits go back before the calls in flight go down (see `ThreadGate`: a call never holds a
        // counted permit while it is not counted in flight).
        chain::exit(
            shared,
            &ExitCx { now_nanos, now_ms, rt_micros, waited_nanos, nodes: call_nodes, error, overload, abandoned },
            &mut self.held(),
        );
        nodes.for_each(|n| n.complete_with(&w, rt_micros, acquire, error));
        if let Some(o) = inner.observed.get() {
            o.record_rt(rt_micros);
        }
        // Before any user code runs (breaker observers, slot exit hooks), so that a panic there cannot leave
        // this entry installed in the thread's context.
        if self.flags & Flags::TOUCHES_TLS != 0 {
            self.restore_context(shared, node);
        }
        // Breakers count the call; the adaptive slot's place goes back to the rule state that gave it.
        if inner.exit_reads_rules.load(Ordering::Acquire) {
            let xcx =
                ExitCx { now_nanos, now_ms, rt_micros, waited_nanos, nodes: call_nodes, error, overload, abandoned };
            let mut held = self.held();
            inner.with_rules(|rules| chain::exit_reading_rules(rules, shared, &xcx, &mut held));
        }
        if self.slots_passed != 0 {
            self.exit_slots(shared, inner, rt_micros, error);
        }
    }
}

impl Entry<'_> {
    /// What the call holds, for the slots' exits.
    #[inline(always)]
    fn held(&mut self) -> chain::Held<'_> {
        chain::Held {
            flow: &mut self.flow,
            param: &mut self.param,
            breakers: &mut self.breakers,
            adaptive: &mut self.adaptive,
            nothing: (),
        }
    }

    /// Runs the exit hooks of the slots that passed this entry (matched by id). Every hook runs even if one
    /// panics; the first panic then goes on, unless the thread is already unwinding (a second panic would
    /// abort the process), in which case it is logged.
    #[cold]
    fn exit_slots(&self, shared: &Shared, inner: &ResourceInner, rt_micros: u64, error: bool) {
        let slots = shared.custom_slots.load();
        let exit = SlotExit { resource: &inner.name, rt_micros, error };
        let mut first_panic = None;
        for (_, id, s) in slots.slots.iter() {
            if (*id as usize) < MAX_SLOT_EXITS
                && self.slots_passed & (1 << id) != 0
                && let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.exit(&exit)))
            {
                first_panic.get_or_insert(p);
            }
        }
        if let Some(p) = first_panic {
            if std::thread::panicking() {
                tracing::error!(resource = %inner.name, "a slot's exit hook panicked while the thread was unwinding");
            } else {
                std::panic::resume_unwind(p);
            }
        }
    }
}
