//! What goes into and comes out of the gateway core: the inbound envelope with where it came
//! from, and the outcome the transport carries out.

use super::error::{Disposition, GatewayError};
use super::store::Millis;
use crate::nlip::Message;
use crate::silp::tokens::Tokenizer;
use crate::silp::{Frontend, Notice};

pub use crate::transport::Transport;

/// Where an inbound message came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub transport: Transport,
    /// The queue or listener name routes match on.
    pub source: String,
    /// Where replies go (AMQP `reply_to`); `None` when the transport answers in place.
    pub reply_to: Option<String>,
    /// Every reply address with the encoding it wants (AMQP `nlip-reply-*`, else `reply_to`).
    pub replies: Vec<(crate::nlip::Encoding, String)>,
    pub correlation_id: Option<String>,
    /// The sender's user (AMQP `user_id`), carried onward in a header.
    pub user_id: Option<String>,
    /// A stable id of the inbound message (AMQP `message_id`), for the processed-message ledger.
    pub message_id: Option<String>,
    /// The cluster partition the message's conversation belongs to (its queue), if any.
    pub partition: Option<super::session::Partition>,
    /// Who sent it, as its door verified; `None` without authentication.
    pub principal: Option<crate::principal::Principal>,
}

impl Origin {
    pub fn new(transport: Transport, source: impl Into<String>) -> Self {
        Origin {
            transport,
            source: source.into(),
            reply_to: None,
            replies: Vec::new(),
            correlation_id: None,
            user_id: None,
            message_id: None,
            partition: None,
            principal: None,
        }
    }
}

/// One envelope to handle.
#[derive(Debug, Clone)]
pub struct Inbound {
    pub envelope: Message,
    pub origin: Origin,
    /// When it arrived; sessions expire against this clock.
    pub received_at: Millis,
}

/// Where an outbound envelope goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// A downstream agent, by name.
    Agent(String),
    /// Back to the sender.
    Reply,
}

/// One envelope to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Outbound {
    pub destination: Destination,
    pub envelope: Message,
}

/// Why a frontend was chosen for a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChoiceReason {
    RouteOverride,
    AgentProfile,
    IrMetaOut,
    ConfiguredDefault,
    /// `frontend = "fewest-tokens"`: the accepted frontend cheapest in the agent's tokenizer.
    FewestTokens,
}

impl ChoiceReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ChoiceReason::RouteOverride => "route_override",
            ChoiceReason::AgentProfile => "agent_profile",
            ChoiceReason::IrMetaOut => "ir_meta_out",
            ChoiceReason::ConfiguredDefault => "configured_default",
            ChoiceReason::FewestTokens => "fewest_tokens",
        }
    }
}

/// Something the core decided or noticed, for logs, traces and metrics.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    /// The route taken.
    Route(String),
    /// The frontend sent for the payload at `path`, why, and what it degraded from.
    Frontend { path: String, frontend: Frontend, reason: ChoiceReason, degraded_from: Option<Frontend> },
    /// The SILP payload at `path`: intent and request id.
    Payload { path: String, intent: String, req_id: String },
    /// The session this message counted towards.
    Session { id: String, turn: u64, renewed: bool },
    /// The sanitiser changed the payload at `path`.
    Sanitized { path: String, notice: Notice },
    /// A compile produced different text than the compile.lock holds; the frozen text was sent.
    LockDrift { ir_hash: String, frontend: Frontend },
    /// A compile was frozen for the first time.
    LockFrozen { ir_hash: String, frontend: Frontend },
    /// A payload written in a surface frontend: its length, and the length of the same IR in
    /// the natural-language baseline (what a frontend saves).
    Size { frontend: Frontend, surface: usize, natural: usize },
    /// The same payload in the receiving agent's tokens: its count in `frontend`, and in the
    /// natural-language baseline. Only for agents with a tokenizer (configured or pinged).
    Tokens { agent: String, frontend: Frontend, tokenizer: Tokenizer, surface: usize, natural: usize },
    /// The sanitiser changed the payload at `path`: its tokens in the agent's tokenizer before
    /// and after the change (what invisible characters and look-alikes did to tokenization).
    SanitizedTokens { path: String, tokenizer: Tokenizer, before: usize, after: usize },
    /// An agent's profile was learnt from a `//ping`.
    ProfileLearnt { agent: String, frontends: Vec<Frontend> },
}

/// What happened to an inbound message.
#[derive(Debug)]
pub enum Status {
    /// Handled; send the outbound envelopes.
    Delivered,
    /// Already published before (a redelivery): acknowledge, send nothing.
    Duplicate,
    /// Not delivered; `outbound` holds the error reply, if one should be sent.
    Failed(GatewayError),
}

/// The core's answer for one inbound message.
#[derive(Debug)]
pub struct Outcome {
    pub status: Status,
    pub outbound: Vec<Outbound>,
    pub notes: Vec<Note>,
    /// The compile.lock entries this message froze first. A cluster also proposes them to the
    /// cluster-wide lock stream, whose order decides the chain.
    pub frozen: Vec<super::store::Freeze>,
    /// What the message changed in its conversation, for the replicas of its partition.
    pub change: super::store::SessionChange,
}

impl Outcome {
    /// An outcome that froze and changed nothing a cluster shares.
    pub(crate) fn new(status: Status, outbound: Vec<Outbound>, notes: Vec<Note>) -> Outcome {
        Outcome {
            status,
            outbound,
            notes,
            frozen: Vec::new(),
            change: super::store::SessionChange::default(),
        }
    }

    /// What the transport does with the inbound message.
    pub fn disposition(&self) -> Option<Disposition> {
        match &self.status {
            Status::Delivered => None,
            Status::Duplicate => Some(Disposition::Duplicate),
            Status::Failed(e) => Some(e.disposition()),
        }
    }
}
