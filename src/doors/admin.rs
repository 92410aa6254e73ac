//! `POST /admin/reload`: the operator's door, which has the daemon read the configuration file
//! again ([`Reload`], which `crate::reload` carries out). Only a principal with the `admin`
//! role may use it (a static token of `[[auth.tokens]]` or a JWT that carries the role): with
//! no principal configured, or one without the role, it refuses everyone, so it is never open
//! by default.

use super::Front;
use super::admission::{authenticate, error_response};
use super::auth::Identity;
use crate::nlip::Encoding;
use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::future::BoxFuture;
use std::net::SocketAddr;
use std::sync::Arc;

/// What the doors ask of the daemon: read the configuration again. A trait, so that the doors
/// know nothing of the layer above them that carries it out.
pub(crate) trait Reload: Send + Sync {
    /// Reads the configuration file again and applies it to `front`, or refuses it.
    fn reload<'a>(&'a self, front: &'a Front) -> BoxFuture<'a, Result<Reloaded, Refused>>;
    /// The configuration in use.
    fn loaded(&self) -> Loaded;
}

/// The configuration in use: its file's SHA-256, and when it was loaded (milliseconds since the
/// epoch).
#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    pub digest: String,
    pub at: u64,
}

/// A reload that went through: the configuration now in use, and the sections and settings
/// that changed.
#[derive(Debug, Clone)]
pub(crate) struct Reloaded {
    pub loaded: Loaded,
    pub changed: Vec<String>,
}

/// Why a reload was refused: which kind of refusal, its error code and its text.
#[derive(Debug, Clone)]
pub(crate) struct Refused {
    pub kind: Refusal,
    pub code: &'static str,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The file: it fails the check, or changes what needs a restart.
    Invalid,
    /// Another reload is under way.
    Busy,
    /// The broker did not do what the reload needs of it.
    Unavailable,
}

/// The role a principal needs to reload the configuration.
pub(crate) const ADMIN_ROLE: &str = "admin";

pub(crate) fn router() -> Router<Arc<Front>> {
    Router::new().route("/admin/reload", post(reload))
}

async fn reload(
    State(front): State<Arc<Front>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    let principal = match authenticate(&front, &headers, peer).await {
        Ok(Identity::Principal(principal)) => principal,
        Ok(Identity::Anonymous) => {
            let why =
                "no principal can be named: configure an [[auth.tokens]] token or a JWT with the admin role";
            return error_response(StatusCode::FORBIDDEN, "forbidden", why, Encoding::Json);
        }
        Err(denied) => return denied.into_response(),
    };
    if !principal.roles.iter().any(|role| role == ADMIN_ROLE) {
        let why = format!("{} does not have the {ADMIN_ROLE} role", principal.subject);
        return error_response(StatusCode::FORBIDDEN, "forbidden", &why, Encoding::Json);
    }
    tracing::info!(by = %principal.subject, "Configuration reload asked for.");
    match front.reloader.reload(&front).await {
        Ok(reloaded) => {
            let body = serde_json::json!({
                "digest": reloaded.loaded.digest,
                "changed": reloaded.changed,
                "loaded_at": reloaded.loaded.at,
            });
            ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
        }
        Err(refused) => {
            let status = match refused.kind {
                Refusal::Busy => StatusCode::CONFLICT,
                Refusal::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                Refusal::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
            };
            error_response(status, refused.code, &refused.message, Encoding::Json)
        }
    }
}
