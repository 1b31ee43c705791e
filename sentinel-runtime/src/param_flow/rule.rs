//! Hot-parameter rule data.

use crate::flow::rule::{ClusterConfig, ControlBehavior, FlowGrade};

/// A typed parameter value in a rule's exception items. Matching is type-sensitive: `Int(7)` is not `Str("7")`.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamItemValue {
    /// An integer (Java's int, long, short, byte).
    Int(i64),
    /// A floating-point number (Java's float, double). An `f32` argument is compared widened to `f64`: an item
    /// meant for `f32` arguments holds the `f32` value widened (`Float(f64::from(1.1f32))`), as rule files'
    /// `classType: float` items do.
    Float(f64),
    /// A string.
    Str(String),
    /// A boolean.
    Bool(bool),
    /// A character.
    Char(char),
}

/// The Java class of a numeric exception item (its `classType`), which its value alone does not tell: Java
/// matches an item by its class (`Long` 7 is not `Integer` 7) and gives the class back as it was pushed, so an
/// item keeps it to be written back the same (see [`ParamFlowItem::class`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ItemClass {
    /// Java's `int` (`java.lang.Integer`).
    Int,
    /// Java's `long` (`java.lang.Long`).
    Long,
    /// Java's `short` (`java.lang.Short`).
    Short,
    /// Java's `byte` (`java.lang.Byte`).
    Byte,
    /// Java's `float` (`java.lang.Float`): the item holds the `f32` value widened.
    Float,
    /// Java's `double` (`java.lang.Double`).
    Double,
}

impl ItemClass {
    /// The name written as `classType`: the primitive's (`int`, `long`, ...), which Java reads as the boxed
    /// class's.
    pub fn java_name(self) -> &'static str {
        match self {
            ItemClass::Int => "int",
            ItemClass::Long => "long",
            ItemClass::Short => "short",
            ItemClass::Byte => "byte",
            ItemClass::Float => "float",
            ItemClass::Double => "double",
        }
    }

    /// Whether a value of this class can be `value`: an integer class one in its range, `Float` a float that
    /// an `f32` holds exactly, `Double` any float.
    pub fn holds(self, value: &ParamItemValue) -> bool {
        match (self, value) {
            (ItemClass::Long, ParamItemValue::Int(_)) | (ItemClass::Double, ParamItemValue::Float(_)) => true,
            (ItemClass::Int, ParamItemValue::Int(v)) => i32::try_from(*v).is_ok(),
            (ItemClass::Short, ParamItemValue::Int(v)) => i16::try_from(*v).is_ok(),
            (ItemClass::Byte, ParamItemValue::Int(v)) => i8::try_from(*v).is_ok(),
            (ItemClass::Float, ParamItemValue::Float(v)) => v.is_nan() || f64::from(*v as f32) == *v,
            _ => false,
        }
    }

    /// The class a numeric value is written with when its item has none: `int` in `int`'s range, `long` past
    /// it; `float` for an `f32` whose own shortest text is shorter than the `f64`'s (1.1 widened), `double`
    /// otherwise (a value both write alike, such as 2.5, matches the same arguments either way). `None` for
    /// the other values, whose class their type tells.
    pub fn of_value(value: &ParamItemValue) -> Option<ItemClass> {
        match value {
            ParamItemValue::Int(v) if i32::try_from(*v).is_ok() => Some(ItemClass::Int),
            ParamItemValue::Int(_) => Some(ItemClass::Long),
            ParamItemValue::Float(v) => {
                let narrow = *v as f32;
                let shorter = format!("{narrow:?}").len() < format!("{v:?}").len();
                Some(if f64::from(narrow) == *v && shorter { ItemClass::Float } else { ItemClass::Double })
            }
            _ => None,
        }
    }
}

/// An exception item: a value with its own threshold.
///
/// Two items are equal when their values, counts and [`class_type`](Self::class_type)s are: an item without
/// a class equals the same item with the class its value gives by default.
#[derive(Clone, Debug)]
pub struct ParamFlowItem {
    /// The value.
    pub value: ParamItemValue,
    /// Its threshold.
    pub count: f64,
    /// The Java class the item is written back with (`classType`), when it is not the one the value gives
    /// by default ([`ItemClass::of_value`]): a rule file's `long` 7 keeps `Some(ItemClass::Long)`, which the
    /// value 7 alone would write as `int`. Only written back: a call's argument is matched by its value, as
    /// before (an argument's integer width is not part of it, see
    /// [`ParamValue`](crate::param_flow::ParamValue)). A class that cannot be the value (`Byte` with 1000,
    /// or any class with a string) is not used: the default is written.
    pub class: Option<ItemClass>,
}

impl ParamFlowItem {
    /// An item for `value` with the threshold `count`, of the class its value gives by default.
    pub fn new(value: ParamItemValue, count: f64) -> Self {
        ParamFlowItem { value, count, class: None }
    }

    /// Sets the Java class the item is written back with (see [`class`](Self::class)).
    pub fn with_class(mut self, class: ItemClass) -> Self {
        self.class = Some(class);
        self
    }

    /// The Java class the item is written back with: its [`class`](Self::class) when that can be its value,
    /// else the one its value gives ([`ItemClass::of_value`]); `None` for a string, boolean or character.
    pub fn class_type(&self) -> Option<ItemClass> {
        match self.class {
            Some(c) if c.holds(&self.value) => Some(c),
            _ => ItemClass::of_value(&self.value),
        }
    }
}

impl PartialEq for ParamFlowItem {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value && self.count == other.count && self.class_type() == other.class_type()
    }
}

/// A hot-parameter rule: limit each distinct value of one argument separately.
///
/// ```
/// use sentinel_runtime::param_flow::ParamFlowRule;
/// let rule = ParamFlowRule::new("getUser", 0).count(5.0);
/// assert_eq!(rule.duration_in_sec, 1);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ParamFlowRule {
    /// An id of the rule's source.
    pub id: Option<u64>,
    /// The resource.
    pub resource: String,
    /// Kept for compatibility with Sentinel's rule format (`"default"`); not read: as in Java, the rule applies to
    /// every caller.
    pub limit_app: String,
    /// Which argument: an index, negative from the end.
    pub param_idx: i32,
    /// QPS or threads per value.
    pub grade: FlowGrade,
    /// Threshold per value.
    pub count: f64,
    /// Reject or rate limiter (others are invalid).
    pub control_behavior: ControlBehavior,
    /// Longest queueing wait (rate limiter).
    pub max_queueing_time_ms: u64,
    /// Extra tokens a value may burst by.
    pub burst_count: u64,
    /// The statistics duration.
    pub duration_in_sec: u64,
    /// Values with their own thresholds.
    pub items: Vec<ParamFlowItem>,
    /// Whether a cluster token service decides.
    pub cluster_mode: bool,
    /// Cluster settings.
    pub cluster_config: Option<ClusterConfig>,
    /// Whether `resource` is a regular expression: the rule applies to every resource whose whole name
    /// matches, each with its own per-value counters (see [`crate::pattern`]). Only with the default
    /// behaviour (reject) and without cluster mode, as in Java.
    pub regex: bool,
}

impl Default for ParamFlowRule {
    fn default() -> Self {
        ParamFlowRule {
            id: None,
            resource: String::new(),
            limit_app: crate::LIMIT_APP_DEFAULT.to_string(),
            param_idx: 0,
            grade: FlowGrade::Qps,
            count: 0.0,
            control_behavior: ControlBehavior::Reject,
            max_queueing_time_ms: 0,
            burst_count: 0,
            duration_in_sec: 1,
            items: Vec::new(),
            cluster_mode: false,
            cluster_config: None,
            regex: false,
        }
    }
}

impl ParamFlowRule {
    /// A QPS reject rule on argument `param_idx` of `resource`.
    pub fn new(resource: impl Into<String>, param_idx: i32) -> Self {
        ParamFlowRule { resource: resource.into(), param_idx, ..Default::default() }
    }
    /// Sets the threshold.
    pub fn count(mut self, c: f64) -> Self {
        self.count = c;
        self
    }
    /// Sets the grade.
    pub fn grade(mut self, g: FlowGrade) -> Self {
        self.grade = g;
        self
    }
    /// Sets the burst.
    pub fn burst_count(mut self, b: u64) -> Self {
        self.burst_count = b;
        self
    }
    /// Sets the duration.
    pub fn duration_in_sec(mut self, d: u64) -> Self {
        self.duration_in_sec = d;
        self
    }
    /// Adds an exception item, of the class its value gives by default (see [`ParamFlowItem::class`]).
    pub fn item(mut self, value: ParamItemValue, count: f64) -> Self {
        self.items.push(ParamFlowItem::new(value, count));
        self
    }
    /// Adds an exception item built apart, such as one with its Java class
    /// (`ParamFlowItem::new(ParamItemValue::Int(7), 10.0).with_class(ItemClass::Long)`).
    pub fn with_item(mut self, item: ParamFlowItem) -> Self {
        self.items.push(item);
        self
    }
    /// Sets the control behaviour.
    pub fn control_behavior(mut self, b: ControlBehavior) -> Self {
        self.control_behavior = b;
        self
    }
    /// Sets the queueing time.
    pub fn max_queueing_time_ms(mut self, ms: u64) -> Self {
        self.max_queueing_time_ms = ms;
        self
    }
    /// Sets the rule id.
    pub fn id(mut self, id: u64) -> Self {
        self.id = Some(id);
        self
    }
    /// Sets `limit_app`, kept for Sentinel's rule format: as in Java, a hot-parameter rule applies to every
    /// caller whatever it says (limit by caller with a parameter that carries the origin).
    pub fn limit_app(mut self, app: impl Into<String>) -> Self {
        self.limit_app = app.into();
        self
    }
    /// Makes `resource` a regular expression (see [`regex`](Self::regex)).
    pub fn regex(mut self, regex: bool) -> Self {
        self.regex = regex;
        self
    }
    /// Puts the rule in cluster mode with `config`.
    pub fn cluster(mut self, config: ClusterConfig) -> Self {
        self.cluster_mode = true;
        self.cluster_config = Some(config);
        self
    }
}
