//! Rate limits (ECMA-434 profile 2 "throttling"): a token bucket per client (its bearer token,
//! or its address when no tokens are configured) and per WebSocket connection. A message over
//! the limit is answered `rate_limited`, not dropped silently.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// A token bucket: `rate` messages per second on average, bursts of up to `burst`.
#[derive(Debug, Clone)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    pub fn new(rate: f64, burst: f64) -> Self {
        Bucket { rate, burst, tokens: burst, last: Instant::now() }
    }

    /// Takes one token; `false` when the bucket is empty. A rate of 0 means no limit.
    pub fn take(&mut self, now: Instant) -> bool {
        if self.rate <= 0.0 {
            return true;
        }
        let refill = now.saturating_duration_since(self.last).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + refill).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Seconds until a token is available again.
    pub fn retry_after(&self) -> u64 {
        if self.rate <= 0.0 { 0 } else { ((1.0 - self.tokens).max(0.0) / self.rate).ceil() as u64 }
    }
}

/// One bucket per client, forgotten when idle.
#[derive(Debug)]
pub struct PerClient {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

/// Clients are forgotten once this many are tracked and theirs is full again.
const MAX_TRACKED: usize = 100_000;

impl PerClient {
    pub fn new(rate: f64, burst: f64) -> Self {
        PerClient { rate, burst, buckets: Mutex::new(HashMap::new()) }
    }

    /// Admits one message from `client`, or says how many seconds to wait.
    pub fn admit(&self, client: &str) -> Result<(), u64> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if buckets.len() >= MAX_TRACKED {
            let (rate, burst) = (self.rate, self.burst);
            buckets.retain(|_, b| {
                let mut probe = b.clone();
                probe.take(now);
                probe.tokens + 1.0 < burst.min(rate * 3600.0)
            });
        }
        if !buckets.contains_key(client) {
            buckets.insert(client.to_owned(), Bucket::new(self.rate, self.burst));
        }
        let bucket = buckets.get_mut(client).expect("inserted above");
        if bucket.take(now) { Ok(()) } else { Err(bucket.retry_after().max(1)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let start = Instant::now();
        let mut b = Bucket::new(10.0, 3.0);
        assert!((0..3).all(|_| b.take(start)));
        assert!(!b.take(start));
        assert!(b.take(start + Duration::from_millis(100)));
        assert!(!b.take(start + Duration::from_millis(110)));
    }

    #[test]
    fn clients_have_their_own_buckets() {
        let limits = PerClient::new(1.0, 2.0);
        assert_eq!(limits.admit("a"), Ok(()));
        assert_eq!(limits.admit("a"), Ok(()));
        assert!(limits.admit("a").is_err());
        assert_eq!(limits.admit("b"), Ok(()));
        assert_eq!(PerClient::new(0.0, 0.0).admit("anyone"), Ok(()));
    }
}
