//! The surface encodings of the IR and how to pick one by name.

pub(crate) mod code;
pub(crate) mod json;
pub(crate) mod natural;

use super::error::{ErrorCode, SilpError};
use std::fmt;
use std::str::FromStr;

/// A frontend this crate implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Frontend {
    /// Function-call syntax; compile and decode, lossless.
    Code,
    /// Flat JSON slots; compile and decode, lossless.
    Json,
    /// English prose; compile only (a control baseline).
    Natural,
    /// English prose in `{"task_description": ..}`; compile only.
    NlJson,
}

impl Frontend {
    pub const ALL: [Frontend; 4] = [Frontend::Code, Frontend::Json, Frontend::Natural, Frontend::NlJson];

    pub fn name(self) -> &'static str {
        match self {
            Frontend::Code => "code",
            Frontend::Json => "json",
            Frontend::Natural => "natural",
            Frontend::NlJson => "nl_json",
        }
    }

    /// True for the frontends that decode back to the IR.
    pub(crate) fn is_lossless(self) -> bool {
        matches!(self, Frontend::Code | Frontend::Json)
    }
}

impl fmt::Display for Frontend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Frontend {
    type Err = SilpError;

    fn from_str(s: &str) -> Result<Self, SilpError> {
        match s {
            "code" => Ok(Frontend::Code),
            "json" => Ok(Frontend::Json),
            "natural" => Ok(Frontend::Natural),
            "nl_json" => Ok(Frontend::NlJson),
            "llmlingua2" => Err(SilpError::new(
                ErrorCode::UnsupportedFrontend,
                "frontend 'llmlingua2' needs an external LLMLingua-2 compressor, which this receiver does not run",
            )),
            other => Err(SilpError::new(
                ErrorCode::UnsupportedFrontend,
                format!("unknown frontend '{other}'; available: code, json, natural, nl_json"),
            )),
        }
    }
}
