//! Principals, black-box: JWTs minted here (key pairs made in the test, their key set served
//! by a local server as the identity provider's `jwks_url`), static tokens naming principals,
//! and who may reach which agent. silpgate runs as a process; every wait has a bound.

mod support;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use support::agents::HttpAgent;
use support::broker::{self, Names};
use support::gateway;

const ISSUER: &str = "https://idp.example.test/";
const AUDIENCE: &str = "silpgate-test";

/// A signing key of the test's identity provider, and its public JWK.
struct Signer {
    kid: String,
    algorithm: Algorithm,
    key: EncodingKey,
    jwk: Value,
}

impl Signer {
    /// A fresh P-256 key (ES256).
    fn es256(kid: &str) -> Signer {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let point = pair.public_key_raw();
        let jwk = json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig",
            "x": B64.encode(&point[1..33]), "y": B64.encode(&point[33..65])});
        Signer {
            kid: kid.into(),
            algorithm: Algorithm::ES256,
            key: EncodingKey::from_ec_der(&pair.serialize_der()),
            jwk,
        }
    }

    /// A fresh Ed25519 key (EdDSA).
    fn eddsa(kid: &str) -> Signer {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let jwk = json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": B64.encode(pair.public_key_raw())});
        Signer {
            kid: kid.into(),
            algorithm: Algorithm::EdDSA,
            key: EncodingKey::from_ed_der(&pair.serialize_der()),
            jwk,
        }
    }

    /// A fresh 2048-bit RSA key (RS256), made by Python's `cryptography`.
    fn rs256(kid: &str) -> Signer {
        let python = std::env::var("SILPGATE_PYTHON").unwrap_or_else(|_| "target/pyenv/bin/python".into());
        let script = r#"
import base64, json
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption())
n = key.public_key().public_numbers().n
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
print(json.dumps({"der": base64.b64encode(der).decode(), "n": b64(n.to_bytes((n.bit_length() + 7) // 8, "big")), "e": b64((65537).to_bytes(3, "big"))}))
"#;
        let mut command = std::process::Command::new(python);
        command.args(["-c", script]);
        // Bounded: a hung key generation fails the test rather than holding CI.
        let out = support::process::run_bounded(command, gateway::LONG);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let made: Value = serde_json::from_slice(&out.stdout).unwrap();
        let der = base64::engine::general_purpose::STANDARD.decode(made["der"].as_str().unwrap()).unwrap();
        let jwk = json!({"kty": "RSA", "kid": kid, "alg": "RS256", "n": made["n"], "e": made["e"]});
        Signer { kid: kid.into(), algorithm: Algorithm::RS256, key: EncodingKey::from_rsa_der(&der), jwk }
    }

    /// A token for `subject` with `roles`, changed by `edit` (claims and header) before signing.
    fn token(&self, subject: &str, roles: &[&str], edit: impl FnOnce(&mut Value, &mut Header)) -> String {
        let now = jsonwebtoken::get_current_timestamp();
        let mut claims = json!({"sub": subject, "roles": roles, "iss": ISSUER, "aud": AUDIENCE,
            "iat": now, "exp": now + 300});
        let mut header = Header::new(self.algorithm);
        header.kid = Some(self.kid.clone());
        edit(&mut claims, &mut header);
        jsonwebtoken::encode(&header, &claims, &self.key).unwrap()
    }
}

/// The identity provider's key set, served at `/jwks.json`; the test changes it at will.
type KeySet = Arc<Mutex<Vec<Value>>>;

/// The identity provider: where it serves `keys`, and how many times they were fetched.
async fn identity_provider(keys: KeySet) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let fetches = Arc::new(AtomicUsize::new(0));
    let serve = |axum::extract::State((keys, fetches)): axum::extract::State<(KeySet, Arc<AtomicUsize>)>| async move {
        fetches.fetch_add(1, Ordering::SeqCst);
        json!({"keys": *keys.lock().unwrap()}).to_string()
    };
    let app = axum::Router::new()
        .route("/jwks.json", axum::routing::get(serve))
        .with_state((keys, fetches.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, fetches)
}

/// A POST with `authorization` (empty: none): the status and the body as JSON.
async fn post_as(addr: &str, path: &str, body: &str, authorization: &str) -> (u16, Value) {
    let (status, _, json) = post_with_head(addr, path, body, authorization).await;
    (status, json)
}

/// [`post_as`], with the response head (status line and headers) too.
async fn post_with_head(addr: &str, path: &str, body: &str, authorization: &str) -> (u16, String, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("silpgate listens");
    let auth = if authorization.is_empty() {
        String::new()
    } else {
        format!("Authorization: Bearer {authorization}\r\n")
    };
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{auth}Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(gateway::LONG, stream.read_to_end(&mut raw))
        .await
        .expect("an answer in time")
        .unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete response");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = String::from_utf8_lossy(&raw[split + 4..]).into_owned();
    // A streamed answer's one event, or the body itself.
    let json = body.lines().find_map(|l| l.strip_prefix("data: ")).unwrap_or(&body).to_owned();
    (status, head, serde_json::from_str(&json).unwrap_or(Value::String(body)))
}

fn nlip(text: &str, conversation: &str) -> String {
    json!({"format": "text", "subformat": "english", "content": text,
        "submessages": [{"format": "token", "subformat": "conversation", "content": conversation}]})
    .to_string()
}

/// silpgate taking JWTs from the identity provider at `idp` (fetched again for an unknown key
/// at most once per `refresh_secs`) and the static token of principal `robot` (role
/// `finance`), routing every message to an echoing HTTP agent that only `allow` may reach.
async fn gateway_with(
    test: &str,
    idp: std::net::SocketAddr,
    refresh_secs: u64,
    allow: &str,
    agent: &HttpAgent,
) -> (broker::Daemon, std::path::PathBuf) {
    let names = Names::new(test);
    let dir = broker::temp_dir(test);
    let rest = format!(
        r#"[auth]
jwks_url = "http://{idp}/jwks.json"
issuer = "{ISSUER}"
audience = "{AUDIENCE}"
jwks_refresh_secs = {refresh_secs}
leeway_secs = 0
[[auth.tokens]]
subject = "robot"
roles = ["finance"]
token_env = "SILPGATE_TEST_ROBOT_TOKEN"
[auth.mcp_tools]
silp_compile = ["role:authors"]
[[agents]]
name = "ledger"
url = "http://{agent}/nlip"
allow = {allow}
[[routes]]
name = "to-ledger"
destination = "ledger"
mode = "encode"
"#,
        agent = agent.addr
    );
    let config = gateway::config(&names, &dir.join("store"), false, 30_000, &rest);
    let path = dir.join("silpgate.toml");
    std::fs::write(&path, &config).unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_silpgate"));
    command.args(["run", "--config"]).arg(&path).env("SILPGATE_TEST_ROBOT_TOKEN", "robot-secret");
    let daemon = tokio::task::spawn_blocking(move || broker::Daemon::spawn(command)).await.unwrap();
    (daemon, dir.join("store"))
}

fn echo_agent() -> support::agents::HttpBehaviour {
    Arc::new(|_, request| (200, Some(request.clone())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwts_name_principals_on_every_door_and_bad_ones_are_refused_saying_why() {
    let (es, ed, rs) = (Signer::es256("es-1"), Signer::eddsa("ed-1"), Signer::rs256("rs-1"));
    let keys: KeySet = Arc::new(Mutex::new(vec![es.jwk.clone(), ed.jwk.clone(), rs.jwk.clone()]));
    let (idp, _) = identity_provider(keys.clone()).await;
    let agent = HttpAgent::start(echo_agent()).await;
    let (daemon, _) = gateway_with("jwt-doors", idp, 0, r#"["*"]"#, &agent).await;
    let addr = daemon.http.clone();
    let send = |token: String| {
        let addr = addr.clone();
        async move { post_as(&addr, "/nlip", &nlip("hello", "jwt-conv"), &token).await }
    };

    // Each algorithm, over /nlip.
    for signer in [&es, &ed, &rs] {
        let (status, answer) = send(signer.token("alice", &[], |_, _| {})).await;
        assert_eq!(status, 200, "{:?}: {answer}", signer.algorithm);
    }
    // Each refusal, 401 with why.
    let now = jsonwebtoken::get_current_timestamp();
    let other = Signer::es256("es-1");
    let refusals: Vec<(&str, String, &str)> = vec![
        ("expired", es.token("alice", &[], |c, _| c["exp"] = json!(now - 60)), "expired"),
        ("not yet", es.token("alice", &[], |c, _| c["nbf"] = json!(now + 600)), "not valid yet"),
        ("another audience", es.token("alice", &[], |c, _| c["aud"] = json!("someone-else")), "audience"),
        ("another issuer", es.token("alice", &[], |c, _| c["iss"] = json!("https://evil.test/")), "issuer"),
        ("another key, same kid", other.token("alice", &[], |_, _| {}), "signature"),
        (
            "no subject",
            es.token("alice", &[], |c, _| drop(c.as_object_mut().unwrap().remove("sub"))),
            "lacks the claim sub",
        ),
        (
            "a header naming another algorithm",
            ed.token("alice", &[], |_, h| h.kid = Some("es-1".into())),
            "algorithm",
        ),
    ];
    for (case, token, says) in refusals {
        let (status, head, answer) = post_with_head(&addr, "/nlip", &nlip("hello", "jwt-conv"), &token).await;
        assert_eq!(status, 401, "{case}: {answer}");
        assert!(answer.to_string().contains(says), "{case}: {answer}");
        // RFC 6750 §3: a refused bearer token is answered with its challenge.
        assert!(
            head.to_ascii_lowercase().contains("\r\nwww-authenticate: bearer error=\"invalid_token\""),
            "{case}: {head}"
        );
    }
    // No token at all: the plain challenge, naming no error (RFC 6750 §3.1).
    let (status, head, answer) = post_with_head(&addr, "/nlip", &nlip("hello", "jwt-conv"), "").await;
    assert_eq!(status, 401, "no token: {answer}");
    assert!(
        head.lines().any(|l| l.trim().eq_ignore_ascii_case("www-authenticate: bearer")),
        "no token: {head}"
    );
    assert!(answer.to_string().contains("a bearer token is required"), "no token: {answer}");
    // alg: none, and HS256 with the public key as its secret.
    let unsigned = format!(
        "{}.{}.",
        B64.encode(r#"{"alg":"none","typ":"JWT","kid":"es-1"}"#),
        B64.encode(json!({"sub": "alice", "iss": ISSUER, "aud": AUDIENCE, "exp": now + 300}).to_string())
    );
    let (status, answer) = send(unsigned).await;
    assert_eq!(status, 401, "alg none: {answer}");
    assert!(answer.to_string().contains("not a signed JWT with an accepted algorithm"), "alg none: {answer}");
    let public = serde_json::to_vec(&es.jwk).unwrap();
    let confused = jsonwebtoken::encode(
        &Header { kid: Some("es-1".into()), ..Header::new(Algorithm::HS256) },
        &json!({"sub": "alice", "iss": ISSUER, "aud": AUDIENCE, "exp": now + 300}),
        &EncodingKey::from_secret(&public),
    )
    .unwrap();
    let (status, answer) = send(confused).await;
    assert_eq!(status, 401, "HS256 with a public key: {answer}");
    assert!(answer.to_string().contains("not a signed JWT with an accepted algorithm"), "HS256: {answer}");

    // Rotation: a key the set did not hold at start is fetched when a token names it.
    let rotated = Signer::es256("es-2");
    let (status, _) = send(rotated.token("alice", &[], |_, _| {})).await;
    assert_eq!(status, 401, "a key nobody published yet");
    keys.lock().unwrap().push(rotated.jwk.clone());
    let (status, answer) = send(rotated.token("alice", &[], |_, _| {})).await;
    assert_eq!(status, 200, "the rotated key: {answer}");

    // The other doors: /a2a, /mcp and the WebSocket upgrade.
    let good = es.token("alice", &[], |_, _| {});
    let bad = es.token("alice", &[], |c, _| c["exp"] = json!(now - 60));
    let a2a = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
        "messageId": "m", "role": "ROLE_USER", "contextId": "jwt-a2a", "parts": [{"text": "hi"}]}}})
    .to_string();
    assert_eq!(post_as(&addr, "/a2a", &a2a, &good).await.0, 200);
    assert_eq!(post_as(&addr, "/a2a", &a2a, &bad).await.0, 401);
    let mcp = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string();
    assert_eq!(post_as(&addr, "/mcp", &mcp, &bad).await.0, 401);
    let (status, pong) = post_as(&addr, "/mcp", &mcp, &good).await;
    assert_eq!((status, &pong["result"]), (200, &json!({})), "a good JWT is served on /mcp: {pong}");
    // A tool kept for a role is not even listed to a principal without it.
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string();
    let tools = |token: String| {
        let (addr, list) = (addr.clone(), list.clone());
        async move {
            let (_, listed) = post_as(&addr, "/mcp", &list, &token).await;
            listed["result"]["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    let compile = "silp_compile".to_owned();
    assert!(!tools(good.clone()).await.contains(&compile));
    assert!(tools(es.token("ann", &["authors"], |_, _| {})).await.contains(&compile));
    for (token, accepted) in [(&good, true), (&bad, false)] {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut request = format!("ws://{addr}/nlip/ws/text").into_client_request().unwrap();
        request.headers_mut().insert("Authorization", format!("Bearer {token}").parse().unwrap());
        let upgraded = tokio_tungstenite::connect_async(request).await;
        assert_eq!(upgraded.is_ok(), accepted, "WebSocket upgrade: {upgraded:?}");
    }

    // A socket is its JWT's principal only while the JWT is good: it is served, then closed
    // (1008, saying why) once the token expires (leeway_secs = 0 here).
    {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::{
            Message as Frame, client::IntoClientRequest, protocol::frame::coding::CloseCode,
        };
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let short = es.token("alice", &[], |c, _| c["exp"] = json!(now + 3));
        let mut request = format!("ws://{addr}/nlip/ws/text").into_client_request().unwrap();
        request.headers_mut().insert("Authorization", format!("Bearer {short}").parse().unwrap());
        let (mut socket, _) =
            tokio_tungstenite::connect_async(request).await.expect("a good token opens a socket");
        socket.send(Frame::Text(nlip("before it expires", "jwt-socket").into())).await.unwrap();
        let first =
            tokio::time::timeout(gateway::LONG, socket.next()).await.expect("an answer").unwrap().unwrap();
        assert!(matches!(first, Frame::Text(_)), "served while the token is good: {first:?}");
        let closed = tokio::time::timeout(gateway::LONG, async {
            loop {
                match socket.next().await {
                    Some(Ok(Frame::Close(frame))) => break frame,
                    Some(Ok(_)) => continue,
                    other => panic!("the socket ended without a close frame: {other:?}"),
                }
            }
        })
        .await
        .expect("the socket is closed once its token expires")
        .expect("with a close frame");
        assert_eq!(closed.code, CloseCode::Policy);
        assert!(closed.reason.contains("expired"), "{}", closed.reason);
    }
}

/// A token naming a key the set does not hold makes silpgate fetch the set again, but at most
/// once per `jwks_refresh_secs`: a flood of made-up `kid`s costs the identity provider one
/// fetch, and a key published since is found by the first token after the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_keys_fetch_the_key_set_again_at_most_once_per_refresh_window() {
    const REFRESH_SECS: u64 = 5;
    let es = Signer::es256("es-1");
    let keys: KeySet = Arc::new(Mutex::new(vec![es.jwk.clone()]));
    let (idp, fetches) = identity_provider(keys.clone()).await;
    let agent = HttpAgent::start(echo_agent()).await;
    let (daemon, _) = gateway_with("jwt-refresh", idp, REFRESH_SECS, r#"["*"]"#, &agent).await;
    let addr = daemon.http.clone();
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "the key set is fetched once at start");
    let rotated = Signer::es256("es-2");
    keys.lock().unwrap().push(rotated.jwk.clone());
    // Past the start's window, the first unknown kid fetches the set (and finds es-2)...
    tokio::time::sleep(std::time::Duration::from_secs(REFRESH_SECS) + std::time::Duration::from_millis(500))
        .await;
    let (status, answer) =
        post_as(&addr, "/nlip", &nlip("hello", "refresh"), &rotated.token("alice", &[], |_, _| {})).await;
    assert_eq!(status, 200, "a key published since start is found after the window: {answer}");
    let first_refetch = std::time::Instant::now();
    assert_eq!(fetches.load(Ordering::SeqCst), 2, "one fetch for the new kid");
    // ...and a flood of made-up ones within the window fetches nothing more.
    for i in 0..20 {
        let stranger = Signer::es256(&format!("made-up-{i}"));
        let (status, answer) =
            post_as(&addr, "/nlip", &nlip("hello", "refresh"), &stranger.token("alice", &[], |_, _| {}))
                .await;
        assert_eq!(status, 401, "{answer}");
    }
    let windows = first_refetch.elapsed().as_secs() / REFRESH_SECS;
    let fetched = fetches.load(Ordering::SeqCst);
    assert!(
        fetched <= 2 + usize::try_from(windows).unwrap(),
        "{fetched} fetches for 20 unknown kids within {windows} windows past the first refetch"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_principals_an_agent_allows_reach_it_and_a_conversation_stays_its_owners() {
    let es = Signer::es256("es-1");
    let (idp, _) = identity_provider(Arc::new(Mutex::new(vec![es.jwk.clone()]))).await;
    let agent = HttpAgent::start(echo_agent()).await;
    let (daemon, store) =
        gateway_with("jwt-allow", idp, 0, r#"["role:finance", "sub:jwt:carol"]"#, &agent).await;
    let addr = daemon.http.clone();
    // The public card does not name the route to an agent only some principals may reach.
    let (status, card) = daemon.get("/.well-known/agent-card.json");
    assert_eq!(status, 200, "{card}");
    let card: Value = serde_json::from_str(&card).unwrap();
    assert_eq!(card["skills"], json!([]), "{card}");
    // SILP payloads: the conversation's first one begins its session, which records its owner,
    // and its compile is frozen in the compile.lock under its principal. Each principal's
    // payload is its own (order<n>), so that each freezes its own record.
    let order = |conversation: &str| match conversation.split('-').next() {
        Some("alice") => 1,
        Some("carol") => 2,
        Some("robot") => 3,
        _ => 4,
    };
    let send = |token: String, conversation: &str| {
        let (addr, body) = (addr.clone(), gateway::ir_request(order(conversation), conversation).to_string());
        async move { post_as(&addr, "/nlip", &body, &token).await }
    };
    let alice = es.token("alice", &["finance"], |_, _| {});
    let bob = es.token("bob", &["ops"], |_, _| {});
    let carol = es.token("carol", &[], |_, _| {});

    let (status, answer) = send(alice.clone(), "alice-1").await;
    assert_eq!(status, 200, "a role the agent allows: {answer}");
    let (status, answer) = send(carol.clone(), "carol-1").await;
    assert_eq!(status, 200, "a subject the agent allows: {answer}");
    let (status, refused) = send(bob, "bob-1").await;
    assert_eq!(status, 403, "{refused}");
    let said = refused.to_string();
    assert!(said.contains("forbidden"), "{said}");
    assert!(!said.contains("ledger"), "the refusal names no agent: {said}");
    // A static token names its principal too.
    let (status, answer) = send("robot-secret".into(), "robot-1").await;
    assert_eq!(status, 200, "the static token's principal has the role: {answer}");

    // alice began alice-1: carol, allowed to reach the agent, may not continue it.
    let (status, refused) = send(carol, "alice-1").await;
    assert_eq!(status, 403, "{refused}");
    assert!(refused.to_string().contains("another principal"), "{refused}");
    let (status, _) = send(alice, "alice-1").await;
    assert_eq!(status, 200, "its owner goes on");
    // Text without a payload counts no turn, but the conversation is still alice's.
    let text = nlip("one more thing", "alice-1");
    let (status, refused) = post_as(&addr, "/nlip", &text, &es.token("carol", &[], |_, _| {})).await;
    assert_eq!(status, 403, "{refused}");
    let before = agent.received.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(before, 4, "the refused messages never reached the agent");
    // A conversation begun in plain text is its first sender's too: another principal may
    // continue it neither in text nor with a SILP payload (which would otherwise begin a
    // session in its own name and lock the first sender out), and its owner goes on in both.
    let owner = es.token("alice", &["finance"], |_, _| {});
    let other = es.token("carol", &[], |_, _| {});
    let (status, answer) = post_as(&addr, "/nlip", &nlip("hello", "alice-text"), &owner).await;
    assert_eq!(status, 200, "{answer}");
    let (status, refused) = post_as(&addr, "/nlip", &nlip("mine now", "alice-text"), &other).await;
    assert_eq!(status, 403, "{refused}");
    assert!(refused.to_string().contains("another principal"), "{refused}");
    let (status, refused) = send(other.clone(), "alice-text").await;
    assert_eq!(status, 403, "a SILP payload does not take it over: {refused}");
    let (status, answer) = send(owner.clone(), "alice-text").await;
    assert_eq!(status, 200, "its owner's first SILP turn: {answer}");
    let (status, answer) = post_as(&addr, "/nlip", &nlip("and text again", "alice-text"), &owner).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        agent.received.load(std::sync::atomic::Ordering::SeqCst),
        before + 3,
        "only the owner's reached it"
    );
    // /a2a and the WebSocket name the same principals, so the agent's allow list decides
    // there too: carol is served, bob is refused without reaching the agent.
    let a2a = |conversation: &str| {
        json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
            "messageId": format!("m-{conversation}"), "role": "ROLE_USER", "contextId": conversation,
            "parts": [{"text": "hi"}]}}})
        .to_string()
    };
    let (status, answer) =
        post_as(&addr, "/a2a", &a2a("carol-a2a"), &es.token("carol", &[], |_, _| {})).await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer.get("error").is_none() && !answer.to_string().contains("forbidden"),
        "carol on /a2a: {answer}"
    );
    let (_, refused) = post_as(&addr, "/a2a", &a2a("bob-a2a"), &es.token("bob", &["ops"], |_, _| {})).await;
    assert!(refused.to_string().contains("forbidden"), "bob on /a2a: {refused}");
    let over_a_socket = |token: String, conversation: &'static str| {
        let addr = addr.clone();
        async move {
            use futures_util::{SinkExt, StreamExt};
            use tokio_tungstenite::tungstenite::{Message as Frame, client::IntoClientRequest};
            let mut request = format!("ws://{addr}/nlip/ws/text").into_client_request().unwrap();
            request.headers_mut().insert("Authorization", format!("Bearer {token}").parse().unwrap());
            let (mut socket, _) =
                tokio_tungstenite::connect_async(request).await.expect("a good token opens a socket");
            socket.send(Frame::Text(nlip("over a socket", conversation).into())).await.unwrap();
            let answer = tokio::time::timeout(gateway::LONG, socket.next())
                .await
                .expect("an answer")
                .unwrap()
                .unwrap();
            answer.into_text().expect("a text frame").to_string()
        }
    };
    let served = over_a_socket(es.token("carol", &[], |_, _| {}), "carol-socket").await;
    assert!(!served.contains("forbidden") && !served.contains("\"error\""), "carol over a socket: {served}");
    let refused = over_a_socket(es.token("bob", &["ops"], |_, _| {}), "bob-socket").await;
    assert!(refused.contains("forbidden"), "bob over a socket: {refused}");
    assert_eq!(
        agent.received.load(std::sync::atomic::Ordering::SeqCst),
        before + 5,
        "carol's message reached the agent through each door, bob's through none"
    );

    // The compile.lock names who froze each record; one principal's records are exported
    // from a chain that verifies whole.
    daemon.kill();
    let silpgate = |args: &[&str]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_silpgate"));
        command.args(args);
        let out = support::process::run_bounded(command, gateway::LONG);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let store = store.to_str().unwrap();
    silpgate(&["lock", "verify", "--store", store]);
    let records = |subject: &str| -> Vec<Value> {
        let text = silpgate(&["lock", "export", "--store", store, "--principal", subject]);
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let of_alice = records("jwt:alice");
    assert!(!of_alice.is_empty(), "alice froze a record");
    assert!(
        of_alice
            .iter()
            .all(|r| r["principal"] == "jwt:alice" && r["output"].as_str().unwrap().contains("order1")),
        "{of_alice:?}"
    );
    let of_carol = records("jwt:carol");
    assert!(
        !of_carol.is_empty() && of_carol.iter().all(|r| r["output"].as_str().unwrap().contains("order2")),
        "{of_carol:?}"
    );
    assert!(records("jwt:bob").is_empty(), "bob reached nothing");
    assert!(records("alice").is_empty(), "a subject is named with its source");
    let of_robot = records("token:robot");
    assert!(
        !of_robot.is_empty() && of_robot.iter().all(|r| r["output"].as_str().unwrap().contains("order3")),
        "the static token's principal froze its record: {of_robot:?}"
    );
}

/// An AMQP sender is the broker user the broker verified, with `[auth.broker_roles]`' roles:
/// it reaches the agent its role is allowed, and a message to one that does not allow it is
/// refused `forbidden` (the sender told, the message dead-lettered) without reaching it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amqp_senders_broker_user_is_its_principal_with_the_roles_configured() {
    let names = Names::new("amqp-principal");
    let dir = broker::temp_dir("amqp-principal");
    let (open, closed) = (HttpAgent::start(echo_agent()).await, HttpAgent::start(echo_agent()).await);
    let rest = format!(
        r#"[auth.broker_roles]
guest = ["finance"]
[[agents]]
name = "open"
url = "http://{open}/nlip"
allow = ["role:finance"]
[[agents]]
name = "closed"
url = "http://{closed}/nlip"
allow = ["sub:amqp:nobody"]
[[routes]]
name = "to-open"
destination = "open"
mode = "validate"
[routes.match]
label = "open"
[[routes]]
name = "to-closed"
destination = "closed"
mode = "validate"
[routes.match]
label = "closed"
"#,
        open = open.addr,
        closed = closed.addr
    );
    let config = gateway::config(&names, &dir.join("store"), true, 30_000, &rest);
    let daemon = gateway::start(&config, &dir, true).await;
    let (_connection, channel) = broker::channel().await;
    gateway::declare(&channel, &names.replies()).await;
    let message = |i: usize, label: &str| {
        let properties = lapin::BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id(format!("principal-{i}").into())
            .with_correlation_id(format!("principal-{i}").into())
            .with_reply_to(names.replies().into())
            .with_user_id("guest".into());
        (names.inbound(), broker::envelope(i, i, Some(label)), properties)
    };
    broker::publish_all(&channel, &names.inbound_exchange(), vec![message(1, "open"), message(2, "closed")])
        .await;
    let replies = broker::collect(&channel, &names.replies(), gateway::LONG, |got| got.len() >= 2).await;
    let reply_to = |id: &str| -> Value {
        let reply = replies.iter().find(|r| r.correlation_id.as_deref() == Some(id)).expect("a reply");
        serde_json::from_slice(&reply.body).unwrap()
    };
    assert_ne!(reply_to("principal-1")["messagetype"], "error", "{}", reply_to("principal-1"));
    let refused = reply_to("principal-2");
    assert!(refused.to_string().contains("forbidden"), "{refused}");
    // A third refused message marks the end: whatever else the first two left behind (a copy,
    // a second dead letter) reaches the queues before its own.
    broker::publish_all(&channel, &names.inbound_exchange(), vec![message(3, "closed")]).await;
    let is_end = |r: &broker::Received| r.message_id == "principal-3";
    let dead = broker::collect_until_end(&channel, &names.dead(), gateway::LONG, is_end).await;
    let dead_ids: Vec<&str> = dead.iter().map(|d| d.message_id.as_str()).collect();
    assert_eq!(dead_ids, ["principal-2", "principal-3"], "only the refused messages are dead-lettered, once");
    assert_eq!(dead[0].headers.get("x-silpgate-error-code").map(String::as_str), Some("forbidden"));
    let later = broker::collect_until_end(&channel, &names.replies(), gateway::LONG, |r| {
        r.correlation_id.as_deref() == Some("principal-3")
    })
    .await;
    assert_eq!(later.len(), 1, "nothing more was answered before the marker's refusal: {:?}", later);
    let reached = |agent: &HttpAgent| agent.received.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!((reached(&open), reached(&closed)), (1, 0));
    // The test's producer and silpgate share `guest`: silpgate says what that lets a producer do.
    let log = daemon.log_text();
    assert!(
        log.contains("A producer publishes as silpgate's own broker user"),
        "no warning of the shared user"
    );
    // The ledger entry of the message names its sender.
    daemon.terminate(std::time::Duration::from_secs(30));
    let store = silpgate::store::SledStore::open_to_read(&dir.join("store")).unwrap();
    assert_eq!(store.ledger_principal("principal-1").unwrap().as_deref(), Some("amqp:guest"));
}

/// Deletes a broker user the test made, if it is there; bounded, whatever the broker does.
fn delete_broker_user(user: &str) {
    let mut command = std::process::Command::new("rabbitmqctl");
    command.args(["delete_user", user]);
    let _ = support::process::run_bounded(command, gateway::LONG);
}

/// In cluster mode a message taken from a partition queue is believed to come from the user
/// the ingress carried (`nlip-user-id`) only when silpgate's own broker user published it: a
/// broker user of its own that publishes to the partition exchange directly, claiming another
/// user in that header, is itself. It neither reaches an agent the claimed user's role opens,
/// nor is its ledger entry written in the claimed user's name; a producer through the inbound
/// queue is still its own broker user after the ingress's forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_delivery_is_its_publishers_whatever_user_header_it_forges() {
    use lapin::types::{AMQPValue, FieldTable, LongString};
    let names = Names::new("partition-forgery");
    let dir = broker::temp_dir("partition-forgery");
    // A broker user that may publish anywhere but configure and read nothing.
    let (forger, password) = ("silpgate-test-forger", "forger-secret");
    delete_broker_user(forger);
    broker::rabbitmqctl(&["add_user", forger, password]);
    broker::rabbitmqctl(&["set_permissions", forger, "^$", ".*", "^$"]);
    let (open, public) = (HttpAgent::start(echo_agent()).await, HttpAgent::start(echo_agent()).await);
    let rest = format!(
        r#"[auth.broker_roles]
guest = ["finance"]
[[agents]]
name = "open"
url = "http://{open}/nlip"
allow = ["role:finance"]
[[agents]]
name = "public"
url = "http://{public}/nlip"
[[routes]]
name = "to-public"
destination = "public"
mode = "validate"
[routes.match]
label = "public"
[[routes]]
name = "to-open"
destination = "open"
mode = "validate"
{cluster}"#,
        open = open.addr,
        public = public.addr,
        cluster = names.cluster_section(2, "a", 100),
    );
    let config = gateway::config(&names, &dir.join("store"), true, 30_000, &rest);
    let daemon = gateway::start(&config, &dir, true).await;
    let (_connection, channel) = broker::channel().await;
    gateway::declare(&channel, &names.replies()).await;
    let properties = |id: &str, user: &str| {
        lapin::BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id(id.into())
            .with_correlation_id(id.into())
            .with_reply_to(names.replies().into())
            .with_user_id(user.into())
    };
    // The forger, straight to the partition exchange, as "guest".
    let forger_connection = lapin::Connection::connect(
        &format!("amqp://{forger}:{password}@127.0.0.1:5672/{}", broker::vhost()),
        lapin::ConnectionProperties::default(),
    )
    .await
    .expect("the forger's broker user connects");
    let forger_channel = forger_connection.create_channel().await.unwrap();
    forger_channel.confirm_select(lapin::options::ConfirmSelectOptions::default()).await.unwrap();
    let mut headers = FieldTable::default();
    headers.insert("nlip-conversation".into(), AMQPValue::LongString(LongString::from(b"conv-2".to_vec())));
    headers.insert("nlip-user-id".into(), AMQPValue::LongString(LongString::from(b"guest".to_vec())));
    let forged = |id: &str| properties(id, forger).with_headers(headers.clone());
    broker::publish_all(
        &forger_channel,
        &names.partition_exchange(),
        vec![
            (String::new(), broker::envelope(2, 2, None), forged("forged-1")),
            (String::new(), broker::envelope(3, 3, Some("public")), forged("forged-2")),
        ],
    )
    .await;
    // guest, through the inbound queue and the ingress.
    broker::publish_all(
        &channel,
        &names.inbound_exchange(),
        vec![(names.inbound(), broker::envelope(1, 1, None), properties("honest-1", "guest"))],
    )
    .await;
    let replies = broker::collect(&channel, &names.replies(), gateway::LONG, |got| got.len() >= 3).await;
    let reply_to = |id: &str| -> Value {
        let reply = replies.iter().find(|r| r.correlation_id.as_deref() == Some(id)).expect("a reply");
        serde_json::from_slice(&reply.body).unwrap()
    };
    assert_ne!(reply_to("honest-1")["messagetype"], "error", "{}", reply_to("honest-1"));
    let refused = reply_to("forged-1");
    assert_eq!(refused["messagetype"], "error", "{refused}");
    assert!(refused.to_string().contains("forbidden"), "{refused}");
    assert_ne!(reply_to("forged-2")["messagetype"], "error", "{}", reply_to("forged-2"));
    // One more honest message marks the end: every message was answered once, none twice.
    broker::publish_all(
        &channel,
        &names.inbound_exchange(),
        vec![(names.inbound(), broker::envelope(4, 4, None), properties("honest-2", "guest"))],
    )
    .await;
    let later = broker::collect_until_end(&channel, &names.replies(), gateway::LONG, |r| {
        r.correlation_id.as_deref() == Some("honest-2")
    })
    .await;
    let mut answered: Vec<_> =
        replies.iter().chain(&later).filter_map(|r| r.correlation_id.clone()).collect();
    answered.sort();
    assert_eq!(answered, ["forged-1", "forged-2", "honest-1", "honest-2"], "one answer each");
    let reached = |agent: &HttpAgent| agent.received.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!((reached(&open), reached(&public)), (2, 1), "only guest's messages reached the finance agent");
    daemon.terminate(std::time::Duration::from_secs(30));
    // What each message froze and handled is written in its sender's name.
    let store = silpgate::store::SledStore::open_to_read(&dir.join("store")).unwrap();
    assert_eq!(store.ledger_principal("honest-1").unwrap().as_deref(), Some("amqp:guest"));
    assert_eq!(
        store.ledger_principal("forged-2").unwrap().as_deref(),
        Some(format!("amqp:{forger}").as_str())
    );
    let _ = forger_connection.close(200, "done".into()).await;
    delete_broker_user(forger);
}
