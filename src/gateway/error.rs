//! Why the gateway core could not deliver a message, and what the transport must do about it.

use super::store::StoreError;
use crate::code::Code;
use crate::nlip::NlipError;
use crate::silp::SilpError;

/// What a transport does with an inbound message the core did not deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// The message can never succeed: reject it (dead-letter), answer the sender.
    Poison,
    /// Something outside the message failed: retry later.
    Transient,
    /// Already handled: acknowledge without doing anything.
    Duplicate,
    /// silpgate itself is broken: stop and page someone.
    Fatal,
}

impl Disposition {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Disposition::Poison => "poison",
            Disposition::Transient => "transient",
            Disposition::Duplicate => "duplicate",
            Disposition::Fatal => "fatal",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("{0}")]
    Envelope(#[from] NlipError),
    #[error("{path}: {error}")]
    Silp { path: String, error: SilpError },
    #[error("{path}: IR is not valid: {}", errors.join("; "))]
    Invalid { path: String, errors: Vec<String> },
    #[error("no route matches this message")]
    NoRoute,
    /// The sender may not do this: reach the route's agent, or continue another principal's
    /// conversation. The words reveal nothing of the agent.
    #[error("{0}")]
    Forbidden(&'static str),
    #[error("session {id} of this conversation has expired; start a new conversation")]
    SessionExpired { id: String },
    #[error("//ping: {0}")]
    Ping(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl GatewayError {
    /// The one place that maps an error to a disposition.
    pub fn disposition(&self) -> Disposition {
        match self {
            GatewayError::Envelope(_)
            | GatewayError::Silp { .. }
            | GatewayError::Invalid { .. }
            | GatewayError::NoRoute
            | GatewayError::Forbidden(_)
            | GatewayError::SessionExpired { .. }
            | GatewayError::Ping(_) => Disposition::Poison,
            GatewayError::Store(StoreError::Unavailable(_) | StoreError::Conflict(_)) => {
                Disposition::Transient
            }
            GatewayError::Store(StoreError::Corrupt(_) | StoreError::Key(_)) => Disposition::Fatal,
        }
    }

    /// The message for the peer, without the code and location that travel beside it.
    pub fn detail(&self) -> String {
        match self {
            GatewayError::Envelope(e) => e.message.clone(),
            GatewayError::Silp { error, .. } => error.message.clone(),
            GatewayError::Invalid { errors, .. } => format!("IR is not valid: {}", errors.join("; ")),
            other => other.to_string(),
        }
    }

    /// The error code sent back to the peer.
    pub fn code(&self) -> &'static str {
        match self {
            GatewayError::Envelope(e) => e.kind.code(),
            GatewayError::Silp { error, .. } => error.code.as_str(),
            GatewayError::Invalid { .. } => Code::DecodeFailed.as_str(),
            GatewayError::NoRoute => Code::NoRoute.as_str(),
            GatewayError::Forbidden(_) => Code::Forbidden.as_str(),
            GatewayError::SessionExpired { .. } => Code::SessionExpired.as_str(),
            GatewayError::Store(_) => Code::Unavailable.as_str(),
            GatewayError::Ping(_) => Code::InvalidPing.as_str(),
        }
    }
}
