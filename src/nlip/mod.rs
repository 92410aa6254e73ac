//! The NLIP envelope layer (ECMA-430 message model; JSON and CBOR encodings of ECMA-431/432):
//! parsing with clear errors, canonical writing, token and control conventions, and the error
//! messages silpgate sends back. It knows nothing about SILP or any transport.

pub(crate) mod codec;
pub(crate) mod error;
mod items;
pub(crate) mod message;
pub mod reply;

pub use codec::{Encoding, Limits, decode, encode, to_json};
pub use error::{NlipError, NlipErrorKind};
pub use message::{Content, Format, Message, RawJson, Submessage};
