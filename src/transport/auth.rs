//! Client authentication by bearer token (ECMA-434 profile 2): a request without a valid
//! `Authorization: Bearer <token>` is refused before any NLIP processing.

use sha2::{Digest, Sha256};

/// The accepted tokens, kept as SHA-256 digests so that comparisons take the same time
/// whatever the input, and the tokens themselves are not kept in memory in clear.
#[derive(Clone, Default)]
pub struct Tokens {
    digests: Vec<[u8; 32]>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} configured)", self.digests.len())
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No bearer token: 401.
    Missing,
    /// A token that is not accepted: 403.
    Wrong,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    /// Tokens from the configuration plus the comma-separated list in `env_var`, if set.
    pub fn new(configured: &[String], env_var: Option<&str>) -> Tokens {
        let from_env =
            env_var.and_then(std::env::var_os).map(|v| v.to_string_lossy().into_owned()).unwrap_or_default();
        let digests = configured
            .iter()
            .map(String::as_str)
            .chain(from_env.split(','))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(digest)
            .collect();
        Tokens { digests }
    }

    /// True when no token is configured: authentication is off.
    pub fn is_open(&self) -> bool {
        self.digests.is_empty()
    }

    /// Checks an `Authorization` header value.
    pub fn check(&self, authorization: Option<&str>) -> Result<(), Refusal> {
        if self.is_open() {
            return Ok(());
        }
        let token = authorization
            .and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")))
            .ok_or(Refusal::Missing)?;
        let d = digest(token.trim());
        // Compare every digest fully: no early exit on the first differing byte.
        let differs = |known: &[u8; 32]| known.iter().zip(&d).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        let matched = self.digests.iter().fold(false, |found, known| found | (differs(known) == 0));
        if matched { Ok(()) } else { Err(Refusal::Wrong) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked() {
        let open = Tokens::new(&[], None);
        assert_eq!(open.check(None), Ok(()));
        let tokens = Tokens::new(&["s3cret".into()], None);
        assert_eq!(tokens.check(None), Err(Refusal::Missing));
        assert_eq!(tokens.check(Some("Basic abc")), Err(Refusal::Missing));
        assert_eq!(tokens.check(Some("Bearer nope")), Err(Refusal::Wrong));
        assert_eq!(tokens.check(Some("Bearer s3cret")), Ok(()));
    }
}
