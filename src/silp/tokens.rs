//! Token counts: what a payload costs the receiving model, in its tokenizer's tokens.
//!
//! The draft measures SILP in tokens (the single-token verbs of §3.8, the tokenization effect
//! of invisible characters in §8.1, the compression term of §6.1); bytes are only a proxy.
//! This module owns the tokenizers silpgate ships (OpenAI's `o200k_base` and `cl100k_base`,
//! through the `bpe-openai` crate, whose dictionaries are compiled into the binary so nothing
//! is downloaded at run time), the count of a text, and a bounded cache of counts keyed by
//! (IR hash, frontend, tokenizer), so that a payload the gateway has seen is not counted again.

use super::Frontend;
use super::whitelist;
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;

/// A tokenizer silpgate can count with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tokenizer {
    /// GPT-4o family.
    O200kBase,
    /// GPT-3.5 and GPT-4.
    Cl100kBase,
}

/// Why a tokenizer name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("unknown tokenizer '{0}'; available: o200k_base, cl100k_base")]
    Unknown(String),
    /// `file:PATH` names a Hugging Face `tokenizer.json`; no lean maintained crate reads those
    /// (the `tokenizers` crate would double the build), so it is refused, not half-supported.
    #[error("tokenizer '{0}': tokenizer files are not supported; silpgate ships o200k_base and cl100k_base")]
    FileUnsupported(String),
}

impl Tokenizer {
    pub const ALL: [Tokenizer; 2] = [Tokenizer::O200kBase, Tokenizer::Cl100kBase];

    pub fn name(self) -> &'static str {
        match self {
            Tokenizer::O200kBase => "o200k_base",
            Tokenizer::Cl100kBase => "cl100k_base",
        }
    }

    fn bpe(self) -> &'static bpe_openai::Tokenizer {
        match self {
            Tokenizer::O200kBase => bpe_openai::o200k_base(),
            Tokenizer::Cl100kBase => bpe_openai::cl100k_base(),
        }
    }

    /// Loads the dictionary now (tens of milliseconds) rather than on the first payload.
    pub fn warm(self) {
        self.count("");
    }

    /// The number of tokens of `text`, counted as ordinary text: a special-token spelling such
    /// as `<|endoftext|>` is counted as the characters it is made of, since a payload is data.
    pub fn count(self, text: &str) -> usize {
        self.bpe().count(text)
    }
}

impl fmt::Display for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Tokenizer {
    type Err = TokenError;

    fn from_str(s: &str) -> Result<Self, TokenError> {
        match s {
            "o200k_base" => Ok(Tokenizer::O200kBase),
            "cl100k_base" => Ok(Tokenizer::Cl100kBase),
            file if file.starts_with("file:") => Err(TokenError::FileUnsupported(shown(file))),
            other => Err(TokenError::Unknown(shown(other))),
        }
    }
}

// Stored by name (agent profiles), so a record reads back whatever the enum's layout.
impl serde::Serialize for Tokenizer {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Tokenizer {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// A name quoted back in an error, bounded so that a huge one does not flood a log.
fn shown(name: &str) -> String {
    let mut s: String = name.chars().take(64).collect();
    if s.len() < name.len() {
        s.push('…');
    }
    s
}

/// The whitelisted verbs, as the code frontend writes them (lower case, draft §3.8), that are
/// not exactly one token in `tokenizer`, with their count. Empty when the draft's claim holds.
pub fn multi_token_verbs(tokenizer: Tokenizer) -> Vec<(String, usize)> {
    whitelist::APPROVED
        .iter()
        .map(|verb| verb.to_ascii_lowercase())
        .map(|verb| {
            let n = tokenizer.count(&verb);
            (verb, n)
        })
        .filter(|(_, n)| *n != 1)
        .collect()
}

/// Counts cached by (IR hash, frontend, tokenizer). An IR hash fixes the IR, and with the
/// frontend and the codec version it fixes the text, so a hit never needs the text.
///
/// Bounded: when `capacity` entries are held, the cache starts over (counts are cheap to redo;
/// an eviction order would cost more than it saves).
pub struct TokenCache {
    capacity: usize,
    counts: Mutex<HashMap<Key, u32>>,
}

type Key = ([u8; 32], Frontend, Tokenizer);

impl TokenCache {
    pub fn new(capacity: usize) -> Self {
        TokenCache { capacity: capacity.max(1), counts: Mutex::new(HashMap::new()) }
    }

    /// The token count of `text`, the `frontend` output of the IR whose `ir_hash`
    /// (`sha256:<hex>`) is given. `text` is only called on a miss.
    pub fn count(
        &self,
        ir_hash: &str,
        frontend: Frontend,
        tokenizer: Tokenizer,
        text: impl FnOnce() -> String,
    ) -> usize {
        let Some(digest) = digest_of(ir_hash) else {
            // Not an IR hash: count without caching rather than cache under a wrong key.
            return tokenizer.count(&text());
        };
        let key = (digest, frontend, tokenizer);
        if let Some(n) = self.lock().get(&key) {
            return *n as usize;
        }
        let n = tokenizer.count(&text());
        let mut counts = self.lock();
        if counts.len() >= self.capacity {
            counts.clear();
        }
        counts.insert(key, u32::try_from(n).unwrap_or(u32::MAX));
        n
    }

    /// Entries held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, u32>> {
        // A panic while holding the lock cannot leave a half-written count: recover the map.
        self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The 32 bytes of `sha256:<64 hex digits>`.
fn digest_of(ir_hash: &str) -> Option<[u8; 32]> {
    let hex = ir_hash.strip_prefix("sha256:")?.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, pair) in hex.chunks_exact(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_names_say_what_is_available() {
        for t in Tokenizer::ALL {
            assert_eq!(t.name().parse::<Tokenizer>(), Ok(t));
        }
        let e = "p50k_base".parse::<Tokenizer>().unwrap_err().to_string();
        assert!(e.contains("'p50k_base'") && e.contains("o200k_base, cl100k_base"), "{e}");
        let e = "file:/x/tokenizer.json".parse::<Tokenizer>().unwrap_err();
        assert!(matches!(e, TokenError::FileUnsupported(_)), "{e}");
        let long = "x".repeat(1000);
        assert!(long.parse::<Tokenizer>().unwrap_err().to_string().len() < 200);
    }

    #[test]
    fn counts_differ_between_the_encodings_where_their_vocabularies_do() {
        // "hello world" is two tokens everywhere; a run of Cyrillic is cheaper in o200k.
        for t in Tokenizer::ALL {
            assert_eq!(t.count("hello world"), 2, "{t}");
            assert_eq!(t.count(""), 0, "{t}");
        }
        let text = "Отменить рейс в Пекин завтра";
        assert!(Tokenizer::O200kBase.count(text) < Tokenizer::Cl100kBase.count(text));
    }

    #[test]
    fn the_cache_counts_once_per_key_and_stays_bounded() {
        let cache = TokenCache::new(2);
        let hash = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let calls = std::cell::Cell::new(0);
        let text = || {
            calls.set(calls.get() + 1);
            "cancel(flight)".to_owned()
        };
        let t = Tokenizer::O200kBase;
        let n = cache.count(&hash('a'), Frontend::Code, t, text);
        assert_eq!(cache.count(&hash('a'), Frontend::Code, t, text), n);
        assert_eq!(calls.get(), 1);
        cache.count(&hash('a'), Frontend::Code, Tokenizer::Cl100kBase, text);
        assert_eq!((calls.get(), cache.len()), (2, 2));
        cache.count(&hash('b'), Frontend::Code, t, text);
        assert_eq!((calls.get(), cache.len()), (3, 1));
        // Not an IR hash: counted, never cached.
        assert_eq!(cache.count("md5:x", Frontend::Code, t, text), n);
        assert_eq!((calls.get(), cache.len()), (4, 1));
    }

    #[test]
    fn digests_are_read_only_from_well_formed_hashes() {
        let good = format!("sha256:{}", "0f".repeat(32));
        assert_eq!(digest_of(&good), Some([0x0f; 32]));
        assert_eq!(digest_of(&format!("sha256:{}", "0F".repeat(32))), None);
        assert_eq!(digest_of("sha256:0f"), None);
        assert_eq!(digest_of(&"0f".repeat(32)), None);
    }
}
