//! The adaptive concurrency part of a diagnosis: the limit in force against the calls in flight, and what
//! the limiter measured (min RTT, sample RTT, baseline, gradient), per partition.

use std::fmt;

use crate::adaptive::AdaptiveStatus;
use crate::Sentinel;

impl Sentinel {
    /// The adaptive limiter of `resource`, if a rule governs it and a call built it.
    pub(crate) fn adaptive_status_of(&self, resource: &str) -> Option<AdaptiveStatus> {
        let cell = self.shared.adaptive.cell(resource)?;
        let limiter = cell.built()?;
        Some(AdaptiveStatus::of(resource, &cell.rule, limiter))
    }
}

/// A note when a rule governs the resource but no call built its limiter yet.
pub(super) fn note(engine: &Sentinel, resource: &str, status: Option<&AdaptiveStatus>) -> Option<String> {
    (status.is_none() && engine.shared.adaptive.governs(resource))
        .then(|| format!("an adaptive rule governs `{resource}`: its limiter starts at the first checked call"))
}

/// The diagnosis's lines on the adaptive limiter.
pub(super) fn write(f: &mut fmt::Formatter<'_>, status: Option<&AdaptiveStatus>) -> fmt::Result {
    let Some(s) = status else {
        return writeln!(f, "Adaptive limit: none");
    };
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    writeln!(
        f,
        "Adaptive limit ({}, bounds {}..={}): limit {}, {} in flight{}{}",
        s.algorithm,
        s.min_limit,
        s.max_limit,
        s.limit,
        s.inflight,
        if s.waiting > 0 { format!(", {} waiting", s.waiting) } else { String::new() },
        if s.probing { ", probing the minimum RTT" } else { "" }
    )?;
    writeln!(
        f,
        "  min RTT {:.1} ms, sample RTT {:.1} ms, baseline {:.1} ms, gradient {:.2}",
        ms(s.min_rtt),
        ms(s.sample_rtt),
        ms(s.baseline_rtt),
        s.gradient
    )?;
    for p in &s.partitions {
        writeln!(
            f,
            "  partition `{}`: share {:.2}, guaranteed {}, {} in flight",
            p.origin, p.share, p.guarantee, p.inflight
        )?;
    }
    Ok(())
}
