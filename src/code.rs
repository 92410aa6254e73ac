//! The error codes silpgate writes into NLIP error messages (and dead-letter headers, metrics
//! and logs), each with what it means to an HTTP client and whether trying again may help: one
//! table, read by every door. A code silpgate does not know (an agent's own) is the sender's
//! to fix: 400, not worth retrying.

/// One error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Code {
    // The envelope or its payload.
    InvalidEncoding,
    InvalidEnvelope,
    TooLarge,
    TooComplex,
    InvalidSyntax,
    UnsupportedVersion,
    UnsupportedFrontend,
    DecodeFailed,
    InvalidPing,
    NoRoute,
    SessionExpired,
    // The door.
    UnsupportedMediaType,
    Unauthorized,
    Forbidden,
    RateLimited,
    TooManyConversations,
    // Reaching the agent, now.
    Unavailable,
    AgentUnavailable,
    BrokerUnavailable,
    PublishRefused,
    PublishTimeout,
    Unroutable,
    Timeout,
    // The agent's side.
    AgentRedirected,
    A2aCardInvalid,
    A2aInvalidAnswer,
    AnswerTooLarge,
    InvalidAnswer,
    AgentRefused,
    A2aRefused,
    McpRefused,
    McpToolError,
    A2aTaskFailed,
    A2aTaskCanceled,
    A2aTaskRejected,
    A2aInputRequired,
    A2aAuthRequired,
    // Answers that find nobody (dead-letter headers).
    RequesterGone,
    ForgedAnswer,
    NoCorrelation,
    Internal,
}

impl Code {
    /// Every code, for the tests that hold the table to the docs.
    pub(crate) const ALL: [Code; 41] = [
        Code::InvalidEncoding,
        Code::InvalidEnvelope,
        Code::TooLarge,
        Code::TooComplex,
        Code::InvalidSyntax,
        Code::UnsupportedVersion,
        Code::UnsupportedFrontend,
        Code::DecodeFailed,
        Code::InvalidPing,
        Code::NoRoute,
        Code::SessionExpired,
        Code::UnsupportedMediaType,
        Code::Unauthorized,
        Code::Forbidden,
        Code::RateLimited,
        Code::TooManyConversations,
        Code::Unavailable,
        Code::AgentUnavailable,
        Code::BrokerUnavailable,
        Code::PublishRefused,
        Code::PublishTimeout,
        Code::Unroutable,
        Code::Timeout,
        Code::AgentRedirected,
        Code::A2aCardInvalid,
        Code::A2aInvalidAnswer,
        Code::AnswerTooLarge,
        Code::InvalidAnswer,
        Code::AgentRefused,
        Code::A2aRefused,
        Code::McpRefused,
        Code::McpToolError,
        Code::A2aTaskFailed,
        Code::A2aTaskCanceled,
        Code::A2aTaskRejected,
        Code::A2aInputRequired,
        Code::A2aAuthRequired,
        Code::RequesterGone,
        Code::ForgedAnswer,
        Code::NoCorrelation,
        Code::Internal,
    ];

    /// The code as it is written.
    pub(crate) fn as_str(self) -> &'static str {
        self.row().0
    }

    /// The HTTP status a door answers it with.
    pub(crate) fn http_status(self) -> u16 {
        self.row().1
    }

    /// Whether the same message may succeed if sent again later.
    pub(crate) fn is_transient(self) -> bool {
        self.row().2
    }

    /// The known code written `code`.
    pub(crate) fn parse(code: &str) -> Option<Code> {
        Code::ALL.into_iter().find(|c| c.as_str() == code)
    }

    /// The table: spelling, HTTP status, transience.
    fn row(self) -> (&'static str, u16, bool) {
        match self {
            Code::InvalidEncoding => ("invalid_encoding", 400, false),
            Code::InvalidEnvelope => ("invalid_envelope", 400, false),
            Code::TooLarge => ("too_large", 413, false),
            Code::TooComplex => ("too_complex", 400, false),
            Code::InvalidSyntax => ("invalid_syntax", 400, false),
            Code::UnsupportedVersion => ("unsupported_version", 400, false),
            Code::UnsupportedFrontend => ("unsupported_frontend", 400, false),
            Code::DecodeFailed => ("decode_failed", 400, false),
            Code::InvalidPing => ("invalid_ping", 400, false),
            Code::NoRoute => ("no_route", 404, false),
            Code::SessionExpired => ("session_expired", 410, false),
            Code::UnsupportedMediaType => ("unsupported_media_type", 415, false),
            Code::Unauthorized => ("unauthorized", 401, false),
            Code::Forbidden => ("forbidden", 403, false),
            Code::RateLimited => ("rate_limited", 429, true),
            Code::TooManyConversations => ("too_many_conversations", 429, true),
            Code::Unavailable => ("unavailable", 503, true),
            Code::AgentUnavailable => ("agent_unavailable", 503, true),
            Code::BrokerUnavailable => ("broker_unavailable", 503, true),
            Code::PublishRefused => ("publish_refused", 503, true),
            Code::PublishTimeout => ("publish_timeout", 503, true),
            Code::Unroutable => ("unroutable", 503, true),
            Code::Timeout => ("timeout", 504, true),
            // The agent, not the request, is at fault.
            Code::AgentRedirected => ("agent_redirected", 502, false),
            Code::A2aCardInvalid => ("a2a_card_invalid", 502, false),
            Code::A2aInvalidAnswer => ("a2a_invalid_answer", 502, false),
            Code::AnswerTooLarge => ("answer_too_large", 502, false),
            Code::InvalidAnswer => ("invalid_answer", 502, false),
            // The agent refused the message, or failed its task, in its own words.
            Code::AgentRefused => ("agent_refused", 400, false),
            Code::A2aRefused => ("a2a_refused", 400, false),
            Code::McpRefused => ("mcp_refused", 400, false),
            Code::McpToolError => ("mcp_tool_error", 400, false),
            Code::A2aTaskFailed => ("a2a_task_failed", 400, false),
            Code::A2aTaskCanceled => ("a2a_task_canceled", 400, false),
            Code::A2aTaskRejected => ("a2a_task_rejected", 400, false),
            Code::A2aInputRequired => ("a2a_input_required", 400, false),
            Code::A2aAuthRequired => ("a2a_auth_required", 400, false),
            Code::RequesterGone => ("requester_gone", 410, false),
            Code::ForgedAnswer => ("forged_answer", 400, false),
            Code::NoCorrelation => ("no_correlation", 400, false),
            Code::Internal => ("internal", 500, false),
        }
    }
}

/// The HTTP status of `code`, known or not.
pub(crate) fn http_status(code: &str) -> u16 {
    Code::parse(code).map_or(400, Code::http_status)
}

/// Whether `code`, known or not, is worth trying again.
pub(crate) fn is_transient(code: &str) -> bool {
    Code::parse(code).is_some_and(Code::is_transient)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_spelt_once_and_reads_back_as_itself() {
        let mut seen = std::collections::HashSet::new();
        for code in Code::ALL {
            assert_eq!(Code::parse(code.as_str()), Some(code));
            seen.insert(code.as_str());
        }
        assert_eq!(seen.len(), Code::ALL.len(), "one spelling per code");
    }

    #[test]
    fn the_statuses_say_who_is_at_fault_and_transient_codes_are_worth_retrying() {
        for code in Code::ALL {
            let status = code.http_status();
            assert!((400..600).contains(&status), "{code:?}");
            // Only a code worth retrying is a 429, 503 or 504, and every such code is one.
            assert_eq!(code.is_transient(), matches!(status, 429 | 503 | 504), "{code:?}");
        }
        assert_eq!(http_status("an_agents_own_code"), 400);
        assert!(!is_transient("an_agents_own_code"));
    }

    #[test]
    fn the_http_table_of_docs_protocol_md_says_what_the_table_here_does() {
        let doc = include_str!("../docs/protocol.md");
        let http = doc.split("## HTTP (ECMA-431)").nth(1).expect("the HTTP section");
        let http = http.split("\n## ").next().expect("its end");
        let mut checked = 0;
        for row in http.lines().filter(|l| l.starts_with("| ")) {
            let Some(status) = row[2..].split(' ').next().and_then(|s| s.parse::<u16>().ok()) else {
                continue;
            };
            for code in row.split('`').skip(1).step_by(2).filter_map(Code::parse) {
                assert_eq!(code.http_status(), status, "{code:?} in the row of {status}");
                checked += 1;
            }
        }
        assert!(checked >= 20, "the table names the codes: {checked} checked");
    }
}
