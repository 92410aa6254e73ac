//! `POST /admin/reload`: the operator's door, which reads the configuration file again
//! ([`crate::reload`]). Only a principal with the `admin` role may use it (a static token of
//! `[[auth.tokens]]` or a JWT that carries the role): with no principal configured, or one
//! without the role, it refuses everyone, so it is never open by default.

use super::Front;
use super::admission::{authenticate, error_response};
use super::auth::Identity;
use crate::nlip::Encoding;
use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use std::net::SocketAddr;
use std::sync::Arc;

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
        Ok(applied) => {
            let body = serde_json::json!({
                "digest": applied.digest,
                "changed": applied.changed,
                "loaded_at": front.reloader.loaded().at,
            });
            ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
        }
        Err(e) => {
            let status = match &e {
                crate::reload::ReloadError::Busy => StatusCode::CONFLICT,
                crate::reload::ReloadError::Topology(_) => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::UNPROCESSABLE_ENTITY,
            };
            error_response(status, e.code(), &e.to_string(), Encoding::Json)
        }
    }
}
