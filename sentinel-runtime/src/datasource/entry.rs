//! What one entry of a store (a Redis key, an etcd key, a ZooKeeper node) holds, shared by the stores:
//! one rule kind's list (Java's per-kind documents), a combined document, or one of the gateway's lists
//! (Java's `gw-flow-rules` and `gw-api-definitions` documents, feature `tower`). How an entry's text is read,
//! which entries a write-back puts, and the text it puts there.

use super::{Format, ParseError, RuleSet, SerializeError, WriteBackError};
use crate::{RuleKind, Sentinel};

/// The largest entry a data source reads, in bytes: the file sources' default bound
/// ([`FileLimits`](super::FileLimits)), 16 MiB. A larger one is refused and the rules in force stay.
pub(crate) const MAX_ENTRY_BYTES: usize = super::file::DEFAULT_MAX_BYTES;

/// The most rules one entry may hold, every kind counted: the file sources' default bound, 100,000.
pub(crate) const MAX_ENTRY_RULES: usize = super::file::DEFAULT_MAX_RULES;

/// The error of an entry of `len` bytes, over [`MAX_ENTRY_BYTES`].
pub(crate) fn too_large(len: usize) -> ParseError {
    ParseError::new(
        Format::Json,
        None,
        None,
        None,
        format!("the entry holds {len} bytes, more than the {MAX_ENTRY_BYTES} a data source reads"),
    )
}

/// What one store entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Holds {
    /// A combined document (`{"flowRules": [...], "gwFlowRules": [...], ...}`).
    Combined,
    /// One kind's list.
    Kind(RuleKind),
    /// The gateway's flow rules, a list in Java's gateway JSON.
    #[cfg(feature = "tower")]
    GatewayRules,
    /// The gateway's API definitions, a list in Java's gateway JSON.
    #[cfg(feature = "tower")]
    ApiDefinitions,
}

impl From<Option<RuleKind>> for Holds {
    fn from(kind: Option<RuleKind>) -> Self {
        kind.map_or(Holds::Combined, Holds::Kind)
    }
}

impl std::fmt::Display for Holds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holds::Combined => f.write_str("a combined rules document"),
            Holds::Kind(kind) => write!(f, "{kind} rules"),
            #[cfg(feature = "tower")]
            Holds::GatewayRules => f.write_str("gateway flow rules"),
            #[cfg(feature = "tower")]
            Holds::ApiDefinitions => f.write_str("API definitions"),
        }
    }
}

impl Holds {
    /// The parts of `set` an entry may hold alone: each rule kind it holds, then each gateway list.
    pub(crate) fn parts_of(set: &RuleSet) -> Vec<Holds> {
        #[allow(unused_mut)]
        let mut parts: Vec<Holds> = set.kinds().into_iter().map(Holds::Kind).collect();
        #[cfg(feature = "tower")]
        {
            if set.gateway.rules.is_some() {
                parts.push(Holds::GatewayRules);
            }
            if set.gateway.api_definitions.is_some() {
                parts.push(Holds::ApiDefinitions);
            }
        }
        parts
    }

    /// Whether an entry holding this stores `part` (a part of [`parts_of`](Holds::parts_of)).
    pub(crate) fn stores(self, part: Holds) -> bool {
        self == Holds::Combined || self == part
    }

    /// An entry's text as a set: the kind's or the gateway list's, or the combined document's. A gateway
    /// list that is not Java's gateway JSON is reported as a JSON [`ParseError`] naming the field. An entry
    /// over [`MAX_ENTRY_BYTES`] or holding more than [`MAX_ENTRY_RULES`] rules is a [`ParseError`] too.
    pub(crate) fn parse(self, text: &str, format: Format) -> Result<RuleSet, ParseError> {
        if text.len() > MAX_ENTRY_BYTES {
            return Err(too_large(text.len()));
        }
        let set = self.parse_unbounded(text, format)?;
        match set.len() {
            n if n > MAX_ENTRY_RULES => Err(ParseError::new(
                format,
                None,
                None,
                None,
                format!("the entry holds {n} rules, more than the {MAX_ENTRY_RULES} a data source applies"),
            )),
            _ => Ok(set),
        }
    }

    fn parse_unbounded(self, text: &str, format: Format) -> Result<RuleSet, ParseError> {
        match self {
            Holds::Combined => RuleSet::parse(text, format),
            Holds::Kind(kind) => RuleSet::parse_entry(Some(kind), text, format),
            #[cfg(feature = "tower")]
            Holds::GatewayRules | Holds::ApiDefinitions => {
                let gateway_error = super::gateway::parse_error;
                let mut set = RuleSet::default();
                if self == Holds::GatewayRules {
                    set.gateway.rules = Some(crate::web::gateway::json::rules_from_json(text).map_err(gateway_error)?);
                } else {
                    set.gateway.api_definitions =
                        Some(crate::web::gateway::json::api_definitions_from_json(text).map_err(gateway_error)?);
                }
                Ok(set)
            }
        }
    }

    /// An entry's bytes (UTF-8) as a set, with its text.
    #[cfg(any(feature = "etcd", feature = "zookeeper", test))]
    pub(crate) fn parse_bytes(self, value: &[u8]) -> Result<(&str, RuleSet), ParseError> {
        if value.len() > MAX_ENTRY_BYTES {
            return Err(too_large(value.len()));
        }
        let text = std::str::from_utf8(value)
            .map_err(|e| ParseError::new(Format::Json, None, None, None, format!("not UTF-8: {e}")))?;
        Ok((text, self.parse(text, Format::Json)?))
    }

    /// A set that clears what the entry holds (every kind and gateway list, for a combined document).
    #[cfg(any(feature = "etcd", feature = "zookeeper"))]
    pub(crate) fn cleared(self) -> RuleSet {
        let mut set = RuleSet::default();
        let kinds = match self {
            Holds::Combined => super::ALL_KINDS.to_vec(),
            Holds::Kind(kind) => vec![kind],
            #[cfg(feature = "tower")]
            Holds::GatewayRules | Holds::ApiDefinitions => Vec::new(),
        };
        for kind in kinds {
            set.merge(RuleSet::parse_entry(Some(kind), "[]", Format::Json).unwrap_or_default());
        }
        #[cfg(feature = "tower")]
        {
            if matches!(self, Holds::Combined | Holds::GatewayRules) {
                set.gateway.rules = Some(Vec::new());
            }
            if matches!(self, Holds::Combined | Holds::ApiDefinitions) {
                set.gateway.api_definitions = Some(Vec::new());
            }
        }
        set
    }

    /// The text a write-back of `set` puts in the entry, in JSON: the kind's list, the gateway list, or the
    /// combined document `current` (the entry's present text, if any) with what `set` holds replaced. A
    /// `current` that is not a rules document is an error: the entry is left untouched. So is an entry the
    /// sources would refuse to read ([`MAX_ENTRY_BYTES`], [`MAX_ENTRY_RULES`]): a write-back that succeeds
    /// is always what the next start loads.
    ///
    /// A combined document keeps the other kinds the entry holds, except one the engine would refuse (an edit
    /// it refused, still in the entry): that one is written as the rules in force, as the file source does, so
    /// that the document loads at the next start, the pushed rules with it.
    pub(crate) fn text(
        self,
        current: Option<&str>,
        set: &RuleSet,
        engine: &Sentinel,
    ) -> Result<String, SerializeError> {
        let (text, count) = self.text_unbounded(current, set, engine)?;
        if count > MAX_ENTRY_RULES {
            return Err(SerializeError::new(
                Format::Json,
                format!("the entry would hold {count} rules, more than the {MAX_ENTRY_RULES} a data source applies"),
            ));
        }
        if text.len() > MAX_ENTRY_BYTES {
            return Err(SerializeError::new(
                Format::Json,
                format!(
                    "the entry would hold {} bytes, more than the {MAX_ENTRY_BYTES} a data source reads",
                    text.len()
                ),
            ));
        }
        Ok(text)
    }

    /// The text of [`text`](Holds::text) and the number of rules it holds.
    fn text_unbounded(
        self,
        current: Option<&str>,
        set: &RuleSet,
        engine: &Sentinel,
    ) -> Result<(String, usize), SerializeError> {
        match self {
            Holds::Combined => {
                let mut doc = match current.map(str::trim) {
                    None | Some("") => RuleSet::default(),
                    Some(t) => RuleSet::parse(t, Format::Json).map_err(|e| {
                        SerializeError::new(Format::Json, format!("the entry holds no valid rules document ({e})"))
                    })?,
                };
                doc.merge(set.clone());
                let doc = loadable(doc, set, engine);
                Ok((doc.to_string(Format::Json)?, doc.len()))
            }
            Holds::Kind(kind) => Ok((set.kind_to_string(kind, Format::Json)?, set.clone().only(kind).len())),
            #[cfg(feature = "tower")]
            Holds::GatewayRules => {
                let rules = set.gateway.rules.as_deref().unwrap_or_default();
                Ok((crate::web::gateway::json::rules_to_json(rules), rules.len()))
            }
            #[cfg(feature = "tower")]
            Holds::ApiDefinitions => {
                let definitions = set.gateway.api_definitions.as_deref().unwrap_or_default();
                Ok((crate::web::gateway::json::api_definitions_to_json(definitions), definitions.len()))
            }
        }
    }
}

/// A combined document about to be written back, made to load: each kind (and gateway list) `pushed` does not
/// hold, that differs from the rules in force and that the engine would refuse, replaced by the rules in force.
/// What differs is tried on an engine of its own (quietly: its warnings are of no use here).
fn loadable(mut doc: RuleSet, pushed: &RuleSet, engine: &Sentinel) -> RuleSet {
    for _ in 0..super::ALL_KINDS.len() + 2 {
        let mut differs = RuleSet::default();
        for kind in doc.kinds().into_iter().filter(|k| !pushed.has(*k)) {
            let one = doc.clone().only(kind);
            if !one.is_in_force(engine) {
                differs.merge(one);
            }
        }
        #[cfg(feature = "tower")]
        {
            if pushed.gateway.rules.is_none()
                && doc.gateway.rules.as_ref().is_some_and(|r| *r != engine.gateway_rules())
            {
                differs.gateway.rules = doc.gateway.rules.clone();
            }
            if pushed.gateway.api_definitions.is_none()
                && doc.gateway.api_definitions.as_ref().is_some_and(|d| *d != engine.api_definitions())
            {
                differs.gateway.api_definitions = doc.gateway.api_definitions.clone();
            }
        }
        #[allow(unused_mut)]
        let mut nothing = differs.kinds().is_empty();
        #[cfg(feature = "tower")]
        {
            nothing &= differs.gateway.is_empty();
        }
        if nothing {
            return doc;
        }
        let scratch = Sentinel::builder().manual_clock(crate::clock::ManualClock::at_millis(0)).build();
        let tried = tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
            differs.apply_all(&scratch)
        });
        match tried {
            Ok(_) => return doc,
            Err(super::ApplyError::Rules(crate::RuleError::Invalid { kind, .. })) => {
                doc.merge(RuleSet::snapshot(engine, &[kind]));
            }
            #[cfg(feature = "tower")]
            Err(super::ApplyError::Gateway(_)) => {
                if differs.gateway.rules.is_some() {
                    doc.gateway.rules = Some(engine.gateway_rules());
                }
                if differs.gateway.api_definitions.is_some() {
                    doc.gateway.api_definitions = Some(engine.api_definitions());
                }
            }
        }
    }
    doc
}

/// The entries (by index) a write-back of `set` puts: for each part of the set, the first entry that holds
/// it alone or a combined document. A part no entry holds is an error: a rule kind
/// [`WriteBackError::Unsupported`], a gateway list [`WriteBackError::Store`] naming it.
pub(crate) fn entries_for(
    entries: impl Iterator<Item = Holds> + Clone,
    set: &RuleSet,
    target: &str,
) -> Result<Vec<usize>, WriteBackError> {
    let mut out = Vec::new();
    for part in Holds::parts_of(set) {
        match entries.clone().position(|e| e.stores(part)) {
            Some(i) if !out.contains(&i) => out.push(i),
            Some(_) => {}
            None => {
                return Err(match part {
                    Holds::Kind(kind) => WriteBackError::Unsupported { target: target.to_string(), kind },
                    other => WriteBackError::Store {
                        target: target.to_string(),
                        reason: format!("no key or node of this data source holds {other}"),
                    },
                })
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow_rules(n: usize) -> String {
        let rules: Vec<String> = (0..n).map(|i| format!(r#"{{"resource": "r{i}", "count": 1}}"#)).collect();
        format!("[{}]", rules.join(","))
    }

    #[test]
    fn an_entry_over_the_bytes_a_source_reads_is_a_parse_error() {
        let text = format!("[{}]", " ".repeat(MAX_ENTRY_BYTES));
        for holds in [Holds::Combined, Holds::Kind(RuleKind::Flow)] {
            let error = holds.parse(&text, Format::Json).unwrap_err();
            assert!(error.message.contains("more than the 16777216 a data source reads"), "{error}");
        }
        // Checked before the bytes are read as text.
        let mut bytes = text.into_bytes();
        bytes[1] = 0xff;
        let error = Holds::Kind(RuleKind::Flow).parse_bytes(&bytes).unwrap_err();
        assert!(error.message.contains("more than the 16777216"), "{error}");
    }

    /// A write-back puts what the source reads back: an entry the source would refuse (more rules or bytes
    /// than it reads) is not written, or the push answers `success` and the next start loads nothing.
    #[test]
    fn a_write_back_entry_over_the_bounds_a_source_reads_is_refused() {
        let rules: Vec<crate::flow::FlowRule> =
            (0..=MAX_ENTRY_RULES).map(|i| crate::flow::FlowRule::new(format!("r{i}")).count(1.0)).collect();
        let set = RuleSet::new().with_flow(rules);
        let engine = Sentinel::builder().build();
        for holds in [Holds::Combined, Holds::Kind(RuleKind::Flow)] {
            if let Ok(text) = holds.text(None, &set, &engine) {
                let back = holds.parse(&text, Format::Json).map(|s| s.len());
                panic!("{holds}: written, and read back as {back:?}");
            }
        }
        let long = crate::flow::FlowRule::new("x".repeat(MAX_ENTRY_BYTES)).count(1.0);
        let set = RuleSet::new().with_flow(vec![long]);
        let written = Holds::Kind(RuleKind::Flow).text(None, &set, &engine).map(|t| t.len());
        assert!(written.is_err(), "an entry of {written:?} bytes");
    }

    #[test]
    fn an_entry_of_more_rules_than_a_source_applies_is_a_parse_error_and_the_bound_itself_parses() {
        let at = flow_rules(MAX_ENTRY_RULES);
        assert_eq!(Holds::Kind(RuleKind::Flow).parse(&at, Format::Json).map(|s| s.len()), Ok(MAX_ENTRY_RULES));
        let over = flow_rules(MAX_ENTRY_RULES + 1);
        let error = Holds::Kind(RuleKind::Flow).parse(&over, Format::Json).unwrap_err();
        assert!(error.message.contains("100001 rules, more than the 100000"), "{error}");
        let combined = format!(r#"{{"flowRules": {over}}}"#);
        assert!(Holds::Combined.parse(&combined, Format::Json).is_err());
        let error = Holds::Kind(RuleKind::Flow).parse_bytes(over.as_bytes()).unwrap_err();
        assert!(error.message.contains("100001 rules"), "{error}");
    }
}
