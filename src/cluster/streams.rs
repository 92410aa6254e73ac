//! Which instance holds each upstream stream (`[[streams]]`) in cluster mode: one at a time in
//! the whole cluster. A stream has no acknowledgement and its server sends its feed to every
//! connection, so two instances connected to it would take every message twice.
//!
//! The holder of a stream is the live member of highest rendezvous weight for its name
//! ([`rendezvous::stream_holder`]), as a partition's owner is. An instance connects only while
//! it is the holder *and* no other live member's heartbeat says that it still holds the stream:
//! when the holder changes, the previous one lets go first (it stops reading, finishes what it
//! read, closes the socket, and says so in its next heartbeat), and only then does the next
//! one connect. A holder that crashed is out as soon as the broker says its connection is gone
//! ([`super::membership::is_gone`]), a leaving one at once. The streams' messages belong to
//! their conversations' partitions, like any front-door message's.

use super::membership::Members;
use super::rendezvous;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// The streams of one instance's configuration, and which of them it may hold now.
pub(crate) struct StreamHolds {
    names: Vec<String>,
    /// The streams this instance may hold, as the members were last compared.
    granted: watch::Sender<BTreeSet<String>>,
    /// The streams whose connection runs here now: the heartbeats list them.
    holding: Arc<Mutex<BTreeSet<String>>>,
}

/// What [`StreamHolds::decide`] found: members to ask the broker about.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Decided {
    /// Presences of members that still say they hold a stream this instance is to hold.
    pub waiting_on: Vec<String>,
}

impl StreamHolds {
    pub(crate) fn new(names: Vec<String>) -> StreamHolds {
        StreamHolds { names, granted: watch::Sender::new(BTreeSet::new()), holding: Arc::default() }
    }

    /// Compares the streams with the `live` members: grants this `instance` each stream it is
    /// the holder of once no other member holds it, and takes back every other.
    pub(crate) fn decide(&self, instance: &str, live: &[String], members: &Members) -> Decided {
        let mut decided = Decided::default();
        let mut granted = BTreeSet::new();
        for name in &self.names {
            if rendezvous::stream_holder(name, live) != Some(instance) {
                continue;
            }
            let elsewhere = members.holding_elsewhere(name);
            if elsewhere.is_empty() {
                granted.insert(name.clone());
            }
            decided.waiting_on.extend(elsewhere);
        }
        self.granted.send_if_modified(|current| {
            let changed = *current != granted;
            *current = granted;
            changed
        });
        decided
    }

    /// Takes every stream back: the broker connection is gone, and with it this instance's
    /// place among the members.
    pub(crate) fn revoke_all(&self) {
        self.granted.send_if_modified(|current| {
            let changed = !current.is_empty();
            current.clear();
            changed
        });
    }

    /// The streams connected here now, for the heartbeats.
    pub(crate) fn holding(&self) -> Vec<String> {
        self.holding.lock().expect("holding").iter().cloned().collect()
    }

    /// The grants as they change.
    pub(crate) fn grants(&self) -> watch::Receiver<BTreeSet<String>> {
        self.granted.subscribe()
    }

    /// Notes that `stream`'s connection runs here until the returned guard is dropped.
    pub(crate) fn hold(&self, stream: &str) -> Holding {
        self.holding.lock().expect("holding").insert(stream.to_owned());
        Holding { holding: self.holding.clone(), stream: stream.to_owned() }
    }
}

/// A stream held here: dropped when its connection is closed and what it read is finished.
pub(crate) struct Holding {
    holding: Arc<Mutex<BTreeSet<String>>>,
    stream: String,
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.holding.lock().expect("holding").remove(&self.stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::membership::Heartbeat;

    fn beat(instance: &str, streams: &[&str]) -> Heartbeat {
        Heartbeat {
            instance: instance.into(),
            presence: format!("q-{instance}"),
            subscribed: Vec::new(),
            owned: Vec::new(),
            streams: streams.iter().map(|s| (*s).to_owned()).collect(),
            leaving: false,
        }
    }

    #[test]
    fn a_stream_is_granted_to_its_holder_only_once_no_other_member_holds_it() {
        let live = vec!["a".to_owned(), "b".to_owned()];
        let feed = "feed";
        let holder = rendezvous::stream_holder(feed, &live).unwrap().to_owned();
        let other = if holder == "a" { "b" } else { "a" };
        let holds = StreamHolds::new(vec![feed.to_owned()]);
        let mut members = Members::new(&holder);
        members.heard(beat(other, &[feed]));
        let decided = holds.decide(&holder, &live, &members);
        assert!(holds.grants().borrow().is_empty(), "the other still holds it");
        assert_eq!(decided.waiting_on, [format!("q-{other}")]);

        members.heard(beat(other, &[]));
        assert_eq!(holds.decide(&holder, &live, &members), Decided::default());
        assert!(holds.grants().borrow().contains(feed), "let go of: granted");
        let other_holds = StreamHolds::new(vec![feed.to_owned()]);
        other_holds.decide(other, &live, &members);
        assert!(
            other_holds.grants().borrow().is_empty(),
            "a member that is not its holder is never granted it"
        );

        holds.revoke_all();
        assert!(holds.grants().borrow().is_empty());
    }

    #[test]
    fn holding_lasts_as_long_as_its_guard() {
        let holds = StreamHolds::new(vec!["feed".to_owned()]);
        let guard = holds.hold("feed");
        assert_eq!(holds.holding(), ["feed"]);
        drop(guard);
        assert!(holds.holding().is_empty());
    }
}
