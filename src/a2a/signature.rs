//! Signed agent cards (A2A 1.0, "Agent Card signing"): a card's `signatures` are JWS (RFC 7515)
//! with a detached payload, the card's canonical form. silpgate verifies an agent's card
//! against keys configured for that agent ([`CardKeys`]) and signs its own with a configured
//! key ([`CardSigner`]).
//!
//! The canonical form is what the A2A SDKs sign: the card as A2A 1.0 defines it (a2a.proto's
//! `AgentCard`; fields of other generations, such as 0.3's top-level `url`, are not signed,
//! as a verifier that reads the card into 1.0's types never sees them), without
//! `signatures`, without empty strings, lists and objects and `false` flags at any depth
//! (proto3 JSON, where a default value and an absent one are the same), written as RFC 8785
//! JSON (JCS). A signature's protected header says its
//! key (`kid`) and algorithm (`alg`); the algorithm must be the key's own (see
//! [`crate::util::jwk`]), and a key the header points to (`jku`, `jwk`, `x5u`) is never
//! fetched or believed: only the configured keys count.

use crate::util::jwk::{Key, key_of};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, EncodingKey};
use serde_json::{Map, Value, json};
use std::path::Path;

/// Why a card's signatures do not hold, or a key cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SignatureError {
    #[error("the agent card carries no signature")]
    Unsigned,
    #[error("no signature of the agent card verifies against the configured keys: {0}")]
    Invalid(String),
    #[error("the agent card has no canonical form: {0}")]
    NotCanonical(String),
    #[error("{path}: {why}")]
    Key { path: String, why: String },
}

/// The canonical form of `card`: the bytes its signatures sign.
///
/// # Errors
/// The card cannot be written as RFC 8785 JSON.
pub(crate) fn canonical(card: &Value) -> Result<Vec<u8>, SignatureError> {
    let projected = project(card, AGENT_CARD);
    let cleaned = projected.and_then(without_empties).unwrap_or_else(|| Value::Object(Map::new()));
    serde_json_canonicalizer::to_vec(&cleaned).map_err(|e| SignatureError::NotCanonical(e.to_string()))
}

/// How a part of an agent card is written in A2A 1.0 (a2a.proto).
#[derive(Clone, Copy)]
enum Shape {
    /// A string, a list of strings, or a flag with presence (`false` is a value): as it is.
    Plain,
    /// A flag without presence: `false` is its default, which proto3 JSON leaves out.
    Flag,
    /// An object of these fields; any other field is not 1.0's.
    Fields(&'static [(&'static str, Shape)]),
    /// A map: any key, each value of this shape.
    MapOf(&'static Shape),
    /// A `google.protobuf.Struct`: anything, as it is.
    Free,
}

use Shape::{Fields, Flag, Free, MapOf, Plain};

const SECURITY_REQUIREMENT: Shape = Fields(&[("schemes", MapOf(&Fields(&[("list", Plain)])))]);
/// The fields of every OAuth flow together (no flow has a field of another's meaning).
const OAUTH_FLOW: Shape = Fields(&[
    ("authorizationUrl", Plain),
    ("deviceAuthorizationUrl", Plain),
    ("tokenUrl", Plain),
    ("refreshUrl", Plain),
    ("scopes", MapOf(&Plain)),
    ("pkceRequired", Flag),
]);
const SECURITY_SCHEME: Shape = Fields(&[
    ("apiKeySecurityScheme", Fields(&[("description", Plain), ("location", Plain), ("name", Plain)])),
    ("httpAuthSecurityScheme", Fields(&[("description", Plain), ("scheme", Plain), ("bearerFormat", Plain)])),
    (
        "oauth2SecurityScheme",
        Fields(&[
            ("description", Plain),
            (
                "flows",
                Fields(&[
                    ("authorizationCode", OAUTH_FLOW),
                    ("clientCredentials", OAUTH_FLOW),
                    ("implicit", OAUTH_FLOW),
                    ("password", OAUTH_FLOW),
                    ("deviceCode", OAUTH_FLOW),
                ]),
            ),
            ("oauth2MetadataUrl", Plain),
        ]),
    ),
    ("openIdConnectSecurityScheme", Fields(&[("description", Plain), ("openIdConnectUrl", Plain)])),
    ("mtlsSecurityScheme", Fields(&[("description", Plain)])),
]);
/// A2A 1.0's `AgentCard` without its `signatures`.
const AGENT_CARD: Shape = Fields(&[
    ("name", Plain),
    ("description", Plain),
    (
        "supportedInterfaces",
        Fields(&[("url", Plain), ("protocolBinding", Plain), ("tenant", Plain), ("protocolVersion", Plain)]),
    ),
    ("provider", Fields(&[("url", Plain), ("organization", Plain)])),
    ("version", Plain),
    ("documentationUrl", Plain),
    (
        "capabilities",
        Fields(&[
            ("streaming", Plain),
            ("pushNotifications", Plain),
            (
                "extensions",
                Fields(&[("uri", Plain), ("description", Plain), ("required", Flag), ("params", Free)]),
            ),
            ("extendedAgentCard", Plain),
        ]),
    ),
    ("securitySchemes", MapOf(&SECURITY_SCHEME)),
    ("securityRequirements", SECURITY_REQUIREMENT),
    ("defaultInputModes", Plain),
    ("defaultOutputModes", Plain),
    (
        "skills",
        Fields(&[
            ("id", Plain),
            ("name", Plain),
            ("description", Plain),
            ("tags", Plain),
            ("examples", Plain),
            ("inputModes", Plain),
            ("outputModes", Plain),
            ("securityRequirements", SECURITY_REQUIREMENT),
        ]),
    ),
    ("iconUrl", Plain),
]);

/// `value` as A2A 1.0 writes a part of shape `shape` (a list: each item so); `None` for a
/// flag at its default.
fn project(value: &Value, shape: Shape) -> Option<Value> {
    if let Value::Array(items) = value {
        return Some(Value::Array(items.iter().filter_map(|item| project(item, shape)).collect()));
    }
    match (shape, value) {
        (Flag, Value::Bool(false)) => None,
        (Fields(fields), Value::Object(object)) => Some(Value::Object(
            fields
                .iter()
                .filter_map(|(name, shape)| Some(((*name).to_owned(), project(object.get(*name)?, *shape)?)))
                .collect(),
        )),
        (MapOf(shape), Value::Object(object)) => Some(Value::Object(
            object.iter().filter_map(|(key, value)| Some((key.clone(), project(value, *shape)?))).collect(),
        )),
        _ => Some(value.clone()),
    }
}

/// `value` without empty strings, lists and objects, at any depth; `None` when nothing is left.
fn without_empties(value: Value) -> Option<Value> {
    match value {
        Value::String(s) if s.is_empty() => None,
        Value::Array(items) => {
            let kept: Vec<Value> = items.into_iter().filter_map(without_empties).collect();
            (!kept.is_empty()).then_some(Value::Array(kept))
        }
        Value::Object(fields) => {
            let kept: Map<String, Value> =
                fields.into_iter().filter_map(|(k, v)| without_empties(v).map(|v| (k, v))).collect();
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        other => Some(other),
    }
}

/// The keys an agent's card must be signed with (`card_keys_file`, a JWK set).
pub(crate) struct CardKeys {
    keys: Vec<Key>,
}

impl CardKeys {
    /// Reads the JWK set at `path`.
    ///
    /// # Errors
    /// The file cannot be read, is not a JWK set, or holds no key silpgate verifies with.
    pub(crate) fn read(path: &Path) -> Result<CardKeys, SignatureError> {
        let failed = |why: String| SignatureError::Key { path: path.display().to_string(), why };
        let bytes = std::fs::read(path).map_err(|e| failed(e.to_string()))?;
        let set: JwkSet =
            serde_json::from_slice(&bytes).map_err(|e| failed(format!("not a JWK set: {e}")))?;
        let keys: Vec<Key> = set.keys.iter().filter_map(key_of).collect();
        if keys.is_empty() {
            return Err(failed("no ES256, RS256 or EdDSA signing key in the set".into()));
        }
        Ok(CardKeys { keys })
    }

    /// Whether one of `card`'s signatures verifies with one of the keys.
    ///
    /// # Errors
    /// The card is unsigned, or no signature verifies (each one's reason, joined).
    pub(crate) fn verify(&self, card: &Value) -> Result<(), SignatureError> {
        let signatures = card.get("signatures").and_then(Value::as_array).filter(|s| !s.is_empty());
        let signatures = signatures.ok_or(SignatureError::Unsigned)?;
        let payload = URL_SAFE_NO_PAD.encode(canonical(card)?);
        let mut refusals = Vec::new();
        for (index, signature) in signatures.iter().enumerate() {
            match self.verify_one(signature, &payload) {
                Ok(()) => return Ok(()),
                Err(why) => refusals.push(format!("signatures[{index}]: {why}")),
            }
        }
        Err(SignatureError::Invalid(refusals.join("; ")))
    }

    fn verify_one(&self, signature: &Value, payload: &str) -> Result<(), String> {
        let text = |key: &str| signature.get(key).and_then(Value::as_str).unwrap_or_default();
        let (protected, signed) = (text("protected"), text("signature"));
        let header: Value = URL_SAFE_NO_PAD
            .decode(protected)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or("its protected header is not base64url JSON")?;
        let algorithm = header.get("alg").and_then(Value::as_str).unwrap_or_default();
        let kid = header.get("kid").and_then(Value::as_str);
        let candidates: Vec<&Key> = self
            .keys
            .iter()
            .filter(|key| kid.is_none_or(|kid| key.id.as_deref() == Some(kid)))
            .filter(|key| name_of(key.algorithm) == algorithm)
            .collect();
        if candidates.is_empty() {
            return Err(format!(
                "no configured key has kid {} and algorithm {algorithm:?}",
                kid.map_or_else(|| "(none)".to_owned(), |k| format!("{k:?}"))
            ));
        }
        let message = format!("{protected}.{payload}");
        let verified = candidates.iter().any(|key| {
            jsonwebtoken::crypto::verify(signed, message.as_bytes(), &key.decoding, key.algorithm)
                .unwrap_or(false)
        });
        if verified { Ok(()) } else { Err("the signature does not verify".into()) }
    }
}

/// The key silpgate signs its own card with (`a2a.card_signing_key_file`, a PEM private key).
pub(crate) struct CardSigner {
    key: EncodingKey,
    algorithm: Algorithm,
    kid: String,
}

impl CardSigner {
    /// Reads the PKCS#8 PEM private key at `path`: a P-256 key signs ES256, an Ed25519 key
    /// EdDSA, an RSA key RS256. `kid` names it in each signature's protected header.
    ///
    /// # Errors
    /// The file cannot be read, or is no such key.
    pub(crate) fn read(path: &Path, kid: &str) -> Result<CardSigner, SignatureError> {
        let failed = |why: String| SignatureError::Key { path: path.display().to_string(), why };
        let pem = std::fs::read(path).map_err(|e| failed(e.to_string()))?;
        let (key, algorithm) = if let Ok(key) = EncodingKey::from_ec_pem(&pem) {
            (key, Algorithm::ES256)
        } else if let Ok(key) = EncodingKey::from_ed_pem(&pem) {
            (key, Algorithm::EdDSA)
        } else if let Ok(key) = EncodingKey::from_rsa_pem(&pem) {
            (key, Algorithm::RS256)
        } else {
            return Err(failed("not a PEM private key of P-256, Ed25519 or RSA".into()));
        };
        let signer = CardSigner { key, algorithm, kid: kid.to_owned() };
        // A key that cannot sign is found at the start, not at the first card served.
        signer.signature(&json!({})).map_err(|e| failed(e.to_string()))?;
        Ok(signer)
    }

    /// `card` with its signature (any it carried replaced).
    ///
    /// # Errors
    /// The card has no canonical form, or the key failed to sign.
    pub(crate) fn sign(&self, card: &mut Value) -> Result<(), SignatureError> {
        let signature = self.signature(card)?;
        card["signatures"] = json!([signature]);
        Ok(())
    }

    fn signature(&self, card: &Value) -> Result<Value, SignatureError> {
        let header = json!({"alg": name_of(self.algorithm), "kid": self.kid, "typ": "JOSE"});
        let protected = URL_SAFE_NO_PAD.encode(header.to_string());
        let payload = URL_SAFE_NO_PAD.encode(canonical(card)?);
        let message = format!("{protected}.{payload}");
        let signature = jsonwebtoken::crypto::sign(message.as_bytes(), &self.key, self.algorithm)
            .map_err(|e| SignatureError::NotCanonical(format!("signing failed: {e}")))?;
        Ok(json!({"protected": protected, "signature": signature}))
    }
}

/// The JWS name of an algorithm silpgate uses.
fn name_of(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::ES256 => "ES256",
        Algorithm::RS256 => "RS256",
        Algorithm::EdDSA => "EdDSA",
        _ => "unsupported",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A P-256 key pair: the signer, and its public half as a JWK set file.
    fn p256(dir: &Path, kid: &str) -> (CardSigner, std::path::PathBuf) {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let pem = dir.join(format!("{kid}.pem"));
        std::fs::write(&pem, pair.serialize_pem()).unwrap();
        let public = pair.public_key_raw();
        // An uncompressed point: 0x04, x, y.
        let (x, y) = (&public[1..33], &public[33..65]);
        let set = json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig",
            "x": URL_SAFE_NO_PAD.encode(x), "y": URL_SAFE_NO_PAD.encode(y)}]});
        let jwks = dir.join(format!("{kid}.jwks.json"));
        std::fs::write(&jwks, set.to_string()).unwrap();
        (CardSigner::read(&pem, kid).unwrap(), jwks)
    }

    fn card() -> Value {
        json!({"name": "agent", "description": "", "version": "1.0.0", "skills": [],
               "capabilities": {"streaming": true, "extensions": []},
               "supportedInterfaces": [{"url": "http://127.0.0.1:1/", "protocolBinding": "JSONRPC"}]})
    }

    #[test]
    fn the_canonical_form_is_the_1_0_card_without_signatures_defaults_and_empties_in_key_order() {
        let mut signed = card();
        signed["signatures"] = json!([{"protected": "x", "signature": "y"}]);
        // 0.3's fields beside 1.0's, and flags at their default, are not signed; a flag with
        // presence is, false or not.
        signed["url"] = json!("http://127.0.0.1:1/");
        signed["preferredTransport"] = json!("JSONRPC");
        signed["capabilities"]["pushNotifications"] = json!(false);
        signed["capabilities"]["extensions"] = json!([{"uri": "u", "required": false, "params": {"a": [1]}}]);
        let text = String::from_utf8(canonical(&signed).unwrap()).unwrap();
        assert_eq!(
            text,
            r#"{"capabilities":{"extensions":[{"params":{"a":[1]},"uri":"u"}],"pushNotifications":false,"streaming":true},"name":"agent","supportedInterfaces":[{"protocolBinding":"JSONRPC","url":"http://127.0.0.1:1/"}],"version":"1.0.0"}"#
        );
    }

    #[test]
    fn a_card_signed_with_a_configured_key_verifies_and_any_change_or_other_key_does_not() {
        let dir = std::env::temp_dir().join(format!("silpgate-cards-{}", crate::util::token::unguessable()));
        std::fs::create_dir_all(&dir).unwrap();
        let (signer, keys) = p256(&dir, "k1");
        let (other_signer, other_keys) = p256(&dir, "k2");
        let keys = CardKeys::read(&keys).unwrap();
        let mut signed = card();
        signer.sign(&mut signed).unwrap();
        keys.verify(&signed).unwrap();

        let mut changed = signed.clone();
        changed["supportedInterfaces"][0]["url"] = json!("http://evil.example/");
        assert!(
            matches!(keys.verify(&changed), Err(SignatureError::Invalid(why)) if why.contains("does not verify"))
        );
        assert_eq!(keys.verify(&card()), Err(SignatureError::Unsigned));
        let mut by_other = card();
        other_signer.sign(&mut by_other).unwrap();
        let refused = keys.verify(&by_other).unwrap_err().to_string();
        assert!(refused.contains("no configured key has kid \"k2\""), "{refused}");
        CardKeys::read(&other_keys).unwrap().verify(&by_other).unwrap();

        // A header that names another algorithm (here HS256, with the public key as its
        // secret) or points to a key of its own is not believed.
        let mut forged = signed.clone();
        let header = json!({"alg": "HS256", "kid": "k1", "jku": "http://evil.example/keys"});
        forged["signatures"][0]["protected"] = json!(URL_SAFE_NO_PAD.encode(header.to_string()));
        assert!(keys.verify(&forged).unwrap_err().to_string().contains("algorithm \"HS256\""));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_key_file_that_is_not_a_key_is_named() {
        let dir = std::env::temp_dir().join(format!("silpgate-cards-{}", crate::util::token::unguessable()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a key").unwrap();
        let refused = CardSigner::read(&junk, "k").err().unwrap().to_string();
        assert!(refused.contains("junk.pem") && refused.contains("not a PEM private key"), "{refused}");
        let refused = CardKeys::read(&dir.join("missing.json")).err().unwrap().to_string();
        assert!(refused.contains("missing.json"), "{refused}");
        std::fs::write(&junk, r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#).unwrap();
        let refused = CardKeys::read(&junk).err().unwrap().to_string();
        assert!(refused.contains("no ES256, RS256 or EdDSA signing key"), "{refused}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
