//! The slot chain: the order in which checks run, and user-defined slots.
//!
//! Built-in slots run in Java Sentinel's order (lowest first): node selector −10000, cluster builder −9000,
//! log −8000, statistics −7000, authority −6000, system −5000, param flow −3000, flow −2000, default circuit
//! breaker −1500, degrade −1000, then adaptive concurrency −500 (not in Java: last among the built-in
//! checks, so a call takes a place under the adaptive limit only once every other rule let it through; a
//! place is then never taken and handed back for a call another rule refuses, and the calls in flight the
//! limit learns from are calls that really ran). Statistics wraps every check after it and records pass or block from their
//! verdict. A user slot added with [`Sentinel::add_slot`](crate::Sentinel::add_slot) runs at its own order
//! among the checks; the first slot that blocks stops the chain.

use std::sync::Arc;

pub(crate) mod contract;
#[cfg(test)]
pub(crate) mod every_nth;
pub(crate) mod toolkit;

/// Whether calls come into this process (counted by system rules) or go out of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum EntryType {
    /// An inbound call: checked by system rules and counted on the global inbound node.
    In,
    /// An outbound call (the default).
    #[default]
    Out,
}

/// Order of the node selector slot.
pub const ORDER_NODE_SELECTOR: i32 = -10000;
/// Order of the cluster builder slot.
pub const ORDER_CLUSTER_BUILDER: i32 = -9000;
/// Order of the log slot.
pub const ORDER_LOG: i32 = -8000;
/// Order of the statistics slot.
pub const ORDER_STATISTIC: i32 = -7000;
/// Order of the authority slot.
pub const ORDER_AUTHORITY: i32 = -6000;
/// Order of the system slot.
pub const ORDER_SYSTEM: i32 = -5000;
/// Order of the hot-parameter slot.
pub const ORDER_PARAM_FLOW: i32 = -3000;
/// Order of the flow slot.
pub const ORDER_FLOW: i32 = -2000;
/// Order of the default circuit breaker slot (rules for `"*"`).
pub const ORDER_DEFAULT_CIRCUIT_BREAKER: i32 = -1500;
/// Order of the degrade slot.
pub const ORDER_DEGRADE: i32 = -1000;

/// Order of the adaptive concurrency slot.
pub const ORDER_ADAPTIVE: i32 = -500;

/// What a user slot sees of an entry.
#[derive(Debug)]
pub struct SlotEntry<'a> {
    /// The resource.
    pub resource: &'a str,
    /// Inbound or outbound.
    pub entry_type: EntryType,
    /// The context's name.
    pub context: &'a str,
    /// The caller's origin (empty when none).
    pub origin: &'a str,
    /// How many permits the call asks for.
    pub acquire: u32,
    /// The engine's current time, ms since the epoch.
    pub now_ms: u64,
}

/// What a user slot sees when an entry it passed exits.
#[derive(Debug)]
pub struct SlotExit<'a> {
    /// The resource.
    pub resource: &'a str,
    /// Response time in microseconds.
    pub rt_micros: u64,
    /// Whether an error was traced on the entry.
    pub error: bool,
}

/// A user-defined check in the slot chain.
///
/// ```
/// use sentinel_runtime::{Sentinel, slot::{Slot, SlotEntry}};
/// struct DenyNight;
/// impl Slot for DenyNight {
///     fn name(&self) -> &'static str { "deny-night" }
///     fn entry(&self, e: &SlotEntry<'_>) -> Result<(), String> {
///         if e.resource == "batch" { Err("not now".into()) } else { Ok(()) }
///     }
/// }
/// let engine = Sentinel::builder().build();
/// engine.add_slot(-1800, DenyNight);
/// assert!(engine.resource("batch").enter().is_err());
/// assert!(engine.resource("other").enter().is_ok());
/// ```
pub trait Slot: Send + Sync + 'static {
    /// A short name, shown in block errors.
    fn name(&self) -> &'static str;
    /// Checks an entry: `Err(reason)` blocks it.
    fn entry(&self, entry: &SlotEntry<'_>) -> Result<(), String>;
    /// Called when an entry this slot passed exits (not called for blocked entries).
    fn exit(&self, _exit: &SlotExit<'_>) {}
}

/// User slots sorted by order, split around the built-in checks.
#[derive(Clone, Default)]
pub(crate) struct CustomSlots {
    /// `(order, id, slot)`: the id is the slot's position in the order slots were added (slots are never
    /// removed), so an entry remembers which slots passed it by id even when a slot is added before it exits.
    pub(crate) slots: Vec<(i32, u32, Arc<dyn Slot>)>,
    /// The id of the next slot added.
    pub(crate) next_id: u32,
}
