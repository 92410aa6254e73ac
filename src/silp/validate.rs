//! The IR validator: the schema, then the reference's eight rules with their names, order and
//! message texts (errors: whitelist, duplicate_entity_id, operator_validity; warnings: the rest).

use super::ir::{Entity, Ir};
use super::schema;
use super::whitelist;
use serde::Serialize;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::HashMap;

/// Validator settings.
#[derive(Debug, Clone, Copy)]
pub struct ValidateOptions {
    /// Reject verbs outside the whitelist (default: on).
    pub enforce_whitelist: bool,
}

impl Default for ValidateOptions {
    fn default() -> Self {
        ValidateOptions { enforce_whitelist: true }
    }
}

/// The result of validating one IR.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Report {
    pub valid: bool,
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
}

/// The operators `operator_validity` accepts.
pub(crate) const VALID_OPERATORS: [&str; 6] = ["!=", "<", "<=", "==", ">", ">="];
const SEQ_KEYWORDS: [&str; 4] = ["reason_first", "reason_last", "parallel", "sequential"];

/// Validates an IR given as JSON: schema first (stopping there on failure, as the reference
/// stops at its model check), then the rules.
pub fn validate_value(value: &Value, options: ValidateOptions) -> Report {
    // The typed reader accepts exactly what the schema accepts; only a refusal needs the
    // validator's list of violations.
    let ir = match super::tree::from_value(value) {
        Ok(ir) => ir,
        Err(_) => {
            let violations = schema::violations(value);
            if !violations.is_empty() {
                return Report {
                    valid: false,
                    errors: violations.iter().map(ToString::to_string).collect(),
                    warnings: vec![],
                };
            }
            Ir::from_schema_valid(value)
        }
    };
    if let Err(e) = schema::check_version(&ir) {
        return Report { valid: false, errors: vec![format!("silp: {}", e.message)], warnings: vec![] };
    }
    validate(&ir, options)
}

/// Runs the eight rules on a schema-valid IR.
pub fn validate(ir: &Ir, options: ValidateOptions) -> Report {
    let errors = errors(ir, options);
    let warnings = warnings(ir);
    Report { valid: errors.is_empty(), errors, warnings }
}

/// The rules that make an IR invalid (whitelist, duplicate_entity_id, operator_validity), in
/// the order [`validate`] reports them; for a caller that needs only the verdict.
pub fn errors(ir: &Ir, options: ValidateOptions) -> Vec<String> {
    let mut errors = Vec::new();

    if options.enforce_whitelist {
        check_verb(&mut errors, || "intent".into(), &ir.intent);
        for e in &ir.entities {
            if let Some(action) = &e.action {
                check_verb(&mut errors, || format!("entity[{}].action", e.id).into(), action);
            }
        }
        for a in &ir.alternatives {
            check_verb(&mut errors, || "alternative.action".into(), &a.action);
        }
    }

    let ids = Ids::new(&ir.entities);
    for (i, e) in ir.entities.iter().enumerate() {
        if ids.repeats_earlier(i) {
            errors.push(format!(
                "duplicate entity id '{}' — would cause ambiguous keyword arguments in code frontend",
                e.id
            ));
        }
    }

    for c in &ir.constraints {
        if let Some(op) = c.extra.get("operator").filter(|v| !v.is_null()) {
            let op_text: Cow<str> = op.as_str().map_or_else(|| op.to_string().into(), Cow::Borrowed);
            if !VALID_OPERATORS.contains(&&*op_text) {
                errors.push(format!(
                    "constraint type='{}': invalid operator '{}'. Must be one of: {}",
                    c.kind,
                    op_text,
                    VALID_OPERATORS.join(", ")
                ));
            }
        }
    }
    errors
}

/// The rules that only warn, in the order [`validate`] reports them.
pub(crate) fn warnings(ir: &Ir) -> Vec<String> {
    let mut warnings = Vec::new();
    let ids = Ids::new(&ir.entities);

    for c in &ir.constraints {
        if c.kind.starts_with('!') && c.value.to_lowercase() == "true" {
            warnings.push(format!(
                "constraint type='{}' with value='{}' creates a double-negative; consider value='false' for the base type",
                c.kind, c.value
            ));
        }
    }

    for (i, a) in ir.alternatives.iter().enumerate() {
        if let Some(loc) = a.location.as_deref().filter(|l| !l.is_empty())
            && a.target.as_deref().is_none_or(str::is_empty)
        {
            warnings.push(format!("alternative[{i}] has location='{loc}' but no target — usually a mistake"));
        }
    }

    for e in &ir.entities {
        if let Some(action) = e.action.as_deref().filter(|a| !a.is_empty() && *a != ir.intent) {
            warnings.push(format!(
                "entity[{}] has secondary action {} (differs from intent {})",
                e.id, action, ir.intent
            ));
        }
    }

    for item in &ir.meta.seq {
        let known = SEQ_KEYWORDS.contains(&item.as_str()) || ids.contains(item);
        if !known {
            warnings.push(format!("meta.seq contains '{item}' which is not a known entity ID or keyword"));
        }
    }

    if ir.entities.is_empty() {
        warnings.push("IR has no entities — most real tasks have at least one argument".to_owned());
    }
    warnings
}

/// Entity id lookups. Typical IRs have a handful of entities and are scanned; large ones (a
/// megabyte payload can hold tens of thousands) get a map from id to first position.
struct Ids<'a> {
    entities: &'a [Entity],
    first: Option<HashMap<&'a str, usize>>,
}

impl<'a> Ids<'a> {
    const SCAN_LIMIT: usize = 32;

    fn new(entities: &'a [Entity]) -> Self {
        let first = (entities.len() > Self::SCAN_LIMIT).then(|| {
            let mut map = HashMap::with_capacity(entities.len());
            for (i, e) in entities.iter().enumerate() {
                map.entry(e.id.as_str()).or_insert(i);
            }
            map
        });
        Ids { entities, first }
    }

    /// Entity `i` has the id of an earlier entity.
    fn repeats_earlier(&self, i: usize) -> bool {
        let id = self.entities[i].id.as_str();
        match &self.first {
            Some(map) => map.get(id).is_some_and(|first| *first < i),
            None => self.entities[..i].iter().any(|e| e.id == id),
        }
    }

    fn contains(&self, id: &str) -> bool {
        match &self.first {
            Some(map) => map.contains_key(id),
            None => self.entities.iter().any(|e| e.id == id),
        }
    }
}

fn check_verb<'a>(errors: &mut Vec<String>, label: impl FnOnce() -> Cow<'a, str>, code: &str) {
    let verb = code.strip_prefix('!').unwrap_or(code);
    if whitelist::is_approved(verb) {
        return;
    }
    let mut message = format!("{}: verb '{verb}' not in whitelist.", label());
    if let Some(replacement) = whitelist::replacement(verb) {
        message.push_str(&format!(" Use !{replacement} instead."));
    }
    errors.push(message);
}
