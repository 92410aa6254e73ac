//! SHA-256 as lower-case hex: content ids, IR hashes, compile.lock records.

use sha2::{Digest, Sha256};

/// Lower-case hex of the SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let mut hex = String::with_capacity(64);
    push_hex(&mut hex, &Sha256::digest(bytes));
    hex
}

/// Appends `bytes` to `out` as lower-case hex.
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_empty_input_hashes_to_the_known_digest() {
        assert_eq!(
            super::sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
