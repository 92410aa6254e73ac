//! Client authentication by bearer token (ECMA-434 profile 2): a request without a valid
//! `Authorization: Bearer <token>` is refused before any NLIP processing.
//!
//! Authentication fails closed: a token variable that is named but unset or empty, or a blank
//! token, stops the daemon at start instead of silently turning authentication off.

use sha2::{Digest, Sha256};

/// The accepted tokens, kept as SHA-256 digests so that comparisons take the same time
/// whatever the input, and the tokens themselves are not kept in memory in clear.
#[derive(Clone, Default)]
pub(crate) struct Tokens {
    digests: Vec<[u8; 32]>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} configured)", self.digests.len())
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No bearer token: 401.
    Missing,
    /// A token that is not accepted: 403.
    Wrong,
}

/// Who a request is, once accepted: the limits of a client are kept per identity, so that
/// spelling one token differently never buys a fresh rate-limit bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Identity {
    /// Authentication is off: clients are told apart by address.
    Anonymous,
    /// The accepted token at this position of the configured list.
    Token(usize),
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
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    /// Tokens from the configuration plus the comma-separated list in `env_var`. A named
    /// variable must be set and hold at least one token; no token may be blank.
    pub(crate) fn new(configured: &[String], env_var: Option<&str>) -> Result<Tokens, AuthError> {
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
        Ok(Tokens { digests: tokens.into_iter().map(digest).collect() })
    }

    /// True when no token is configured: authentication is off.
    pub(crate) fn is_open(&self) -> bool {
        self.digests.is_empty()
    }

    /// Checks an `Authorization` header value: the scheme is case-insensitive (RFC 9110
    /// §11.1) and spaces around the token are ignored.
    pub(crate) fn check(&self, authorization: Option<&str>) -> Result<Identity, Refusal> {
        if self.is_open() {
            return Ok(Identity::Anonymous);
        }
        let (scheme, token) = authorization.and_then(|h| h.trim().split_once(' ')).ok_or(Refusal::Missing)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(Refusal::Missing);
        }
        let d = digest(token.trim());
        // Compare every digest fully: no early exit on the first differing byte.
        let differs = |known: &[u8; 32]| known.iter().zip(&d).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        let found = self
            .digests
            .iter()
            .enumerate()
            .fold(None, |found, (i, known)| if differs(known) == 0 { Some(i) } else { found });
        found.map(Identity::Token).ok_or(Refusal::Wrong)
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
        let open = Tokens::new(&[], None).unwrap();
        assert_eq!(open.check(None), Ok(Identity::Anonymous));
        let tokens = Tokens::new(&["s3cret".into(), "other".into()], None).unwrap();
        assert_eq!(tokens.check(None), Err(Refusal::Missing));
        assert_eq!(tokens.check(Some("Basic abc")), Err(Refusal::Missing));
        assert_eq!(tokens.check(Some("Bearer nope")), Err(Refusal::Wrong));
        assert_eq!(tokens.check(Some("Bearer s3cret")), Ok(Identity::Token(0)));
        assert_eq!(tokens.check(Some("Bearer other")), Ok(Identity::Token(1)));
    }

    #[test]
    fn spellings_of_one_token_are_one_identity() {
        let tokens = Tokens::new(&["s3cret".into()], None).unwrap();
        for header in ["Bearer s3cret", "bearer s3cret", "BEARER   s3cret ", " Bearer s3cret"] {
            assert_eq!(tokens.check(Some(header)), Ok(Identity::Token(0)), "{header:?}");
        }
    }

    #[test]
    fn blank_tokens_are_refused() {
        let err = Tokens::new(&["ok".into(), " ".into()], None).unwrap_err();
        assert_eq!(err, AuthError::BlankToken { origin: "[http] tokens".into(), position: 2 });
    }

    #[test]
    fn a_named_variable_must_hold_tokens() {
        // Variable names unique to this test: no other test reads or writes them.
        let unset = "SILPGATE_TEST_AUTH_UNSET_7F3A";
        assert_eq!(Tokens::new(&[], Some(unset)).unwrap_err(), AuthError::VariableUnset(unset.into()));
        let err = AuthError::VariableEmpty("X".into()).to_string();
        assert!(err.contains("holds no token"), "{err}");
    }
}
