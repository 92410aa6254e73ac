//! `[auth]`: who the doors' clients are. Static bearer tokens (`[http] tokens` and
//! `tokens_env`, or `[[auth.tokens]]`, each naming its principal), JWTs verified against a key
//! set (`jwks_file` or `jwks_url`), and the roles of AMQP senders' broker users.

use super::ConfigError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// A JSON Web Key Set file: JWTs signed by its keys are accepted. Set this or
    /// `jwks_url`, not both.
    pub jwks_file: Option<PathBuf>,
    /// Where the identity provider publishes its key set (`https://`; `http://` only on
    /// this machine). Fetched at start, and again for a key id it does not hold, at most
    /// once every `jwks_refresh_secs`; TLS verified, no redirects, at most 1 MiB.
    pub jwks_url: Option<String>,
    /// PEM file of authorities `jwks_url` is verified against, besides the system's.
    pub jwks_ca_file: Option<PathBuf>,
    /// Shortest time between two fetches of `jwks_url`. Default 30.
    pub jwks_refresh_secs: u64,
    /// The `iss` a JWT must carry. Unset: any issuer (a key set shared by issuers should set it).
    pub issuer: Option<String>,
    /// An `aud` a JWT must carry. Unset: a JWT naming any audience is refused, as RFC 7519 asks.
    pub audience: Option<String>,
    /// The claim holding the principal's roles: an array of strings, or one string of
    /// space-separated roles. Default `roles`.
    pub roles_claim: String,
    /// Slack on `exp` and `nbf`, in seconds, for clocks that disagree. Default 30.
    pub leeway_secs: u64,
    /// Static tokens, each naming its principal.
    pub tokens: Vec<StaticToken>,
    /// Roles of AMQP senders, by the broker user the broker verified (`user_id`): the user is
    /// the principal's subject.
    pub broker_roles: BTreeMap<String, Vec<String>>,
    /// Who may use each of `/mcp`'s tools, by tool name (rules as `[[agents]] allow`). A tool
    /// not named is everyone's.
    pub mcp_tools: BTreeMap<String, Vec<String>>,
}

/// One static bearer token and the principal it names.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticToken {
    pub subject: String,
    #[serde(default)]
    pub roles: Vec<String>,
    /// Environment variable holding the token (it must be set).
    pub token_env: String,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            jwks_file: None,
            jwks_url: None,
            jwks_ca_file: None,
            jwks_refresh_secs: 30,
            issuer: None,
            audience: None,
            roles_claim: "roles".into(),
            leeway_secs: 30,
            tokens: Vec::new(),
            broker_roles: BTreeMap::new(),
            mcp_tools: BTreeMap::new(),
        }
    }
}

impl AuthConfig {
    /// True when JWTs are accepted.
    pub fn takes_jwts(&self) -> bool {
        self.jwks_file.is_some() || self.jwks_url.is_some()
    }

    pub(super) fn check(&self) -> Result<(), ConfigError> {
        let invalid = |why: String| ConfigError::Invalid(format!("[auth] {why}"));
        if self.jwks_file.is_some() && self.jwks_url.is_some() {
            return Err(invalid("set jwks_file or jwks_url, not both".into()));
        }
        if let Some(url) = &self.jwks_url {
            let parsed = reqwest::Url::parse(url).map_err(|e| invalid(format!("jwks_url: {e}")))?;
            let local = parsed.host_str().is_some_and(super::is_loopback);
            if parsed.scheme() != "https" && !(parsed.scheme() == "http" && local) {
                return Err(invalid("jwks_url must be https:// (http:// only on this machine)".into()));
            }
        }
        for (tool, rules) in &self.mcp_tools {
            if let Some(why) = rules.iter().find_map(|rule| crate::principal::rule_error(rule)) {
                return Err(invalid(format!("mcp_tools.{tool}: {why}")));
            }
        }
        for token in &self.tokens {
            if token.subject.trim().is_empty() {
                return Err(invalid("a token's subject is empty".into()));
            }
        }
        Ok(())
    }
}
