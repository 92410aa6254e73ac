//! The natural and nl_json frontends: English prose baselines (draft §4.3, §4.4). Compile
//! only; their output matches the reference byte for byte, including its "indoors" wording.

use crate::silp::ir::Ir;
use crate::util::json_text;
use std::borrow::Cow;

/// Compiles an IR to one English sentence.
pub(crate) fn compile(ir: &Ir) -> String {
    let mut out = String::with_capacity(128);
    if !ir.constraints.is_empty() {
        out.push_str("If ");
        for (i, c) in ir.constraints.iter().enumerate() {
            if i > 0 {
                out.push_str(" and ");
            }
            if let Some(base) = c.kind.strip_prefix('!') {
                out.push_str("not ");
                out.push_str(base);
            } else {
                out.push_str(&c.kind);
                match c.operator().filter(|op| !op.is_empty()) {
                    Some(op) => {
                        out.push(' ');
                        out.push_str(operator_phrase(op));
                        out.push(' ');
                    }
                    None => out.push_str(" is "),
                }
                out.push_str(&c.value);
            }
            if let Some(time) = c.time.as_deref().filter(|t| !t.is_empty()) {
                out.push_str(" at ");
                out.push_str(time);
            }
        }
        out.push_str(", ");
    }

    out.push_str(&verb_phrase(&ir.intent));
    out.push(' ');
    let before_values = out.len();
    let mut first = true;
    for e in ir.entities.iter().filter(|e| e.is_primary(&ir.intent)) {
        if !first {
            out.push_str(", ");
        }
        first = false;
        out.push_str(&e.value);
    }
    if out.len() == before_values {
        out.push_str("the task");
    }

    for e in ir.entities.iter().filter(|e| !e.is_primary(&ir.intent)) {
        out.push_str(" and ");
        out.push_str(&verb_phrase(e.action.as_deref().unwrap_or_default()));
        out.push(' ');
        out.push_str(&e.value);
    }

    if !ir.alternatives.is_empty() {
        out.push_str(" otherwise ");
        for (i, a) in ir.alternatives.iter().enumerate() {
            if i > 0 {
                out.push_str(" and ");
            }
            out.push_str(&verb_phrase(&a.action));
            out.push(' ');
            out.push_str(a.target.as_deref().filter(|t| !t.is_empty()).unwrap_or("the alternative"));
            match a.location.as_deref() {
                Some("indoor") => out.push_str(" indoors"),
                Some(location) if !location.is_empty() => {
                    out.push_str(" at ");
                    out.push_str(location);
                }
                _ => {}
            }
        }
    }
    out.push('.');
    out
}

/// Compiles an IR to `{"task_description":"<natural>"}`.
pub(crate) fn compile_nl_json(ir: &Ir) -> String {
    let mut out = String::from("{\"task_description\":");
    json_text::write_str(&mut out, &compile(ir));
    out.push('}');
    out
}

fn operator_phrase(op: &str) -> &str {
    match op {
        "==" => "is",
        "!=" => "is not",
        "<" => "is less than",
        ">" => "is greater than",
        "<=" => "is at most",
        ">=" => "is at least",
        other => other,
    }
}

/// The English verb for an action code; the reference's table, lower case otherwise.
fn verb_phrase(action: &str) -> Cow<'static, str> {
    let verb = action.strip_prefix('!').unwrap_or(action);
    let phrase = match verb {
        "CANCEL" => "cancel",
        "START" => "start",
        "EMAIL" => "notify",
        "FETCH" => "fetch",
        "PROCESS" => "process",
        "TRANSLATE" => "translate",
        "SWITCH" | "SWITCH_TOOL" => "switch to",
        "BOOK" => "book",
        "ROUTE" => "route",
        "SEARCH" => "search",
        "UPDATE" => "update",
        "ESCALATE" => "escalate",
        "SUGGEST" => "suggest",
        other => return Cow::Owned(other.to_lowercase()),
    };
    Cow::Borrowed(phrase)
}
