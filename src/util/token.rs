//! Unguessable tokens: 128 bits from the operating system's random source, as hex. Whatever
//! correlates an answer with its request is one of these, so that nobody who can merely see or
//! count silpgate's message ids can answer in an agent's place.

use std::fmt::Write;

/// 128 random bits as 32 lower-case hex digits.
pub(crate) fn unguessable() -> String {
    let mut bytes = [0u8; 16];
    // The OS random source failing is the machine failing: nothing silpgate can go on without.
    getrandom::fill(&mut bytes).expect("the operating system's random source is readable");
    bytes.iter().fold(String::with_capacity(32), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_are_128_bits_and_differ() {
        let (a, b) = (super::unguessable(), super::unguessable());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
