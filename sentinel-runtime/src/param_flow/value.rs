//! Hot-parameter values: what an argument contributes, and the fixed-size key a value is counted under.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashSet, VecDeque};
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

use super::rule::ParamItemValue;

/// One hot-parameter value, borrowed from an argument.
///
/// Matching is type-sensitive: `Int(7)` and `Str("7")` are different values, with separate counters, and an
/// exception item [`ParamItemValue::Int(7)`](ParamItemValue::Int) matches only `Int(7)`. Integers of every
/// width are one type (`7u8` and `7i64` are the same value), and so are `f32` and `f64`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum ParamValue<'a> {
    /// An integer that fits in `i64`.
    Int(i64),
    /// An integer outside `i64`'s range (from `u64`, `usize`, `i128`). Never equal to an `Int`.
    BigInt(i128),
    /// A float. Values are compared by their bits (like Java's `Double.equals`): `0.0` is not `-0.0`, and
    /// every NaN is the same value.
    Float(f64),
    /// A string.
    Str(&'a str),
    /// A boolean.
    Bool(bool),
    /// A character.
    Char(char),
}

impl ParamValue<'_> {
    /// The integer `v`, as `Int` when it fits in `i64`.
    pub fn int(v: i128) -> ParamValue<'static> {
        match i64::try_from(v) {
            Ok(i) => ParamValue::Int(i),
            Err(_) => ParamValue::BigInt(v),
        }
    }

    /// The fixed-size key this value is counted under (strings are hashed to 128 bits).
    pub(crate) fn key(&self) -> ValueKey {
        match *self {
            ParamValue::Int(i) => ValueKey::int(i as i128),
            ParamValue::BigInt(i) => ValueKey::int(i),
            ParamValue::Float(f) => ValueKey::float(f),
            ParamValue::Str(s) => ValueKey::str(s),
            ParamValue::Bool(b) => ValueKey { tag: TAG_BOOL, hi: 0, lo: b as u64 },
            ParamValue::Char(c) => ValueKey { tag: TAG_CHAR, hi: 0, lo: c as u64 },
        }
    }
}

impl fmt::Display for ParamValue<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamValue::Int(i) => write!(f, "{i}"),
            ParamValue::BigInt(i) => write!(f, "{i}"),
            ParamValue::Float(x) => write!(f, "{x:?}"),
            ParamValue::Str(s) => f.write_str(s),
            ParamValue::Bool(b) => write!(f, "{b}"),
            ParamValue::Char(c) => write!(f, "{c}"),
        }
    }
}

const TAG_INT: u8 = 1;
const TAG_FLOAT: u8 = 2;
const TAG_STR: u8 = 3;
const TAG_BOOL: u8 = 4;
const TAG_CHAR: u8 = 5;

/// A value's identity in the counter maps: its type tag and 128 bits. Integers, floats, booleans and
/// characters are stored exactly; a string is stored as its 128-bit XXH3 hash (two distinct strings share a
/// counter with probability about `n² / 2¹²⁹` for `n` strings: below 10⁻²⁸ at the 200,000-value cap).
/// The key never borrows the argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ValueKey {
    tag: u8,
    hi: u64,
    lo: u64,
}

impl ValueKey {
    fn int(i: i128) -> Self {
        let u = i as u128;
        ValueKey { tag: TAG_INT, hi: (u >> 64) as u64, lo: u as u64 }
    }
    fn float(f: f64) -> Self {
        let bits = if f.is_nan() { f64::NAN.to_bits() } else { f.to_bits() };
        ValueKey { tag: TAG_FLOAT, hi: 0, lo: bits }
    }
    fn str(s: &str) -> Self {
        let h = xxhash_rust::xxh3::xxh3_128(s.as_bytes());
        ValueKey { tag: TAG_STR, hi: (h >> 64) as u64, lo: h as u64 }
    }
    /// The type tag (never 0) and the two words of the key.
    #[inline]
    pub(crate) fn parts(&self) -> (u8, u64, u64) {
        (self.tag, self.hi, self.lo)
    }
    /// The key of these parts (a value's cell read back by the counter table).
    #[inline]
    pub(crate) fn from_parts(tag: u8, hi: u64, lo: u64) -> Self {
        ValueKey { tag, hi, lo }
    }
    /// The key of an exception item's value.
    pub(crate) fn of_item(v: &ParamItemValue) -> Self {
        match v {
            ParamItemValue::Int(i) => ValueKey::int(*i as i128),
            ParamItemValue::Float(f) => ValueKey::float(*f),
            ParamItemValue::Str(s) => ValueKey::str(s),
            ParamItemValue::Bool(b) => ParamValue::Bool(*b).key(),
            ParamItemValue::Char(c) => ParamValue::Char(*c).key(),
        }
    }
}

/// A value that can be a hot parameter. Implement it for your own types to limit by them.
///
/// Implemented for the integers, floats, `bool`, `char`, `str`/`String` (and `Cow`, `Box<str>`,
/// `Arc<str>`), `Option<T>` (`None` is absent and always passes), slices, arrays, `Vec`, `VecDeque`,
/// `HashSet` and `BTreeSet` (each element is checked, as Java checks each element of a collection), and
/// references, `Box`, `Rc` and `Arc` of any of these. The scalars also give their one value through
/// [`single_value`](HotParam::single_value), which spares a check the callback; a type of your own that stands
/// for one value may do the same, as `User` does below.
///
/// ```
/// use sentinel_runtime::param_flow::{HotParam, ParamFlowRule, ParamValue};
/// use sentinel_runtime::{Sentinel, BlockError};
///
/// struct User { id: u64, name: String }
///
/// // Limit by the user's id.
/// impl HotParam for User {
///     fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
///         self.id.visit_values(f)
///     }
///     // Optional: the one value, without the callback.
///     fn single_value(&self) -> Option<ParamValue<'_>> {
///         self.id.single_value()
///     }
/// }
///
/// let engine = Sentinel::builder().build();
/// engine.load_param_flow_rules(vec![ParamFlowRule::new("profile", 0).count(1.0)]).unwrap();
/// let profile = engine.resource("profile");
/// let alice = User { id: 1, name: "alice".into() };
/// assert!(profile.entry().args(&[&alice]).enter().is_ok());
/// let err = profile.entry().args(&[&alice]).enter().unwrap_err();
/// assert!(matches!(err, BlockError::ParamFlow { ref value, .. } if value == "1"));
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a hot parameter",
    label = "not a hot parameter",
    note = "implement `sentinel_runtime::param_flow::HotParam` for `{Self}` (its `visit_values` yields the values to limit by), or pass a field that is one (an integer, string, bool, char, float, or a collection of them)"
)]
pub trait HotParam {
    /// Calls `f` with each value this argument contributes: one for a scalar, each element for a collection,
    /// none for an absent value (which always passes).
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>));

    /// The value this argument contributes when it is exactly one (a scalar), so that a check decides it
    /// without calling back through [`visit_values`](Self::visit_values). `None`, the default, means "ask
    /// `visit_values`" (a collection, an absent value, a type that does not say). An implementation that
    /// returns `Some(v)` must contribute `v` alone, as its `visit_values` would.
    #[inline]
    fn single_value(&self) -> Option<ParamValue<'_>> {
        None
    }
}

macro_rules! small_int {
    ($($t:ty),*) => {$(
        impl HotParam for $t {
            #[inline]
            fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
                f(ParamValue::Int(*self as i64))
            }
            #[inline]
            fn single_value(&self) -> Option<ParamValue<'_>> {
                Some(ParamValue::Int(*self as i64))
            }
        }
    )*};
}
small_int!(i8, i16, i32, i64, isize, u8, u16, u32);

macro_rules! wide_int {
    ($($t:ty),*) => {$(
        impl HotParam for $t {
            #[inline]
            fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
                f(ParamValue::int(*self as i128))
            }
            #[inline]
            fn single_value(&self) -> Option<ParamValue<'_>> {
                Some(ParamValue::int(*self as i128))
            }
        }
    )*};
}
wide_int!(u64, usize, i128);

impl HotParam for f64 {
    #[inline]
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        f(ParamValue::Float(*self))
    }
    #[inline]
    fn single_value(&self) -> Option<ParamValue<'_>> {
        Some(ParamValue::Float(*self))
    }
}
impl HotParam for f32 {
    #[inline]
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        f(ParamValue::Float(*self as f64))
    }
    #[inline]
    fn single_value(&self) -> Option<ParamValue<'_>> {
        Some(ParamValue::Float(*self as f64))
    }
}
impl HotParam for bool {
    #[inline]
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        f(ParamValue::Bool(*self))
    }
    #[inline]
    fn single_value(&self) -> Option<ParamValue<'_>> {
        Some(ParamValue::Bool(*self))
    }
}
impl HotParam for char {
    #[inline]
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        f(ParamValue::Char(*self))
    }
    #[inline]
    fn single_value(&self) -> Option<ParamValue<'_>> {
        Some(ParamValue::Char(*self))
    }
}
impl HotParam for str {
    #[inline]
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        f(ParamValue::Str(self))
    }
    #[inline]
    fn single_value(&self) -> Option<ParamValue<'_>> {
        Some(ParamValue::Str(self))
    }
}
impl HotParam for String {
    #[inline]
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        f(ParamValue::Str(self))
    }
    #[inline]
    fn single_value(&self) -> Option<ParamValue<'_>> {
        Some(ParamValue::Str(self))
    }
}
impl HotParam for Cow<'_, str> {
    #[inline]
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        f(ParamValue::Str(self))
    }
    #[inline]
    fn single_value(&self) -> Option<ParamValue<'_>> {
        Some(ParamValue::Str(self))
    }
}
impl HotParam for ParamValue<'_> {
    #[inline]
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        f(*self)
    }
    #[inline]
    fn single_value(&self) -> Option<ParamValue<'_>> {
        Some(*self)
    }
}

impl<T: HotParam> HotParam for Option<T> {
    #[inline]
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        if let Some(v) = self {
            v.visit_values(f)
        }
    }
    #[inline]
    fn single_value(&self) -> Option<ParamValue<'_>> {
        self.as_ref().and_then(|v| v.single_value())
    }
}

macro_rules! pointer {
    ($($p:ident),*) => {$(
        impl<T: HotParam + ?Sized> HotParam for $p<T> {
            #[inline]
            fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
                (**self).visit_values(f)
            }
            #[inline]
            fn single_value(&self) -> Option<ParamValue<'_>> {
                (**self).single_value()
            }
        }
    )*};
}
pointer!(Box, Rc, Arc);

impl<T: HotParam + ?Sized> HotParam for &T {
    #[inline]
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        (**self).visit_values(f)
    }
    #[inline]
    fn single_value(&self) -> Option<ParamValue<'_>> {
        (**self).single_value()
    }
}
impl<T: HotParam + ?Sized> HotParam for &mut T {
    #[inline]
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        (**self).visit_values(f)
    }
    #[inline]
    fn single_value(&self) -> Option<ParamValue<'_>> {
        (**self).single_value()
    }
}

impl<T: HotParam> HotParam for [T] {
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        for v in self {
            v.visit_values(f)
        }
    }
}
impl<T: HotParam, const N: usize> HotParam for [T; N] {
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        self.as_slice().visit_values(f)
    }
}
impl<T: HotParam> HotParam for Vec<T> {
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        self.as_slice().visit_values(f)
    }
}
impl<T: HotParam> HotParam for VecDeque<T> {
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        for v in self {
            v.visit_values(f)
        }
    }
}
impl<T: HotParam, S> HotParam for HashSet<T, S> {
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        for v in self {
            v.visit_values(f)
        }
    }
}
impl<T: HotParam> HotParam for BTreeSet<T> {
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        for v in self {
            v.visit_values(f)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(p: &dyn HotParam) -> Vec<String> {
        let mut out = Vec::new();
        p.visit_values(&mut |v| out.push(format!("{v:?}")));
        out
    }

    #[test]
    fn scalars_collections_and_absent_values() {
        assert_eq!(values(&7u8), ["Int(7)"]);
        assert_eq!(values(&u64::MAX), [format!("BigInt({})", u64::MAX)]);
        assert_eq!(values(&"a"), ["Str(\"a\")"]);
        assert_eq!(values(&String::from("b")), ["Str(\"b\")"]);
        assert_eq!(values(&None::<u32>), Vec::<String>::new());
        assert_eq!(values(&Some(3i32)), ["Int(3)"]);
        assert_eq!(values(&vec![1, 2]), ["Int(1)", "Int(2)"]);
        assert_eq!(values(&[true]), ["Bool(true)"]);
        assert_eq!(values(&&&'x'), ["Char('x')"]);
        assert_eq!(values(&Arc::<str>::from("s")), ["Str(\"s\")"]);
    }

    #[test]
    fn a_single_value_is_what_visiting_yields_alone() {
        let cases: Vec<Box<dyn HotParam>> = vec![
            Box::new(7u8),
            Box::new(-3i64),
            Box::new(u64::MAX),
            Box::new(i128::MIN),
            Box::new(1.5f32),
            Box::new(2.5f64),
            Box::new(true),
            Box::new('x'),
            Box::new(String::from("b")),
            Box::new(Cow::Borrowed("c")),
            Box::new(ParamValue::Str("d")),
            Box::new(Some(3i32)),
            Box::new(None::<u32>),
            Box::new(Some(Some(String::from("e")))),
            Box::new(Arc::<str>::from("s")),
            Box::new(Rc::new(9u16)),
            Box::new(Box::new(4usize)),
            Box::new(vec![1, 2]),
            Box::new([5u8]),
            Box::new(Vec::<u8>::new()),
        ];
        let mut singles = 0;
        for p in &cases {
            let visited = values(p.as_ref());
            // Collections and absent values say nothing: they are visited.
            if let Some(v) = p.single_value() {
                assert_eq!(visited, [format!("{v:?}")]);
                singles += 1;
            }
        }
        assert_eq!(singles, 16, "every scalar, wrapped or not, says its value");
        assert_eq!((&&7u8).single_value(), Some(ParamValue::Int(7)));
    }

    #[test]
    fn keys_are_type_sensitive_and_width_insensitive() {
        assert_ne!(ParamValue::Int(7).key(), ParamValue::Str("7").key());
        assert_ne!(ParamValue::Int(1).key(), ParamValue::Bool(true).key());
        assert_ne!(ParamValue::Int(1).key(), ParamValue::Float(1.0).key());
        assert_ne!(ParamValue::Int(55).key(), ParamValue::Char('7').key());
        assert_eq!(ParamValue::int(7).key(), ParamValue::Int(7).key());
        assert_ne!(ParamValue::int(u64::MAX as i128).key(), ParamValue::Int(-1).key());
        assert_eq!(ParamValue::Float(f64::NAN).key(), ParamValue::Float(-f64::NAN).key());
        assert_ne!(ParamValue::Float(0.0).key(), ParamValue::Float(-0.0).key());
        assert_eq!(ValueKey::of_item(&ParamItemValue::Str("7".into())), ParamValue::Str("7").key());
        assert_eq!(ValueKey::of_item(&ParamItemValue::Int(7)), ParamValue::Int(7).key());
    }
}
