//! The SILP intermediate representation (draft §3): Rust types, conversion from a
//! schema-checked JSON value, the canonical compact JSON and the `ir_hash` built on it.
//!
//! The root is strict; `Entity`, `Constraint`, `Alternative` and `Meta` keep unknown fields in
//! `extra`, in the order they arrived, and carry them through every lossless round trip.

use crate::util::json_text::{self, FloatStyle, Style};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Unknown fields of an extensible IR object, in arrival order.
pub(crate) type Extras = Map<String, Value>;

/// IR text: inline up to 24 bytes, so that decoding a payload allocates little.
pub(crate) type Text = compact_str::CompactString;

/// The IR version this crate speaks.
pub(crate) const SILP_VERSION: &str = "v1";
/// The default `version` field.
pub(crate) const IR_VERSION: &str = "ir-v0.1";

#[derive(Debug, Clone, PartialEq)]
pub struct Ir {
    pub silp: Text,
    pub version: Text,
    /// The primary action code, `!VERB`.
    pub intent: Text,
    pub entities: Vec<Entity>,
    pub constraints: Vec<Constraint>,
    pub alternatives: Vec<Alternative>,
    pub meta: Meta,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Entity {
    pub id: Text,
    pub value: Text,
    /// `None` or the intent: an argument of the primary action; anything else: a secondary action.
    pub action: Option<Text>,
    pub extra: Extras,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Constraint {
    pub kind: Text,
    pub value: Text,
    pub time: Option<Text>,
    /// Unknown fields; `subject` and `operator` live here, as in the draft.
    pub extra: Extras,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Alternative {
    pub action: Text,
    pub target: Option<Text>,
    pub location: Option<Text>,
    pub extra: Extras,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    pub priority: i64,
    pub confidence: f64,
    pub seq: Vec<Text>,
    pub out: Text,
    pub next_agent: Option<Text>,
    pub req_id: Text,
    pub session_id: Option<Text>,
    pub extra: Extras,
}

impl Meta {
    /// The meta of a freshly decoded IR: every default, and the given request id.
    pub fn with_req_id(req_id: Text) -> Self {
        Meta {
            priority: 0,
            confidence: 1.0,
            seq: Vec::new(),
            out: Text::const_new("natural"),
            next_agent: None,
            req_id,
            session_id: None,
            extra: Extras::new(),
        }
    }
}

impl Entity {
    /// An argument of the primary action (action absent or equal to the intent).
    pub(crate) fn is_primary(&self, intent: &str) -> bool {
        self.action.as_deref().is_none_or(|a| a == intent)
    }
}

impl Constraint {
    pub(crate) fn new(kind: impl Into<Text>, value: impl Into<Text>) -> Self {
        Constraint { kind: kind.into(), value: value.into(), time: None, extra: Extras::new() }
    }

    /// The `subject` extra, when it is a string.
    pub(crate) fn subject(&self) -> Option<&str> {
        self.extra.get("subject").and_then(Value::as_str)
    }

    /// The `operator` extra, when it is a string.
    pub(crate) fn operator(&self) -> Option<&str> {
        self.extra.get("operator").and_then(Value::as_str)
    }
}

/// `^v\d+$` as the schema validator compiles it (`\d` is ASCII there).
pub(crate) fn is_silp_version(s: &str) -> bool {
    s.len() >= 2 && s.starts_with('v') && s.bytes().skip(1).all(|b| b.is_ascii_digit())
}

/// `^[a-f0-9]{4,8}$`.
pub(crate) fn is_req_id(s: &str) -> bool {
    (4..=8).contains(&s.len()) && s.bytes().all(|b| matches!(b, b'a'..=b'f' | b'0'..=b'9'))
}

/// An IR reader ([`super::typed`] of text, [`super::tree`] of a parsed value) gave its input
/// back: not JSON, JSON that breaks the schema, or (for text, rarely) a repeated declared
/// field whose earlier value breaks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused;

/// What an IR reader saw besides the IR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Noted {
    /// `meta.out` was given: the sender chose the frontend, rather than the default.
    pub out_given: bool,
}

/// True for an action code as the draft's schema writes it: `^![A-Z][A-Z_]*$`.
pub(crate) fn is_action_code(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 2
        && b[0] == b'!'
        && b[1].is_ascii_uppercase()
        && b[2..].iter().all(|c| c.is_ascii_uppercase() || *c == b'_')
}

impl Ir {
    /// The fixed versions and nothing else: what a reader fills in field by field.
    pub(crate) fn unfilled() -> Ir {
        Ir {
            silp: Text::const_new(SILP_VERSION),
            version: Text::const_new(IR_VERSION),
            intent: Text::default(),
            entities: Vec::new(),
            constraints: Vec::new(),
            alternatives: Vec::new(),
            meta: Meta::with_req_id(Text::default()),
        }
    }

    /// Builds the IR from a JSON value that already passed the schema ([`super::schema`]), so
    /// every field has its schema type. Absent defaults are filled in as the reference does.
    pub fn from_schema_valid(value: &Value) -> Ir {
        let root = value.as_object().expect("schema: root is an object");
        let mut ir = Ir::unfilled();
        // One pass over each object's fields: no hashing per declared field.
        for (key, v) in root {
            match key.as_str() {
                "silp" => ir.silp = text(v),
                "version" => ir.version = text(v),
                "intent" => ir.intent = text(v),
                "entities" => ir.entities = objects(v).map(entity_from).collect(),
                "constraints" => ir.constraints = objects(v).map(constraint_from).collect(),
                "alternatives" => ir.alternatives = objects(v).map(alternative_from).collect(),
                "meta" => ir.meta = meta_from(v.as_object().expect("schema: meta is an object")),
                _ => {}
            }
        }
        ir
    }

    /// The canonical compact JSON: pydantic's `model_dump_json(exclude_none=True)` byte for byte
    /// (declared fields in declaration order with defaults, then extras; nulls dropped).
    pub fn to_compact_json(&self) -> String {
        // A typical IR takes 300-500 bytes: one allocation, no regrowth.
        let mut out = String::with_capacity(512);
        self.write_compact_json(&mut out);
        out
    }

    /// [`Ir::to_compact_json`] appended to `out`.
    pub(crate) fn write_compact_json(&self, out: &mut String) {
        out.push_str("{\"silp\":");
        json_text::write_str(out, &self.silp);
        out.push_str(",\"version\":");
        json_text::write_str(out, &self.version);
        out.push_str(",\"intent\":");
        json_text::write_str(out, &self.intent);
        out.push_str(",\"entities\":");
        write_list(out, &self.entities, |out, e| e.write_json(out, Style::CANONICAL));
        out.push_str(",\"constraints\":");
        write_list(out, &self.constraints, |out, c| c.write_json(out, Style::CANONICAL));
        out.push_str(",\"alternatives\":");
        write_list(out, &self.alternatives, |out, a| a.write_json(out, Style::CANONICAL));
        out.push_str(",\"meta\":");
        self.meta.write_json(out);
        out.push('}');
    }

    /// `"sha256:" + hex(sha256(compact JSON))`, the reference's `CompileLock.ir_hash`.
    pub fn ir_hash(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let digest = Sha256::digest(self.to_compact_json().as_bytes());
        // Spelled out on the stack, then copied once.
        let mut hex = [0u8; 64];
        for (pair, byte) in hex.chunks_exact_mut(2).zip(digest.iter()) {
            pair[0] = DIGITS[usize::from(byte >> 4)];
            pair[1] = DIGITS[usize::from(byte & 0xf)];
        }
        let mut hash = String::with_capacity(71);
        hash.push_str("sha256:");
        hash.push_str(std::str::from_utf8(&hex).expect("hex digits are ASCII"));
        hash
    }

    /// True when every string of the IR, extras and their keys included, is ASCII: then it
    /// holds nothing the sanitiser strips, and an IR read from a tree holds every string of
    /// that tree (declared keys are ASCII, nulls and numbers hold none).
    pub(crate) fn is_ascii(&self) -> bool {
        let opt = |t: &Option<Text>| t.as_deref().is_none_or(str::is_ascii);
        self.silp.is_ascii()
            && self.version.is_ascii()
            && self.intent.is_ascii()
            && self
                .entities
                .iter()
                .all(|e| e.id.is_ascii() && e.value.is_ascii() && opt(&e.action) && extras_ascii(&e.extra))
            && self
                .constraints
                .iter()
                .all(|c| c.kind.is_ascii() && c.value.is_ascii() && opt(&c.time) && extras_ascii(&c.extra))
            && self
                .alternatives
                .iter()
                .all(|a| a.action.is_ascii() && opt(&a.target) && opt(&a.location) && extras_ascii(&a.extra))
            && self.meta.seq.iter().all(|s| s.is_ascii())
            && self.meta.out.is_ascii()
            && opt(&self.meta.next_agent)
            && self.meta.req_id.is_ascii()
            && opt(&self.meta.session_id)
            && extras_ascii(&self.meta.extra)
    }

    /// The canonical compact JSON parsed back into a value, for comparisons and output.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(&self.to_compact_json()).expect("compact JSON is valid JSON")
    }
}

impl Entity {
    /// `{"id":..,"value":..[,"action":..],extras}`.
    pub(crate) fn write_json(&self, out: &mut String, style: Style) {
        out.push_str("{\"id\":");
        json_text::write_text(out, &self.id, style);
        out.push_str(",\"value\":");
        json_text::write_text(out, &self.value, style);
        write_opt(out, "action", self.action.as_deref(), style);
        json_text::write_extras(out, &self.extra, style);
        out.push('}');
    }
}

impl Constraint {
    /// `{"type":..,"value":..[,"time":..],extras}`.
    pub(crate) fn write_json(&self, out: &mut String, style: Style) {
        out.push_str("{\"type\":");
        json_text::write_text(out, &self.kind, style);
        out.push_str(",\"value\":");
        json_text::write_text(out, &self.value, style);
        write_opt(out, "time", self.time.as_deref(), style);
        json_text::write_extras(out, &self.extra, style);
        out.push('}');
    }
}

impl Alternative {
    /// `{"action":..[,"target":..][,"location":..],extras}`.
    pub(crate) fn write_json(&self, out: &mut String, style: Style) {
        out.push_str("{\"action\":");
        json_text::write_text(out, &self.action, style);
        write_opt(out, "target", self.target.as_deref(), style);
        write_opt(out, "location", self.location.as_deref(), style);
        json_text::write_extras(out, &self.extra, style);
        out.push('}');
    }
}

impl Meta {
    fn write_json(&self, out: &mut String) {
        out.push_str("{\"priority\":");
        out.push_str(itoa::Buffer::new().format(self.priority));
        out.push_str(",\"confidence\":");
        write_confidence(out, self.confidence);
        out.push_str(",\"seq\":");
        write_list(out, &self.seq, |out, s| json_text::write_str(out, s));
        out.push_str(",\"out\":");
        json_text::write_str(out, &self.out);
        write_opt(out, "next_agent", self.next_agent.as_deref(), Style::CANONICAL);
        out.push_str(",\"req_id\":");
        json_text::write_str(out, &self.req_id);
        write_opt(out, "session_id", self.session_id.as_deref(), Style::CANONICAL);
        json_text::write_extras(out, &self.extra, Style::CANONICAL);
        out.push('}');
    }
}

/// Writes a confidence as pydantic does. Most are a decimal `0.d` .. `0.dddd`: when `f` is the
/// double nearest to one, that decimal is its shortest round-trip spelling (doubles there lie
/// far closer together than 1e-4, so no other decimal of as few digits is nearest to `f`, and
/// fewer digits are tried first), written in fixed notation, without formatting machinery.
fn write_confidence(out: &mut String, f: f64) {
    if f > 0.0 && f < 1.0 {
        let mut scale = 1.0;
        for places in 1..=4usize {
            scale *= 10.0;
            let m = (f * scale).round();
            // `m / scale` is the double nearest to the decimal m·10^-places: IEEE division
            // rounds the exact quotient of two exactly held values.
            if m / scale == f {
                let mut buffer = itoa::Buffer::new();
                let digits = buffer.format(m as u32);
                out.push_str("0.");
                out.extend(std::iter::repeat_n('0', places - digits.len()));
                out.push_str(digits);
                return;
            }
        }
    }
    json_text::write_float(out, f, FloatStyle::Pydantic);
}

fn extras_ascii(extras: &Extras) -> bool {
    extras.iter().all(|(k, v)| k.is_ascii() && value_ascii(v))
}

fn value_ascii(value: &Value) -> bool {
    match value {
        Value::String(s) => s.is_ascii(),
        Value::Array(items) => items.iter().all(value_ascii),
        Value::Object(map) => extras_ascii(map),
        Value::Null | Value::Bool(_) | Value::Number(_) => true,
    }
}

fn write_opt(out: &mut String, key: &str, value: Option<&str>, style: Style) {
    if let Some(v) = value {
        out.push_str(",\"");
        out.push_str(key);
        out.push_str("\":");
        json_text::write_text(out, v, style);
    }
}

fn write_list<T>(out: &mut String, items: &[T], mut write: impl FnMut(&mut String, &T)) {
    out.push('[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write(out, item);
    }
    out.push(']');
}

fn text(v: &Value) -> Text {
    Text::from(v.as_str().unwrap_or_default())
}

fn optional_text(v: &Value) -> Option<Text> {
    v.as_str().map(Text::from)
}

fn objects(v: &Value) -> impl Iterator<Item = &Map<String, Value>> {
    v.as_array().into_iter().flatten().filter_map(Value::as_object)
}

fn entity_from(obj: &Map<String, Value>) -> Entity {
    let mut e = Entity { id: Text::default(), value: Text::default(), action: None, extra: Extras::new() };
    for (key, v) in obj {
        match key.as_str() {
            "id" => e.id = text(v),
            "value" => e.value = text(v),
            "action" => e.action = optional_text(v),
            _ => {
                e.extra.insert(key.clone(), v.clone());
            }
        }
    }
    e
}

fn constraint_from(obj: &Map<String, Value>) -> Constraint {
    let mut c = Constraint::new(Text::default(), Text::default());
    for (key, v) in obj {
        match key.as_str() {
            "type" => c.kind = text(v),
            "value" => c.value = text(v),
            "time" => c.time = optional_text(v),
            _ => {
                c.extra.insert(key.clone(), v.clone());
            }
        }
    }
    c
}

fn alternative_from(obj: &Map<String, Value>) -> Alternative {
    let mut a = Alternative { action: Text::default(), target: None, location: None, extra: Extras::new() };
    for (key, v) in obj {
        match key.as_str() {
            "action" => a.action = text(v),
            "target" => a.target = optional_text(v),
            "location" => a.location = optional_text(v),
            _ => {
                a.extra.insert(key.clone(), v.clone());
            }
        }
    }
    a
}

fn meta_from(obj: &Map<String, Value>) -> Meta {
    let mut m = Meta::with_req_id(Text::default());
    for (key, v) in obj {
        match key.as_str() {
            // The schema says integer; JSON Schema counts 2.0 as an integer, and so does pydantic.
            "priority" => m.priority = v.as_i64().or_else(|| v.as_f64().map(|f| f as i64)).unwrap_or(0),
            "confidence" => m.confidence = v.as_f64().unwrap_or(1.0),
            "seq" => {
                m.seq = v.as_array().into_iter().flatten().filter_map(Value::as_str).map(Text::from).collect()
            }
            "out" => m.out = text(v),
            "next_agent" => m.next_agent = optional_text(v),
            "req_id" => m.req_id = text(v),
            "session_id" => m.session_id = optional_text(v),
            _ => {
                m.extra.insert(key.clone(), v.clone());
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(f: f64) -> (String, String) {
        let (mut fast, mut general) = (String::new(), String::new());
        write_confidence(&mut fast, f);
        json_text::write_float(&mut general, f, FloatStyle::Pydantic);
        (fast, general)
    }

    #[test]
    fn confidences_are_spelled_as_the_general_float_writer_spells_them() {
        for places in 1..=6 {
            let scale = 10f64.powi(places);
            for m in 0..=(scale as u32) {
                let f = f64::from(m) / scale;
                for g in [f, f64::from_bits(f.to_bits() + 1), f64::from_bits(f.to_bits().saturating_sub(1))] {
                    let (fast, general) = both(g);
                    assert_eq!(fast, general, "{g:e}");
                }
            }
        }
        for f in [1e-5, 1e-7, 0.3333333333333333, 0.1 + 0.2, 1.0, 0.0, -0.5] {
            let (fast, general) = both(f);
            assert_eq!(fast, general, "{f:e}");
        }
    }

    #[test]
    fn the_ir_hash_is_sha256_of_the_compact_json_in_lower_case_hex() {
        let mut ir = Ir::unfilled();
        ir.intent = Text::const_new("!SEARCH");
        ir.meta.req_id = Text::const_new("abcd");
        let expected = format!("sha256:{}", crate::util::hash::sha256_hex(ir.to_compact_json().as_bytes()));
        assert_eq!(ir.ir_hash(), expected);
    }

    #[test]
    fn ascii_is_judged_over_every_string_extras_included() {
        let mut ir = Ir::unfilled();
        ir.intent = Text::const_new("!SEARCH");
        ir.meta.req_id = Text::const_new("abcd");
        assert!(ir.is_ascii());
        let mut c = Constraint::new("rating", "4");
        c.extra.insert("note".into(), serde_json::json!({"k": ["a", "b\u{200b}"]}));
        ir.constraints.push(c);
        assert!(!ir.is_ascii());
        ir.constraints[0].extra = Extras::new();
        ir.constraints[0].extra.insert("n\u{e9}".into(), Value::Null);
        assert!(!ir.is_ascii());
        ir.constraints.clear();
        ir.meta.session_id = Some(Text::from("\u{430}b"));
        assert!(!ir.is_ascii());
    }
}
