//! The NLIP AMQP binding on AMQP 0-9-1 message properties: what an inbound delivery says about
//! itself (encoding, reply addresses, correlation, identity) and the properties silpgate puts
//! on everything it publishes.
//!
//! The binding (ECMA-433 working draft) maps one NLIP message to one AMQP message, with
//! `content-type` `application/json` or `application/cbor`, `correlation-id` copied to the
//! response, the response sent to `reply-to`, and `nlip-reply-<content-type>` application
//! properties (AMQP 0-9-1 headers here) asking for responses in several encodings at several
//! addresses. RabbitMQ's default exchange routes a reply to the queue `reply-to` names.

use crate::nlip::Encoding;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

/// Header prefix of the binding's multi-format reply requests.
const REPLY_HEADER_PREFIX: &str = "nlip-reply-";
/// Header that carries an inbound message's `user_id` onward: RabbitMQ refuses a publish whose
/// `user_id` is not the publishing connection's user, so the property itself cannot travel.
pub const USER_ID_HEADER: &str = "nlip-user-id";
/// Dead-letter headers: the error code and the human-readable reason.
pub(crate) const ERROR_CODE_HEADER: &str = "x-silpgate-error-code";
pub(crate) const ERROR_HEADER: &str = "x-silpgate-error";
/// Dead-letter header: the queue the message was consumed from.
pub(crate) const SOURCE_QUEUE_HEADER: &str = "x-silpgate-source-queue";
/// In a cluster: the inbound queue a message first arrived at, kept when silpgate forwards it
/// to its partition, so that routes still match on it.
pub const SOURCE_HEADER: &str = "x-silpgate-source";
/// In a cluster: the instance that forwarded a front-door message to its partition's owner.
/// Believed only on a message whose broker-checked `user_id` is silpgate's own broker user.
pub(crate) const FORWARDED_HEADER: &str = "x-silpgate-forwarded-by";
/// On every reply silpgate publishes for a message: its place among that message's replies,
/// `<index>/<count>`, so that an instance waiting for a forwarded message's replies puts them
/// in order (they may be taken side by side) and knows when it has them all.
pub(crate) const REPLY_HEADER: &str = "x-silpgate-reply";
/// In a cluster: the principal of a front-door message another instance forwarded, as JSON.
/// Believed only where [`FORWARDED_HEADER`] is (the broker-checked `user_id` is silpgate's).
pub(crate) const PRINCIPAL_HEADER: &str = "x-silpgate-principal";
/// On a request: its sender takes interim replies (an agent's progress) before the answer.
pub const PROGRESS_HEADER: &str = "x-silpgate-progress";
/// On a reply to a sender that takes interim replies: `progress` on each interim one,
/// `final` on the answer, which ends the replies to its request.
pub const REPLY_KIND_HEADER: &str = "x-silpgate-reply-kind";
/// Longest error text put in a header.
const MAX_ERROR_HEADER: usize = 4096;

/// Longest queue name AMQP allows (a short string): a longer reply address names no queue.
const MAX_QUEUE_NAME: usize = 255;

/// Persistent delivery mode.
const PERSISTENT: u8 = 2;

/// What an inbound delivery's properties say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Envelope {
    /// The encoding the body is in; `Err` holds an unsupported content type.
    pub encoding: Result<Encoding, String>,
    pub message_id: Option<String>,
    pub correlation_id: Option<String>,
    pub reply_to: Option<String>,
    pub user_id: Option<String>,
    /// Where replies go, in which encoding: the `nlip-reply-*` headers, else `reply_to` in the
    /// inbound encoding, else nowhere.
    pub replies: Vec<(Encoding, String)>,
    /// Deliveries of this message before this one, as the broker counts them (quorum queues'
    /// `x-delivery-count`; classic queues only say whether it is a redelivery).
    pub earlier_deliveries: u32,
    /// The inbound queue a partitioned message first arrived at ([`SOURCE_HEADER`]), or the
    /// front door of a forwarded one.
    pub source: Option<String>,
    /// The instance that forwarded a front-door message here ([`FORWARDED_HEADER`]).
    pub forwarded_by: Option<String>,
    /// This reply's place among the replies to one message: index and count ([`REPLY_HEADER`];
    /// the only one without it).
    pub reply_place: (usize, usize),
    /// The sender takes interim replies ([`PROGRESS_HEADER`]).
    pub wants_progress: bool,
    /// The principal a forwarding instance verified ([`PRINCIPAL_HEADER`]); believe it only
    /// of a message [`Envelope::forwarded_by_silpgate`].
    pub forwarded_principal: Option<crate::principal::Principal>,
    /// The broker-checked user a partition message's sender had ([`USER_ID_HEADER`], which
    /// the ingress sets from the `user_id` the broker checked, and nothing else): believe it
    /// only of a message taken from a partition queue.
    pub partitioned_user: Option<String>,
}

impl Envelope {
    /// Decodes a delivery's body by its content type, under `limits`.
    ///
    /// # Errors
    /// The body does not decode, or its content type is neither JSON nor CBOR.
    pub(crate) fn decode(
        &self,
        body: &[u8],
        limits: &crate::nlip::Limits,
    ) -> Result<crate::nlip::Message, crate::nlip::NlipError> {
        match &self.encoding {
            Ok(encoding) => crate::nlip::decode(body, *encoding, limits),
            Err(content_type) => Err(crate::nlip::NlipError::new(
                crate::nlip::NlipErrorKind::InvalidEncoding,
                format!("content type '{content_type}' is neither application/json nor application/cbor"),
            )),
        }
    }

    /// Reads the properties of a delivery.
    pub(crate) fn read(properties: &BasicProperties, redelivered: bool) -> Envelope {
        let text =
            |v: &Option<ShortString>| v.as_ref().map(|s| s.as_str().to_owned()).filter(|s| !s.is_empty());
        // A missing content type is read as JSON, the binding's text form; an unknown one is an
        // error the sender hears about.
        let encoding = match properties.content_type() {
            None => Ok(Encoding::Json),
            Some(ct) => Encoding::from_content_type(ct.as_str()).ok_or_else(|| ct.as_str().to_owned()),
        };
        let headers = properties.headers().as_ref();
        let mut replies = headers.map(reply_addresses).unwrap_or_default();
        let reply_to = text(properties.reply_to());
        if replies.is_empty()
            && let Some(address) = &reply_to
        {
            // A sender whose content type is not understood still hears why, in JSON.
            replies.push((encoding.clone().unwrap_or(Encoding::Json), address.clone()));
        }
        let earlier_deliveries = headers
            .and_then(|h| h.inner().get("x-delivery-count"))
            .and_then(value_number)
            .unwrap_or(u32::from(redelivered));
        let header = |name: &str| headers.and_then(|h| h.inner().get(name));
        let source = header(SOURCE_HEADER).and_then(value_text);
        let forwarded_by = header(FORWARDED_HEADER).and_then(value_text);
        let reply_place =
            header(REPLY_HEADER).and_then(value_text).and_then(|v| read_place(&v)).unwrap_or((0, 1));
        let wants_progress = match header(PROGRESS_HEADER) {
            Some(AMQPValue::Boolean(yes)) => *yes,
            Some(other) => {
                value_number(other) == Some(1)
                    || value_text(other).is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
            }
            None => false,
        };
        let forwarded_principal =
            header(PRINCIPAL_HEADER).and_then(value_text).and_then(|v| serde_json::from_str(&v).ok());
        Envelope {
            encoding,
            message_id: text(properties.message_id()),
            correlation_id: text(properties.correlation_id()),
            reply_to,
            user_id: text(properties.user_id()),
            replies,
            earlier_deliveries,
            source,
            forwarded_by,
            reply_place,
            wants_progress,
            forwarded_principal,
            partitioned_user: header(USER_ID_HEADER).and_then(value_text),
        }
    }

    /// Whether a silpgate instance forwarded this message from its front door: it says so,
    /// and the broker vouches that it was published as `own_user`, silpgate's own broker user
    /// (RabbitMQ refuses a publish whose `user_id` is not the connection's user). A producer
    /// with a broker user of its own cannot pose as a front door.
    pub(crate) fn forwarded_by_silpgate(&self, own_user: &str) -> bool {
        self.forwarded_by.is_some() && self.user_id.as_deref() == Some(own_user)
    }

    /// The broker user who sent a message taken from a partition queue. What silpgate's own
    /// user published there is the ingress's forward, whose [`USER_ID_HEADER`] carries the
    /// user the broker checked at the inbound queue; anything else was published to the
    /// partition exchange directly, and its sender is its own broker-checked `user_id`,
    /// whatever its headers claim.
    pub(crate) fn partition_sender(&self, own_user: &str) -> Option<&String> {
        if self.user_id.as_deref() == Some(own_user) {
            self.partitioned_user.as_ref()
        } else {
            self.user_id.as_ref()
        }
    }

    /// Properties of a message silpgate publishes on behalf of this one: persistent, in
    /// `encoding`, with its own stable `message_id` and this message's correlation.
    pub(crate) fn outbound_properties(&self, encoding: Encoding, message_id: &str) -> BasicProperties {
        published(Published {
            encoding,
            message_id,
            correlation_id: self.correlation_id.as_deref(),
            reply_to: None,
            replies: &[],
            user_id: self.user_id.as_deref(),
        })
    }
}

/// What a message silpgate publishes says about itself.
pub(crate) struct Published<'a> {
    pub encoding: Encoding,
    /// Stable across redeliveries of what caused it, so that receivers drop duplicates.
    pub message_id: &'a str,
    pub correlation_id: Option<&'a str>,
    pub reply_to: Option<&'a str>,
    /// More reply addresses, as `nlip-reply-<content-type>` headers (those not `reply_to`).
    pub replies: &'a [(Encoding, String)],
    /// The user of the message it was caused by, in a header: the broker refuses a publish
    /// whose `user_id` is not the publishing connection's user.
    pub user_id: Option<&'a str>,
}

/// The properties of a message silpgate publishes: persistent, always with a message id.
pub(crate) fn published(p: Published<'_>) -> BasicProperties {
    let mut properties = BasicProperties::default()
        .with_delivery_mode(PERSISTENT)
        .with_content_type(p.encoding.content_type().into())
        .with_message_id(p.message_id.into());
    if let Some(correlation_id) = p.correlation_id {
        properties = properties.with_correlation_id(correlation_id.into());
    }
    if let Some(reply_to) = p.reply_to {
        properties = properties.with_reply_to(reply_to.into());
    }
    let mut headers = FieldTable::default();
    if let Some(user) = p.user_id {
        headers.insert(USER_ID_HEADER.into(), long_string(user));
    }
    for (encoding, address) in p.replies.iter().filter(|(_, a)| Some(a.as_str()) != p.reply_to) {
        headers
            .insert(format!("{REPLY_HEADER_PREFIX}{}", encoding.content_type()).into(), long_string(address));
    }
    properties.with_headers(headers)
}

/// `properties` marked as a reply of `kind` (`progress` or `final`) to a sender that takes
/// interim replies.
pub(crate) fn reply_kind(properties: BasicProperties, kind: &str) -> BasicProperties {
    let mut headers = properties.headers().clone().unwrap_or_default();
    headers.insert(REPLY_KIND_HEADER.into(), long_string(kind));
    properties.with_headers(headers)
}

/// A front-door message forwarded to its partition's owner (cluster mode).
pub(crate) struct Forwarded<'a> {
    /// The partition key: the message's conversation token.
    pub key: &'a str,
    /// The door it came through (`http`, `ws`, ...): the source its routes match on.
    pub source: &'a str,
    /// Who sent it, as the forwarding door verified.
    pub principal: Option<&'a crate::principal::Principal>,
    pub message_id: &'a str,
    /// Where the owner sends the replies: the forwarding instance's reply queue.
    pub reply_to: &'a str,
    pub correlation_id: &'a str,
    /// The forwarding instance.
    pub instance: &'a str,
    /// The broker user the forwarding connection authenticated as: published as `user_id`,
    /// which the broker checks, it is what makes the owner believe `source`.
    pub user: &'a str,
}

/// The properties of a forwarded front-door message: JSON, persistent, keyed by its
/// conversation, its source and forwarder in headers.
pub(crate) fn forwarded_properties(f: &Forwarded<'_>, mut headers: FieldTable) -> BasicProperties {
    headers.insert(super::topology::CONVERSATION_HEADER.into(), long_string(f.key));
    headers.insert(SOURCE_HEADER.into(), long_string(f.source));
    headers.insert(FORWARDED_HEADER.into(), long_string(f.instance));
    if let Some(principal) = f.principal {
        let principal = serde_json::to_string(principal).expect("a principal is JSON");
        headers.insert(PRINCIPAL_HEADER.into(), long_string(&principal));
    }
    BasicProperties::default()
        .with_delivery_mode(PERSISTENT)
        .with_content_type(Encoding::Json.content_type().into())
        .with_message_id(f.message_id.into())
        .with_correlation_id(f.correlation_id.into())
        .with_reply_to(f.reply_to.into())
        .with_user_id(f.user.into())
        .with_headers(headers)
}

/// `properties` with [`REPLY_HEADER`] saying the reply is the `index`-th of `count`.
pub(crate) fn with_reply_place(properties: BasicProperties, index: usize, count: usize) -> BasicProperties {
    let mut headers = properties.headers().clone().unwrap_or_default();
    headers.insert(REPLY_HEADER.into(), long_string(&format!("{index}/{count}")));
    properties.with_headers(headers)
}

/// Most replies one message has that a reader believes (a message's replies are its notices
/// and its answer: a handful): a header claiming more reserves nothing.
const MAX_REPLIES: usize = 64;

/// `<index>/<count>` with the index below the count; anything else is no place.
fn read_place(value: &str) -> Option<(usize, usize)> {
    let (index, count) = value.split_once('/')?;
    let place: (usize, usize) = (index.parse().ok()?, count.parse().ok()?);
    (place.0 < place.1 && place.1 <= MAX_REPLIES).then_some(place)
}

/// The properties of a message being dead-lettered: its own, with why it was given up, and
/// its `user_id` moved into a header (the broker refuses another user's id from silpgate).
pub(crate) fn dead_letter_properties(
    original: &BasicProperties,
    code: &str,
    reason: &str,
    queue: &str,
) -> BasicProperties {
    let mut headers = original.headers().clone().unwrap_or_default();
    headers.insert(ERROR_CODE_HEADER.into(), long_string(code));
    headers.insert(ERROR_HEADER.into(), long_string(truncate(reason, MAX_ERROR_HEADER)));
    headers.insert(SOURCE_QUEUE_HEADER.into(), long_string(queue));
    carry_user_id(&mut headers, original);
    let mut properties = BasicProperties::default().with_delivery_mode(PERSISTENT).with_headers(headers);
    if let Some(v) = original.content_type() {
        properties = properties.with_content_type(v.clone());
    }
    if let Some(v) = original.message_id() {
        properties = properties.with_message_id(v.clone());
    }
    if let Some(v) = original.correlation_id() {
        properties = properties.with_correlation_id(v.clone());
    }
    if let Some(v) = original.reply_to() {
        properties = properties.with_reply_to(v.clone());
    }
    properties
}

/// The `nlip-reply-*` addresses: at most one per encoding (the first, in header order; many
/// spellings of one content type name the same encoding), each a queue name of at most
/// [`MAX_QUEUE_NAME`] bytes. The headers are the producer's to choose, and every address is
/// published to and named in spans, so their number and size are bounded here.
fn reply_addresses(headers: &FieldTable) -> Vec<(Encoding, String)> {
    let mut replies: Vec<(Encoding, String)> = Vec::with_capacity(2);
    for (k, v) in headers.inner() {
        let Some(content_type) = k.as_str().strip_prefix(REPLY_HEADER_PREFIX) else { continue };
        let Some(encoding) = Encoding::from_content_type(content_type) else { continue };
        let Some(address) = value_text(v).filter(|a| !a.is_empty() && a.len() <= MAX_QUEUE_NAME) else {
            continue;
        };
        if !replies.iter().any(|(e, _)| *e == encoding) {
            replies.push((encoding, address));
        }
    }
    replies
}

/// An id for a message that came without one: its body's hash, the same on every redelivery.
pub(crate) fn content_id(body: &[u8]) -> String {
    let hex = crate::util::hash::sha256_hex(body);
    format!("sha256-{}", &hex[..32])
}

/// Reads a header as text.
pub fn value_text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok().map(str::to_owned),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

fn value_number(value: &AMQPValue) -> Option<u32> {
    value_integer(value).and_then(|n| u32::try_from(n).ok())
}

/// Reads a header as an integer of any width.
pub(crate) fn value_integer(value: &AMQPValue) -> Option<i64> {
    Some(match *value {
        AMQPValue::ShortShortInt(n) => n.into(),
        AMQPValue::ShortShortUInt(n) => n.into(),
        AMQPValue::ShortInt(n) => n.into(),
        AMQPValue::ShortUInt(n) => n.into(),
        AMQPValue::LongInt(n) => n.into(),
        AMQPValue::LongUInt(n) => n.into(),
        AMQPValue::LongLongInt(n) => n,
        AMQPValue::Timestamp(n) => i64::try_from(n).ok()?,
        _ => return None,
    })
}

/// A delivery's properties with the partition key and its inbound queue added: what silpgate
/// publishes when it forwards an inbound message to its partition. The source is always the
/// queue silpgate took the message from (a producer's own `x-silpgate-source` is overwritten).
/// The message is published as `own_user`, silpgate's broker user, which the broker checks:
/// that is what makes the partition's owner believe the sender's broker-checked `user_id`,
/// carried in the header [`USER_ID_HEADER`] (RabbitMQ refuses a publish whose `user_id` is not
/// the publishing connection's user). Since the forward is silpgate's word, a producer's own
/// [`FORWARDED_HEADER`] and [`PRINCIPAL_HEADER`] are dropped: they would pose as a front door.
pub fn partitioned_properties(
    properties: &BasicProperties,
    key: &str,
    source: &str,
    own_user: &str,
) -> BasicProperties {
    let mut headers = properties.headers().clone().unwrap_or_default();
    headers.insert(super::topology::CONVERSATION_HEADER.into(), long_string(key));
    headers.insert(SOURCE_HEADER.into(), long_string(source));
    carry_user_id(&mut headers, properties);
    let headers = without(headers, &[FORWARDED_HEADER, PRINCIPAL_HEADER]);
    without_user_id(properties)
        .with_delivery_mode(PERSISTENT)
        .with_user_id(own_user.into())
        .with_headers(headers)
}

/// `headers` less those `names`.
fn without(headers: FieldTable, names: &[&str]) -> FieldTable {
    let mut kept = FieldTable::default();
    for (k, v) in headers.inner() {
        if !names.contains(&k.as_str()) {
            kept.insert(k.clone(), v.clone());
        }
    }
    kept
}

/// Sets [`USER_ID_HEADER`] from the broker-checked `user_id` of `original`, dropping whatever
/// the producer put in that header itself: only the broker vouches for a user.
fn carry_user_id(headers: &mut FieldTable, original: &BasicProperties) {
    let mut kept = without(std::mem::take(headers), &[USER_ID_HEADER]);
    if let Some(user) = original.user_id() {
        kept.insert(USER_ID_HEADER.into(), long_string(user.as_str()));
    }
    *headers = kept;
}

/// Every property of `p` but `user_id`, which silpgate publishes only as its own user (on a
/// forwarded front-door message).
fn without_user_id(p: &BasicProperties) -> BasicProperties {
    let mut out = BasicProperties::default();
    if let Some(v) = p.content_type() {
        out = out.with_content_type(v.clone());
    }
    if let Some(v) = p.content_encoding() {
        out = out.with_content_encoding(v.clone());
    }
    if let Some(v) = p.headers() {
        out = out.with_headers(v.clone());
    }
    if let Some(v) = p.delivery_mode() {
        out = out.with_delivery_mode(*v);
    }
    if let Some(v) = p.priority() {
        out = out.with_priority(*v);
    }
    if let Some(v) = p.correlation_id() {
        out = out.with_correlation_id(v.clone());
    }
    if let Some(v) = p.reply_to() {
        out = out.with_reply_to(v.clone());
    }
    if let Some(v) = p.expiration() {
        out = out.with_expiration(v.clone());
    }
    if let Some(v) = p.message_id() {
        out = out.with_message_id(v.clone());
    }
    if let Some(v) = p.timestamp() {
        out = out.with_timestamp(*v);
    }
    if let Some(v) = p.kind() {
        out = out.with_type(v.clone());
    }
    if let Some(v) = p.app_id() {
        out = out.with_app_id(v.clone());
    }
    if let Some(v) = p.cluster_id() {
        out = out.with_cluster_id(v.clone());
    }
    out
}

/// Properties of a changelog or lock stream entry.
pub(crate) fn stream_properties() -> BasicProperties {
    BasicProperties::default().with_delivery_mode(PERSISTENT).with_content_type("application/json".into())
}

fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, AMQPValue)]) -> FieldTable {
        let mut table = FieldTable::default();
        for (k, v) in pairs {
            table.insert((*k).into(), v.clone());
        }
        table
    }

    #[test]
    fn a_forwarded_front_door_message_is_believed_only_as_silpgates_own_user() {
        let forwarded = Forwarded {
            key: "conv-1",
            source: "http",
            principal: Some(&crate::principal::Principal::new("alice", vec!["finance".into()])),
            message_id: "gw-1",
            reply_to: "silpgate.replies.a",
            correlation_id: "gw-1",
            instance: "a",
            user: "silpgate",
        };
        let read = Envelope::read(&forwarded_properties(&forwarded, FieldTable::default()), false);
        assert_eq!(read.source.as_deref(), Some("http"));
        assert_eq!(read.forwarded_by.as_deref(), Some("a"));
        assert_eq!(read.replies, vec![(Encoding::Json, "silpgate.replies.a".to_owned())]);
        assert!(read.forwarded_by_silpgate("silpgate"));
        assert_eq!(read.forwarded_principal.as_ref().map(|p| p.subject.as_str()), Some("alice"));
        assert!(!read.forwarded_by_silpgate("producer"), "another broker user is not silpgate");
        // Ingress drops `user_id`: a producer's own forwarded-by header proves nothing.
        let claimed =
            BasicProperties::default().with_headers(headers(&[(FORWARDED_HEADER, long_string("a"))]));
        let through_ingress = partitioned_properties(&claimed, "conv-1", "silpgate.in", "silpgate");
        let read = Envelope::read(&through_ingress, false);
        assert!(!read.forwarded_by_silpgate("silpgate"), "the ingress drops a producer's forwarded-by");
        assert!(read.forwarded_principal.is_none());
    }

    #[test]
    fn interim_replies_are_asked_for_by_true_in_any_spelling_or_one_as_text_or_a_number() {
        let asks = |value: AMQPValue| {
            let p = BasicProperties::default().with_headers(headers(&[(PROGRESS_HEADER, value)]));
            Envelope::read(&p, false).wants_progress
        };
        for yes in [
            AMQPValue::Boolean(true),
            long_string("TRUE"),
            long_string("1"),
            AMQPValue::ShortShortInt(1),
            AMQPValue::LongLongInt(1),
        ] {
            assert!(asks(yes.clone()), "{yes:?}");
        }
        for no in
            [AMQPValue::Boolean(false), long_string("yes"), AMQPValue::LongInt(0), AMQPValue::LongInt(2)]
        {
            assert!(!asks(no.clone()), "{no:?}");
        }
    }

    #[test]
    fn a_reply_says_its_place_and_a_bogus_place_is_read_as_the_only_reply() {
        let placed = with_reply_place(BasicProperties::default(), 1, 2);
        assert_eq!(Envelope::read(&placed, false).reply_place, (1, 2));
        for bogus in ["2/2", "x/2", "1", "0/100000", ""] {
            let p = BasicProperties::default().with_headers(headers(&[(REPLY_HEADER, long_string(bogus))]));
            assert_eq!(Envelope::read(&p, false).reply_place, (0, 1), "{bogus:?}");
        }
        assert_eq!(Envelope::read(&BasicProperties::default(), false).reply_place, (0, 1));
    }

    #[test]
    fn reply_headers_override_reply_to_and_content_type_selects_the_encoding() {
        let properties = BasicProperties::default()
            .with_content_type("application/cbor".into())
            .with_reply_to("requester".into())
            .with_correlation_id("c-1".into())
            .with_headers(headers(&[
                ("nlip-reply-application/json", long_string("json-inbox")),
                ("nlip-reply-application/cbor", long_string("cbor-inbox")),
                ("x-delivery-count", AMQPValue::LongLongInt(3)),
            ]));
        let e = Envelope::read(&properties, true);
        assert_eq!(e.encoding, Ok(Encoding::Cbor));
        let mut replies = e.replies.clone();
        replies.sort_by(|a, b| a.1.cmp(&b.1));
        assert_eq!(replies, [(Encoding::Cbor, "cbor-inbox".into()), (Encoding::Json, "json-inbox".into())]);
        assert_eq!(e.earlier_deliveries, 3);
        assert_eq!(e.correlation_id.as_deref(), Some("c-1"));
    }

    #[test]
    fn a_forward_to_a_partition_is_silpgates_and_carries_its_senders_user_and_source() {
        let original = BasicProperties::default()
            .with_user_id("alice".into())
            .with_message_id("m-1".into())
            .with_reply_to("inbox".into())
            .with_headers(headers(&[
                (SOURCE_HEADER, long_string("forged-source")),
                (USER_ID_HEADER, long_string("forged-user")),
                (PRINCIPAL_HEADER, long_string(r#"{"subject":"root","roles":["admin"]}"#)),
            ]));
        let p = partitioned_properties(&original, "conv", "silpgate.in", "silpgate");
        assert_eq!(p.user_id().as_ref().map(ShortString::as_str), Some("silpgate"), "published as silpgate");
        assert_eq!(
            (p.message_id().clone(), p.reply_to().clone()),
            (Some("m-1".into()), Some("inbox".into()))
        );
        let h = p.headers().clone().unwrap();
        let h = h.inner();
        assert_eq!(value_text(&h[SOURCE_HEADER]).as_deref(), Some("silpgate.in"));
        assert_eq!(value_text(&h[USER_ID_HEADER]).as_deref(), Some("alice"));
        assert!(!h.contains_key(PRINCIPAL_HEADER), "a producer's principal header is dropped");
        let read = Envelope::read(&p, false);
        assert_eq!(read.partition_sender("silpgate").map(String::as_str), Some("alice"));
    }

    #[test]
    fn a_direct_partition_publish_is_its_publishers_whatever_its_user_header_says() {
        let direct = BasicProperties::default()
            .with_user_id("mallory".into())
            .with_headers(headers(&[(USER_ID_HEADER, long_string("alice"))]));
        let read = Envelope::read(&direct, false);
        assert_eq!(read.partition_sender("silpgate").map(String::as_str), Some("mallory"));
        let anonymous =
            BasicProperties::default().with_headers(headers(&[(USER_ID_HEADER, long_string("alice"))]));
        assert_eq!(Envelope::read(&anonymous, false).partition_sender("silpgate"), None);
    }

    #[test]
    fn a_forged_user_header_never_reaches_a_dead_letter() {
        let forged =
            BasicProperties::default().with_headers(headers(&[(USER_ID_HEADER, long_string("root"))]));
        let p = dead_letter_properties(&forged, "invalid_syntax", "bad", "silpgate.in");
        assert!(!p.headers().clone().unwrap().inner().contains_key(USER_ID_HEADER));
        let real = forged.clone().with_user_id("bob".into());
        let p = dead_letter_properties(&real, "invalid_syntax", "bad", "silpgate.in");
        assert_eq!(value_text(&p.headers().clone().unwrap().inner()[USER_ID_HEADER]).as_deref(), Some("bob"));
    }

    #[test]
    fn reply_addresses_are_one_per_encoding_and_queue_name_sized() {
        let mut pairs: Vec<(String, AMQPValue)> = (0..500)
            .map(|i| (format!("nlip-reply-application/json; v={i}"), long_string(&format!("inbox-{i:03}"))))
            .collect();
        pairs.push(("nlip-reply-application/cbor".into(), long_string(&"q".repeat(256))));
        let named: Vec<(&str, AMQPValue)> = pairs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let e = Envelope::read(&BasicProperties::default().with_headers(headers(&named)), false);
        assert_eq!(
            e.replies,
            [(Encoding::Json, "inbox-000".into())],
            "the too-long cbor address names no queue"
        );
    }

    #[test]
    fn reply_to_gets_the_inbound_encoding_and_unknown_types_are_reported() {
        let properties = BasicProperties::default().with_reply_to("inbox".into());
        let e = Envelope::read(&properties, true);
        assert_eq!(e.replies, [(Encoding::Json, "inbox".into())]);
        assert_eq!(e.earlier_deliveries, 1, "a classic-queue redelivery counts once");
        let odd = BasicProperties::default().with_content_type("text/plain".into());
        assert_eq!(Envelope::read(&odd, false).encoding, Err("text/plain".into()));
    }

    #[test]
    fn dead_letters_keep_the_message_and_say_why() {
        let original = BasicProperties::default()
            .with_message_id("m-7".into())
            .with_user_id("alice".into())
            .with_headers(headers(&[("app", long_string("kept"))]));
        let p = dead_letter_properties(&original, "invalid_envelope", &"x".repeat(10_000), "in");
        let h = p.headers().as_ref().unwrap().inner();
        assert_eq!(value_text(&h[ERROR_CODE_HEADER]).as_deref(), Some("invalid_envelope"));
        assert_eq!(value_text(&h[ERROR_HEADER]).unwrap().len(), MAX_ERROR_HEADER);
        assert_eq!(value_text(&h["app"]).as_deref(), Some("kept"));
        assert_eq!(value_text(&h[USER_ID_HEADER]).as_deref(), Some("alice"));
        assert!(p.user_id().is_none(), "the broker would refuse another user's id");
        assert_eq!(p.message_id().as_ref().map(|s| s.as_str()), Some("m-7"));
    }
}
