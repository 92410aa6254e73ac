//! Conversation sessions: an NLIP conversation token maps to a 2-character SILP session id;
//! every message is a turn; every N turns (the heartbeat) the session renews, and the next
//! message carries a renewal notice; a session idle for too long expires.
//!
//! A renewal notice is a submessage of the message it comes with (labelled
//! [`RENEWAL_LABEL`]), never a message of its own: an agent that answers each call (HTTP, A2A,
//! MCP) would otherwise be called for it, and an asker waiting for one answer would get the
//! notice in the answer's place. Connectors that cannot carry a submessage carry it in their
//! protocol's metadata (A2A `metadata`, MCP `_meta`).
//!
//! Ids are two characters from `a-z0-9`, as the draft asks, and their scope is the conversation
//! (SILP draft -02: `session_id` is a correlation convenience within an external uniqueness
//! scope; the NLIP conversation token, which travels with every message, is that scope). An id
//! is derived from the token, so it needs no allocation and no index, two conversations may
//! share one, and the number of live conversations is bounded only by memory and disk. An
//! expired session stays as a tombstone, so that its conversation answers `session_expired`,
//! until the store sweeps it.
//!
//! In a cluster, a session remembers its conversation's partition, whose changelog carries it.

use super::error::GatewayError;
use super::store::Turn;
use super::store::{Millis, SessionRecord, Store};
use crate::nlip::{Content, Format, Submessage};
use serde_json::{Value, json};

const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";
/// The heartbeat value that means "never renew".
pub(crate) const NO_HEARTBEAT: u32 = 9999;

/// One slice of the session id space: the ids at positions `index`, `index + count`, ...
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    pub index: u16,
    pub count: u16,
}

impl Partition {
    /// Whether `id` lies in this slice.
    pub(crate) fn holds(&self, id: &str) -> bool {
        id_position(id).is_some_and(|p| p % usize::from(self.count.max(1)) == usize::from(self.index))
    }
}

/// Where an id sits in the allocation order, if it is a well-formed id.
fn id_position(id: &str) -> Option<usize> {
    let &[a, b] = id.as_bytes() else { return None };
    let digit = |c: u8| ALPHABET.iter().position(|&x| x == c);
    Some(digit(a)? * ALPHABET.len() + digit(b)?)
}

/// Session settings.
#[derive(Debug, Clone, Copy)]
pub struct SessionPolicy {
    pub heartbeat: u32,
    pub idle_timeout_ms: Millis,
    /// The slice new sessions take their ids from; `None`: the whole space.
    pub partition: Option<Partition>,
}

/// Counts one turn of the conversation `token`, creating its session on the first turn.
/// Returns the turn and the session record to commit; nothing is written here.
///
/// A conversation begun by a principal is that principal's: `party` another client is
/// refused (`forbidden`).
pub fn count_turn(
    store: &dyn Store,
    token: &str,
    now: Millis,
    policy: &SessionPolicy,
    party: Party<'_>,
) -> Result<(Turn, SessionRecord), GatewayError> {
    let mut record = match store.session_by_token(token)? {
        Some(record) if !party.may_continue(&record) => return Err(not_the_owner()),
        // A claim (a conversation begun without a turn, [`claim`]) begins its session with
        // the first turn, whenever that comes; it keeps its owner.
        Some(record) if record.turns == 0 => SessionRecord {
            owner: record.owner,
            ..SessionRecord::begin(record.id, token, policy.heartbeat, now, policy.partition.map(|p| p.index))
        },
        // An idle session stays expired: its last activity does not move any more.
        Some(record)
            if record.expired || now.saturating_sub(record.last_activity) > policy.idle_timeout_ms =>
        {
            return Err(GatewayError::SessionExpired { id: record.id });
        }
        Some(record) => record,
        None => begun(token, now, policy, party.subject()),
    };
    record.turns += 1;
    let renewed = std::mem::take(&mut record.renewal_due);
    record.renewal_due =
        record.heartbeat < NO_HEARTBEAT && record.turns % u64::from(record.heartbeat.max(1)) == 0;
    record.last_activity = now;
    let turn = Turn { id: record.id.clone(), turn: record.turns, renewed };
    Ok((turn, record))
}

/// Who a message of a conversation comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Party<'a> {
    /// A door's client: the subject of its principal, when clients authenticate.
    Client(Option<&'a str>),
    /// An agent answering: its answer belongs to the conversation it answers.
    Agent,
}

impl<'a> Party<'a> {
    /// True when this party may continue the conversation of `record`: an agent answering,
    /// the principal that began it, or anyone when no authenticated principal did.
    fn may_continue(self, record: &SessionRecord) -> bool {
        match self {
            Party::Agent => true,
            Party::Client(sender) => record.owner.as_deref().is_none_or(|owner| is_owner(owner, sender)),
        }
    }

    /// The principal a conversation this party begins belongs to.
    fn subject(self) -> Option<&'a str> {
        match self {
            Party::Client(sender) => sender,
            Party::Agent => None,
        }
    }
}

/// Whether `sender` is `owner`. Owners recorded before subjects were qualified by their source
/// (`alice`, where one is now `jwt:alice`) are matched by name, so that an upgrade locks
/// nobody out of a conversation it began; they go as their sessions expire.
fn is_owner(owner: &str, sender: Option<&str>) -> bool {
    let Some(sender) = sender else { return false };
    owner == sender || (!owner.contains(':') && sender.split_once(':').is_some_and(|(_, name)| name == owner))
}

/// A message of conversation `token` that counts no turn (plain text, no SILP): refused to
/// `party` when another principal began the conversation. When it begins the conversation and
/// its sender is a principal, the record to commit: the principal's claim, a session with no
/// turn yet, so that a conversation is its first sender's whatever its first payload was.
/// Anonymous senders claim nothing (their conversations are anyone's).
pub fn claim(
    store: &dyn Store,
    token: &str,
    now: Millis,
    policy: &SessionPolicy,
    party: Party<'_>,
) -> Result<Option<SessionRecord>, GatewayError> {
    match store.session_by_token(token)? {
        Some(record) if !party.may_continue(&record) => Err(not_the_owner()),
        Some(_) => Ok(None),
        None => Ok(party.subject().map(|owner| begun(token, now, policy, Some(owner)))),
    }
}

/// The session of conversation `token` that `owner` begins `now`, before its first turn.
fn begun(token: &str, now: Millis, policy: &SessionPolicy, owner: Option<&str>) -> SessionRecord {
    SessionRecord {
        owner: owner.map(str::to_owned),
        ..SessionRecord::begin(id_for(token), token, policy.heartbeat, now, policy.partition.map(|p| p.index))
    }
}

fn not_the_owner() -> GatewayError {
    GatewayError::Forbidden("this conversation was begun by another principal")
}

/// The session as it stood before `turn` was counted, if `now` is the session just after it
/// (no later turn counted, not expired since). Its last activity stays: the message that
/// counted the turn was activity too.
pub(crate) fn uncount_turn(now: &SessionRecord, turn: &Turn) -> Option<SessionRecord> {
    let counted_last = now.id == turn.id && now.turns == turn.turn && !now.expired;
    let turns = now.turns.checked_sub(1).filter(|_| counted_last)?;
    Some(SessionRecord { turns, renewal_due: turn.renewed, ..now.clone() })
}

/// The label of the submessage that tells a message's receiver that its session renewed.
pub(crate) const RENEWAL_LABEL: &str = "silp-renewal";

/// The renewal notice for a renewed turn: `{"silp":"v1","session":..,"renewed":true,"turn":..}`
/// as a `structured`/`json` submessage labelled [`RENEWAL_LABEL`].
pub(crate) fn renewal_notice(turn: &Turn) -> Submessage {
    Submessage::new(Format::Structured, "json", Content::Json(renewal_content(turn)))
        .with_label(RENEWAL_LABEL)
}

fn renewal_content(turn: &Turn) -> Value {
    json!({ "silp": "v1", "session": turn.id, "renewed": true, "turn": turn.turn })
}

/// Whether a submessage is a renewal notice. Notices are silpgate's own: one that arrives on a
/// message (an agent echoing its request) is dropped before the message goes on.
pub fn is_renewal_notice(submessage: &Submessage) -> bool {
    submessage.label.as_deref() == Some(RENEWAL_LABEL)
}

/// The session id of a conversation: two characters of `a-z0-9` taken from the SHA-256 of its
/// token, the same on every instance and after every restart.
pub fn id_for(token: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(token.as_bytes());
    let position =
        usize::from(u16::from_be_bytes([digest[0], digest[1]])) % (ALPHABET.len() * ALPHABET.len());
    let pair = [ALPHABET[position / ALPHABET.len()], ALPHABET[position % ALPHABET.len()]];
    String::from_utf8(pair.to_vec()).expect("ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::store::{Changes, MemoryStore};

    /// Counts a turn and commits it, as the core does.
    fn turn(
        store: &MemoryStore,
        token: &str,
        now: Millis,
        policy: &SessionPolicy,
    ) -> Result<Turn, GatewayError> {
        let (turn, record) = count_turn(store, token, now, policy, Party::Client(None))?;
        store.commit(&Changes { sessions: vec![record], ..Changes::default() }, now)?;
        Ok(turn)
    }

    const POLICY: SessionPolicy = SessionPolicy { heartbeat: 5, idle_timeout_ms: 1_000, partition: None };

    #[test]
    fn a_conversation_keeps_one_id_and_renews_every_n_turns() {
        let store = MemoryStore::new();
        let turns: Vec<Turn> = (0..11).map(|i| turn(&store, "conv-1", i, &POLICY).unwrap()).collect();
        assert!(turns.iter().all(|t| t.id == id_for("conv-1")));
        assert_eq!(turns.iter().map(|t| t.turn).collect::<Vec<_>>(), (1..=11).collect::<Vec<_>>());
        // Renewed after turns 5 and 10: turns 6 and 11 carry the notice.
        let renewed: Vec<u64> = turns.iter().filter(|t| t.renewed).map(|t| t.turn).collect();
        assert_eq!(renewed, [6, 11]);
        assert_eq!(turn(&store, "conv-2", 20, &POLICY).unwrap().id, id_for("conv-2"));
    }

    /// A principal's plain-text first message claims the conversation; the claim never
    /// expires into a refusal of its own first turn, which begins the session (turn 1) at
    /// that turn's time; anonymous senders claim nothing.
    #[test]
    fn a_claim_keeps_a_conversation_its_owners_until_its_first_turn_begins_the_session() {
        let store = MemoryStore::new();
        let claimed =
            claim(&store, "c", 10, &POLICY, Party::Client(Some("alice"))).unwrap().expect("a claim");
        assert_eq!((claimed.turns, claimed.owner.as_deref()), (0, Some("alice")));
        store.commit(&Changes { sessions: vec![claimed], ..Changes::default() }, 10).unwrap();
        assert!(matches!(
            claim(&store, "c", 20, &POLICY, Party::Client(Some("bob"))),
            Err(GatewayError::Forbidden(_))
        ));
        assert!(matches!(
            count_turn(&store, "c", 20, &POLICY, Party::Client(Some("bob"))),
            Err(GatewayError::Forbidden(_))
        ));
        assert_eq!(
            claim(&store, "c", 20, &POLICY, Party::Client(Some("alice"))).unwrap(),
            None,
            "claimed once"
        );
        // Long after the idle timeout, the owner's first turn begins the session.
        let (turn, record) = count_turn(&store, "c", 50_000, &POLICY, Party::Client(Some("alice"))).unwrap();
        assert_eq!((turn.turn, record.started, record.owner.as_deref()), (1, 50_000, Some("alice")));
        assert_eq!(
            claim(&store, "d", 10, &POLICY, Party::Client(None)).unwrap(),
            None,
            "anonymous: anyone's"
        );
    }

    #[test]
    fn an_owner_recorded_before_subjects_were_qualified_is_still_its_conversations_owner() {
        assert!(is_owner("jwt:alice", Some("jwt:alice")));
        assert!(!is_owner("jwt:alice", Some("token:alice")), "another source is another principal");
        assert!(is_owner("alice", Some("jwt:alice")), "a plain owner from before");
        assert!(!is_owner("alice", Some("jwt:bob")) && !is_owner("alice", None));
    }

    #[test]
    fn a_session_id_is_the_same_on_every_instance_and_build() {
        // Computed apart from this code, from the definition: the first two bytes of the
        // token's SHA-256, big-endian, modulo 36², as two characters of `a-z0-9`.
        let ids: Vec<String> = ["conv-1", "conv-A", "py-1", ""].into_iter().map(id_for).collect();
        assert_eq!(ids, ["0k", "fg", "kh", "9e"]);
    }

    #[test]
    fn heartbeat_9999_never_renews_and_1_renews_every_turn() {
        let store = MemoryStore::new();
        let never = SessionPolicy { heartbeat: NO_HEARTBEAT, ..POLICY };
        assert!((0..30).all(|i| !turn(&store, "a", i, &never).unwrap().renewed));
        let always = SessionPolicy { heartbeat: 1, ..POLICY };
        let renewed: Vec<bool> = (0..4).map(|i| turn(&store, "b", i, &always).unwrap().renewed).collect();
        assert_eq!(renewed, [false, true, true, true]);
    }

    #[test]
    fn an_idle_session_expires_and_stays_expired() {
        let store = MemoryStore::new();
        turn(&store, "c", 0, &POLICY).unwrap();
        assert!(matches!(turn(&store, "c", 5_000, &POLICY), Err(GatewayError::SessionExpired { .. })));
        assert!(matches!(turn(&store, "c", 5_001, &POLICY), Err(GatewayError::SessionExpired { .. })));
    }

    #[test]
    fn a_turn_taken_back_is_counted_again_as_it_was_and_a_later_turn_keeps_it() {
        let store = MemoryStore::new();
        for i in 0..4 {
            turn(&store, "back", i, &POLICY).unwrap();
        }
        // Turn 5 renews the context after it; taken back, turn 5 is counted again the same.
        let (fifth, after) = count_turn(&store, "back", 5, &POLICY, Party::Client(None)).unwrap();
        let before = store.session_by_token("back").unwrap().unwrap();
        let taken_back = uncount_turn(&after, &fifth).expect("the last turn counted");
        assert_eq!((taken_back.turns, taken_back.renewal_due), (before.turns, before.renewal_due));
        store.commit(&Changes { sessions: vec![after.clone()], ..Changes::default() }, 5).unwrap();
        let sixth = count_turn(&store, "back", 6, &POLICY, Party::Client(None)).unwrap().1;
        assert_eq!(uncount_turn(&sixth, &fifth), None, "a later turn keeps it");
        let renewed = Turn { renewed: true, ..fifth.clone() };
        assert!(uncount_turn(&after, &renewed).unwrap().renewal_due, "the notice is due again");
        let other = Turn { id: "zz".into(), ..fifth };
        assert_eq!(uncount_turn(&after, &other), None, "another session's turn");
    }

    #[test]
    fn a_turn_counted_on_state_that_moved_meanwhile_is_refused() {
        let store = MemoryStore::new();
        turn(&store, "busy", 0, &POLICY).unwrap();
        // Two messages of one conversation plan from the same state...
        let (_, first) = count_turn(&store, "busy", 1, &POLICY, Party::Client(None)).unwrap();
        let (_, second) = count_turn(&store, "busy", 2, &POLICY, Party::Client(None)).unwrap();
        let commit = |record: SessionRecord| {
            let seen = vec![(record.token.clone(), record.turns - 1)];
            store.commit(&Changes { sessions: vec![record], turns_seen: seen, ..Changes::default() }, 3)
        };
        commit(first).unwrap();
        // ...and the second, planned on turn 1 while the store is at turn 2, must plan again.
        assert!(matches!(commit(second), Err(crate::gateway::store::StoreError::Conflict(_))));
        assert_eq!(turn(&store, "busy", 4, &POLICY).unwrap().turn, 3, "no turn lost");
    }

    #[test]
    fn conversations_are_not_capped_by_the_id_space() {
        let store = MemoryStore::new();
        // Far more conversations than there are two-character ids: none is refused.
        for i in 0..5_000 {
            let t = turn(&store, &format!("t{i}"), 0, &POLICY).unwrap();
            assert_eq!(t.id, id_for(&format!("t{i}")), "a conversation's id comes from its token");
            assert_eq!(t.id.len(), 2);
        }
        assert_eq!(turn(&store, "t42", 1, &POLICY).unwrap().turn, 2, "each conversation keeps its own turns");
    }
}
