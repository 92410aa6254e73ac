//! Public keys from JWK sets (RFC 7517), each with the one algorithm it verifies: ES256 for
//! P-256 keys, RS256 for RSA keys, EdDSA for Ed25519 keys, and only that. A key's `alg`, when
//! it names another, or a `use` other than signatures, leaves the key out; so do HMAC secrets
//! and other curves. What a token or a signature's header names cannot choose how it is
//! checked.

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey};

/// One key of a set, with the algorithm it verifies.
pub(crate) struct Key {
    pub id: Option<String>,
    pub algorithm: Algorithm,
    pub decoding: DecodingKey,
}

/// The key a JWK holds, with the one algorithm it verifies; none for a key silpgate does
/// not use (HMAC secrets, other curves, keys for encryption only).
pub(crate) fn key_of(jwk: &Jwk) -> Option<Key> {
    if jwk.common.public_key_use.as_ref().is_some_and(|u| *u != jsonwebtoken::jwk::PublicKeyUse::Signature) {
        return None;
    }
    let by_type = match &jwk.algorithm {
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => Algorithm::EdDSA,
        _ => return None,
    };
    let algorithm = match jwk.common.key_algorithm {
        None => by_type,
        Some(KeyAlgorithm::ES256) if by_type == Algorithm::ES256 => by_type,
        Some(KeyAlgorithm::RS256) if by_type == Algorithm::RS256 => by_type,
        Some(KeyAlgorithm::EdDSA) if by_type == Algorithm::EdDSA => by_type,
        Some(_) => return None,
    };
    let decoding = DecodingKey::from_jwk(jwk).ok()?;
    Some(Key { id: jwk.common.key_id.clone(), algorithm, decoding })
}
