//! The `silpgate silp` command line, driven as other tools drive it: real process, stdin,
//! stdout, stderr and exit status.

mod support;

use serde_json::Value;
use std::process::{Command, Output};
use std::time::Duration;

fn silpgate(args: &[&str], stdin: &str) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_silpgate"));
    command.args(args);
    support::process::run_bounded_with_input(command, stdin.as_bytes(), Duration::from_secs(60))
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("utf-8 stdout")
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).expect("utf-8 stderr")
}

const CASE2: &str = r#"{"silp":"v1","version":"ir-v0.1","intent":"!START","entities":[{"id":"act","value":"hike","action":"!START"}],"constraints":[{"type":"!rain","value":"true","time":"t+1"}],"alternatives":[{"action":"!START","target":"cards","location":"indoor"}],"meta":{"priority":1,"confidence":0.95,"seq":[],"out":"code","req_id":"b7e2"}}"#;

#[test]
fn compile_prints_the_surface_text() {
    let o = silpgate(&["silp", "compile", "--frontend", "code"], CASE2);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "if !rain(t+1): start(hike) else: start(cards@indoor)\n");
    let o = silpgate(&["silp", "compile", "--frontend", "natural", "-"], CASE2);
    assert_eq!(stdout(&o), "If not rain at t+1, start hike otherwise start cards indoors.\n");
}

#[test]
fn decode_prints_canonical_compact_ir_with_an_8_hex_req_id() {
    let o = silpgate(
        &["silp", "decode", "--frontend", "code"],
        "if !rain(t+1): start(hike) else: start(cards@indoor)\n",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let ir: Value = serde_json::from_str(stdout(&o).trim_end()).expect("JSON out");
    assert_eq!(ir["intent"], "!START");
    assert_eq!(ir["meta"]["req_id"].as_str().map(str::len), Some(8));
    assert!(stdout(&o).starts_with(r#"{"silp":"v1","version":"ir-v0.1","intent":"!START","entities":[{"id":"act","value":"hike","action":"!START"}]"#));
}

#[test]
fn decode_in_reference_mode_reproduces_the_reference_req_id() {
    // The reference hashes the text without its else branch: 'e008' for both.
    for text in ["if !rain(t+1): start(hike)", "if !rain(t+1): start(hike) else: start(cards@indoor)"] {
        let o = silpgate(&["silp", "decode", "--frontend", "code", "--compat", "reference"], text);
        let ir: Value = serde_json::from_str(stdout(&o).trim_end()).expect("JSON out");
        assert_eq!(ir["meta"]["req_id"], "e008", "{text}");
    }
    let o = silpgate(&["silp", "decode", "--frontend", "code", "--req-id-len", "4"], "cancel(x)");
    let ir: Value = serde_json::from_str(stdout(&o).trim_end()).expect("JSON out");
    assert_eq!(ir["meta"]["req_id"].as_str().map(str::len), Some(4));
}

#[test]
fn a_syntax_error_shows_line_column_and_a_caret_and_exits_1() {
    let o = silpgate(&["silp", "decode", "--frontend", "code"], "if rain > : cancel(x)");
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.starts_with("error[invalid_syntax]: "), "{err}");
    assert!(err.contains("--> 1:"), "{err}");
    assert!(err.contains("\n1 | if rain > : cancel(x)\n"), "{err}");
    assert!(err.lines().last().is_some_and(|l| l.trim_start_matches([' ', '|']).starts_with('^')), "{err}");
}

#[test]
fn sanitiser_notices_go_to_stderr() {
    let o = silpgate(&["silp", "decode", "--frontend", "code"], "\u{FEFF}с\u{0430}ncel(flight)");
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("warning: stripped invisible character U+FEFF at byte 0"), "{err}");
    assert!(err.contains("read as 'cancel'"), "{err}");
}

/// `--no-sanitize` keeps what the sanitiser would strip, and says nothing about it.
#[test]
fn no_sanitize_keeps_invisible_characters_and_reports_none() {
    let text = "cancel(or\u{200B}der1)";
    let value = |o: &Output| -> Value {
        assert!(o.status.success(), "{}", stderr(o));
        serde_json::from_str::<Value>(&stdout(o)).expect("an IR")["entities"][0]["value"].clone()
    };
    let sanitised = silpgate(&["silp", "decode", "--frontend", "code"], text);
    assert_eq!(value(&sanitised), "order1");
    assert!(stderr(&sanitised).contains("stripped invisible character U+200B"), "{}", stderr(&sanitised));
    let kept = silpgate(&["silp", "decode", "--frontend", "code", "--no-sanitize"], text);
    assert_eq!(value(&kept), "or\u{200B}der1");
    assert!(!stderr(&kept).contains("stripped"), "{}", stderr(&kept));
}

#[test]
fn lines_mode_answers_each_line_and_keeps_going() {
    let input = "\"cancel(flight)\"\n\"cancel(\"\nnot json\n\"if disk>90%: switch(backup_mode)\"\n";
    let o = silpgate(&["silp", "decode", "--frontend", "code", "--lines"], input);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[0]["ok"]["entities"][0]["value"], "flight");
    assert_eq!(lines[1]["error"]["code"], "invalid_syntax");
    assert_eq!(lines[2]["error"]["code"], "invalid_syntax");
    assert_eq!(lines[3]["ok"]["constraints"][0]["value"], "90%");

    let o = silpgate(
        &["silp", "compile", "--frontend", "json", "--lines"],
        &format!("{CASE2}\n{{\"intent\":\"x\"}}\n"),
    );
    let lines: Vec<Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
    assert_eq!(
        lines[0]["ok"],
        r#"{"intent":"!START","act":"hike","constraints":[{"type":"!rain","value":"true","time":"t+1"}],"alternatives":[{"action":"!START","target":"cards","location":"indoor"}]}"#
    );
    assert_eq!(lines[1]["error"]["code"], "decode_failed");
}

#[test]
fn validate_reports_rules_and_exit_status() {
    let o = silpgate(&["silp", "validate"], CASE2);
    assert_eq!(o.status.code(), Some(0));
    let report: Value = serde_json::from_str(stdout(&o).trim_end()).expect("JSON report");
    assert_eq!(report["valid"], true);
    assert_eq!(
        report["warnings"][0],
        "constraint type='!rain' with value='true' creates a double-negative; consider value='false' for the base type"
    );

    let escalate = CASE2.replace("\"intent\":\"!START\"", "\"intent\":\"!ESCALATE\"");
    let o = silpgate(&["silp", "validate"], &escalate);
    assert_eq!(o.status.code(), Some(1));
    let report: Value = serde_json::from_str(stdout(&o).trim_end()).expect("JSON report");
    assert_eq!(report["errors"][0], "intent: verb 'ESCALATE' not in whitelist. Use !RAISE instead.");
    let o = silpgate(&["silp", "validate", "--no-whitelist"], &escalate);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));

    let o = silpgate(&["silp", "validate"], &CASE2.replace("b7e2", "xyz"));
    let report: Value = serde_json::from_str(stdout(&o).trim_end()).expect("JSON report");
    assert!(report["errors"][0].as_str().is_some_and(|e| e.starts_with("meta.req_id: ")), "{report}");
}

#[test]
fn hash_matches_the_reference_ir_hash() {
    // The expected hash is the one the reference implementation computed, from the vectors.
    let vectors: Vec<Value> =
        serde_json::from_str(include_str!("vectors/silp-reference.json")).expect("vector file is JSON");
    let case2 = vectors.iter().find(|v| v["name"] == "example/case2_negation").expect("case2 vector");
    let o = silpgate(&["silp", "hash"], &case2["ir"].to_string());
    assert!(o.status.success(), "{}", stderr(&o));
    let expected = case2["ir_sha256"].as_str().expect("the vector has ir_sha256");
    assert_eq!(stdout(&o), format!("{expected}\n"));
}

#[test]
fn unknown_frontends_and_baseline_decodes_are_usage_errors() {
    let o = silpgate(&["silp", "compile", "--frontend", "math"], CASE2);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unsupported_frontend"), "{}", stderr(&o));
    let o = silpgate(&["silp", "decode", "--frontend", "natural"], "cancel flight.");
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unsupported_frontend"), "{}", stderr(&o));
    let o = silpgate(&["silp", "decode", "--frontend", "code", "--req-id-len", "9"], "cancel(x)");
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn unsupported_versions_are_named() {
    let o = silpgate(
        &["silp", "compile", "--frontend", "code"],
        &CASE2.replace("\"silp\":\"v1\"", "\"silp\":\"v2\""),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("error[unsupported_version]"), "{}", stderr(&o));
}

#[test]
fn oversized_input_is_refused() {
    let o = silpgate(
        &["silp", "decode", "--frontend", "code", "--max-input-bytes", "16"],
        "cancel(abcdefghijklmnopqrstuvwxyz)",
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("larger than the limit of 16 bytes"), "{}", stderr(&o));
}

#[test]
fn config_check_names_the_line_and_column_of_a_bad_key() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let bad = dir.join("bad-config.toml");
    std::fs::write(&bad, "[gateway]\nname = \"x\"\nbogus = 1\n").unwrap();
    let o = silpgate(&["config", "check", bad.to_str().unwrap()], "");
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("line 3, column 1") && err.contains("unknown field `bogus`"), "{err}");
    let heartbeat = dir.join("bad-heartbeat.toml");
    std::fs::write(&heartbeat, "[sessions]\nheartbeat = 7\n").unwrap();
    let o = silpgate(&["config", "check", heartbeat.to_str().unwrap()], "");
    assert!(
        stderr(&o).contains("sessions.heartbeat = 7 is not one of [1, 5, 10, 15, 20, 9999]"),
        "{}",
        stderr(&o)
    );
    let good = concat!(env!("CARGO_MANIFEST_DIR"), "/config/silpgate.toml");
    assert!(silpgate(&["config", "check", good], "").status.success(), "the shipped configuration is valid");
}

#[test]
fn config_check_never_echoes_the_value_of_an_environment_override() {
    let good = concat!(env!("CARGO_MANIFEST_DIR"), "/config/silpgate.toml");
    for (var, value) in
        [("SILPGATE_HTTP_CLIENT_RATE", "s3cr3t-value"), ("SILPGATE_HTTP_TOKENS", "s3cr3t-a,s3cr3t-b")]
    {
        let o = Command::new(env!("CARGO_BIN_EXE_silpgate"))
            .args(["config", "check", good])
            .env(var, value)
            .output()
            .expect("silpgate runs");
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(var) && err.contains("values are not shown"), "{err}");
        assert!(!err.contains("s3cr3t"), "{var}: the value was echoed: {err}");
    }
}

#[test]
fn validate_names_the_draft_revision_of_each_warning_and_warns_on_undefined_seq_keywords() {
    let parallel = CASE2.replace(r#""seq":[]"#, r#""seq":["act","parallel"]"#);
    let o = silpgate(&["silp", "validate"], &parallel);
    assert_eq!(o.status.code(), Some(0), "a warning does not make the IR invalid");
    let report: Value = serde_json::from_str(stdout(&o).trim_end()).expect("JSON report");
    let warnings = report["warnings"].as_array().unwrap();
    let revisions = report["warning_revisions"].as_array().unwrap();
    assert_eq!(warnings.len(), revisions.len(), "{report}");
    assert_eq!(revisions[0], "draft-00", "the double negative is -00's rule: {report}");
    let last = warnings.last().unwrap().as_str().unwrap();
    assert!(last.starts_with("draft-02 §3.6: meta.seq names 'parallel'"), "{report}");
    assert!(last.contains("nothing runs in parallel or is reordered"), "{report}");
    assert_eq!(revisions.last().unwrap(), "draft-02");
    let o = silpgate(&["silp", "validate"], &CASE2.replace(r#""seq":[]"#, r#""seq":["sequential"]"#));
    let report: Value = serde_json::from_str(stdout(&o).trim_end()).expect("JSON report");
    assert!(!report.to_string().contains("draft-02"), "sequential is what seq means: {report}");
}
