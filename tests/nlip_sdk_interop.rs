//! Interop with the real Python NLIP SDK (`nlip-sdk` 0.1.3, installed by tests/run.sh): every
//! kind of envelope silpgate emits (replies, errors, transcoded payloads in every form, `//ping`
//! answers, control replies, messages carrying session renewal notices) must parse with
//! `NLIP_Message.model_validate_json` and keep its content.

mod support;

use serde_json::{Value, json};
use silpgate::config::Config;
use silpgate::gateway::{Gateway, Inbound, MemoryStore, Origin, Transport};
use silpgate::nlip::{self, Encoding, Limits};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

const CONFIG: &str = r#"
[sessions]
heartbeat = 1
[[agents]]
name = "coder"
frontends = ["code"]
[[agents]]
name = "jsoner"
frontends = ["json"]
[[agents]]
name = "reader"
frontends = ["natural"]
[[agents]]
name = "wrapped"
frontends = ["nl_json"]
[[routes]]
name = "decode"
destination = "reply"
mode = "decode"
[routes.match]
label = "decode"
[[routes]]
name = "to-jsoner"
destination = "jsoner"
mode = "encode"
[routes.match]
source = "j"
[[routes]]
name = "to-reader"
destination = "reader"
mode = "transcode"
[routes.match]
source = "r"
[[routes]]
name = "to-wrapped"
destination = "wrapped"
mode = "encode"
[routes.match]
source = "w"
[[routes]]
name = "to-coder"
destination = "coder"
mode = "encode"
[routes.match]
source = "c"
"#;

const IR: &str = r#"{"silp":"v1","intent":"!BOOK","entities":[{"id":"act","value":"hotel"},{"id":"city","value":"上海"},{"id":"notify","value":"bob","action":"!EMAIL"}],"constraints":[{"type":"budget","value":"500","operator":"<="},{"type":"!rain","value":"true","time":"t+1"}],"alternatives":[{"action":"!SUGGEST","target":"hostels","location":"downtown"}],"meta":{"req_id":"e7f4a1b2"}}"#;

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("SILPGATE_PYTHON") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/pyenv/bin/python")
}

fn emitted() -> Vec<String> {
    let gateway = Gateway::new(Arc::new(Config::parse(CONFIG).unwrap()), Arc::new(MemoryStore::new()));
    let ir: Value = serde_json::from_str(IR).unwrap();
    let token = json!({"format":"token","subformat":"conversation","content":"conv-1"});
    let auth = json!({"format":"token","subformat":"authentication_idp","content":"secret"});
    let inputs: Vec<(Value, &str)> = vec![
        (
            json!({"format":"structured","subformat":"silp-ir","content":ir,"label":"decode","submessages":[token, auth]}),
            "x",
        ),
        (
            json!({"format":"structured","subformat":"silp-code","content":"if budget<=500: book(hotel)","label":"decode","submessages":[token]}),
            "x",
        ),
        (
            json!({"format":"text","subformat":"english","content":"plan","submessages":[{"format":"structured","subformat":"silp-ir","content":ir},token]}),
            "c",
        ),
        (json!({"format":"structured","subformat":"silp-ir","content":ir,"submessages":[token]}), "j"),
        (json!({"format":"structured","subformat":"silp-ir","content":ir,"submessages":[token]}), "r"),
        (json!({"format":"structured","subformat":"silp-ir","content":ir,"submessages":[token]}), "w"),
        (
            json!({"format":"structured","subformat":"silp-code","content":"cancel(\"a, b\",note=\"x=y\")","submessages":[token]}),
            "c",
        ),
        (
            json!({"messagetype":"control","format":"text","subformat":"english","content":"//ping","submessages":[{"format":"structured","subformat":"json","content":{"silp":"v1","frontends":["json","code"]}},token]}),
            "jsoner",
        ),
        (
            json!({"messagetype":"control","format":"text","subformat":"english","content":"hello?","submessages":[auth]}),
            "x",
        ),
        (
            json!({"format":"structured","subformat":"silp-code","content":"if rain > : cancel(x)","submessages":[token, auth]}),
            "x",
        ),
        (
            json!({"format":"structured","subformat":"silp-code","content":"escalate(x)","submessages":[token]}),
            "c",
        ),
        (json!({"format":"text","subformat":"english","content":"unroutable"}), "nowhere"),
    ];
    let mut lines = Vec::new();
    for (i, (envelope, source)) in inputs.into_iter().enumerate() {
        let message =
            nlip::decode(envelope.to_string().as_bytes(), Encoding::Json, &Limits::default()).unwrap();
        let outcome = gateway.handle(Inbound {
            envelope: message,
            origin: Origin::new(Transport::Cli, source),
            received_at: i as u64,
        });
        assert!(!outcome.outbound.is_empty(), "input {i} produced nothing: {:?}", outcome.status);
        lines.extend(outcome.outbound.iter().map(|o| nlip::to_json(&o.envelope)));
    }
    let undecodable =
        nlip::decode(b"{\"format\":\"text\",\"content\":1}", Encoding::Json, &Limits::default()).unwrap_err();
    lines.extend(gateway.reject_undecodable(undecodable).outbound.iter().map(|o| nlip::to_json(&o.envelope)));
    lines
}

#[test]
fn every_envelope_silpgate_emits_parses_with_the_python_sdk() {
    let lines = emitted();
    assert!(lines.len() >= 13, "{} envelopes", lines.len());
    // With a heartbeat of 1 the conversation renews every turn: the notices ride inside the
    // messages, and the SDK must read those too.
    assert!(lines.iter().any(|l| l.contains(r#""label":"silp-renewal""#)), "a renewal notice among them");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let file = dir.join("silpgate-emitted.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let python = python();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/sdk_check.py");
    let mut command = Command::new(&python);
    command.arg(&script).arg(&file);
    let output = support::process::run_bounded(command, std::time::Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "nlip_sdk rejected silpgate output:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains(&format!("{} envelopes checked, 0 failed", lines.len())), "{stdout}");
}
