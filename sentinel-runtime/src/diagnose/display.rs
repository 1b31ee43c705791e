//! How a [`Diagnosis`] prints for a person.

use std::fmt;

use super::{calls, origin_label, Diagnosis, RuleFinding};

fn write_findings(f: &mut fmt::Formatter<'_>, title: &str, findings: &[RuleFinding]) -> fmt::Result {
    if findings.is_empty() {
        return writeln!(f, "{title}: none");
    }
    writeln!(f, "{title}:")?;
    for r in findings {
        let mark = if r.applies { "" } else { "  [DOES NOT APPLY]" };
        writeln!(f, "  #{} {}{mark}", r.index, r.summary)?;
        if let Some(p) = &r.pattern {
            writeln!(f, "     matched by pattern: `{p}` (regex rule)")?;
        }
        writeln!(f, "     reads: {}", r.reads)?;
        match (r.current, r.threshold) {
            (Some(c), Some(t)) => writeln!(f, "     now: {c:.2} against threshold {t}")?,
            (None, Some(t)) if r.applies => writeln!(f, "     threshold: {t}")?,
            _ => {}
        }
        for p in &r.problems {
            writeln!(f, "     - {p}")?;
        }
    }
    Ok(())
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Diagnosis of resource `{}`", self.resource)?;
        writeln!(
            f,
            "  registered: {}; entered: {}{}",
            if self.registered { "yes" } else { "no" },
            if self.ever_entered { "yes" } else { "never" },
            if self.contexts.is_empty() { String::new() } else { format!(" (contexts: {})", self.contexts.join(", ")) }
        )?;
        writeln!(f, "  caps: {}", self.caps)?;
        if let Some(s) = &self.stats {
            writeln!(
                f,
                "  now: pass {:.1}/s, block {:.1}/s, success {:.1}/s, exception {:.1}/s, avg rt {:.1} ms, {} in flight",
                s.pass_qps, s.block_qps, s.success_qps, s.exception_qps, s.avg_rt_ms, s.threads
            )?;
            writeln!(
                f,
                "  last minute: {} passed, {} blocked, {} completed, {} with errors",
                s.minute_pass, s.minute_block, s.minute_success, s.minute_exception
            )?;
        }
        let mut callers: Vec<String> = Vec::new();
        if self.calls_without_origin > 0 {
            callers.push(format!("{} {} calls", origin_label(""), self.calls_without_origin));
        }
        callers.extend(self.origins.iter().map(|(o, s)| format!("{} {} calls", origin_label(o), calls(s))));
        if !callers.is_empty() {
            writeln!(f, "  callers (last minute): {}", callers.join(", "))?;
        }
        for n in &self.notes {
            writeln!(f, "  note: {n}")?;
        }
        write_findings(f, "Flow rules", &self.flow)?;
        for c in &self.cluster {
            writeln!(f, "  {c}")?;
        }
        write_findings(f, "Degrade rules", &self.degrade)?;
        if self.breakers.is_empty() {
            writeln!(f, "Circuit breakers: none")?;
        } else {
            writeln!(f, "Circuit breakers:")?;
            for b in &self.breakers {
                writeln!(
                    f,
                    "  {:?} count {} ({}): {}, {} of {} calls bad in the current interval{}",
                    b.rule.grade,
                    b.rule.count,
                    if b.is_default { "default rule `*`" } else { "own rule" },
                    b.state,
                    b.interval_bad,
                    b.interval_total,
                    b.retry_at_ms.map(|r| format!(", next probe at {r} ms")).unwrap_or_default()
                )?;
            }
        }
        write_findings(f, "Hot-parameter rules", &self.param_flow)?;
        write_findings(f, "Authority rules", &self.authority)?;
        write_findings(f, "System rules", &self.system)?;
        super::adaptive::write(f, self.adaptive.as_ref())?;
        write!(
            f,
            "Errors: {} of {} completions in the last minute had a traced error",
            self.errors.exceptions, self.errors.completions
        )?;
        if let Some(h) = &self.errors.hint {
            write!(f, "\n  - {h}")?;
        }
        writeln!(f)
    }
}
