//! Test agents that answer like real ones: an AMQP agent (a lapin consumer that answers to
//! `reply_to` with the request's `correlation_id`) and an HTTP agent (an axum server that
//! answers POST /nlip with an NLIP body, or with a status the test chooses). Both count what
//! they receive, so that tests can assert delivered-once and retried-until-accepted.

#![allow(dead_code, reason = "each test binary uses its own part of the support module")]

use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicPublishOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel};
use silpgate::nlip::{self, Encoding, Limits, Message};
use std::net::SocketAddr;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What an agent does with one request: its answer, if it answers.
pub type Behaviour = Arc<dyn Fn(&Message) -> Option<Message> + Send + Sync>;

/// An agent answering every SILP code request with the same code text (so the asker can tell
/// which request an answer belongs to), other requests with a text.
pub fn echo_code() -> Behaviour {
    Arc::new(|request: &Message| {
        let code = silp_code_of(request).unwrap_or_else(|| "confirm(unknown)".to_owned());
        let mut answer = Message::new(
            nlip::Format::Structured,
            "silp-code",
            nlip::Content::Json(serde_json::Value::String(code)),
        );
        // Agents echo the conversation token (ECMA-430 §6.2).
        if let Some(token) = request.conversation_token() {
            answer.push(nlip::Submessage::new(
                nlip::Format::Token,
                "conversation",
                nlip::Content::Json(serde_json::Value::String(token.to_owned())),
            ));
        }
        Some(answer)
    })
}

/// The SILP code text of a message (its content or a submessage's), if it carries one.
pub fn silp_code_of(message: &Message) -> Option<String> {
    let top = std::iter::once((message.subformat.as_str(), &message.content));
    let subs = message.submessages().iter().map(|s| (s.subformat.as_str(), &s.content));
    top.chain(subs).find_map(|(subformat, content)| match content {
        nlip::Content::Json(serde_json::Value::String(s)) if subformat.eq_ignore_ascii_case("silp-code") => {
            Some(s.clone())
        }
        _ => None,
    })
}

/// A running AMQP agent.
pub struct AmqpAgent {
    pub received: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AmqpAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Consumes `queue` on `channel` and answers each request to its `reply_to`.
pub async fn amqp_agent(channel: Channel, queue: &str, behaviour: Behaviour) -> AmqpAgent {
    let mut consumer = channel
        .basic_consume(queue.into(), "".into(), BasicConsumeOptions::default(), FieldTable::default())
        .await
        .unwrap_or_else(|e| panic!("the test agent consumes {queue}: {e}"));
    let received = Arc::new(AtomicUsize::new(0));
    let count = received.clone();
    let task = tokio::spawn(async move {
        while let Some(Ok(delivery)) = consumer.next().await {
            count.fetch_add(1, Ordering::SeqCst);
            let encoding = delivery
                .properties
                .content_type()
                .as_ref()
                .and_then(|c| Encoding::from_content_type(c.as_str()))
                .unwrap_or(Encoding::Json);
            let request =
                nlip::decode(&delivery.data, encoding, &Limits::default()).expect("silpgate sends NLIP");
            if let (Some(answer), Some(reply_to)) = (behaviour(&request), delivery.properties.reply_to()) {
                let mut properties = BasicProperties::default().with_content_type("application/json".into());
                if let Some(id) = delivery.properties.correlation_id() {
                    properties = properties.with_correlation_id(id.clone());
                }
                let body = nlip::encode(&answer, Encoding::Json);
                let options = BasicPublishOptions::default();
                let confirm = channel
                    .basic_publish("".into(), reply_to.as_str().into(), options, &body, properties)
                    .await
                    .expect("the test agent publishes");
                confirm.await.expect("the test agent's answer is confirmed");
            }
            delivery.acker.ack(BasicAckOptions::default()).await.expect("the test agent acks");
        }
    });
    AmqpAgent { received, task }
}

/// How the HTTP agent answers: a status and a body, or its behaviour's answer with 200.
pub type HttpBehaviour = Arc<dyn Fn(usize, &Message) -> (u16, Option<Message>) + Send + Sync>;

/// A running HTTP agent on a fixed address; stop it and start it again on the same address.
pub struct HttpAgent {
    pub addr: SocketAddr,
    /// Requests received (the n-th request is numbered n - 1 for the behaviour).
    pub received: Arc<AtomicUsize>,
    /// The requests' SILP code texts, in arrival order.
    pub codes: Arc<Mutex<Vec<String>>>,
    behaviour: HttpBehaviour,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl HttpAgent {
    pub async fn start(behaviour: HttpBehaviour) -> HttpAgent {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut agent = HttpAgent {
            addr,
            received: Arc::new(AtomicUsize::new(0)),
            codes: Arc::default(),
            behaviour,
            task: None,
        };
        agent.serve(listener);
        agent
    }

    /// Stops answering: open connections are closed, and the port refuses new ones until
    /// [`HttpAgent::restart`].
    pub fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    pub async fn restart(&mut self) {
        let listener =
            tokio::net::TcpListener::bind(self.addr).await.expect("the agent's port is free again");
        self.serve(listener);
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let (received, codes, behaviour) =
            (self.received.clone(), self.codes.clone(), self.behaviour.clone());
        let app = axum::Router::new().route(
            "/nlip",
            axum::routing::post(move |body: axum::body::Bytes| {
                let (received, codes, behaviour) = (received.clone(), codes.clone(), behaviour.clone());
                async move {
                    let n = received.fetch_add(1, Ordering::SeqCst);
                    let request = nlip::decode(&body, Encoding::Json, &Limits::default()).expect("NLIP");
                    if let Some(code) = silp_code_of(&request) {
                        codes.lock().unwrap().push(code);
                    }
                    // A behaviour may take its time (an agent that is slow to answer).
                    let (status, answer) = tokio::task::block_in_place(|| behaviour(n, &request));
                    let body = answer.map(|a| nlip::encode(&a, Encoding::Json)).unwrap_or_default();
                    let status = axum::http::StatusCode::from_u16(status).unwrap();
                    (status, [(axum::http::header::CONTENT_TYPE, "application/json")], body)
                }
            }),
        );
        // The agent owns its connections: stopping it (aborting this task) drops them with it,
        // kept-alive ones included, as a crashed agent's would be.
        self.task = Some(tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let service = hyper_util::service::TowerToHyperService::new(app.clone());
                connections.spawn(async move {
                    let io = hyper_util::rt::TokioIo::new(tcp);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        }));
    }
}

impl Drop for HttpAgent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A Python test server from `tests/interop/`, killed when dropped.
pub struct PythonServer {
    child: Child,
    pub port: u16,
}

impl PythonServer {
    /// Starts `script 0`, on a port the system picks, and waits (at most 60 s) until it
    /// listens.
    pub fn start(script: &str) -> PythonServer {
        PythonServer::start_on(script, 0)
    }

    /// Starts `script PORT` (0: any) and waits (at most 60 s) until it listens. The script
    /// says which port it bound (`listening PORT`): a port taken by another process makes it
    /// exit, rather than the test talking to whoever holds it.
    pub fn start_on(script: &str, port: u16) -> PythonServer {
        PythonServer::start_with(script, port, &[])
    }

    /// Starts `script PORT ARGS...` (PORT 0: any), as [`PythonServer::start_on`].
    pub fn start_with(script: &str, port: u16, args: &[&str]) -> PythonServer {
        let python = std::env::var("SILPGATE_PYTHON").unwrap_or_else(|_| "target/pyenv/bin/python".into());
        let path = format!("{}/tests/interop/{script}", env!("CARGO_MANIFEST_DIR"));
        let mut command = Command::new(&python);
        command.arg(&path).arg(port.to_string()).args(args);
        let (child, port) = spawn_listening(command, script)
            .unwrap_or_else(|e| panic!("{e} (tests/run.sh installs a2a-sdk and mcp)"));
        PythonServer { child, port }
    }
}

/// Spawns a server that prints `listening PORT` once bound (tests/interop/listening.py), and
/// returns it with that port; waits at most 60 s.
pub fn spawn_listening(mut command: Command, what: &str) -> Result<(Child, u16), String> {
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    let stdout = child.stdout.take().expect("piped");
    let (told, heard) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let port = lines.find_map(|line| line.ok()?.strip_prefix("listening ")?.trim().parse::<u16>().ok());
        let _ = told.send(port);
        // Keep reading, so that the server never blocks on a full pipe.
        for _ in lines {}
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    match heard.recv_timeout(Duration::from_secs(60)) {
        Ok(Some(port)) => {
            // Bound is not yet listening: wait for the server to accept.
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                if child.try_wait().ok().flatten().is_some() || std::time::Instant::now() > deadline {
                    let _ = child.kill();
                    return Err(format!("{what} bound port {port} but did not accept on it"));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok((child, port))
        }
        outcome => {
            let _ = child.kill();
            let status = child.wait().ok();
            Err(format!("{what} did not say it listens within 60 s ({outcome:?}, exit {status:?})"))
        }
    }
}

impl Drop for PythonServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    probe.local_addr().unwrap().port()
}
