//! Client authentication (ECMA-434 profile 2): a request without an accepted
//! `Authorization: Bearer <token>` is refused before any NLIP processing. An accepted token
//! names a principal ([`crate::principal`]): a static token the one it is configured with
//! (`[[auth.tokens]]`; `[http] tokens`, which name none, are `token-1`, `token-2`, ... in
//! their order, `tokens_env`'s after them), a JWT its own ([`super::jwt`]).
//!
//! Authentication fails closed: a token variable that is named but unset or empty, or a blank
//! token, stops the daemon at start instead of silently turning authentication off.

use super::jwt::{JwtError, Jwts};
use crate::principal::{Principal, Source};
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// The accepted tokens, kept as SHA-256 digests so that comparisons take the same time
/// whatever the input, and the tokens themselves are not kept in memory in clear; and the
/// JWT verifier, when JWTs are taken.
#[derive(Clone, Default)]
pub(crate) struct Tokens {
    digests: Vec<([u8; 32], Principal)>,
    jwts: Option<Arc<Jwts>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} configured, JWTs {})", self.digests.len(), self.jwts.is_some())
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No bearer token: 401.
    Missing,
    /// A token that is not accepted: 403.
    Wrong,
    /// A JWT that does not verify: 401, saying which check failed.
    Invalid(JwtError),
}

/// Who a request is, once accepted: the limits of a client are kept per identity, so that
/// spelling one token differently never buys a fresh rate-limit bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Identity {
    /// Authentication is off: clients are told apart by address.
    Anonymous,
    Principal(Principal),
}

impl Identity {
    pub(crate) fn principal(&self) -> Option<&Principal> {
        match self {
            Identity::Anonymous => None,
            Identity::Principal(principal) => Some(principal),
        }
    }
}

/// A token configuration that would leave the door open by mistake. Never carries a token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error(
        "the environment variable {0} named by [http] tokens_env is not set; set it to the accepted bearer tokens (comma-separated), or remove tokens_env to run without authentication"
    )]
    VariableUnset(String),
    #[error("the environment variable {0} named by [http] tokens_env holds no token")]
    VariableEmpty(String),
    #[error("token {position} of {origin} is blank; a blank token would accept anyone")]
    BlankToken { origin: String, position: usize },
    #[error(
        "[[auth.tokens]] of subject '{subject}': the environment variable {variable} is not set or is blank"
    )]
    StaticUnset { subject: String, variable: String },
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    /// Tokens from the configuration plus the comma-separated list in `env_var`, which name
    /// no principal, and `named`, which do. A named variable must be set and hold at least
    /// one token; no token may be blank.
    pub(crate) fn new(
        configured: &[String],
        env_var: Option<&str>,
        named: &[crate::config::StaticToken],
    ) -> Result<Tokens, AuthError> {
        let mut tokens: Vec<&str> = Vec::new();
        for (i, token) in configured.iter().enumerate() {
            tokens.push(non_blank(token, "[http] tokens", i + 1)?);
        }
        let from_env = match env_var {
            None => String::new(),
            Some(name) => std::env::var(name).map_err(|_| AuthError::VariableUnset(name.to_owned()))?,
        };
        if let Some(name) = env_var {
            if from_env.trim().is_empty() {
                return Err(AuthError::VariableEmpty(name.to_owned()));
            }
            for (i, token) in from_env.split(',').enumerate() {
                tokens.push(non_blank(token, name, i + 1)?);
            }
        }
        let mut digests: Vec<([u8; 32], Principal)> = tokens
            .into_iter()
            .enumerate()
            .map(|(i, token)| {
                (digest(token), Principal::verified(Source::Token, &format!("#{}", i + 1), Vec::new()))
            })
            .collect();
        for named in named {
            let token =
                std::env::var(&named.token_env).ok().filter(|t| !t.trim().is_empty()).ok_or_else(|| {
                    AuthError::StaticUnset {
                        subject: named.subject.clone(),
                        variable: named.token_env.clone(),
                    }
                })?;
            digests.push((
                digest(token.trim()),
                Principal::verified(Source::Token, &named.subject, named.roles.clone()),
            ));
        }
        Ok(Tokens { digests, jwts: None })
    }

    /// These tokens, and JWTs that `jwts` verifies.
    pub(crate) fn with_jwts(mut self, jwts: Option<Jwts>) -> Tokens {
        self.jwts = jwts.map(Arc::new);
        self
    }

    /// True when no token is configured: authentication is off.
    pub(crate) fn is_open(&self) -> bool {
        self.digests.is_empty() && self.jwts.is_none()
    }

    /// Checks an `Authorization` header value: the scheme is case-insensitive (RFC 9110
    /// §11.1) and spaces around the token are ignored.
    pub(crate) async fn check(&self, authorization: Option<&str>) -> Result<Identity, Refusal> {
        if self.is_open() {
            return Ok(Identity::Anonymous);
        }
        let (scheme, token) = authorization.and_then(|h| h.trim().split_once(' ')).ok_or(Refusal::Missing)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(Refusal::Missing);
        }
        let token = token.trim();
        let d = digest(token);
        // Compare every digest fully: no early exit on the first differing byte.
        let differs = |known: &[u8; 32]| known.iter().zip(&d).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        let found = self.digests.iter().fold(
            None,
            |found, (known, principal)| if differs(known) == 0 { Some(principal) } else { found },
        );
        if let Some(principal) = found {
            return Ok(Identity::Principal(principal.clone()));
        }
        match &self.jwts {
            // A JWT is three base64url parts.
            Some(jwts) if token.split('.').count() == 3 => {
                jwts.verify(token).await.map(Identity::Principal).map_err(Refusal::Invalid)
            }
            _ => Err(Refusal::Wrong),
        }
    }
}

fn non_blank<'a>(token: &'a str, origin: &str, position: usize) -> Result<&'a str, AuthError> {
    match token.trim() {
        "" => Err(AuthError::BlankToken { origin: origin.to_owned(), position }),
        token => Ok(token),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked() {
        let check =
            |tokens: &Tokens, header| futures_util::FutureExt::now_or_never(tokens.check(header)).unwrap();
        let open = Tokens::new(&[], None, &[]).unwrap();
        assert_eq!(check(&open, None), Ok(Identity::Anonymous));
        let tokens = Tokens::new(&["s3cret".into(), "other".into()], None, &[]).unwrap();
        assert_eq!(check(&tokens, None), Err(Refusal::Missing));
        assert_eq!(check(&tokens, Some("Basic abc")), Err(Refusal::Missing));
        assert_eq!(check(&tokens, Some("Bearer nope")), Err(Refusal::Wrong));
        let named = |subject: &str| Ok(Identity::Principal(Principal::new(subject, Vec::new())));
        assert_eq!(check(&tokens, Some("Bearer s3cret")), named("token:#1"));
        assert_eq!(check(&tokens, Some("Bearer other")), named("token:#2"));
    }

    #[test]
    fn spellings_of_one_token_are_one_identity() {
        let tokens = Tokens::new(&["s3cret".into()], None, &[]).unwrap();
        for header in ["Bearer s3cret", "bearer s3cret", "BEARER   s3cret ", " Bearer s3cret"] {
            let checked = futures_util::FutureExt::now_or_never(tokens.check(Some(header))).unwrap();
            assert_eq!(
                checked,
                Ok(Identity::Principal(Principal::new("token:#1", Vec::new()))),
                "{header:?}"
            );
        }
    }

    #[test]
    fn blank_tokens_are_refused() {
        let err = Tokens::new(&["ok".into(), " ".into()], None, &[]).unwrap_err();
        assert_eq!(err, AuthError::BlankToken { origin: "[http] tokens".into(), position: 2 });
    }

    #[test]
    fn a_named_variable_must_hold_tokens() {
        // Variable names unique to this test: no other test reads or writes them.
        let unset = "SILPGATE_TEST_AUTH_UNSET_7F3A";
        assert_eq!(Tokens::new(&[], Some(unset), &[]).unwrap_err(), AuthError::VariableUnset(unset.into()));
        let err = AuthError::VariableEmpty("X".into()).to_string();
        assert!(err.contains("holds no token"), "{err}");
    }
}
