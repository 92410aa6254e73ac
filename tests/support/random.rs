//! Fault points picked at random, reproducibly.

#![allow(dead_code, reason = "each test binary uses its own part of the support module")]

/// A small xorshift generator for picking fault points: seeded from the clock, or from
/// `SILPGATE_TEST_SEED` to replay a run that failed (the tests print their seed).
pub struct Random(u64);

impl Random {
    pub fn from_clock() -> Random {
        let seed =
            std::env::var("SILPGATE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
                let now =
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                now.as_nanos() as u64
            });
        Random(seed.max(1))
    }

    pub fn seed(&self) -> u64 {
        self.0
    }

    /// A number below `bound` (which must be above 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}
