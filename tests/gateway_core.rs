//! The gateway core, rule by rule, without any broker or socket: routes, payload forms, frontend
//! choice and degradation, `//ping`, control replies, token echo, errors, sessions, the
//! compile.lock and the processed-message ledger.

use serde_json::{Value, json};
use silpgate::config::Config;
use silpgate::gateway::store::{
    AgentProfile, Changes, Freeze, Frozen, LedgerState, Millis, ProfileSource, SessionRecord, StoreError,
};
use silpgate::gateway::{
    ChoiceReason, Destination, Disposition, Gateway, Inbound, MemoryStore, Note, Origin, Outcome, Status,
    Store, Transport,
};
use silpgate::nlip::{self, Encoding, Limits, Message};
use silpgate::silp::Frontend;
use std::sync::Arc;

const CONFIG: &str = r#"
[gateway]
default_frontend = "json"

[sessions]
heartbeat = 5
idle_timeout_secs = 60

[[agents]]
name = "coder"
frontends = ["code", "json"]

[[agents]]
name = "reader"
frontends = ["natural"]

[[agents]]
name = "open"
frontends = []

[[routes]]
name = "decode-back"
destination = "reply"
mode = "decode"
[routes.match]
label = "decode"

[[routes]]
name = "check-only"
destination = "coder"
mode = "validate"
[routes.match]
source = "audit"

[[routes]]
name = "forced-json"
destination = "coder"
mode = "encode"
frontend = "json"
[routes.match]
intent = "!FETCH"

[[routes]]
name = "to-reader"
destination = "reader"
mode = "transcode"
[routes.match]
next_agent = "reader"

[[routes]]
name = "unprofiled"
destination = "nobody-configured"
mode = "encode"
[routes.match]
source = "free"

[[routes]]
name = "default"
destination = "coder"
mode = "encode"
[routes.match]
messagetype = "request"
"#;

fn gateway_with(config: &str, store: Arc<dyn Store>) -> Gateway {
    Gateway::new(Arc::new(Config::parse(config).expect("test config is valid")), store)
}

/// [`CONFIG`] with the agent its `unprofiled` route names, so that it passes the check.
fn config_text() -> String {
    CONFIG.replace(
        "[[routes]]\nname = \"unprofiled\"\ndestination = \"nobody-configured\"",
        "[[agents]]\nname = \"nobody-configured\"\nfrontends = []\n\n[[routes]]\nname = \"unprofiled\"\ndestination = \"nobody-configured\"",
    )
}

fn gateway() -> Gateway {
    gateway_with(&config_text(), Arc::new(MemoryStore::new()))
}

fn envelope(v: Value) -> Message {
    nlip::decode(v.to_string().as_bytes(), Encoding::Json, &Limits::default())
        .expect("test envelope is valid")
}

fn inbound(v: Value, source: &str, at: Millis) -> Inbound {
    Inbound { envelope: envelope(v), origin: Origin::new(Transport::Cli, source), received_at: at }
}

fn out_json(o: &Outcome, i: usize) -> Value {
    serde_json::from_str(&nlip::to_json(&o.outbound[i].envelope)).unwrap()
}

const CASE2_IR: &str = r#"{"silp":"v1","intent":"!START","entities":[{"id":"act","value":"hike","action":"!START"}],"constraints":[{"type":"!rain","value":"true","time":"t+1"}],"alternatives":[{"action":"!START","target":"cards","location":"indoor"}],"meta":{"req_id":"b7e2","out":"natural","next_agent":"reader"}}"#;

fn ir() -> Value {
    serde_json::from_str(CASE2_IR).unwrap()
}

#[test]
fn encode_sends_the_agents_preferred_frontend_and_leaves_everything_else_alone() {
    let g = gateway();
    let mut ir = ir();
    ir["meta"].as_object_mut().unwrap().remove("next_agent");
    let o = g.handle(inbound(
        json!({"messagetype":"Request","format":"text","subformat":"english","content":"go","X-Extra":1,"submessages":[
            {"format":"text","subformat":"english","content":"before","label":"first"},
            {"format":"structured","subformat":"silp-ir","content":ir,"label":"task"},
            {"format":"binary","subformat":"image/png","content":"AAAA","label":"pic"}
        ]}),
        "ingress",
        0,
    ));
    assert!(matches!(o.status, Status::Delivered), "{:?}", o.status);
    assert_eq!(o.outbound.len(), 1);
    assert_eq!(o.outbound[0].destination, Destination::Agent("coder".into()));
    let out = out_json(&o, 0);
    assert_eq!(out["X-Extra"], 1);
    assert_eq!(
        out["submessages"][0],
        json!({"format":"text","subformat":"english","content":"before","label":"first"})
    );
    assert_eq!(
        out["submessages"][1],
        json!({"format":"structured","subformat":"silp-code","content":"if !rain(t+1): start(hike) else: start(cards@indoor)","label":"task"})
    );
    assert_eq!(
        out["submessages"][2],
        json!({"format":"binary","subformat":"image/png","content":"AAAA","label":"pic"})
    );
    assert!(o.notes.contains(&Note::Route("default".into())));
    assert!(o.notes.iter().any(|n| matches!(
        n,
        Note::Frontend {
            frontend: Frontend::Code,
            reason: ChoiceReason::AgentProfile,
            degraded_from: None,
            ..
        }
    )));
    // The payload's size, beside the natural-language baseline's, for the bytes-saved metric.
    let surface = "if !rain(t+1): start(hike) else: start(cards@indoor)".len();
    let size = o.notes.iter().find_map(|n| match n {
        Note::Size { frontend: Frontend::Code, surface, natural } => Some((*surface, *natural)),
        _ => None,
    });
    let (written, natural) = size.expect("a size note for the code payload");
    assert_eq!(written, surface);
    assert!(natural > surface, "the code frontend is shorter than natural language: {natural} vs {surface}");
}

#[test]
fn decode_answers_the_sender_with_the_ir_and_the_session_id() {
    let g = gateway();
    let o = g.handle(inbound(
        json!({"format":"structured","subformat":"silp-code","content":"if disk>90%: switch(backup_mode)","label":"decode","submessages":[
            {"format":"token","subformat":"conversation_client7","content":"c-1"}
        ]}),
        "ingress",
        0,
    ));
    assert!(matches!(o.status, Status::Delivered), "{:?}", o.status);
    assert_eq!(o.outbound[0].destination, Destination::Reply);
    let out = out_json(&o, 0);
    assert_eq!(out["subformat"], "silp-ir");
    assert_eq!(out["content"]["constraints"][0], json!({"type":"disk","value":"90%","operator":">"}));
    assert_eq!(out["content"]["meta"]["session_id"], silpgate::gateway::session::id_for("c-1").as_str());
    assert_eq!(out["content"]["meta"]["req_id"].as_str().map(str::len), Some(8));
    assert_eq!(
        out["submessages"][0],
        json!({"format":"token","subformat":"conversation_client7","content":"c-1"})
    );
}

#[test]
fn transcode_degrades_to_what_the_agent_accepts() {
    let g = gateway();
    let o =
        g.handle(inbound(json!({"format":"structured","subformat":"silp-ir","content":ir()}), "ingress", 0));
    assert!(matches!(o.status, Status::Delivered), "{:?}", o.status);
    assert_eq!(o.outbound[0].destination, Destination::Agent("reader".into()));
    let out = out_json(&o, 0);
    assert_eq!((out["format"].as_str(), out["subformat"].as_str()), (Some("text"), Some("english")));
    assert_eq!(out["content"], "If not rain at t+1, start hike otherwise start cards indoors.");
}

#[test]
fn route_override_wins_and_meta_out_or_the_default_decide_without_a_profile() {
    let g = gateway();
    let o = g.handle(inbound(json!({"messagetype":"request","format":"structured","subformat":"silp-code","content":"fetch(data)"}), "ingress", 0));
    let out = out_json(&o, 0);
    assert_eq!(out["subformat"], "silp-json");
    assert_eq!(out["content"], json!({"intent":"!FETCH","act":"data"}));
    assert!(o.notes.iter().any(|n| matches!(n, Note::Frontend { reason: ChoiceReason::RouteOverride, .. })));

    // An agent with no frontends listed accepts anything: meta.out decides, else the default.
    let mut with_out = ir();
    with_out["meta"]["out"] = json!("code");
    with_out["meta"].as_object_mut().unwrap().remove("next_agent");
    let o =
        g.handle(inbound(json!({"format":"structured","subformat":"silp-ir","content":with_out}), "free", 0));
    assert!(
        o.notes.iter().any(|n| matches!(
            n,
            Note::Frontend { frontend: Frontend::Code, reason: ChoiceReason::IrMetaOut, .. }
        )),
        "{:?}",
        o.notes
    );
    let o = g.handle(inbound(
        json!({"format":"structured","subformat":"silp-code","content":"cancel(x)"}),
        "free",
        0,
    ));
    assert!(
        o.notes.iter().any(|n| matches!(
            n,
            Note::Frontend { frontend: Frontend::Json, reason: ChoiceReason::ConfiguredDefault, .. }
        )),
        "{:?}",
        o.notes
    );
}

#[test]
fn validate_routes_forward_the_payload_unchanged_but_still_check_it() {
    let g = gateway();
    let original = json!({"format":"structured","subformat":"silp-code","content":"cancel(flight)"});
    let o = g.handle(inbound(original.clone(), "audit", 0));
    assert_eq!(out_json(&o, 0), original);
    let o = g.handle(inbound(
        json!({"format":"structured","subformat":"silp-code","content":"escalate(x)"}),
        "audit",
        0,
    ));
    let Status::Failed(e) = &o.status else { panic!("{:?}", o.status) };
    assert_eq!(e.disposition(), Disposition::Poison);
    assert!(e.detail().contains("verb 'ESCALATE' not in whitelist. Use !RAISE instead."), "{}", e.detail());
}

#[test]
fn errors_go_back_as_nlip_error_messages_with_code_span_and_echoed_tokens() {
    let g = gateway();
    let o = g.handle(inbound(
        json!({"format":"structured","subformat":"silp-code","content":"if rain > : cancel(x)","submessages":[
            {"format":"token","subformat":"conversation","content":"c"},
            {"format":"token","subformat":"authentication_idp","content":"a"},
            {"format":"token","subformat":"group_7","content":"g"}
        ]}),
        "ingress",
        0,
    ));
    assert_eq!(o.disposition(), Some(Disposition::Poison));
    assert_eq!(o.outbound.len(), 1);
    assert_eq!(o.outbound[0].destination, Destination::Reply);
    let out = out_json(&o, 0);
    assert_eq!(out["messagetype"], "error");
    assert_eq!((out["format"].as_str(), out["subformat"].as_str()), (Some("text"), Some("english")));
    let detail = &out["submessages"][0];
    assert_eq!((detail["format"].as_str(), detail["subformat"].as_str()), (Some("structured"), Some("json")));
    assert_eq!(detail["content"]["code"], "invalid_syntax");
    assert_eq!(detail["content"]["path"], "content");
    assert_eq!(detail["content"]["span"], json!([3, 7]));
    let echoed: Vec<&str> = out["submessages"].as_array().unwrap()[1..]
        .iter()
        .map(|s| s["subformat"].as_str().unwrap())
        .collect();
    assert_eq!(echoed, ["conversation", "authentication_idp", "group_7"]);
}

#[test]
fn an_error_is_never_answered_with_an_error() {
    let g = gateway();
    let o = g.handle(inbound(
        json!({"messagetype":"error","format":"text","subformat":"english","content":"your fault"}),
        "nowhere",
        0,
    ));
    let Status::Failed(e) = &o.status else { panic!("{:?}", o.status) };
    assert_eq!(e.code(), "no_route");
    assert!(o.outbound.is_empty());
}

#[test]
fn ping_is_answered_and_the_announced_profile_is_used_afterwards() {
    let g = gateway();
    let o = g.handle(inbound(
        json!({"MessageType":"Control","format":"text","subformat":"english","content":"//ping","submessages":[
            {"format":"structured","subformat":"JSON","content":{"silp":"v1","frontends":["math","json","natural"],"agent":"coder"}},
            {"format":"token","subformat":"conversation","content":"p"}
        ]}),
        "coder",
        0,
    ));
    assert!(matches!(o.status, Status::Delivered), "{:?}", o.status);
    let out = out_json(&o, 0);
    assert_eq!(out["messagetype"], "control");
    assert_eq!(
        out["content"],
        json!({"silp":"v1","frontends":["code","json","natural","nl_json"],"preferred":"json"})
    );
    assert_eq!(out["submessages"][0]["content"], "p");
    assert_eq!(
        g.store().profile("coder").unwrap().map(|p| (p.frontends, p.source)),
        Some((vec![Frontend::Json, Frontend::Natural], ProfileSource::Ping))
    );
    let mut no_next = ir();
    no_next["meta"].as_object_mut().unwrap().remove("next_agent");
    let o = g.handle(inbound(
        json!({"messagetype":"Request","format":"structured","subformat":"silp-ir","content":no_next}),
        "ingress",
        1,
    ));
    assert_eq!(out_json(&o, 0)["subformat"], "silp-json");

    let o = g.handle(inbound(json!({"messagetype":"control","format":"text","subformat":"english","content":"//ping","submessages":[{"format":"structured","subformat":"json","content":{"silp":"v2","frontends":["code"]}}]}), "x", 0));
    let Status::Failed(e) = &o.status else { panic!("{:?}", o.status) };
    assert!(e.detail().contains("silp version 'v2'"), "{}", e.detail());
    assert_eq!(out_json(&o, 0)["messagetype"], "error");
}

#[test]
fn other_control_messages_get_a_control_reply_with_tokens() {
    let g = gateway();
    let o = g.handle(inbound(
        json!({"control":true,"format":"text","subformat":"english","content":"status?","submessages":[{"format":"token","subformat":"authorization","content":"sdk-style"}]}),
        "x",
        0,
    ));
    let out = out_json(&o, 0);
    assert_eq!(out["messagetype"], "control");
    assert_eq!(
        out["submessages"][0],
        json!({"format":"token","subformat":"authorization","content":"sdk-style"})
    );
}

#[test]
fn a_conversation_keeps_its_session_renews_every_n_turns_and_expires() {
    let g = gateway();
    let message = |turn: u64| {
        inbound(
            json!({"format":"structured","subformat":"silp-code","content":format!("cancel(t{turn})"),"label":"decode","submessages":[{"format":"token","subformat":"conversation","content":"conv-A"}]}),
            "ingress",
            turn * 1000,
        )
    };
    let mut notices = Vec::new();
    for turn in 1..=11 {
        let o = g.handle(message(turn));
        assert!(matches!(o.status, Status::Delivered), "{:?}", o.status);
        // One envelope a message, the notice inside it: never a message of its own.
        assert_eq!(o.outbound.len(), 1);
        let only = out_json(&o, 0);
        assert_eq!(
            only["content"]["meta"]["session_id"],
            silpgate::gateway::session::id_for("conv-A").as_str()
        );
        assert_eq!(only["submessages"][0]["content"], "conv-A");
        let subs = only["submessages"].as_array().unwrap();
        if let Some(notice) = subs.iter().find(|s| s["label"] == "silp-renewal") {
            assert_eq!(notice["content"]["renewed"], true);
            assert_eq!(notice["content"]["session"], silpgate::gateway::session::id_for("conv-A").as_str());
            notices.push(notice["content"]["turn"].as_u64().unwrap());
        }
    }
    assert_eq!(notices, [6, 11]);
    let late = inbound(
        json!({"format":"structured","subformat":"silp-code","content":"cancel(x)","label":"decode","submessages":[{"format":"token","subformat":"conversation","content":"conv-A"}]}),
        "ingress",
        11_000 + 61_000,
    );
    let o = g.handle(late);
    let Status::Failed(e) = &o.status else { panic!("{:?}", o.status) };
    assert_eq!(e.code(), "session_expired");
    assert_eq!(out_json(&o, 0)["submessages"][0]["content"]["code"], "session_expired");
    let other = inbound(
        json!({"format":"structured","subformat":"silp-code","content":"cancel(x)","label":"decode","submessages":[{"format":"token","subformat":"conversation","content":"conv-B"}]}),
        "ingress",
        0,
    );
    let other_id = out_json(&g.handle(other), 0)["content"]["meta"]["session_id"].clone();
    assert_eq!(
        other_id,
        silpgate::gateway::session::id_for("conv-B").as_str(),
        "the id comes from the token"
    );
}

#[test]
fn the_compile_lock_freezes_the_first_compile_and_reports_drift() {
    let store = Arc::new(MemoryStore::new());
    let config = "[[agents]]\nname = \"coder\"\nfrontends = [\"code\"]\n[[routes]]\nname = \"all\"\ndestination = \"coder\"\nmode = \"encode\"\n";
    let g = gateway_with(config, store.clone());
    let send = || {
        g.handle(inbound(json!({"format":"structured","subformat":"silp-ir","content":ir()}), "ingress", 0))
    };
    let first = send();
    assert!(first.notes.iter().any(|n| matches!(n, Note::LockFrozen { frontend: Frontend::Code, .. })));
    let again = send();
    assert!(!again.notes.iter().any(|n| matches!(n, Note::LockFrozen { .. } | Note::LockDrift { .. })));
    assert_eq!(out_json(&first, 0), out_json(&again, 0));
    assert_eq!(store.lock_len(), 1);

    // Another IR whose frozen text differs from what the codec writes today.
    let mut other = ir();
    other["meta"]["req_id"] = json!("abcd");
    let parsed = silpgate::silp::schema::parse_ir(&other).unwrap();
    let freeze = Freeze {
        ir_hash: parsed.ir_hash(),
        frontend: Frontend::Code,
        output: "start(hike)".into(),
        principal: None,
    };
    store.commit(&Changes { freezes: vec![freeze], ..Changes::default() }, 0).unwrap();
    let o =
        g.handle(inbound(json!({"format":"structured","subformat":"silp-ir","content":other}), "ingress", 0));
    assert!(o.notes.iter().any(|n| matches!(n, Note::LockDrift { .. })), "{:?}", o.notes);
    assert_eq!(out_json(&o, 0)["content"], "start(hike)");
}

#[test]
fn a_missing_req_id_is_assigned_8_hex() {
    let g = gateway();
    let mut no_id = ir();
    no_id["meta"].as_object_mut().unwrap().remove("req_id");
    no_id["meta"]["out"] = json!("code");
    let o = g.handle(inbound(
        json!({"format":"structured","subformat":"silp-ir","content":no_id,"label":"decode"}),
        "ingress",
        0,
    ));
    let req_id = out_json(&o, 0)["content"]["meta"]["req_id"].as_str().unwrap().to_owned();
    assert_eq!(req_id.len(), 8);
    assert!(req_id.bytes().all(|b| b.is_ascii_hexdigit()));
}

#[test]
fn a_published_message_id_is_a_duplicate_and_a_pending_one_is_handled_again() {
    let g = gateway();
    let with_id = |id: &str| {
        let mut i = inbound(
            json!({"format":"structured","subformat":"silp-code","content":"cancel(x)","label":"decode","submessages":[{"format":"token","subformat":"conversation","content":"conv-R"}]}),
            "ingress",
            0,
        );
        i.origin.message_id = Some(id.into());
        i
    };
    let first = g.handle(with_id("m-1"));
    assert!(matches!(first.status, Status::Delivered));
    let Some(LedgerState::Pending { turn: Some(turn), .. }) = g.store().ledger("m-1").unwrap() else {
        panic!("a pending entry with the turn it counted")
    };
    assert_eq!(turn.turn, 1);
    let redelivered = g.handle(with_id("m-1"));
    assert!(matches!(redelivered.status, Status::Delivered), "pending: publish again");
    assert_eq!(out_json(&first, 0), out_json(&redelivered, 0));
    let session = g.store().session_by_token("conv-R").unwrap().unwrap();
    assert_eq!(session.turns, 1, "a redelivery does not count the turn again");
    let published = Changes { ledger: vec![("m-1".into(), LedgerState::Published)], ..Changes::default() };
    g.store().commit(&published, 1).unwrap();
    let duplicate = g.handle(with_id("m-1"));
    assert!(matches!(duplicate.status, Status::Duplicate));
    assert_eq!(duplicate.disposition(), Some(Disposition::Duplicate));
    assert!(duplicate.outbound.is_empty());
}

#[test]
fn a_partitioned_message_hands_its_replicas_the_session_as_it_left_it_even_after_later_turns() {
    let g = gateway();
    let partitioned = |id: &str| {
        let mut i = inbound(
            json!({"format":"structured","subformat":"silp-code","content":"cancel(x)","label":"decode","submessages":[{"format":"token","subformat":"conversation","content":"conv-P"}]}),
            "ingress",
            0,
        );
        i.origin.message_id = Some(id.into());
        i.origin.partition = Some(silpgate::gateway::session::Partition { index: 3, count: 16 });
        i
    };
    let turns_of = |o: &Outcome| o.change.session.as_ref().map(|s| s.turns);
    let first = g.handle(partitioned("m-1"));
    let second = g.handle(partitioned("m-2"));
    assert_eq!((turns_of(&first), turns_of(&second)), (Some(1), Some(2)));
    let (id, state) = first.change.message.clone().expect("the message's ledger entry travels with it");
    assert_eq!(id, "m-1");
    let LedgerState::Pending { turn: Some(turn), session: None } = state else {
        panic!("a replica gets the pending entry with its turn, its session beside it: {state:?}")
    };
    assert_eq!(turn.turn, 1);
    // m-1 sent again after m-2 counted its turn (its first changelog append failed): it hands
    // its replicas turn 1 again, never the store's turn 2 without m-2's ledger entry.
    let again = g.handle(partitioned("m-1"));
    assert_eq!(turns_of(&again), Some(1));
    assert_eq!(again.change.message, first.change.message);
    assert_eq!(g.store().session_by_token("conv-P").unwrap().unwrap().turns, 2);
    // A message that comes another way (an agent's answer) changes the same partition's
    // session: its replicas get that too.
    let mut answer = partitioned("m-3");
    answer.origin.partition = None;
    assert_eq!(turns_of(&g.handle(answer)), Some(3));
    // A conversation without a partition has no replicas: the ledger keeps no session copy.
    let mut alone = partitioned("m-4");
    alone.origin.partition = None;
    alone.envelope = nlip::decode(
        br#"{"format":"structured","subformat":"silp-code","content":"cancel(x)","label":"decode","submessages":[{"format":"token","subformat":"conversation","content":"conv-Q"}]}"#,
        Encoding::Json,
        &Limits::default(),
    )
    .unwrap();
    let alone = g.handle(alone);
    assert_eq!(alone.change.session, None);
    assert!(matches!(g.store().ledger("m-4").unwrap(), Some(LedgerState::Pending { session: None, .. })));
}

#[test]
fn sanitiser_changes_are_reported() {
    let g = gateway();
    let o = g.handle(inbound(json!({"format":"structured","subformat":"silp-code","content":"\u{FEFF}с\u{0430}ncel(flight)","label":"decode"}), "ingress", 0));
    assert_eq!(out_json(&o, 0)["content"]["intent"], "!CANCEL");
    let sanitized = o.notes.iter().filter(|n| matches!(n, Note::Sanitized { .. })).count();
    assert_eq!(sanitized, 2, "{:?}", o.notes);
}

#[test]
fn a_message_no_route_takes_is_poison() {
    let g = gateway();
    let o = g.handle(inbound(json!({"format":"text","subformat":"english","content":"hello"}), "ingress", 0));
    let Status::Failed(e) = &o.status else { panic!("{:?}", o.status) };
    assert_eq!((e.code(), e.disposition()), ("no_route", Disposition::Poison));
}

#[test]
fn undecodable_bytes_get_an_error_message_naming_the_field() {
    let g = gateway();
    let err =
        nlip::decode(br#"{"format":"text","content":"x"}"#, Encoding::Json, &Limits::default()).unwrap_err();
    let o = g.reject_undecodable(err);
    assert_eq!(o.disposition(), Some(Disposition::Poison));
    let out = out_json(&o, 0);
    assert_eq!(
        out["submessages"][0]["content"],
        json!({"code":"invalid_envelope","message":"missing required field 'subformat'","path":"subformat"})
    );
}

/// A store whose every call fails, as an unreachable database would.
struct Unavailable;

impl Store for Unavailable {
    fn session_by_token(&self, _: &str) -> Result<Option<SessionRecord>, StoreError> {
        Err(StoreError::Unavailable("disk gone".into()))
    }
    fn profile(&self, _: &str) -> Result<Option<AgentProfile>, StoreError> {
        Err(StoreError::Unavailable("disk gone".into()))
    }
    fn profile_count(&self) -> Result<usize, StoreError> {
        Err(StoreError::Unavailable("disk gone".into()))
    }
    fn frozen(&self, _: &str, _: Frontend) -> Result<Option<String>, StoreError> {
        Err(StoreError::Unavailable("disk gone".into()))
    }
    fn ledger(&self, _: &str) -> Result<Option<LedgerState>, StoreError> {
        Err(StoreError::Unavailable("disk gone".into()))
    }
    fn commit(&self, _: &Changes, _: Millis) -> Result<Vec<Frozen>, StoreError> {
        Err(StoreError::Unavailable("disk gone".into()))
    }
    fn flush(&self) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("disk gone".into()))
    }
}

#[test]
fn store_failures_are_transient() {
    let g = gateway_with(
        CONFIG
            .replace(
                "name = \"unprofiled\"\ndestination = \"nobody-configured\"",
                "name = \"unprofiled\"\ndestination = \"open\"",
            )
            .as_str(),
        Arc::new(Unavailable),
    );
    let mut i = inbound(
        json!({"messagetype":"request","format":"structured","subformat":"silp-code","content":"cancel(x)"}),
        "ingress",
        0,
    );
    i.origin.message_id = Some("m".into());
    let o = g.handle(i);
    assert_eq!(o.disposition(), Some(Disposition::Transient));
    let Status::Failed(e) = &o.status else { panic!() };
    assert_eq!(e.code(), "unavailable");
}

/// Runs `silpgate gateway handle` on `envelope` with `config`, as source `source`: the core
/// behind a real command line.
fn handle_on_the_command_line(config: &str, source: &str, envelope: &Value) -> (i32, String, String) {
    use std::io::Write;
    // Its own file per call: tests run in parallel.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let config_file = dir.join(format!("gateway-core-{}-{call}.toml", std::process::id()));
    std::fs::write(&config_file, config).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_silpgate"))
        .args(["gateway", "handle", "--config", config_file.to_str().unwrap(), "--source", source])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("silpgate runs");
    child.stdin.take().unwrap().write_all(envelope.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_silp_subformat_is_validated_under_any_format() {
    for format in ["text", "generic", "token", "location", "structured"] {
        let attack = json!({"format": format, "subformat": "silp-code", "content": "escalate(ticket)"});
        let (code, out, err) = handle_on_the_command_line(&config_text(), "audit", &attack);
        assert_eq!(code, 1, "format {format}: forwarded unchecked: {out}");
        assert!(err.contains("not in whitelist"), "format {format}: {err}");
        assert!(!out.contains("\"destination\":\"coder\""), "format {format}: {out}");
    }
    // Inside a submessage too, and an unknown `silp-*` form is refused, not passed on.
    let g = gateway();
    let o = g.handle(inbound(
        json!({"format":"text","subformat":"english","content":"hi","submessages":[
            {"format":"generic","subformat":"SILP-CODE","content":"escalate(ticket)"}]}),
        "audit",
        0,
    ));
    let Status::Failed(e) = &o.status else { panic!("{:?}", o.status) };
    assert!(e.detail().contains("not in whitelist"), "{}", e.detail());
    let o = g.handle(inbound(json!({"format":"text","subformat":"silp-natural","content":"x"}), "audit", 0));
    let Status::Failed(e) = &o.status else { panic!("{:?}", o.status) };
    assert_eq!((e.code(), e.disposition()), ("unsupported_frontend", Disposition::Poison));
    // A valid payload under another format is read like any other.
    let o =
        g.handle(inbound(json!({"format":"text","subformat":"silp-code","content":"cancel(x)"}), "audit", 0));
    assert!(matches!(o.status, Status::Delivered), "{:?}", o.status);
}

#[test]
fn submessages_nested_in_a_submessage_are_refused() {
    let attack = json!({"format":"structured","subformat":"silp-code","content":"cancel(x)","submessages":[
        {"format":"text","subformat":"english","content":"cover","submessages":[
            {"format":"structured","subformat":"silp-code","content":"escalate(ticket)"}]}]});
    let (code, out, err) = handle_on_the_command_line(&config_text(), "audit", &attack);
    assert_eq!(code, 1, "nested submessages were forwarded: {out}");
    assert!(err.contains("invalid_envelope") && err.contains("submessages[0].submessages"), "{err}");
    assert!(!out.contains("escalate"), "{out}");
}

fn ping(agent: Option<&str>, version: &str) -> Value {
    let mut body = json!({"silp": version, "frontends": ["natural"]});
    if let Some(agent) = agent {
        body["agent"] = json!(agent);
    }
    json!({"messagetype":"control","format":"text","subformat":"english","content":"//ping",
           "submessages":[{"format":"structured","subformat":"json","content":body}]})
}

#[test]
fn a_ping_cannot_change_a_configured_agents_profile() {
    let g = gateway();
    let o = g.handle(inbound(ping(Some("coder"), "v1"), "mallory", 0));
    let Status::Failed(e) = &o.status else { panic!("a ping from mallory changed coder: {:?}", o.status) };
    assert_eq!(e.code(), "invalid_ping");
    assert!(e.detail().contains("only a //ping from 'coder' itself"), "{}", e.detail());
    assert_eq!(g.store().profile("coder").unwrap(), None);
    let request =
        json!({"messagetype":"request","format":"structured","subformat":"silp-code","content":"cancel(x)"});
    let o = g.handle(inbound(request, "ingress", 1));
    assert_eq!(out_json(&o, 0)["subformat"], "silp-code", "coder still gets its configured frontend");
    // The agent itself may.
    let o = g.handle(inbound(ping(Some("coder"), "v1"), "coder", 2));
    assert!(matches!(o.status, Status::Delivered), "{:?}", o.status);
}

#[test]
fn ping_profiles_are_bounded_in_name_size_and_number() {
    let g = gateway();
    let o = g.handle(inbound(ping(Some(&"a".repeat(129)), "v1"), "x", 0));
    let Status::Failed(e) = &o.status else { panic!("{:?}", o.status) };
    assert!(e.detail().contains("129 bytes"), "{}", e.detail());
    for i in 0..1024 {
        let o = g.handle(inbound(ping(Some(&format!("agent-{i}")), "v1"), "x", 0));
        assert!(matches!(o.status, Status::Delivered), "ping {i}: {:?}", o.status);
    }
    let o = g.handle(inbound(ping(Some("agent-1024"), "v1"), "x", 0));
    let Status::Failed(e) = &o.status else { panic!("profile 1025 was stored: {:?}", o.status) };
    assert!(e.detail().contains("at most 1024 agent profiles"), "{}", e.detail());
    let o = g.handle(inbound(ping(Some("agent-7"), "v1"), "x", 1));
    assert!(matches!(o.status, Status::Delivered), "a known agent renews its profile: {:?}", o.status);
}

#[test]
fn a_ping_with_a_huge_agent_name_or_version_stores_and_echoes_nothing_of_it() {
    let store = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("gateway-core-ping-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&store);
    let config = config_text();
    let huge = "n".repeat(900_000);
    for (agent, version) in [(Some(huge.as_str()), "v1"), (None, huge.as_str())] {
        let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let config_file = dir.join(format!("gateway-core-ping-{}.toml", std::process::id()));
        std::fs::write(&config_file, &config).unwrap();
        let input = dir.join(format!("gateway-core-ping-{}.json", std::process::id()));
        std::fs::write(&input, ping(agent, version).to_string()).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_silpgate"))
            .args(["gateway", "handle", "--config", config_file.to_str().unwrap(), "--store"])
            .arg(&store)
            .arg(&input)
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("invalid_ping"), "{stderr}");
        assert!(
            stdout.len() + stderr.len() < 2_000,
            "the refusal quotes the input: {} bytes",
            stdout.len() + stderr.len()
        );
    }
    let stored = silpgate::store::SledStore::open_to_read(&store).unwrap();
    assert_eq!(stored.profile_count().unwrap(), 0);
}

#[test]
fn a_conversation_token_is_bounded() {
    let token = "t".repeat(10_000);
    let message = json!({"format":"structured","subformat":"silp-code","content":"cancel(x)",
        "submessages":[{"format":"token","subformat":"conversation","content":token}]});
    let (code, out, err) = handle_on_the_command_line(&config_text(), "ingress", &message);
    assert_eq!(code, 1, "a 10 kB conversation token was taken: {out}");
    assert!(err.contains("too_large") && err.contains("a conversation token of 10000 bytes"), "{err}");
    // Other tokens are only echoed: a long authentication token (a JWT, say) still passes.
    let message = json!({"messagetype":"request","format":"structured","subformat":"silp-code","content":"cancel(x)",
        "submessages":[{"format":"token","subformat":"conversation","content":"c"},
                       {"format":"token","subformat":"authentication_idp","content":"j".repeat(2_000)}]});
    let (code, _, err) = handle_on_the_command_line(&config_text(), "ingress", &message);
    assert_eq!(code, 0, "{err}");
}

/// Messages of one conversation handled on several threads at once: a plan whose commit loses
/// the race (the session moved meanwhile) is made again from the winner's state, so every
/// message counts one turn and none fails.
#[test]
fn messages_of_one_conversation_racing_on_threads_each_count_one_turn() {
    let store = Arc::new(MemoryStore::new());
    let g = Arc::new(gateway_with(&config_text(), store.clone()));
    const THREADS: u64 = 4;
    const EACH: u64 = 100;
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let g = g.clone();
            std::thread::spawn(move || {
                (0..EACH)
                    .filter(|i| {
                        let at = 1_000 + t * EACH + i;
                        let o = g.handle(inbound(
                            json!({"format":"structured","subformat":"silp-code","content":format!("cancel(t{t}m{i})"),"label":"decode","submessages":[{"format":"token","subformat":"conversation","content":"conv-race"}]}),
                            "ingress",
                            at,
                        ));
                        !matches!(o.status, Status::Delivered)
                    })
                    .count()
            })
        })
        .collect();
    let failed: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(failed, 0, "no message lost its race for good");
    let session = store.session_by_token("conv-race").unwrap().expect("the conversation's session");
    assert_eq!(session.turns, THREADS * EACH, "every message counted exactly one turn");
}
