//! Who sends a message: a principal, as a door verified it (a static token's name, a JWT's
//! subject and roles, a broker user), and the rules (`[[agents]] allow`) that say which
//! principals may reach an agent.
//!
//! A rule is `*` (anyone, an unauthenticated client too), `sub:<subject>` or `role:<role>`;
//! a principal passes when any rule names it. Without authentication a client is no
//! principal, and only `*` lets it through.

use serde::{Deserialize, Serialize};

/// A verified identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    pub subject: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    /// When the credential that named it stops being good (a JWT's `exp` plus the leeway), in
    /// seconds since the Unix epoch: a connection that outlives it ends. Only the door that
    /// verified the credential knows it; it does not travel.
    #[serde(skip)]
    pub valid_until: Option<u64>,
}

impl Principal {
    pub fn new(subject: impl Into<String>, roles: Vec<String>) -> Principal {
        Principal { subject: subject.into(), roles, valid_until: None }
    }
}

/// Who may reach an agent when its `allow` is not set.
pub const ANYONE: &str = "*";

/// True when `rules` let `principal` through.
pub fn allowed(rules: &[String], principal: Option<&Principal>) -> bool {
    rules.iter().any(|rule| {
        if rule == ANYONE {
            return true;
        }
        let Some(principal) = principal else { return false };
        match rule.split_once(':') {
            Some(("sub", subject)) => principal.subject == subject,
            Some(("role", role)) => principal.roles.iter().any(|r| r == role),
            _ => false,
        }
    })
}

/// Why a rule is not one: `None` when it is.
pub fn rule_error(rule: &str) -> Option<String> {
    match rule.split_once(':') {
        _ if rule == ANYONE => None,
        Some(("sub" | "role", name)) if !name.is_empty() => None,
        _ => Some(format!("'{rule}' is not a rule: write \"*\", \"sub:<subject>\" or \"role:<role>\"")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_principal_passes_by_subject_role_or_star_and_nobody_by_star_alone() {
        let alice = Principal::new("alice", vec!["finance".into()]);
        let rules = |r: &[&str]| r.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(allowed(&rules(&["sub:alice"]), Some(&alice)));
        assert!(allowed(&rules(&["role:finance"]), Some(&alice)));
        assert!(allowed(&rules(&["*"]), Some(&alice)));
        assert!(allowed(&rules(&["*"]), None));
        assert!(!allowed(&rules(&["sub:bob", "role:ops"]), Some(&alice)));
        assert!(!allowed(&rules(&["sub:alice"]), None));
        assert!(!allowed(&rules(&[]), Some(&alice)));
        assert!(rule_error("sub:alice").is_none() && rule_error("*").is_none());
        assert!(
            rule_error("alice").is_some() && rule_error("sub:").is_some() && rule_error("group:x").is_some()
        );
    }
}
