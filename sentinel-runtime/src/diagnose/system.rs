//! The findings on system rules: each limit against the global inbound node.

use super::RuleFinding;
use crate::{RuleKind, Sentinel};

/// The findings on the system rules (they apply to inbound entries of every resource).
pub(super) fn findings(engine: &Sentinel) -> Vec<RuleFinding> {
    let inbound = engine.inbound_stats();
    engine
        .system_rules()
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut limits = Vec::new();
            let mut problems = Vec::new();
            if let Some(q) = r.qps {
                limits.push(format!("qps {q} (inbound now {:.1})", inbound.pass_qps));
            }
            if let Some(t) = r.max_thread {
                limits.push(format!("threads {t} (inbound now {})", inbound.threads));
            }
            if let Some(rt) = r.avg_rt {
                limits.push(format!("avg rt {rt} ms (inbound now {:.1})", inbound.avg_rt_ms));
            }
            if let Some(l) = r.highest_system_load {
                limits.push(format!("load {l}"));
            }
            if let Some(c) = r.highest_cpu_usage {
                limits.push(format!("cpu {c}"));
            }
            if inbound.minute_pass + inbound.minute_block == 0 {
                problems.push(
                    "no inbound call in the last minute: system rules only check entries of type In \
                     (`resource_typed(name, EntryType::In)`, `entry_type = \"in\"`)"
                        .to_string(),
                );
            }
            RuleFinding {
                kind: RuleKind::System,
                index: i,
                summary: limits.join(", "),
                reads: "the global inbound node (all In entries)".to_string(),
                current: None,
                threshold: None,
                applies: inbound.minute_pass + inbound.minute_block > 0,
                problems,
                pattern: None,
            }
        })
        .collect()
}
