//! Capped exponential backoff with jitter, for reconnecting and for retrying a message.
//!
//! Jitter spreads the retries of many instances (or many messages) that failed at the same
//! moment, so that they do not hit the broker again in lockstep.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Delays that double from `initial` up to `max`, each drawn from the upper half of its step.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    step: u32,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial: initial.max(Duration::from_millis(1)), max: max.max(initial), step: 0 }
    }

    /// The wait before the next attempt.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let ceiling = self.initial.saturating_mul(1u32 << self.step.min(20)).min(self.max);
        self.step = self.step.saturating_add(1);
        // Uniform in [ceiling / 2, ceiling].
        let half = ceiling / 2;
        let spread = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX).max(1);
        half + Duration::from_nanos(random() % spread)
    }

    /// Starts over after a success.
    pub(crate) fn reset(&mut self) {
        self.step = 0;
    }

    /// After a connection that lived `lived` ended: starts over only if it lived long enough
    /// to count as working ([`STEADY`]). One that dies young (a server that accepts and
    /// closes) is a failure, and the waits keep growing.
    pub(crate) fn connection_ended(&mut self, lived: Duration) {
        if lived >= STEADY {
            self.reset();
        }
    }
}

/// How long a connection must live to count as a working one.
pub(crate) const STEADY: Duration = Duration::from_secs(5);

/// A random number from the standard library's randomly keyed hasher: jitter needs no more.
pub(crate) fn random() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(crate::util::time::now_millis());
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_with_jitter_and_reset() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        let delays: Vec<_> = (0..8).map(|_| b.next_delay()).collect();
        let ceilings = [100, 200, 400, 800, 1000, 1000, 1000, 1000];
        for (delay, ceiling) in delays.iter().zip(ceilings) {
            let ceiling = Duration::from_millis(ceiling);
            assert!(
                *delay >= ceiling / 2 && *delay <= ceiling,
                "{delay:?} not in [{:?}, {ceiling:?}]",
                ceiling / 2
            );
        }
        assert!(delays[4..].windows(2).any(|w| w[0] != w[1]), "capped delays are jittered");
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn a_connection_that_dies_young_keeps_the_waits_growing() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(10_000));
        for _ in 0..5 {
            b.next_delay();
            b.connection_ended(Duration::from_millis(50));
        }
        assert!(b.next_delay() >= Duration::from_millis(1_600), "five young deaths are five failures");
        b.connection_ended(STEADY);
        assert!(b.next_delay() <= Duration::from_millis(100), "a connection that lived starts over");
    }
}
