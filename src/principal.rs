//! Who sends a message: a principal, as a door verified it (a static token's name, a JWT's
//! subject and roles, a broker user), and the rules (`[[agents]] allow`) that say which
//! principals may reach an agent.
//!
//! A principal's subject is qualified by where it was verified: `jwt:<sub claim>`,
//! `token:<subject>` (a static token of `[[auth.tokens]]`; `token:#<n>` for the n-th of
//! `http.tokens`) or `amqp:<broker user>`. The same name from two sources is two principals:
//! a JWT whose `sub` is `alice` is not the static token alice, nor the broker user alice.
//!
//! A rule is `*` (anyone, an unauthenticated client too), `sub:<source>:<name>` or
//! `role:<role>`; a principal passes when any rule names it. Without authentication a client
//! is no principal, and only `*` lets it through.

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
    /// A principal of this exact `subject` (already qualified by its source).
    pub fn new(subject: impl Into<String>, roles: Vec<String>) -> Principal {
        Principal { subject: subject.into(), roles, valid_until: None }
    }

    /// The principal `source` verified as `name`: its subject is `<source>:<name>`.
    pub fn verified(source: Source, name: &str, roles: Vec<String>) -> Principal {
        Principal::new(format!("{}:{name}", source.as_str()), roles)
    }
}

/// Where a principal was verified: the name space its name belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A JWT's `sub` claim.
    Jwt,
    /// A static bearer token's subject.
    Token,
    /// A broker user, as RabbitMQ checked it.
    Amqp,
}

impl Source {
    pub const ALL: [Source; 3] = [Source::Jwt, Source::Token, Source::Amqp];

    pub fn as_str(self) -> &'static str {
        match self {
            Source::Jwt => "jwt",
            Source::Token => "token",
            Source::Amqp => "amqp",
        }
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
        Some(("role", name)) if !name.is_empty() => None,
        Some(("sub", subject)) => match subject.split_once(':') {
            Some((source, name)) if !name.is_empty() && Source::ALL.iter().any(|s| s.as_str() == source) => {
                None
            }
            _ if subject.is_empty() => Some(format!("'{rule}' names no subject")),
            _ => Some(format!(
                "'{rule}' names no source: subjects are qualified by where they were verified; write \"sub:jwt:{subject}\", \"sub:token:{subject}\" or \"sub:amqp:{subject}\""
            )),
        },
        _ => Some(format!(
            "'{rule}' is not a rule: write \"*\", \"sub:<source>:<name>\" (jwt, token or amqp) or \"role:<role>\""
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_principal_passes_by_subject_role_or_star_and_nobody_by_star_alone() {
        let alice = Principal::verified(Source::Jwt, "alice", vec!["finance".into()]);
        let rules = |r: &[&str]| r.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(allowed(&rules(&["sub:jwt:alice"]), Some(&alice)));
        assert!(allowed(&rules(&["role:finance"]), Some(&alice)));
        assert!(allowed(&rules(&["*"]), Some(&alice)));
        assert!(allowed(&rules(&["*"]), None));
        assert!(!allowed(&rules(&["sub:jwt:bob", "role:ops"]), Some(&alice)));
        assert!(!allowed(&rules(&["sub:jwt:alice"]), None));
        assert!(!allowed(&rules(&[]), Some(&alice)));
        assert!(rule_error("sub:jwt:alice").is_none() && rule_error("*").is_none());
        assert!(
            rule_error("alice").is_some() && rule_error("sub:").is_some() && rule_error("group:x").is_some()
        );
    }

    /// The same name verified by two sources is two principals, and a rule names one of them.
    #[test]
    fn subjects_are_qualified_by_their_source_and_rules_must_say_which() {
        let (jwt, token, broker) = (
            Principal::verified(Source::Jwt, "alice", Vec::new()),
            Principal::verified(Source::Token, "alice", Vec::new()),
            Principal::verified(Source::Amqp, "alice", Vec::new()),
        );
        assert_eq!(
            [&jwt.subject, &token.subject, &broker.subject],
            ["jwt:alice", "token:alice", "amqp:alice"]
        );
        let rule = vec!["sub:token:alice".to_owned()];
        assert!(
            allowed(&rule, Some(&token)) && !allowed(&rule, Some(&jwt)) && !allowed(&rule, Some(&broker))
        );
        let plain = rule_error("sub:alice").expect("a subject without its source is refused");
        assert!(plain.contains("sub:jwt:alice") && plain.contains("sub:amqp:alice"), "{plain}");
        assert!(rule_error("sub:ldap:alice").is_some() && rule_error("sub:jwt:").is_some());
    }
}
