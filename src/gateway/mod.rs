//! The transport-free gateway core: for one inbound NLIP envelope, decide what goes out and
//! where. The intake calls it ([`Gateway::handle`] for a message, `Gateway::handle_answer` for an
//! agent's answer); it never sees a door or a connector.
//!
//! For each message: recognise a redelivery (ledger); answer `//ping` and other control
//! messages; read every SILP payload into an IR (schema, sanitiser, validator); pick the route;
//! count the conversation's turn; write each payload in the form the route and the receiving
//! agent call for (through the compile.lock); pass everything else through untouched.

pub mod choose;
pub(crate) mod envelope;
pub(crate) mod error;
pub(crate) mod negotiate;
pub mod payload;
pub(crate) mod route;
pub mod session;
pub mod store;

pub use envelope::{ChoiceReason, Destination, Inbound, Note, Origin, Outbound, Outcome, Status, Transport};
pub use error::{Disposition, GatewayError};
pub use store::{MemoryStore, Store};

use crate::config::{Config, FrontendRule, RouteMode};
use crate::nlip::reply::{self, Location};
use crate::nlip::{Content, Format, Message, NlipError, Submessage};
use crate::silp::tokens::{TokenCache, Tokenizer};
use crate::silp::validate::{self, ValidateOptions};
use crate::silp::{DecodeOptions, Frontend, ReqIdMode, ir::Ir};
use payload::{OutputForm, SilpForm};
use session::SessionPolicy;
use std::sync::Arc;
use store::{AgentProfile, Changes, Freeze, Frozen, LedgerState, ProfileSource, SessionChange};

/// Plans made again after losing a race before the conflict counts as a failure.
const MAX_RACES: u32 = 16;

/// The gateway core: configuration plus state.
pub struct Gateway {
    config: Arc<Config>,
    store: Arc<dyn Store>,
    decode_options: DecodeOptions,
    /// Token counts by (IR hash, frontend, tokenizer), for `fewest-tokens` and the metrics.
    tokens: TokenCache,
}

/// Token counts kept; past this the cache starts over (about 4 MiB at most).
const TOKEN_CACHE_ENTRIES: usize = 1 << 16;

/// What the gateway knows of a receiving agent.
#[derive(Default)]
struct Receiver {
    /// Frontends it accepts, most preferred first (`None`: any).
    accepted: Option<Vec<Frontend>>,
    /// Its model's tokenizer, from its `//ping` or its configuration.
    tokenizer: Option<Tokenizer>,
    /// Its configuration asks for `fewest-tokens`.
    fewest_tokens: bool,
}

/// What the core decided for one message.
// Made and taken apart once per message, never stored: boxing the common variant would only
// add an allocation.
#[allow(clippy::large_enum_variant)]
enum Plan {
    /// Already published: nothing to do.
    Duplicate,
    /// Answer the sender with these envelopes (ping answers, control replies).
    Reply(Vec<Outbound>),
    /// Send the message to `destination` with its payloads rewritten and, when its session
    /// renewed, the renewal notice among its submessages.
    Forward {
        destination: Destination,
        notice: Option<Submessage>,
        renders: Vec<Render>,
        frozen: Vec<Freeze>,
        change: SessionChange,
    },
}

/// A payload's new form: `format`, `subformat` and `content` of the unit at `index`.
struct Render {
    index: Option<usize>,
    format: Format,
    subformat: &'static str,
    content: Content,
}

/// A SILP payload found in the envelope: where it is and what it says.
struct Unit {
    /// `None`: the message's own content; `Some(i)`: submessage `i`.
    index: Option<usize>,
    path: String,
    ir: Ir,
    explicit_out: Option<Frontend>,
    /// The payload's text before and after the sanitiser changed it.
    sanitized: Option<(String, String)>,
}

impl Gateway {
    pub fn new(config: Arc<Config>, store: Arc<dyn Store>) -> Self {
        let decode_options = DecodeOptions {
            sanitize: config.silp.sanitize,
            req_id: ReqIdMode::Hash { len: config.silp.req_id_len },
            max_input_bytes: config.silp.max_payload_bytes,
        };
        // Dictionaries load in tens of milliseconds: pay that at start, not on a payload.
        for tokenizer in config.agents.iter().filter_map(|a| a.tokenizer) {
            tokenizer.warm();
        }
        Gateway { config, store, decode_options, tokens: TokenCache::new(TOKEN_CACHE_ENTRIES) }
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Handles one inbound envelope.
    pub fn handle(&self, inbound: Inbound) -> Outcome {
        self.run(inbound, None)
    }

    /// Handles an agent's answer to a request: like any message (ledger, sanitiser,
    /// validator, the conversation's turn), but it goes back to the asker, every SILP payload
    /// written in `form`, the form the asker reads ([`payload::answer_form`]).
    pub(crate) fn handle_answer(&self, answer: Inbound, form: OutputForm) -> Outcome {
        self.run(answer, Some(form))
    }

    /// Plans and commits a message. A plan that lost a race with another message of its
    /// conversation (its commit was refused, nothing was written) is made again at once, up
    /// to [`MAX_RACES`] times: the loser reads the winner's state.
    fn run(&self, inbound: Inbound, answering: Option<OutputForm>) -> Outcome {
        let mut notes = Vec::with_capacity(8);
        let mut races = 0;
        let planned = loop {
            let planned = self.plan(&inbound, answering, &mut notes);
            let lost = matches!(&planned, Err((GatewayError::Store(store::StoreError::Conflict(_)), _)));
            if !lost || races == MAX_RACES {
                break planned;
            }
            races += 1;
            notes.clear();
        };
        match planned {
            Ok(Plan::Duplicate) => Outcome::new(Status::Duplicate, Vec::new(), notes),
            Ok(Plan::Reply(outbound)) => Outcome::new(Status::Delivered, outbound, notes),
            Ok(Plan::Forward { destination, notice, renders, frozen, change }) => {
                // Everything that can fail is done: rewrite the payloads in place and send.
                let mut envelope = inbound.envelope;
                for render in renders {
                    let (format, subformat, content) = match render.index {
                        None => (&mut envelope.format, &mut envelope.subformat, &mut envelope.content),
                        Some(i) => {
                            let sub =
                                &mut envelope.submessages.as_mut().expect("a unit's submessage exists")[i];
                            (&mut sub.format, &mut sub.subformat, &mut sub.content)
                        }
                    };
                    *format = render.format;
                    render.subformat.clone_into(subformat);
                    *content = render.content;
                }
                // After the renders: their indices count the submessages as they arrived.
                if let Some(subs) = envelope.submessages.as_mut() {
                    subs.retain(|s| !session::is_renewal_notice(s));
                }
                if let Some(notice) = notice {
                    envelope.push(notice);
                }
                let outbound = vec![Outbound { destination, envelope }];
                Outcome { status: Status::Delivered, outbound, notes, frozen, change }
            }
            Err((error, location)) => {
                let outbound =
                    self.error_reply(&error, &location, Some(&inbound.envelope)).into_iter().collect();
                Outcome::new(Status::Failed(error), outbound, notes)
            }
        }
    }

    /// Takes back the turn message `message_id` of conversation `token` counted, once the
    /// message is refused for good after its state was committed (see
    /// [`take_back_turn`](Self::take_back_turn)), and drops the message's ledger entry: its
    /// id may come again as a new message. The turn is the one its ledger entry kept.
    ///
    /// # Errors
    /// The store failed.
    pub(crate) fn take_back(
        &self,
        message_id: &str,
        token: &str,
    ) -> Result<Option<store::SessionRecord>, GatewayError> {
        let Some(LedgerState::Pending { turn: Some(turn), .. }) = self.store.ledger(message_id)? else {
            return Ok(None);
        };
        self.take_back_turn(token, &turn, Some(message_id))
    }

    /// Takes back `turn` of conversation `token`, counted by a message refused for good after
    /// its state was committed: its sender hears that it failed and may send it again, which
    /// must not count twice. The session goes back to where it stood before the message, and
    /// the ledger entry of `forget`, if given, is dropped. A conversation that counted a later
    /// turn since keeps this one: renumbering the later turns would disagree with what their
    /// agents were told. Returns the session as it was put back, for the replicas of its
    /// partition.
    ///
    /// # Errors
    /// The store failed.
    pub(crate) fn take_back_turn(
        &self,
        token: &str,
        turn: &store::Turn,
        forget: Option<&str>,
    ) -> Result<Option<store::SessionRecord>, GatewayError> {
        let Some(before) =
            self.store.session_by_token(token)?.and_then(|now| session::uncount_turn(&now, turn))
        else {
            return Ok(None);
        };
        let changes = Changes {
            sessions: vec![before.clone()],
            turns_seen: vec![(token.to_owned(), turn.turn)],
            forgotten: forget.into_iter().map(str::to_owned).collect(),
            ..Changes::default()
        };
        match self.store.commit(&changes, crate::util::time::now_millis()) {
            Ok(_) => Ok(Some(before)),
            // A later turn was counted meanwhile.
            Err(store::StoreError::Conflict(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The outcome for bytes a transport could not even decode into an envelope.
    pub fn reject_undecodable(&self, error: NlipError) -> Outcome {
        let location = error.path.clone().map_or(Location::None, Location::Path);
        let error = GatewayError::Envelope(error);
        let outbound = self.error_reply(&error, &location, None).into_iter().collect();
        Outcome::new(Status::Failed(error), outbound, Vec::new())
    }

    /// An error message for the sender, echoing its tokens. Errors are never answered with
    /// errors: that way two gateways cannot bounce one back and forth.
    fn error_reply(
        &self,
        error: &GatewayError,
        location: &Location,
        request: Option<&Message>,
    ) -> Option<Outbound> {
        if request.is_some_and(Message::is_error) {
            return None;
        }
        let mut envelope = reply::error_message(error.code(), &error.detail(), location);
        if let Some(request) = request {
            reply::echo_tokens(&mut envelope, request, &self.config.gateway.name);
        }
        Some(Outbound { destination: Destination::Reply, envelope })
    }

    /// Decides what happens to a message, without changing it. `answering`: the message is an
    /// agent's answer, for an asker who reads this form.
    fn plan(
        &self,
        inbound: &Inbound,
        answering: Option<OutputForm>,
        notes: &mut Vec<Note>,
    ) -> Result<Plan, (GatewayError, Location)> {
        let message = &inbound.envelope;
        let message_id = inbound.origin.message_id.as_deref();
        // A redelivery: if it was published, it is done; if its state was applied but its
        // publishes not all confirmed, it is planned again from the turn it already counted, so
        // that it goes out the same and counts nothing twice.
        let replay = match message_id.map(|id| self.store.ledger(id)).transpose() {
            Err(e) => return Err(nowhere(e.into())),
            Ok(Some(Some(LedgerState::Published))) => return Ok(Plan::Duplicate),
            Ok(Some(Some(LedgerState::Pending { turn, session }))) => Some((turn, session)),
            Ok(_) => None,
        };
        if answering.is_none() && negotiate::is_ping(message) {
            return self.answer_ping(inbound, notes).map(Plan::Reply).map_err(nowhere);
        }
        if answering.is_none() && message.is_control() {
            let mut ack = Message::text(format!("{}: control message received", self.config.gateway.name))
                .with_messagetype("control");
            reply::echo_tokens(&mut ack, message, &self.config.gateway.name);
            return Ok(Plan::Reply(vec![Outbound { destination: Destination::Reply, envelope: ack }]));
        }

        let units = self.read_units(message, notes)?;
        let first = units.first().map(|u| &u.ir);
        let facts = route::RouteFacts {
            source: &inbound.origin.source,
            messagetype: message.messagetype.as_deref(),
            labels: units.iter().filter_map(|u| label_of(message, u.index)).collect(),
            intent: first.map(|ir| ir.intent.as_str()),
            next_agent: first.and_then(|ir| ir.meta.next_agent.as_deref()),
        };
        let route = match answering {
            // An answer goes back the way its request came, in the asker's form.
            Some(form) => Route::Answer(form),
            None => Route::Configured(
                route::select(&self.config.routes, &facts).ok_or((GatewayError::NoRoute, Location::None))?,
            ),
        };
        if let Route::Configured(route) = &route
            && let Some(agent) = self.config.agents.iter().find(|a| a.name == route.destination)
            && !crate::principal::allowed(&agent.allow, inbound.origin.principal.as_ref())
        {
            return Err((
                GatewayError::Forbidden("this sender may not send this message here"),
                Location::None,
            ));
        }
        notes.push(Note::Route(route.name().to_owned()));

        let mut changes = Changes::default();
        // The session as this message leaves it, kept with its ledger entry for the replicas
        // of the partition the session belongs to (only a cluster's sessions have any).
        let mut left = None;
        let policy = SessionPolicy {
            heartbeat: self.config.sessions.heartbeat,
            idle_timeout_ms: self.config.sessions.idle_timeout_secs.saturating_mul(1000),
            partition: inbound.origin.partition,
        };
        let session = match (replay, message.conversation_token()) {
            (Some((turn, record)), _) => {
                left = record.map(|r| *r);
                turn
            }
            (None, Some(token)) if !units.is_empty() => {
                let party = party_of(&inbound.origin, answering.is_some());
                let (turn, record) =
                    session::count_turn(self.store.as_ref(), token, inbound.received_at, &policy, party)
                        .map_err(nowhere)?;
                notes.push(Note::Session { id: turn.id.clone(), turn: turn.turn, renewed: turn.renewed });
                changes.turns_seen.push((record.token.clone(), record.turns - 1));
                if record.partition.is_some() {
                    left = Some(record.clone());
                }
                changes.sessions.push(record);
                Some(turn)
            }
            (None, Some(token)) => {
                // No payload counts a turn, but a conversation begun by a principal stays
                // its own for every message, whatever its first one carried.
                let party = party_of(&inbound.origin, answering.is_some());
                let claim = session::claim(self.store.as_ref(), token, inbound.received_at, &policy, party)
                    .map_err(nowhere)?;
                if let Some(record) = claim {
                    changes.turns_seen.push((record.token.clone(), 0));
                    if record.partition.is_some() {
                        left = Some(record.clone());
                    }
                    changes.sessions.push(record);
                }
                None
            }
            (None, None) => None,
        };

        let destination = match &route {
            Route::Configured(r) if r.destination != "reply" => Destination::Agent(r.destination.clone()),
            _ => Destination::Reply,
        };
        let notice = session.as_ref().filter(|t| t.renewed).map(session::renewal_notice);

        let receiver = match &destination {
            Destination::Agent(agent) => self.receiver(agent).map_err(nowhere)?,
            Destination::Reply => Receiver::default(),
        };
        let accepted = receiver.accepted.as_deref();
        // Decide each payload's form and compile it; surface texts go through the compile.lock.
        let mut pending = Vec::with_capacity(units.len());
        for mut unit in units {
            if let Some(turn) = &session {
                unit.ir.meta.session_id = Some(turn.id.as_str().into());
            }
            let form = match &route {
                Route::Configured(r) if r.mode == RouteMode::Validate => continue,
                Route::Configured(r) if r.mode == RouteMode::Decode => OutputForm::Ir,
                Route::Configured(r) => {
                    let fixed = match r.frontend {
                        Some(FrontendRule::Fixed(f)) => Some(f),
                        _ => None,
                    };
                    let fewest = match r.frontend {
                        Some(rule) => rule == FrontendRule::FewestTokens,
                        None => receiver.fewest_tokens,
                    };
                    // An agent without a tokenizer is weighed in the GPT-4o family's.
                    let tokenizer = receiver.tokenizer.unwrap_or(Tokenizer::O200kBase);
                    let cheapest = fewest
                        .then(|| {
                            // Hashed here only: the other choices must not pay for it.
                            let ir_hash = unit.ir.ir_hash();
                            choose::fewest_tokens(accepted, r.allow_lossy, |f| {
                                self.tokens
                                    .count(&ir_hash, f, tokenizer, || crate::silp::compile(&unit.ir, f))
                            })
                        })
                        .flatten();
                    let choice = cheapest.unwrap_or_else(|| {
                        choose::choose(
                            fixed,
                            accepted,
                            unit.explicit_out,
                            self.config.gateway.default_frontend,
                        )
                    });
                    notes.push(Note::Frontend {
                        path: unit.path.clone(),
                        frontend: choice.frontend,
                        reason: choice.reason,
                        degraded_from: choice.degraded_from,
                    });
                    OutputForm::Surface(choice.frontend)
                }
                Route::Answer(form) => *form,
            };
            if let OutputForm::Surface(frontend) = form {
                // The store keeps the first compile and reports drift against this one.
                let output = crate::silp::compile(&unit.ir, frontend);
                changes.freezes.push(Freeze {
                    ir_hash: unit.ir.ir_hash(),
                    frontend,
                    output,
                    principal: inbound.origin.principal.as_ref().map(|p| p.subject.clone()),
                });
            }
            pending.push((unit, form));
        }
        let mut change = SessionChange { session: left, message: None };
        if let Some(id) = message_id {
            let state =
                LedgerState::Pending { turn: session.clone(), session: change.session.clone().map(Box::new) };
            change.message = Some((id.to_owned(), state.for_replica()));
            changes.ledger.push((id.to_owned(), state));
            changes.principal = inbound.origin.principal.as_ref().map(|p| p.subject.clone());
        }

        // One atomic state step; the compile.lock answers with what is frozen.
        let frozen = self.store.commit(&changes, inbound.received_at).map_err(|e| nowhere(e.into()))?;
        let mut frozen = changes.freezes.into_iter().zip(frozen);
        let mut renders = Vec::with_capacity(pending.len());
        let mut first_frozen = Vec::new();
        for (unit, form) in pending {
            if let (Some(tokenizer), Some((before, after))) = (receiver.tokenizer, &unit.sanitized) {
                notes.push(Note::SanitizedTokens {
                    path: unit.path.clone(),
                    tokenizer,
                    before: tokenizer.count(before),
                    after: tokenizer.count(after),
                });
            }
            let text = match form {
                OutputForm::Surface(frontend) => {
                    let (freeze, frozen) = frozen.next().expect("one frozen entry per surface payload");
                    Self::note_lock(&freeze, &frozen, notes);
                    // Counted only for an agent whose tokenizer is known, and then mostly from
                    // the cache: a frozen text is the compile of its IR hash (drift aside).
                    if let (Some(tokenizer), Destination::Agent(agent)) = (receiver.tokenizer, &destination) {
                        let surface =
                            self.tokens.count(&freeze.ir_hash, frontend, tokenizer, || frozen.output.clone());
                        let natural =
                            self.tokens.count(&freeze.ir_hash, Frontend::Natural, tokenizer, || {
                                crate::silp::compile(&unit.ir, Frontend::Natural)
                            });
                        notes.push(Note::Tokens {
                            agent: agent.clone(),
                            frontend,
                            tokenizer,
                            surface,
                            natural,
                        });
                    }
                    if frozen.first {
                        first_frozen.push(freeze);
                    }
                    let natural = match frontend {
                        Frontend::Natural => frozen.output.len(),
                        _ => crate::silp::compile(&unit.ir, Frontend::Natural).len(),
                    };
                    notes.push(Note::Size { frontend, surface: frozen.output.len(), natural });
                    Some(frozen.output)
                }
                OutputForm::Ir => None,
            };
            let (format, subformat, content) = payload::render(&unit.ir, form, text);
            renders.push(Render { index: unit.index, format, subformat, content });
        }
        Ok(Plan::Forward { destination, notice, renders, frozen: first_frozen, change })
    }

    /// Reads, checks and validates every SILP payload of the message.
    fn read_units(
        &self,
        message: &Message,
        notes: &mut Vec<Note>,
    ) -> Result<Vec<Unit>, (GatewayError, Location)> {
        let top = std::iter::once((None, message.subformat.as_str(), &message.content));
        let subs = message
            .submessages()
            .iter()
            .enumerate()
            .map(|(i, s)| (Some(i), s.subformat.as_str(), &s.content));
        let rules = ValidateOptions { enforce_whitelist: self.config.silp.whitelist };
        let mut units = Vec::with_capacity(2);
        for (index, subformat, content) in top.chain(subs) {
            let form = match payload::silp_form(subformat) {
                Ok(Some(form)) => form,
                Ok(None) => continue,
                Err(error) => {
                    let path = unit_path(index);
                    let at = Location::Path(path.clone());
                    return Err((GatewayError::Silp { path, error }, at));
                }
            };
            let path = unit_path(index);
            let read = payload::read(form, content, &self.decode_options, self.config.silp.req_id_len)
                .map_err(|error| {
                    let location = match &error.span {
                        Some(span) if form == SilpForm::Code => {
                            Location::Span { path: path.clone(), span: span.clone() }
                        }
                        _ => Location::Path(path.clone()),
                    };
                    (GatewayError::Silp { path: path.clone(), error }, location)
                })?;
            // Warnings are not sent anywhere: only the errors are worked out.
            let errors = validate::errors(&read.ir, rules);
            if !errors.is_empty() {
                return Err((GatewayError::Invalid { path: path.clone(), errors }, Location::Path(path)));
            }
            notes.extend(
                read.notices.into_iter().map(|notice| Note::Sanitized { path: path.clone(), notice }),
            );
            notes.push(Note::Payload {
                path: path.clone(),
                intent: read.ir.intent.as_str().to_owned(),
                req_id: read.ir.meta.req_id.as_str().to_owned(),
            });
            units.push(Unit {
                index,
                path,
                ir: read.ir,
                explicit_out: read.explicit_out,
                sanitized: read.sanitized,
            });
        }
        Ok(units)
    }

    /// What is known of an agent: its accepted frontends, learnt by `//ping` if it has pinged,
    /// else from config (`None`, no profile or an empty list: it takes any frontend); its
    /// tokenizer, the pinged one before the configured one; and its `fewest-tokens` setting.
    fn receiver(&self, agent: &str) -> Result<Receiver, GatewayError> {
        let configured = self.config.agents.iter().find(|a| a.name == agent);
        let (frontends, pinged) = match self.store.profile(agent)? {
            Some(profile) => (profile.frontends, profile.tokenizer),
            None => (configured.map(|a| a.frontends.clone()).unwrap_or_default(), None),
        };
        Ok(Receiver {
            accepted: (!frontends.is_empty()).then_some(frontends),
            tokenizer: pinged.or(configured.and_then(|a| a.tokenizer)),
            fewest_tokens: configured.is_some_and(|a| a.frontend == Some(FrontendRule::FewestTokens)),
        })
    }

    /// Notes what the compile.lock did: froze a new entry, or sent a frozen text that today's
    /// codec writes differently (drift).
    fn note_lock(freeze: &Freeze, frozen: &Frozen, notes: &mut Vec<Note>) {
        if frozen.first {
            notes.push(Note::LockFrozen { ir_hash: freeze.ir_hash.clone(), frontend: freeze.frontend });
        }
        if frozen.drift {
            notes.push(Note::LockDrift { ir_hash: freeze.ir_hash.clone(), frontend: freeze.frontend });
        }
    }

    fn answer_ping(&self, inbound: &Inbound, notes: &mut Vec<Note>) -> Result<Vec<Outbound>, GatewayError> {
        let announced = negotiate::announcement(&inbound.envelope)?;
        if let Some(tokenizer) = announced.tokenizer {
            tokenizer.warm();
        }
        let mut answer = negotiate::reply_to_ping(&announced)?;
        let agent = announced.agent.clone().unwrap_or_else(|| inbound.origin.source.clone());
        self.may_store_profile(&agent, &inbound.origin.source)?;
        let profile = AgentProfile {
            frontends: announced.frontends.clone(),
            source: ProfileSource::Ping,
            updated: inbound.received_at,
            tokenizer: announced.tokenizer,
        };
        let changes = Changes { profiles: vec![(agent.clone(), profile)], ..Changes::default() };
        self.store.commit(&changes, inbound.received_at)?;
        notes.push(Note::ProfileLearnt { agent, frontends: announced.frontends });
        reply::echo_tokens(&mut answer, &inbound.envelope, &self.config.gateway.name);
        Ok(vec![Outbound { destination: Destination::Reply, envelope: answer }])
    }
}

impl Gateway {
    /// A `//ping` may store a profile for `agent` when the name is bounded, a configured agent
    /// is the sender itself (no one else may change what it is sent), and a new profile fits
    /// under [`negotiate::MAX_PROFILES`].
    fn may_store_profile(&self, agent: &str, source: &str) -> Result<(), GatewayError> {
        negotiate::check_agent_name(agent)?;
        if agent != source && self.config.agents.iter().any(|a| a.name == agent) {
            return Err(GatewayError::Ping(format!(
                "agent '{agent}' is configured; only a //ping from '{agent}' itself changes its profile"
            )));
        }
        if self.store.profile(agent)?.is_none() && self.store.profile_count()? >= negotiate::MAX_PROFILES {
            return Err(GatewayError::Ping(format!(
                "silpgate keeps at most {} agent profiles learnt from //ping; idle ones are forgotten after sessions.idle_timeout_secs",
                negotiate::MAX_PROFILES
            )));
        }
        Ok(())
    }
}

/// The route a message takes: a configured one, or back to the asker for an agent's answer.
enum Route<'a> {
    Configured(&'a crate::config::RouteConfig),
    Answer(OutputForm),
}

impl Route<'_> {
    fn name(&self) -> &str {
        match self {
            Route::Configured(r) => &r.name,
            Route::Answer(_) => "answer",
        }
    }
}

fn nowhere(error: GatewayError) -> (GatewayError, Location) {
    (error, Location::None)
}

/// `content` or `submessages[i].content`: where a payload is, for notes and errors.
fn unit_path(index: Option<usize>) -> String {
    let Some(i) = index else { return "content".to_owned() };
    let mut path = String::with_capacity(32);
    path.push_str("submessages[");
    path.push_str(itoa::Buffer::new().format(i));
    path.push_str("].content");
    path
}

fn label_of(message: &Message, index: Option<usize>) -> Option<&str> {
    match index {
        None => message.label.as_deref(),
        Some(i) => message.submessages().get(i).and_then(|s: &Submessage| s.label.as_deref()),
    }
}

/// Who sends a message, for its conversation's owner: an agent when it answers, else the
/// door's client.
fn party_of(origin: &Origin, answer: bool) -> session::Party<'_> {
    match answer {
        true => session::Party::Agent,
        false => session::Party::Client(origin.principal.as_ref().map(|p| p.subject.as_str())),
    }
}
