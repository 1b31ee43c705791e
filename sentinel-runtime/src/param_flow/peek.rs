//! Reads of the hot-parameter rules' buckets that spend nothing (the web layer's RateLimit header fields).

use super::state::BucketPeek;
use super::{argument, HotParam, ParamFlowRule, ResourceParamRules};

/// One value's budget under one rule, at one instant.
#[derive(Clone, Debug)]
pub(crate) struct ValuePeek<'r> {
    pub(crate) rule: &'r ParamFlowRule,
    /// The rule's window in seconds.
    pub(crate) window_secs: u64,
    pub(crate) bucket: BucketPeek,
}

impl ResourceParamRules {
    /// The budget of the call's values under each local token-bucket rule (QPS, reject), read without
    /// taking from it: exact at that instant. A value no counter tracks yet has the whole bucket.
    pub(crate) fn peek<'r>(&'r self, args: &[&dyn HotParam], now_ms: u64, out: &mut impl FnMut(ValuePeek<'r>)) {
        for st in self.rules.iter().filter(|s| !s.rule.cluster_mode) {
            let Some(arg) = argument(args, st.rule.param_idx) else { continue };
            arg.visit_values(&mut |v| {
                if let Some(bucket) = st.peek_bucket(&v.key(), now_ms) {
                    out(ValuePeek { rule: &st.rule, window_secs: st.window_secs(), bucket });
                }
            });
        }
    }
}
