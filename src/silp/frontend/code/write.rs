//! IR -> code frontend text.
//!
//! Output is byte-identical to the reference wherever the reference's own output decodes back
//! to the same IR. Where it would not (a value with a comma, an empty value, a negation whose
//! value is not "true", a type that is not a name, ...) the affected value is quoted, or the
//! constraint is written in the explicit keyed form `type(value=..,subject=..,time=..,op=..)`.

use super::lexical::*;
use crate::silp::ir::{Alternative, Constraint, Entity, Ir};

/// Compiles an IR to the code frontend.
pub(crate) fn compile(ir: &Ir) -> String {
    let mut out = String::with_capacity(128);
    if !ir.constraints.is_empty() {
        out.push_str("if ");
        for (i, c) in ir.constraints.iter().enumerate() {
            if i > 0 {
                out.push_str(" and ");
            }
            write_constraint(&mut out, c);
        }
        out.push_str(": ");
    }
    write_actions(&mut out, ir);
    if !ir.alternatives.is_empty() {
        out.push_str(" else: ");
        for (i, a) in ir.alternatives.iter().enumerate() {
            if i > 0 {
                out.push_str("; ");
            }
            write_alternative(&mut out, a);
        }
    }
    out
}

/// `!CANCEL` -> `cancel`. Action codes are ASCII by schema, so lower-casing in place is exact.
pub(crate) fn write_function(out: &mut String, action: &str) {
    let start = out.len();
    out.push_str(action.strip_prefix('!').unwrap_or(action));
    out[start..].make_ascii_lowercase();
}

/// The primary call, then one call per secondary action in order of first appearance.
fn write_actions(out: &mut String, ir: &Ir) {
    write_function(out, &ir.intent);
    out.push('(');
    let mut first = true;
    for e in ir.entities.iter().filter(|e| e.is_primary(&ir.intent)) {
        if !first {
            out.push(',');
        }
        first = false;
        write_primary_argument(out, e);
    }
    out.push(')');

    // One call per secondary action, in order of first appearance.
    let secondaries = || ir.entities.iter().filter(|e| !e.is_primary(&ir.intent));
    for (i, e) in secondaries().enumerate() {
        let action = e.action.as_deref().unwrap_or_default();
        if secondaries().take(i).any(|earlier| earlier.action.as_deref() == Some(action)) {
            continue;
        }
        out.push_str("; ");
        write_function(out, action);
        out.push('(');
        for (j, same) in secondaries().skip(i).filter(|s| s.action.as_deref() == Some(action)).enumerate() {
            if j > 0 {
                out.push(',');
            }
            write_positional(out, &same.value);
        }
        out.push(')');
    }
}

fn write_positional(out: &mut String, value: &str) {
    write_value(out, value, is_bare_argument(value) && !looks_like_keyword(value));
}

fn write_primary_argument(out: &mut String, e: &Entity) {
    if e.id == "act" {
        return write_positional(out, &e.value);
    }
    write_value(out, &e.id, is_ascii_name(&e.id));
    out.push('=');
    write_value(out, &e.value, is_bare_argument(&e.value));
}

fn write_alternative(out: &mut String, a: &Alternative) {
    write_function(out, &a.action);
    out.push('(');
    match (a.target.as_deref(), a.location.as_deref()) {
        (Some(target), location) => {
            let bare = is_bare_argument(target) && !target.contains('@') && !target.starts_with("loc=");
            write_value(out, target, bare);
            if let Some(location) = location {
                out.push('@');
                write_value(out, location, is_bare_argument(location));
            }
        }
        (None, Some(location)) => {
            out.push_str("loc=");
            write_value(out, location, is_bare_argument(location));
        }
        (None, None) => {}
    }
    out.push(')');
}

fn write_constraint(out: &mut String, c: &Constraint) {
    let operator = c.operator();
    let subject = c.subject();
    let time = c.time.as_deref();
    match operator {
        Some(op) => {
            let infix = is_bare_type(&c.kind)
                && is_operator(op)
                && subject.is_none()
                && is_bare_word(&c.value)
                && !c.value.starts_with(OPERATOR_CHARS)
                && time.is_none_or(is_bare_word);
            if !infix {
                return write_keyed(out, c);
            }
            out.push_str(&c.kind);
            out.push_str(op);
            out.push_str(&c.value);
            if let Some(t) = time {
                out.push_str(", ");
                out.push_str(t);
            }
        }
        None if c.kind.starts_with('!') => {
            if !(is_bare_type(&c.kind) && c.value == "true" && subject.is_none()) {
                return write_keyed(out, c);
            }
            out.push_str(&c.kind);
            if let Some(t) = time {
                out.push('(');
                write_constraint_argument(out, t);
                out.push(')');
            }
        }
        None => {
            let Some(arguments) = positional_arguments(c) else { return write_keyed(out, c) };
            out.push_str(&c.kind);
            out.push('(');
            for (i, a) in arguments.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_constraint_argument(out, a);
            }
            out.push(')');
        }
    }
}

fn write_constraint_argument(out: &mut String, value: &str) {
    write_value(out, value, is_bare_argument(value) && !looks_like_constraint_key(value));
}

/// The arguments of `type(subject,value,time)` when the positional rules read them back as the
/// same fields: two arguments mean `(value, time)` when the second starts with `t+`/`t-`, else
/// `(subject, value)`.
fn positional_arguments(c: &Constraint) -> Option<Vec<&str>> {
    if !is_ascii_name(&c.kind) {
        return None;
    }
    let is_time = |s: &str| s.starts_with("t+") || s.starts_with("t-");
    match (c.subject(), c.time.as_deref()) {
        (Some(s), Some(t)) => Some(vec![s, &c.value, t]),
        (Some(s), None) if !is_time(&c.value) => Some(vec![s, &c.value]),
        (None, Some(t)) if is_time(t) => Some(vec![&c.value, t]),
        (None, None) if c.value.is_empty() => Some(vec![]),
        (None, None) => Some(vec![&c.value]),
        _ => None,
    }
}

/// `type(value=..[,subject=..][,time=..][,op=..])`: every field named, nothing to infer.
fn write_keyed(out: &mut String, c: &Constraint) {
    write_value(out, &c.kind, is_bare_type(&c.kind));
    out.push_str("(value=");
    write_value(out, &c.value, is_bare_argument(&c.value));
    let fields = [("subject", c.subject()), ("time", c.time.as_deref()), ("op", c.operator())];
    for (key, value) in fields {
        if let Some(v) = value {
            out.push(',');
            out.push_str(key);
            out.push('=');
            write_value(out, v, is_bare_argument(v));
        }
    }
    out.push(')');
}
