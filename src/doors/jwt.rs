//! JWTs as bearer tokens: verified against the identity provider's key set (`[auth]
//! jwks_file` or `jwks_url`), they name a principal, their `sub` and roles.
//!
//! Only ES256, RS256 and EdDSA are accepted, and each key is used with the one algorithm its
//! JWK says (its `alg`, else its type and curve), so that a token cannot choose how it is
//! checked: `alg: none`, HMAC with a public key as the secret, and a header naming another
//! algorithm than its key's are all refused. `exp` and `sub` are required; `nbf`, `iss` and
//! `aud` are checked, with `leeway_secs` of slack on times. A key id the set does not hold
//! makes silpgate fetch `jwks_url` again (a rotated key), at most once every
//! `jwks_refresh_secs`.

use crate::config::AuthConfig;
use crate::principal::Principal;
use crate::util::jwk::{Key, key_of};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, Validation};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Largest key set read from `jwks_url`.
const MAX_KEY_SET_BYTES: usize = 1 << 20;

/// Why a JWT is not accepted. The text is what the client is told: it names the check that
/// failed, never a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum JwtError {
    #[error("the token is not a signed JWT with an accepted algorithm (ES256, RS256, EdDSA)")]
    Malformed,
    #[error("the token's algorithm {0} is not its key's")]
    Algorithm(String),
    #[error("the token's key ({0}) is not in the identity provider's key set")]
    UnknownKey(String),
    #[error("the token's signature does not verify")]
    Signature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet (nbf)")]
    NotYet,
    #[error("the token's issuer is not accepted")]
    Issuer,
    #[error("the token's audience is not accepted")]
    Audience,
    #[error("the token lacks the claim {0}")]
    Missing(String),
    #[error("the token's claims are not valid: {0}")]
    Claims(String),
}

/// Why the key set cannot be had (at start: the daemon does not start).
#[derive(Debug, thiserror::Error)]
pub enum KeySetError {
    #[error("[auth] jwks_file {path}: {why}")]
    File { path: PathBuf, why: String },
    #[error("[auth] jwks_url: {0}")]
    Url(String),
}

/// Where the keys come from.
enum Source {
    File(PathBuf),
    Url { url: reqwest::Url, client: reqwest::Client },
}

/// The verifier of JWTs.
pub(crate) struct Jwts {
    keys: RwLock<Arc<Vec<Key>>>,
    source: Source,
    /// When `jwks_url` was last fetched; one fetch at a time.
    fetched: tokio::sync::Mutex<Option<Instant>>,
    refresh: Duration,
    issuer: Option<String>,
    audience: Option<String>,
    roles_claim: String,
    leeway: u64,
}

impl Jwts {
    /// The verifier `config` asks for, its keys read (or fetched) now; `None` when JWTs are
    /// not taken.
    pub(crate) async fn new(config: &AuthConfig) -> Result<Option<Jwts>, KeySetError> {
        let source = match (&config.jwks_file, &config.jwks_url) {
            (Some(path), _) => Source::File(path.clone()),
            (None, Some(url)) => {
                let url = reqwest::Url::parse(url).map_err(|e| KeySetError::Url(e.to_string()))?;
                Source::Url { url, client: key_set_client(config)? }
            }
            (None, None) => return Ok(None),
        };
        let jwts = Jwts {
            keys: RwLock::default(),
            source,
            fetched: tokio::sync::Mutex::new(None),
            refresh: Duration::from_secs(config.jwks_refresh_secs),
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
            roles_claim: config.roles_claim.clone(),
            leeway: config.leeway_secs,
        };
        let keys = jwts.read_keys().await?;
        *jwts.keys.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(keys);
        *jwts.fetched.lock().await = Some(Instant::now());
        Ok(Some(jwts))
    }

    /// The key set, read from its file or fetched from its URL.
    async fn read_keys(&self) -> Result<Vec<Key>, KeySetError> {
        let text = match &self.source {
            Source::File(path) => std::fs::read(path)
                .map_err(|e| KeySetError::File { path: path.clone(), why: e.to_string() })?,
            Source::Url { url, client } => fetch(client, url).await.map_err(KeySetError::Url)?,
        };
        let set: JwkSet = serde_json::from_slice(&text).map_err(|e| match &self.source {
            Source::File(path) => {
                KeySetError::File { path: path.clone(), why: format!("not a JWK set: {e}") }
            }
            Source::Url { .. } => KeySetError::Url(format!("not a JWK set: {e}")),
        })?;
        Ok(set.keys.iter().filter_map(key_of).collect())
    }

    /// The principal `token` names, once verified.
    pub(crate) async fn verify(&self, token: &str) -> Result<Principal, JwtError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| JwtError::Malformed)?;
        if !matches!(header.alg, Algorithm::ES256 | Algorithm::RS256 | Algorithm::EdDSA) {
            return Err(JwtError::Malformed);
        }
        let kid = header.kid.as_deref();
        let keys = match self.find(kid, header.alg) {
            Ok(keys) => keys,
            Err(JwtError::UnknownKey(_)) if self.refreshed().await => self.find(kid, header.alg)?,
            Err(e) => return Err(e),
        };
        let (keys, index) = keys;
        let key = &keys[index];
        let mut validation = Validation::new(key.algorithm);
        validation.leeway = self.leeway;
        validation.validate_nbf = true;
        let mut required = vec!["exp", "sub"];
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        if let Some(audience) = &self.audience {
            validation.set_audience(&[audience]);
            required.push("aud");
        }
        validation.set_required_spec_claims(&required);
        let claims = jsonwebtoken::decode::<Value>(token, &key.decoding, &validation)
            .map_err(|e| refusal(e.kind()))?
            .claims;
        let subject = claims.get("sub").and_then(Value::as_str).filter(|s| !s.is_empty());
        let subject = subject.ok_or_else(|| JwtError::Missing("sub".into()))?;
        let roles = match claims.get(&self.roles_claim) {
            Some(Value::Array(roles)) => roles.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
            Some(Value::String(roles)) => roles.split_whitespace().map(str::to_owned).collect(),
            _ => Vec::new(),
        };
        let valid_until =
            claims.get("exp").and_then(Value::as_u64).map(|exp| exp.saturating_add(self.leeway));
        Ok(Principal { valid_until, ..Principal::verified(crate::principal::Source::Jwt, subject, roles) })
    }

    /// The key for a token of `kid` and `algorithm`: the set, and the key's place in it.
    #[allow(clippy::type_complexity)]
    fn find(&self, kid: Option<&str>, algorithm: Algorithm) -> Result<(Arc<Vec<Key>>, usize), JwtError> {
        let keys = self.keys.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let index = match kid {
            Some(kid) => keys.iter().position(|k| k.id.as_deref() == Some(kid)),
            // Without a key id, only a set of one key of the token's algorithm says which.
            None => {
                let mut candidates = keys.iter().enumerate().filter(|(_, k)| k.algorithm == algorithm);
                match (candidates.next(), candidates.next()) {
                    (Some((index, _)), None) => Some(index),
                    _ => None,
                }
            }
        };
        // The key id is the client's to choose, and the refusal names it: only its start.
        let named = |kid: &str| format!("kid {}", kid.chars().take(64).collect::<String>());
        let index = index.ok_or_else(|| JwtError::UnknownKey(kid.map_or("no key id".into(), named)))?;
        if keys[index].algorithm != algorithm {
            return Err(JwtError::Algorithm(format!("{algorithm:?}")));
        }
        Ok((keys, index))
    }

    /// Fetches `jwks_url` again, unless it was fetched within `jwks_refresh_secs`: true when
    /// the set was replaced.
    async fn refreshed(&self) -> bool {
        if !matches!(self.source, Source::Url { .. }) {
            return false;
        }
        let mut fetched = self.fetched.lock().await;
        if fetched.is_some_and(|at| at.elapsed() < self.refresh) {
            return false;
        }
        *fetched = Some(Instant::now());
        match self.read_keys().await {
            Ok(keys) => {
                tracing::info!(keys = keys.len(), "The identity provider's key set was fetched again.");
                *self.keys.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(keys);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "The identity provider's key set could not be fetched again.");
                false
            }
        }
    }
}

fn refusal(kind: &jsonwebtoken::errors::ErrorKind) -> JwtError {
    use jsonwebtoken::errors::ErrorKind;
    match kind {
        ErrorKind::InvalidSignature => JwtError::Signature,
        ErrorKind::ExpiredSignature => JwtError::Expired,
        ErrorKind::ImmatureSignature => JwtError::NotYet,
        ErrorKind::InvalidIssuer => JwtError::Issuer,
        ErrorKind::InvalidAudience => JwtError::Audience,
        ErrorKind::MissingRequiredClaim(claim) => JwtError::Missing(claim.clone()),
        ErrorKind::InvalidAlgorithm => JwtError::Algorithm("of another family".into()),
        ErrorKind::InvalidToken | ErrorKind::Base64(_) | ErrorKind::Json(_) | ErrorKind::Utf8(_) => {
            JwtError::Malformed
        }
        other => JwtError::Claims(format!("{other:?}")),
    }
}

/// The client `jwks_url` is fetched with: TLS verified (the system's roots, and
/// `jwks_ca_file`), no redirects, bounded in time.
fn key_set_client(config: &AuthConfig) -> Result<reqwest::Client, KeySetError> {
    let ca = config.jwks_ca_file.as_deref().map(|file| ("jwks_ca_file", file));
    let builder = crate::connectors::http::outbound(Duration::from_secs(5), ca).map_err(KeySetError::Url)?;
    builder
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| KeySetError::Url(format!("HTTP client: {e}")))
}

/// The key set at `url`: a 200 of at most [`MAX_KEY_SET_BYTES`].
async fn fetch(client: &reqwest::Client, url: &reqwest::Url) -> Result<Vec<u8>, String> {
    let mut response = client.get(url.clone()).send().await.map_err(crate::connectors::http::described)?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("HTTP {status} (silpgate follows no redirects)"));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(crate::connectors::http::described)? {
        if body.len() + chunk.len() > MAX_KEY_SET_BYTES {
            return Err(format!("the key set is larger than {MAX_KEY_SET_BYTES} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    use serde_json::json;

    /// A P-256 key pair: the signing key, and its JWK with `extra` fields.
    fn es256(extra: Value) -> (jsonwebtoken::EncodingKey, Value) {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let point = pair.public_key_raw();
        let mut jwk = json!({"kty": "EC", "crv": "P-256", "x": B64.encode(&point[1..33]), "y": B64.encode(&point[33..65])});
        jwk.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        (jsonwebtoken::EncodingKey::from_ec_der(&pair.serialize_der()), jwk)
    }

    #[test]
    fn keys_are_taken_for_signatures_with_their_own_algorithm_only() {
        let key = |jwk: Value| key_of(&serde_json::from_value(jwk).unwrap()).map(|k| k.algorithm);
        let (_, ec) = es256(json!({}));
        assert_eq!(key(ec.clone()), Some(Algorithm::ES256));
        let mut claimed = ec.clone();
        claimed["alg"] = json!("RS256");
        assert_eq!(key(claimed), None, "an EC key claiming RS256 is no key");
        let mut encryption = ec;
        encryption["use"] = json!("enc");
        assert_eq!(key(encryption), None, "a key for encryption signs nothing");
        assert_eq!(key(json!({"kty": "oct", "k": "c2VjcmV0"})), None, "an HMAC secret is no key");
    }

    #[tokio::test]
    async fn a_key_set_file_verifies_its_tokens_and_names_their_principal() {
        let (signing, jwk) = es256(json!({"kid": "k1"}));
        let dir = std::env::temp_dir().join(format!("silpgate-jwks-{}", crate::util::token::unguessable()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("jwks.json");
        std::fs::write(&file, json!({"keys": [jwk]}).to_string()).unwrap();
        let config =
            AuthConfig { jwks_file: Some(file), audience: Some("me".into()), ..AuthConfig::default() };
        let jwts = Jwts::new(&config).await.unwrap().expect("JWTs are taken");
        let now = jsonwebtoken::get_current_timestamp();
        let token = |claims: Value| {
            let header = jsonwebtoken::Header {
                kid: Some("k1".into()),
                ..jsonwebtoken::Header::new(Algorithm::ES256)
            };
            jsonwebtoken::encode(&header, &claims, &signing).unwrap()
        };
        let alice = jwts
            .verify(&token(json!({"sub": "alice", "aud": "me", "exp": now + 60, "roles": "finance ops"})))
            .await
            .unwrap();
        let until = Some(now + 60 + jwts.leeway);
        assert_eq!(
            alice,
            Principal {
                valid_until: until,
                ..Principal::new("jwt:alice", vec!["finance".into(), "ops".into()])
            }
        );
        let unaudienced = jwts.verify(&token(json!({"sub": "alice", "exp": now + 60}))).await;
        assert_eq!(unaudienced, Err(JwtError::Missing("aud".into())));
        let _ = std::fs::remove_dir_all(dir);
    }
}
