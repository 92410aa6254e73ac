//! The one message path every door uses. A message's life, whichever door it came through:
//!
//! 1. **plan**: the gateway core decides it and commits its state ([`Intake::plan`]; a window
//!    of messages, each in order, with [`Intake::plan_window`]);
//! 2. **flush**: one flush makes the plans' state durable ([`Intake::make_durable`]);
//! 3. **share**: in cluster mode, what it taught the cluster goes to the streams;
//! 4. **deliver**: its envelopes go to their agents through the agents' connectors;
//! 5. **answer**: an answer given in the call (HTTP, A2A, MCP agents) is in hand and goes
//!    through the core at once, with no wait; one that comes later (AMQP, WebSocket agents)
//!    is waited for under an unguessable correlation id, at most `gateway.reply_timeout_ms`,
//!    and handed to the asker's door through the [`ReturnPath`] the door left;
//! 6. **outcome**: one per request: its replies and answer, or why it failed and with which
//!    disposition. A message that fails after counting a turn takes the turn back first.
//!
//! [`Intake::take`] runs all of it for a door that does not retry; the AMQP door, which
//! retries and acknowledges, runs the steps itself around its own settling. An agent's answer
//! is a message like any other (its conversation's turn counted, sanitised, validated),
//! written in the form the asker reads.
//!
//! Doors own their wire (decoding, acknowledgements, status codes, retries); the intake owns
//! everything between: one span layout, one set of metric labels, one disposition map.
//!
//! In cluster mode the intake also shares what a message taught the cluster: the compile.lock
//! entries it froze first and the agent profiles it learnt go to the lock stream, confirmed
//! before the message is delivered ([`Intake::take`]) or an answer handed back
//! ([`Intake::answer`]). A partition owner's messages are the exception: the AMQP door appends
//! theirs with the message's changelog entry, in the one confirm wait before the ack.
//! A front-door message that belongs to a conversation is not taken here at all in cluster
//! mode: it goes to its partition's owner ([`Intake::forward`], [`forward`]).

pub(crate) mod forward;
#[cfg(test)]
mod tests;
pub(crate) mod waiting;

use crate::broker::link::BrokerLink;
use crate::broker::publish::PublishError;
use crate::cluster::{Cluster, ClusterError};
use crate::code::Code;
use crate::config::{AwaitMode, Reach, RepliesMode};
pub(crate) use crate::connectors::AnswerError;
use crate::connectors::{Agents, AnswerTo, DeliveryError, Parcel};
use crate::gateway::payload::{self, OutputForm};
use crate::gateway::store::StoreError;
use crate::gateway::store::{Freeze, SessionChange, Turn};
use crate::gateway::{
    Destination, Disposition, Gateway, GatewayError, Inbound, Note, Origin, Status, Transport,
};
use crate::nlip::reply::{self, Location};
use crate::nlip::{Encoding, Message, NlipError, NlipErrorKind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tracing::{Instrument, info_span};
pub(crate) use waiting::{InPlace, ReturnPath, Returned, Waiter, Waiting};

/// A message a door hands in.
pub(crate) struct Arrival {
    pub envelope: Message,
    pub origin: Origin,
    /// The message's span (a [`crate::telemetry::message_span!`]); the intake's stages are its
    /// children and fill in its fields.
    pub span: tracing::Span,
    /// Where an agent's answer to this message goes; `None`: nobody waits for one.
    pub answers: Option<Arc<dyn ReturnPath>>,
    /// What the message's envelopes are numbered from when it has no `message_id`: a door
    /// that recognises a redelivery without one (AMQP: by the body's hash) names it, so that
    /// the agents get a redelivery under the ids they got the first time. `None`: a fresh id.
    pub content_id: Option<String>,
}

/// What became of a message the core accepted.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    /// Envelopes for the sender now, in order (a reply route, a ping's answer).
    pub replies: Vec<Message>,
    /// Already handled before (a redelivery): nothing was done again.
    pub duplicate: bool,
    /// compile.lock entries this message froze first.
    pub frozen: Vec<Freeze>,
    /// Agents whose profiles this message taught (a `//ping`).
    pub learnt: Vec<String>,
    /// The ids of the envelopes delivered to agents.
    pub delivered: Vec<String>,
    /// The correlation id of the request whose answer comes later, to the door's return path
    /// (an AMQP or WebSocket agent's).
    pub awaiting: Option<String>,
    /// The agent's answer when it came in the call that delivered the request (an HTTP, A2A
    /// or MCP agent's): through the core and written for the sender, for the door to return
    /// after `replies`. Nothing waited for it.
    pub answer: Option<Message>,
    /// What the message changed in its conversation, for the replicas of its partition.
    pub change: SessionChange,
}

/// Why a message was not taken, and what the sender is told.
#[derive(Debug)]
pub(crate) struct NotTaken {
    pub failure: Failure,
    /// Envelopes for the sender (the error message), in order.
    pub replies: Vec<Message>,
}

/// Why a message failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    #[error(transparent)]
    Delivery(#[from] DeliveryError),
    /// The agent answered at once (HTTP), and its answer could not be passed on.
    #[error("the agent's answer could not be passed on: {0}")]
    Answer(AnswerError),
    /// In cluster mode: what the message taught the cluster did not reach the lock stream.
    #[error("the cluster's lock stream did not take the message's entries: {0}")]
    Shared(ClusterError),
    /// In cluster mode: a front-door message did not reach its partition's owner.
    #[error("the message could not be forwarded to its partition's owner: {0}")]
    Forward(ClusterError),
}

impl Failure {
    /// The one place a message's failure maps to a disposition.
    pub(crate) fn disposition(&self) -> Disposition {
        match self {
            Failure::Gateway(e) => e.disposition(),
            Failure::Delivery(e) => e.disposition(),
            Failure::Answer(e) => e.disposition(),
            Failure::Shared(_) | Failure::Forward(_) => Disposition::Transient,
        }
    }

    pub(crate) fn code(&self) -> &str {
        match self {
            Failure::Gateway(e) => e.code(),
            Failure::Delivery(e) => e.code(),
            Failure::Answer(e) => e.code(),
            Failure::Shared(_) | Failure::Forward(_) => Code::BrokerUnavailable.as_str(),
        }
    }
}

/// What a configuration makes of the message path: the gateway core and the agents'
/// connectors. A reload replaces it as a whole ([`Intake::replace`]); each message takes the
/// one current when it starts, and finishes under it.
pub(crate) struct Core {
    pub gateway: Gateway,
    pub agents: Agents,
}

/// The intake: the core, the agents, and the requests waiting for answers.
pub(crate) struct Intake {
    core: std::sync::RwLock<Arc<Core>>,
    waiting: Waiting,
    /// Front-door messages forwarded to their partition's owner, awaiting its replies.
    forwards: forward::Forwards,
    ids: Ids,
    /// In cluster mode: the cluster and the broker its lock stream is written through.
    cluster: Option<(Arc<Cluster>, BrokerLink)>,
}

impl Intake {
    pub(crate) fn new(gateway: Gateway, agents: Agents) -> Self {
        let timeout = Duration::from_millis(gateway.config().gateway.reply_timeout_ms.max(1));
        let ids = Ids::new(&gateway.config().gateway.name);
        let waiting = Waiting::new(timeout);
        let core = std::sync::RwLock::new(Arc::new(Core { gateway, agents }));
        Intake { core, waiting, forwards: forward::Forwards::default(), ids, cluster: None }
    }

    /// The core messages start under now.
    pub(crate) fn core(&self) -> Arc<Core> {
        self.core.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Makes `core` the one later messages start under; those under way finish under theirs.
    pub(crate) fn replace(&self, core: Core) {
        *self.core.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(core);
    }

    /// In cluster mode: messages taken here share what they froze and learnt on the cluster's
    /// lock stream, through the AMQP side's connection.
    #[must_use]
    pub(crate) fn in_cluster(mut self, cluster: Arc<Cluster>, broker: BrokerLink) -> Self {
        self.cluster = Some((cluster, broker));
        self
    }

    /// Appends `change` to its partition's changelog, and `frozen` and the profiles of
    /// `learnt` to the cluster's lock stream, and waits for the confirms, in a span under
    /// `parent` (nothing to do, and no span, outside cluster mode or when the message changed
    /// and taught nothing the cluster shares). The local store has them already; the streams
    /// are what make them the cluster's.
    async fn share(
        &self,
        parent: &tracing::Span,
        change: &SessionChange,
        frozen: &[Freeze],
        learnt: &[String],
    ) -> Result<(), ClusterError> {
        let Some((cluster, broker)) = &self.cluster else { return Ok(()) };
        if change.session.is_none() && frozen.is_empty() && learnt.is_empty() {
            return Ok(());
        }
        let Some(link) = broker.current() else {
            return Err(ClusterError::Stream("the broker is not connected".into()));
        };
        let shared = cluster
            .propose(&link.publisher, change, frozen, learnt)
            .instrument(info_span!(parent: parent, "cluster share"))
            .await;
        if let Err(ClusterError::Publish(e @ crate::broker::publish::PublishError::Channel(_))) = &shared {
            link.endings.broken(e);
        }
        shared
    }

    pub(crate) fn waiting(&self) -> &Waiting {
        &self.waiting
    }

    pub(crate) fn forwards(&self) -> &forward::Forwards {
        &self.forwards
    }

    /// Whether a front-door message goes to its partition's owner instead of being taken here:
    /// in cluster mode, when it belongs to a conversation. A message without a conversation
    /// token has no session to keep in one place, and is taken by whichever instance has it.
    pub(crate) fn forwards_to_owner(&self, envelope: &Message) -> bool {
        self.cluster.is_some() && envelope.conversation_token().is_some()
    }

    /// Publishes a front-door message to its partition (see [`forward`]) and returns the wait
    /// for the owner's replies, once the broker has confirmed it. `source` is the door's name,
    /// which the owner's routes match on.
    pub(crate) async fn forward(
        &self,
        envelope: &Message,
        (transport, source, principal): (Transport, &str, Option<&crate::principal::Principal>),
        span: &tracing::Span,
    ) -> Result<tokio::sync::oneshot::Receiver<Vec<Message>>, NotTaken> {
        let unforwarded = |e: ClusterError| failed(span, transport, refusal(Failure::Forward(e)));
        let (Some((cluster, broker)), Some(key)) = (&self.cluster, envelope.conversation_token()) else {
            return Err(unforwarded(ClusterError::Stream("not a clustered conversation".into())));
        };
        let Some(link) = broker.current() else {
            return Err(unforwarded(ClusterError::Stream("the broker is not connected".into())));
        };
        let id = self.ids.next();
        let publish_span = info_span!(parent: span, "cluster forward", messaging.destination.name = %cluster.config.exchange);
        let publication =
            cluster.forward_publication(envelope, (key, source, principal), &id, &link.user, &publish_span);
        let replies = self.forwards.expect(&id);
        let sent =
            async { link.publisher.send(publication)?.confirmed().await }.instrument(publish_span).await;
        let result = if sent.is_ok() { "forwarded" } else { "failed" };
        crate::metrics::get().front_door_forwards.with_label_values(&[transport.as_str(), result]).inc();
        if let Err(e) = sent {
            self.forwards.cancel(&id);
            if matches!(e, PublishError::Channel(_)) {
                link.endings.broken(&e);
            }
            return Err(unforwarded(ClusterError::Publish(e)));
        }
        Ok(replies)
    }

    /// Takes one message through the core, makes its state durable and delivers what it
    /// produced to its agents. The door settles the message by the result: a door that takes
    /// a message this way does not try it again, so a message that fails here leaves no turn
    /// counted ([`take_back`](Self::take_back)) and its sender may send it again.
    pub(crate) async fn take(&self, arrival: Arrival) -> Result<Taken, NotTaken> {
        let planned = self.plan(arrival)?;
        if let Err(e) = self.make_durable(&[&planned]).await {
            return Err(planned.refuse(refusal(GatewayError::Store(e).into())));
        }
        let counted = planned.counted.clone();
        let shared = match planned.duplicate {
            true => Ok(()),
            false => self.share(&planned.span, &planned.change, &planned.frozen, &planned.learnt).await,
        };
        let taken = match shared {
            Ok(()) => self.deliver_planned(planned).await,
            Err(e) => Err(planned.refuse(refusal(Failure::Shared(e)))),
        };
        if taken.is_err()
            && let Some((token, turn)) = &counted
        {
            self.take_back(token, turn).await;
        }
        taken
    }

    /// Takes back `turn` of conversation `token`, which a message that failed counted, and
    /// makes that durable, before the message's sender hears that it failed. Best effort: a
    /// turn that stays counted is a gap in the numbering, nothing is lost.
    async fn take_back(&self, token: &str, turn: &Turn) {
        let core = self.core();
        match core.gateway.take_back_turn(token, turn, None) {
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(e) => {
                return tracing::warn!(turn = turn.turn, error = %e, "A failed message's turn could not be taken back.");
            }
        }
        if let Err(e) = core.gateway.store().flush_async().await {
            tracing::warn!(turn = turn.turn, error = %e, "A failed message's turn was taken back but could not be made durable.");
        }
    }

    /// The first half of taking a window of messages: the core decides each in the order
    /// given and commits its state, and one flush makes the window's state durable. The door
    /// then delivers each plan with [`deliver_planned`](Self::deliver_planned), in the order it
    /// keeps (a conversation's messages one after another). Per arrival: its plan, or why the
    /// core refused it; `Err(None)` for a message not planned here (`None` in: the door could
    /// not read it; or the flush failed), which the door takes on its one-at-a-time path,
    /// where it meets its failure again and knows what to do.
    pub(crate) async fn plan_window(
        &self,
        arrivals: Vec<Option<Arrival>>,
    ) -> Vec<Result<Planned, Option<NotTaken>>> {
        let mut planned: Vec<_> = arrivals
            .into_iter()
            .map(|arrival| {
                let arrival = arrival.ok_or(None)?;
                let span = arrival.span.clone();
                span.in_scope(|| self.plan(arrival)).map_err(Some)
            })
            .collect();
        let plans: Vec<&Planned> = planned.iter().flatten().collect();
        if self.make_durable(&plans).await.is_err() {
            for plan in planned.iter_mut().filter(|p| p.is_ok()) {
                *plan = Err(None);
            }
        }
        planned
    }

    /// Makes the state `plans` committed durable with one flush, which each message's trace
    /// shows as its own `store flush` stage. Nothing to do when none of them changed state.
    ///
    /// # Errors
    /// The store could not flush: none of the plans' state is known to be durable.
    pub(crate) async fn make_durable(&self, plans: &[&Planned]) -> Result<(), StoreError> {
        let durable: Vec<&&Planned> = plans.iter().filter(|p| p.needs_flush()).collect();
        if durable.is_empty() {
            return Ok(());
        }
        let count = durable.len();
        let spans: Vec<tracing::Span> = durable
            .iter()
            .map(|p| info_span!(parent: &p.span, "store flush", messaging.batch.message_count = count))
            .collect();
        let flushed = self.core().gateway.store().flush_async().await;
        drop(spans);
        flushed
    }

    /// Bytes a door could not read as an NLIP message: what their sender is told, the same
    /// through every door. CBOR that does not decode gets the failure message of ECMA-432
    /// §11, with its hint to fall back to text; anything else gets the core's error for the
    /// envelope, saying where it broke.
    pub(crate) fn unreadable(&self, error: NlipError, encoding: Encoding) -> NotTaken {
        let reply = if encoding == Encoding::Cbor && error.kind == NlipErrorKind::InvalidEncoding {
            let message = format!("CBOR decoding failed. Fallback to text recommended. ({})", error.message);
            reply::error_message(error.kind.code(), &message, &Location::None)
        } else {
            let outcome = self.core().gateway.reject_undecodable(error.clone());
            outcome.outbound.into_iter().next().map_or_else(
                || reply::error_message(error.kind.code(), "the message cannot be read", &Location::None),
                |o| o.envelope,
            )
        };
        NotTaken { failure: GatewayError::Envelope(error).into(), replies: vec![reply] }
    }

    /// The first half of [`take`](Self::take): the core decides and commits the message's
    /// state, which is not yet durable. A door that plans several messages makes them durable
    /// with one [`Store::flush_async`](crate::gateway::store::Store::flush_async) for all,
    /// then delivers each with [`deliver_planned`](Self::deliver_planned).
    pub(crate) fn plan(&self, arrival: Arrival) -> Result<Planned, NotTaken> {
        let Arrival { envelope, origin, span, answers, content_id } = arrival;
        crate::telemetry::record_format(&span, &envelope);
        let form = payload::answer_form(&envelope);
        let token = envelope.conversation_token().map(str::to_owned);
        let base_id = origin.message_id.clone().or(content_id).unwrap_or_else(|| self.ids.next());
        let inbound =
            Inbound { envelope, origin: origin.clone(), received_at: crate::util::time::now_millis() };
        let core = self.core();
        let outcome =
            info_span!(parent: &span, "gateway handle").in_scope(|| self.handle(&core, inbound, None));
        crate::telemetry::record_notes(&span, &outcome.notes);
        crate::metrics::get().observe_notes(&outcome.notes);
        let route = route_of(&core, &outcome.notes);
        let learnt = learnt(&outcome.notes);
        let counted = token.zip(counted(&outcome.notes));
        let (outbound, frozen, change, duplicate) = match outcome.status {
            Status::Duplicate => (Vec::new(), Vec::new(), SessionChange::default(), true),
            Status::Failed(error) => {
                let replies = outcome.outbound.into_iter().map(|o| o.envelope).collect();
                return Err(failed(&span, origin.transport, NotTaken { failure: error.into(), replies }));
            }
            Status::Delivered => (outcome.outbound, outcome.frozen, outcome.change, false),
        };
        Ok(Planned {
            core,
            span,
            base_id,
            origin,
            form,
            route,
            answers,
            outbound,
            frozen,
            learnt,
            change,
            duplicate,
            counted,
        })
    }

    /// The second half of [`take`](Self::take), once the plan's state is durable: delivers
    /// what the core produced to its agents.
    pub(crate) async fn deliver_planned(&self, planned: Planned) -> Result<Taken, NotTaken> {
        if planned.duplicate {
            return Ok(Taken { duplicate: true, ..Taken::default() });
        }
        let Planned {
            core,
            span,
            base_id,
            origin,
            form,
            route,
            answers,
            outbound,
            frozen,
            learnt,
            change,
            ..
        } = planned;
        let mut taken = Taken { frozen, learnt, change, ..Taken::default() };
        let route = route.and_then(|index| core.gateway.config().routes.get(index));
        let delivery = Delivery { core: &core, base_id: &base_id, origin: &origin, form, route, answers };
        match self.deliver(outbound, delivery, &mut taken).instrument(span.clone()).await {
            Ok(()) => Ok(taken),
            Err(refused) => Err(failed(&span, origin.transport, refused)),
        }
    }

    /// Runs the core on a message (or, with the asker's form, on an answer); the core makes
    /// again a plan that lost a race with another message of its conversation.
    ///
    /// In a cluster, what the message changed in a partition's conversation is noted from its
    /// commit on, until its changelog entry is confirmed ([`Cluster::committed`]).
    fn handle(
        &self,
        core: &Core,
        inbound: Inbound,
        answering: Option<OutputForm>,
    ) -> crate::gateway::Outcome {
        let cluster = self.cluster.as_ref().map(|(cluster, _)| cluster);
        let _committing = cluster.map(|cluster| cluster.committing());
        let outcome = match answering {
            None => core.gateway.handle(inbound),
            Some(form) => core.gateway.handle_answer(inbound, form),
        };
        if let Some(cluster) = cluster {
            cluster.committed(&outcome.change);
        }
        outcome
    }

    /// Delivers an outcome's envelopes: replies to the door, the rest to their agents, each
    /// agent's in order. The last envelope for an agent is the request its answer belongs to.
    async fn deliver(
        &self,
        outbound: Vec<crate::gateway::Outbound>,
        delivery: Delivery<'_>,
        taken: &mut Taken,
    ) -> Result<(), NotTaken> {
        let mut by_agent: Vec<(String, Vec<Parcel>)> = Vec::new();
        for (index, out) in outbound.into_iter().enumerate() {
            let agent = match out.destination {
                Destination::Reply => {
                    taken.replies.push(out.envelope);
                    continue;
                }
                Destination::Agent(agent) => agent,
            };
            let parcel = Parcel {
                envelope: out.envelope,
                message_id: outbound_id(delivery.base_id, index),
                answer_to: AnswerTo::Nobody,
                user_id: delivery.origin.user_id.clone(),
                progress: delivery.answers.clone().map(|path| crate::connectors::ProgressTo(path)),
            };
            match by_agent.iter_mut().find(|(name, _)| *name == agent) {
                Some((_, parcels)) => parcels.push(parcel),
                None => by_agent.push((agent, vec![parcel])),
            }
        }
        for (agent, mut parcels) in by_agent {
            let Some(connector) = delivery.core.agents.get(&agent) else {
                let detail = "no connector is configured for it".to_owned();
                return Err(refusal(
                    DeliveryError::Unavailable { agent, code: Code::Unavailable.as_str(), detail }.into(),
                ));
            };
            let request = parcels.last_mut().expect("a group holds a parcel");
            request.answer_to = self.answer_to(&agent, connector.answers_in_call(), &delivery);
            let asked = request.answer_to.clone();
            let request_id = request.message_id.clone();
            let ids: Vec<String> = parcels.iter().map(|p| p.message_id.clone()).collect();
            let metrics = crate::metrics::get();
            let labels =
                |result: &str| [agent.clone(), connector.transport().as_str().to_owned(), result.to_owned()];
            // A request someone waits for is bounded as a whole by the reply timeout: an agent
            // that answers in the call (HTTP, A2A, MCP) but slowly, or drips its answer, is cut there.
            let since = Instant::now();
            let delivering = connector.deliver(parcels);
            let mut timed_out = false;
            let delivered = match asked {
                AnswerTo::Gateway { .. } | AnswerTo::Caller => {
                    tokio::time::timeout(self.waiting.timeout(), delivering).await.unwrap_or_else(|_| {
                        timed_out = true;
                        Err(DeliveryError::Unavailable {
                            agent: agent.clone(),
                            code: Code::Timeout.as_str(),
                            detail: format!("no answer within {} ms", self.waiting.timeout().as_millis()),
                        })
                    })
                }
                AnswerTo::Direct { .. } | AnswerTo::Nobody => delivering.await,
            };
            match delivered {
                Ok(delivered) => {
                    metrics.agent_deliveries.with_label_values(&labels("delivered")).inc_by(ids.len() as u64);
                    if asked == AnswerTo::Caller && !delivered.answers.iter().any(|(id, _)| *id == request_id)
                    {
                        // The agent took the request and gave no answer (an HTTP 2xx without a
                        // body): its asker hears that the agent has it, not a timeout.
                        taken.answer = taken.answer.take().or_else(|| Some(reply::accepted(&ids)));
                    }
                    taken.delivered.extend(ids);
                    let in_hand = delivered.answers.into_iter().find(|(id, _)| *id == request_id);
                    match (asked, in_hand) {
                        (AnswerTo::Gateway { correlation_id }, _) => {
                            taken.awaiting = taken.awaiting.take().or(Some(correlation_id));
                        }
                        (AnswerTo::Caller, Some((_, answer))) => {
                            metrics
                                .reply_wait_seconds
                                .with_label_values(&[&agent])
                                .observe(since.elapsed().as_secs_f64());
                            let span = info_span!("agent answer", silpgate.agent = %agent);
                            let from = Origin::new(delivery.origin.transport, agent.as_str());
                            match self.read_answer(&span, delivery.form, answer, from).await {
                                Ok(Some(read)) => taken.answer = taken.answer.take().or(Some(read.message)),
                                Ok(None) => {}
                                Err(e) => return Err(refusal(Failure::Answer(e))),
                            }
                        }
                        (_, Some(_)) if self.waiting.is_concluded(delivery.base_id) => {
                            // Its sender heard `timeout` on an earlier attempt: the answer goes nowhere.
                            metrics.replies_orphaned.with_label_values(&["timeout"]).inc();
                            tracing::warn!(agent = %agent, request = delivery.base_id, "An answer came after its sender was told it timed out; dropped.");
                        }
                        _ => {}
                    }
                }
                Err(error) => {
                    let result = error.disposition().as_str();
                    metrics.agent_deliveries.with_label_values(&labels(result)).inc_by(ids.len() as u64);
                    // Nothing will answer this request now. Past the reply timeout its sender
                    // hears `timeout`, once, as a wait that expires tells it.
                    match &asked {
                        AnswerTo::Gateway { correlation_id } => {
                            if let Some(waiter) = self.waiting.take(correlation_id)
                                && timed_out
                            {
                                self.waiting.conclude(&waiter.request);
                                self.tell_timeout(&waiter.agent, &waiter.path).await;
                            }
                        }
                        AnswerTo::Caller if timed_out => {
                            if let Some(path) = &delivery.answers {
                                self.waiting.conclude(delivery.base_id);
                                self.tell_timeout(&agent, path).await;
                            }
                        }
                        _ => {}
                    }
                    let said = match &error {
                        DeliveryError::Refused { answer: Some(answer), .. } => Some(Message::clone(answer)),
                        _ => None,
                    };
                    let mut refused = refusal(error.into());
                    if let Some(answer) = said {
                        // The agent said why in NLIP: the sender hears it in the agent's words.
                        refused.replies = vec![answer];
                    }
                    return Err(refused);
                }
            }
        }
        Ok(())
    }

    /// Who the agent answers for a request: the call itself for an agent that answers in it
    /// (`in_call`); else silpgate, under a fresh, unguessable correlation id whose wait starts
    /// here.
    fn answer_to(&self, agent: &str, in_call: bool, delivery: &Delivery<'_>) -> AnswerTo {
        let direct = delivery.route.is_some_and(|r| r.replies == RepliesMode::Direct);
        let unwanted = delivery.route.is_some_and(|r| r.wait == AwaitMode::None);
        let origin = delivery.origin;
        // A sender that heard this request's outcome (an earlier attempt timed out) hears
        // nothing more: the agent gets the request again, but nobody waits for its answer.
        let concluded = self.waiting.is_concluded(delivery.base_id);
        match &delivery.answers {
            _ if direct => AnswerTo::Direct {
                reply_to: origin.reply_to.clone(),
                replies: origin.replies.clone(),
                correlation_id: origin.correlation_id.clone(),
            },
            Some(_) if !unwanted && !concluded && in_call => AnswerTo::Caller,
            Some(path) if !unwanted && !concluded => {
                let waiter = Waiter {
                    agent: agent.to_owned(),
                    form: delivery.form,
                    path: path.clone(),
                    since: Instant::now(),
                    request: delivery.base_id.to_owned(),
                };
                let correlation_id = crate::util::token::unguessable();
                self.waiting.wait(&correlation_id, waiter);
                AnswerTo::Gateway { correlation_id }
            }
            _ => AnswerTo::Nobody,
        }
    }

    /// An agent's answer to the wait `id` (its correlation id): through the core, written for
    /// the asker, then to the asker's door. `from` says which agent and transport it came
    /// from; an AMQP answer whose agent names its broker `user` is believed only from that user.
    pub(crate) async fn answer(&self, id: &str, envelope: Message, from: Origin) -> Result<(), AnswerError> {
        let metrics = crate::metrics::get();
        let Some(waiter) = self.waiting.take(id) else {
            metrics.replies_orphaned.with_label_values(&["timeout"]).inc();
            return Err(AnswerError::Orphan);
        };
        if from.transport == Transport::Amqp
            && let Some(user) =
                self.core().gateway.config().agents.iter().find(|a| a.name == waiter.agent).and_then(|a| {
                    match &a.reach {
                        Reach::Amqp(reach) => reach.user.as_deref(),
                        _ => None,
                    }
                })
            && from.user_id.as_deref() != Some(user)
        {
            metrics.replies_orphaned.with_label_values(&["forged"]).inc();
            let agent = waiter.agent.clone();
            // The agent's own answer may still come.
            self.waiting.restore(id, waiter);
            return Err(AnswerError::Forged { agent, got: from.user_id });
        }
        metrics
            .reply_wait_seconds
            .with_label_values(&[&waiter.agent])
            .observe(waiter.since.elapsed().as_secs_f64());
        let span = info_span!("agent answer", silpgate.agent = %waiter.agent, silpgate.correlation_id = id);
        let ReadAnswer { message, invalid } = match self.read_answer(&span, waiter.form, envelope, from).await
        {
            Ok(Some(read)) => read,
            Ok(None) => return Ok(()),
            Err(e) => {
                self.waiting.restore(id, waiter);
                return Err(e);
            }
        };
        match waiter.path.send(message).instrument(span).await {
            Ok(()) => invalid.map_or(Ok(()), |e| Err(AnswerError::Invalid(e))),
            Err(Returned::Gone) => {
                metrics.replies_orphaned.with_label_values(&["requester_gone"]).inc();
                Err(AnswerError::Gone)
            }
            Err(Returned::Retry(why)) => {
                self.waiting.restore(id, waiter);
                Err(AnswerError::Retry(why))
            }
        }
    }

    /// An agent's answer through the core, in `span`: its turn counted, sanitised and
    /// validated, made durable and shared, and written in the asker's `form`. `None`: it was
    /// handled before (a redelivery), and passed on then.
    ///
    /// # Errors
    /// Only [`AnswerError::Retry`]: the answer's state could not be made durable or shared
    /// yet. An answer the core refuses for good is read as an error message for its asker.
    async fn read_answer(
        &self,
        span: &tracing::Span,
        form: OutputForm,
        envelope: Message,
        from: Origin,
    ) -> Result<Option<ReadAnswer>, AnswerError> {
        let inbound = Inbound { envelope, origin: from, received_at: crate::util::time::now_millis() };
        let core = self.core();
        let outcome = span.in_scope(|| self.handle(&core, inbound, Some(form)));
        crate::metrics::get().observe_notes(&outcome.notes);
        let invalid = match outcome.status {
            Status::Duplicate => return Ok(None),
            Status::Failed(e) if e.disposition() == Disposition::Transient => {
                return Err(AnswerError::Retry(e.to_string()));
            }
            Status::Failed(e) => Some(e),
            Status::Delivered => None,
        };
        if let Err(e) = core.gateway.store().flush_async().await {
            return Err(AnswerError::Retry(e.to_string()));
        }
        if let Err(e) = self.share(span, &outcome.change, &outcome.frozen, &learnt(&outcome.notes)).await {
            return Err(AnswerError::Retry(e.to_string()));
        }
        let message = outcome.outbound.into_iter().next().map(|o| o.envelope).unwrap_or_else(|| {
            let error = invalid.as_ref().map_or("internal", GatewayError::code);
            reply::error_message(error, "the agent's answer cannot be passed on", &Location::None)
        });
        Ok(Some(ReadAnswer { message, invalid }))
    }

    /// Ends the waits whose time is up, telling each asker with a `timeout` error; forgets the
    /// forwarded messages whose askers stopped waiting.
    pub(crate) async fn expire_due(&self) {
        self.forwards.prune();
        for waiter in self.waiting.expired(Instant::now()) {
            self.tell_timeout(&waiter.agent, &waiter.path).await;
        }
    }

    /// Tells the asker at `path` that `agent` did not answer in time.
    async fn tell_timeout(&self, agent: &str, path: &Arc<dyn ReturnPath>) {
        let detail = format!("agent {agent} did not answer within {} ms", self.waiting.timeout().as_millis());
        crate::metrics::get().failures.with_label_values(&["agent", "transient", "timeout"]).inc();
        let _ = path.send(reply::error_message(Code::Timeout.as_str(), &detail, &Location::None)).await;
    }

    /// Expires waits every 50 ms, until the process ends.
    pub(crate) async fn expire_forever(self: Arc<Self>) {
        let mut every = tokio::time::interval(Duration::from_millis(50));
        loop {
            every.tick().await;
            self.expire_due().await;
        }
    }
}

impl crate::connectors::AnswerPath for Intake {
    fn answer(
        &self,
        id: String,
        answer: Message,
        from: Origin,
    ) -> futures_util::future::BoxFuture<'_, Result<(), AnswerError>> {
        Box::pin(async move { Intake::answer(self, &id, answer, from).await })
    }
}

/// A message the core has decided and committed, not yet durable nor delivered.
pub(crate) struct Planned {
    /// The core it was planned under, which delivers it too.
    core: Arc<Core>,
    span: tracing::Span,
    base_id: String,
    origin: Origin,
    form: OutputForm,
    /// The configured route it took, by its index in the core's configuration.
    route: Option<usize>,
    answers: Option<Arc<dyn ReturnPath>>,
    outbound: Vec<crate::gateway::Outbound>,
    frozen: Vec<Freeze>,
    learnt: Vec<String>,
    change: SessionChange,
    duplicate: bool,
    /// The conversation and the turn the message counted, if it counted one.
    counted: Option<(String, Turn)>,
}

impl Planned {
    /// Whether the plan wrote anything that must be durable before it is delivered.
    pub(crate) fn needs_flush(&self) -> bool {
        !self.duplicate
    }

    /// The plan failed after all (its state could not be made durable).
    pub(crate) fn refuse(self, refused: NotTaken) -> NotTaken {
        failed(&self.span, self.origin.transport, refused)
    }
}

/// The configured route a message took (its index in `core`'s routes), from the core's notes.
fn route_of(core: &Core, notes: &[Note]) -> Option<usize> {
    let name = notes.iter().find_map(|n| match n {
        Note::Route(name) => Some(name),
        _ => None,
    })?;
    core.gateway.config().routes.iter().position(|r| &r.name == name)
}

/// The agents whose profiles a message taught, from the core's notes.
fn learnt(notes: &[Note]) -> Vec<String> {
    notes
        .iter()
        .filter_map(|n| match n {
            Note::ProfileLearnt { agent, .. } => Some(agent.clone()),
            _ => None,
        })
        .collect()
}

/// The turn a message counted, from the core's notes.
fn counted(notes: &[Note]) -> Option<Turn> {
    notes.iter().find_map(|n| match n {
        Note::Session { id, turn, renewed } => Some(Turn { id: id.clone(), turn: *turn, renewed: *renewed }),
        _ => None,
    })
}

/// Records a refusal on the message's span and in the failure metrics.
fn failed(span: &tracing::Span, transport: crate::gateway::Transport, refused: NotTaken) -> NotTaken {
    let (disposition, code) = (refused.failure.disposition(), refused.failure.code());
    span.record("error.type", code);
    span.record("silpgate.disposition", disposition.as_str());
    crate::metrics::get().failures.with_label_values(&[transport.as_str(), disposition.as_str(), code]).inc();
    refused
}

/// An agent's answer as its asker gets it: the message, and why the core refused the agent's
/// own if it did (the message then says so).
struct ReadAnswer {
    message: Message,
    invalid: Option<GatewayError>,
}

/// What the deliveries of one message need to know about it.
struct Delivery<'a> {
    core: &'a Core,
    base_id: &'a str,
    origin: &'a Origin,
    form: OutputForm,
    route: Option<&'a crate::config::RouteConfig>,
    answers: Option<Arc<dyn ReturnPath>>,
}

/// The id of the `index`-th envelope an inbound message sends on: stable across redeliveries
/// of the message, so that agents can drop duplicates.
fn outbound_id(inbound_id: &str, index: usize) -> String {
    format!("{inbound_id}:{index}")
}

/// A refusal whose sender hears the error.
fn refusal(failure: Failure) -> NotTaken {
    let detail = failure.to_string();
    let message = reply::error_message(failure.code(), &detail, &Location::None);
    NotTaken { failure, replies: vec![message] }
}

/// Ids for messages that came without one (HTTP, WebSocket): unique across restarts of this
/// gateway, so that the envelopes it sends on for them never share an id.
struct Ids {
    prefix: String,
    next: AtomicU64,
}

impl Ids {
    fn new(gateway: &str) -> Self {
        let started = crate::util::time::now_millis();
        Ids { prefix: format!("{gateway}-{started:x}-{:x}", std::process::id()), next: AtomicU64::new(0) }
    }

    fn next(&self) -> String {
        format!("{}-{}", self.prefix, self.next.fetch_add(1, Ordering::Relaxed))
    }
}
