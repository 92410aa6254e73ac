//! IR -> json frontend text, written as Python's `json.dumps(ensure_ascii=False,
//! separators=(",", ":"))` writes it, so the bytes equal the reference's. When the flat slots
//! cannot hold the entities faithfully (duplicate ids, ids that collide with a slot or start with
//! `action_`, entity extras) the entities are written as an explicit `"entities":[..]` list
//! instead; see docs/silp.md.

use super::{ACTION_PREFIX, RESERVED_SLOTS};
use crate::silp::ir::Ir;
use crate::util::json_text::{self, Style};

/// Compiles an IR to the json frontend.
pub(crate) fn compile(ir: &Ir) -> String {
    let mut out = String::with_capacity(256);
    out.push_str("{\"intent\":");
    write_text(&mut out, &ir.intent);
    if needs_explicit_entities(ir) {
        write_objects(&mut out, "entities", &ir.entities, |e, out| e.write_json(out, Style::FRONTEND));
    } else {
        write_flat_entities(&mut out, ir);
    }
    if !ir.constraints.is_empty() {
        write_objects(&mut out, "constraints", &ir.constraints, |c, out| c.write_json(out, Style::FRONTEND));
    }
    if !ir.alternatives.is_empty() {
        write_objects(&mut out, "alternatives", &ir.alternatives, |a, out| {
            a.write_json(out, Style::FRONTEND)
        });
    }
    out.push('}');
    out
}

/// `,"<key>":[<item>,<item>..]`.
fn write_objects<T>(out: &mut String, key: &str, items: &[T], write: impl Fn(&T, &mut String)) {
    out.push_str(",\"");
    out.push_str(key);
    out.push_str("\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write(item, out);
    }
    out.push(']');
}

/// Strings in this frontend escape the invisible characters, so that the sanitiser (which
/// strips them when raw) leaves the value intact.
fn write_text(out: &mut String, s: &str) {
    json_text::write_text(out, s, Style::FRONTEND);
}

fn needs_explicit_entities(ir: &Ir) -> bool {
    let mut primary_ids: Vec<&str> = Vec::new();
    for e in &ir.entities {
        if e.extra.values().any(|v| !v.is_null()) {
            return true;
        }
        if e.is_primary(&ir.intent) {
            if RESERVED_SLOTS.contains(&e.id.as_str())
                || e.id.starts_with(ACTION_PREFIX)
                || primary_ids.contains(&e.id.as_str())
            {
                return true;
            }
            primary_ids.push(&e.id);
        }
    }
    false
}

/// Primary entities as `id: value` slots and secondary ones grouped under `action_<verb>`, in
/// order of first appearance (as Python dict insertion order gives).
fn write_flat_entities(out: &mut String, ir: &Ir) {
    let secondaries = || ir.entities.iter().filter(|e| !e.is_primary(&ir.intent));
    let mut secondary_index = 0;
    for e in &ir.entities {
        if e.is_primary(&ir.intent) {
            out.push(',');
            write_text(out, &e.id);
            out.push(':');
            write_text(out, &e.value);
            continue;
        }
        let i = secondary_index;
        secondary_index += 1;
        let action = e.action.as_deref().unwrap_or_default();
        if secondaries().take(i).any(|earlier| earlier.action.as_deref() == Some(action)) {
            continue;
        }
        out.push_str(",\"action_");
        crate::silp::frontend::code::write::write_function(out, action);
        out.push_str("\":[");
        for (j, member) in secondaries().skip(i).filter(|s| s.action.as_deref() == Some(action)).enumerate() {
            if j > 0 {
                out.push(',');
            }
            write_text(out, &member.value);
        }
        out.push(']');
    }
}
