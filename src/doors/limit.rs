//! Rate limits (ECMA-434 profile 2 "throttling"): a token bucket per client (its bearer token,
//! or its address when no tokens are configured) and per WebSocket connection. A message over
//! the limit is answered `rate_limited`, not dropped silently.

use crate::code::Code;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// A token bucket: `rate` messages per second on average, bursts of up to `burst`.
#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    pub(crate) fn new(rate: f64, burst: f64) -> Self {
        Bucket { rate, burst, tokens: burst, last: Instant::now() }
    }

    /// Takes one token; `false` when the bucket is empty. A rate of 0 means no limit.
    pub(crate) fn take(&mut self, now: Instant) -> bool {
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
    pub(crate) fn retry_after(&self) -> u64 {
        if self.rate <= 0.0 { 0 } else { ((1.0 - self.tokens).max(0.0) / self.rate).ceil() as u64 }
    }
}

/// One bucket per client, forgotten when idle. A reload sets new limits ([`PerClient::set`]).
#[derive(Debug)]
pub(crate) struct PerClient {
    buckets: Mutex<Buckets>,
}

#[derive(Debug)]
struct Buckets {
    rate: f64,
    burst: f64,
    by_client: HashMap<String, Bucket>,
}

/// Clients are forgotten once this many are tracked and theirs is full again.
const MAX_TRACKED: usize = 100_000;

impl PerClient {
    pub(crate) fn new(rate: f64, burst: f64) -> Self {
        PerClient { buckets: Mutex::new(Buckets { rate, burst, by_client: HashMap::new() }) }
    }

    /// New limits, from the next message on. Every client starts again with a full bucket of
    /// the new size: carrying a level over from a bucket of another size would be a guess.
    pub(crate) fn set(&self, rate: f64, burst: f64) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if (buckets.rate, buckets.burst) != (rate, burst) {
            *buckets = Buckets { rate, burst, by_client: HashMap::new() };
        }
    }

    /// Admits one message from `client`, or says how many seconds to wait.
    pub(crate) fn admit(&self, client: &str) -> Result<(), u64> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Buckets { rate, burst, by_client } = &mut *buckets;
        if *rate <= 0.0 {
            return Ok(());
        }
        if by_client.len() >= MAX_TRACKED {
            let (rate, burst) = (*rate, *burst);
            by_client.retain(|_, b| {
                let mut probe = b.clone();
                probe.take(now);
                probe.tokens + 1.0 < burst.min(rate * 3600.0)
            });
        }
        let bucket = by_client.entry(client.to_owned()).or_insert_with(|| Bucket::new(*rate, *burst));
        if bucket.take(now) { Ok(()) } else { Err(bucket.retry_after().max(1)) }
    }
}

/// Live conversations per client: a client may keep at most `max` conversations active (each
/// seen within `idle`); a message that would open one more is refused, and nothing of it is
/// handled or stored. It keeps one client from taking every session a gateway can hold.
#[derive(Debug)]
pub(crate) struct Conversations {
    /// A reload sets it ([`Conversations::set_max`]).
    max: std::sync::atomic::AtomicUsize,
    idle: std::time::Duration,
    by_client: Mutex<HashMap<String, HashMap<String, Instant>>>,
}

impl Conversations {
    /// `max` 0: no limit.
    pub(crate) fn new(max: usize, idle: std::time::Duration) -> Self {
        Conversations { max: max.into(), idle, by_client: Mutex::new(HashMap::new()) }
    }

    /// A new limit, from the next message on; the conversations already live stay counted.
    pub(crate) fn set_max(&self, max: usize) {
        self.max.store(max, std::sync::atomic::Ordering::Relaxed);
    }

    /// Admits a message of `conversation` (its token, if it has one) from `client`; `Err` with
    /// the limit when it would open a conversation past it.
    pub(crate) fn admit(&self, client: &str, conversation: Option<&str>, now: Instant) -> Result<(), usize> {
        let max = self.max.load(std::sync::atomic::Ordering::Relaxed);
        let Some(token) = conversation.filter(|_| max > 0) else { return Ok(()) };
        let mut by_client = self.by_client.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if by_client.len() >= MAX_TRACKED {
            let idle = self.idle;
            by_client.retain(|_, live| live.values().any(|seen| now.saturating_duration_since(*seen) < idle));
        }
        let live = by_client.entry(client.to_owned()).or_default();
        if let Some(seen) = live.get_mut(token) {
            *seen = now;
            return Ok(());
        }
        if live.len() >= max {
            let idle = self.idle;
            live.retain(|_, seen| now.saturating_duration_since(*seen) < idle);
        }
        if live.len() >= max {
            return Err(max);
        }
        live.insert(token.to_owned(), now);
        Ok(())
    }
}

/// The error message for a message that would open a conversation past its client's limit.
pub(crate) fn too_many_conversations(limit: usize) -> crate::nlip::Message {
    let detail = format!(
        "this client has {limit} live conversations, its limit; continue one of them, or start a new one once one has been idle long enough to expire"
    );
    crate::nlip::reply::error_message(
        Code::TooManyConversations.as_str(),
        &detail,
        &crate::nlip::reply::Location::None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_keeps_its_conversations_and_opens_no_more_than_its_limit() {
        let limit = Conversations::new(2, std::time::Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(limit.admit("a", Some("c1"), t0), Ok(()));
        assert_eq!(limit.admit("a", Some("c2"), t0), Ok(()));
        assert_eq!(limit.admit("a", Some("c3"), t0), Err(2), "a third conversation is refused");
        assert_eq!(limit.admit("a", Some("c1"), t0), Ok(()), "its own conversations go on");
        assert_eq!(limit.admit("b", Some("c3"), t0), Ok(()), "another client has its own limit");
        assert_eq!(limit.admit("a", None, t0), Ok(()), "a message without a conversation opens none");
        let later = t0 + std::time::Duration::from_secs(61);
        assert_eq!(limit.admit("a", Some("c3"), later), Ok(()), "idle conversations free their place");
    }
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

    #[test]
    fn new_limits_apply_from_the_next_message_on() {
        let limits = PerClient::new(0.001, 1.0);
        assert_eq!(limits.admit("a"), Ok(()));
        assert!(limits.admit("a").is_err(), "the burst is spent");
        limits.set(0.0, 0.0);
        assert_eq!(limits.admit("a"), Ok(()), "no limit after the change");
        limits.set(0.001, 2.0);
        assert_eq!(
            (limits.admit("a"), limits.admit("a")),
            (Ok(()), Ok(())),
            "a fresh bucket of the new size"
        );
        assert!(limits.admit("a").is_err());
        let conversations = Conversations::new(0, std::time::Duration::from_secs(60));
        let now = Instant::now();
        assert_eq!(conversations.admit("a", Some("c1"), now), Ok(()));
        conversations.set_max(1);
        assert_eq!(conversations.admit("a", Some("c2"), now), Ok(()), "c1 was not counted while unlimited");
        assert_eq!(conversations.admit("a", Some("c3"), now), Err(1));
        assert_eq!(conversations.admit("a", Some("c2"), now), Ok(()), "the live one goes on");
    }
}
