//! Every default is stated once, in code (the `Default` impls and `#[serde(default)]`
//! functions). The documentation and the annotated configuration repeat them for readers;
//! these tests hold both to the code: a value they give as the default must change nothing
//! when it is set.

use super::Config;

/// A section as a configuration states it with nothing set, to which a key is added.
struct Section {
    header: String,
    /// Keys a lone entry of an array of tables needs (a stream's name and url).
    required: &'static str,
}

fn section(name: &str) -> Option<Section> {
    let (header, required) = match name {
        "gateway" | "silp" | "nlip" | "sessions" | "store" | "http" | "a2a" | "auth" | "amqp" | "cluster"
        | "telemetry" => (format!("[{name}]"), ""),
        "streams" => ("[[streams]]".to_owned(), "name = \"s\"\nurl = \"ws://127.0.0.1:1\"\n"),
        // An agent of each kind, as `[[agents]]` rows of docs/configuration.md name them.
        "agents" | "HTTP" => ("[[agents]]".to_owned(), "name = \"a\"\nurl = \"http://127.0.0.1:1\"\n"),
        "AMQP" => ("[[agents]]".to_owned(), "name = \"a\"\n"),
        "WebSocket" => ("[[agents]]".to_owned(), "name = \"a\"\nurl = \"ws://127.0.0.1:1\"\n"),
        "A2A" => {
            ("[[agents]]".to_owned(), "name = \"a\"\nprotocol = \"a2a\"\nurl = \"http://127.0.0.1:1\"\n")
        }
        "MCP" => (
            "[[agents]]".to_owned(),
            "name = \"a\"\nprotocol = \"mcp\"\nurl = \"http://127.0.0.1:1\"\ntool = \"t\"\n",
        ),
        _ => return None,
    };
    Some(Section { header, required })
}

/// The configuration with `[section]` present and nothing else set, and with `key = value`
/// set in it, as parsed; equal when `value` is the default.
fn with_and_without(section: &Section, key: &str, value: &str) -> Result<(String, String), String> {
    // `[cluster]` needs `[amqp]`.
    let prelude = if section.header == "[cluster]" { "[amqp]\n" } else { "" };
    let bare = format!("{prelude}{}\n{}", section.header, section.required);
    let set = format!("{bare}{key} = {value}\n");
    let parse = |text: &str| Config::parse(text).map(|c| seen(&c, key)).map_err(|e| format!("{text}: {e}"));
    Ok((parse(&bare)?, parse(&set)?))
}

/// A configuration as silpgate acts on it. Unset, `amqp.url` is the local broker, in
/// `AmqpConfig::addresses`: that is the default of the address silpgate connects to.
fn seen(config: &Config, key: &str) -> String {
    match &config.amqp {
        Some(amqp) if key == "url" => format!("{:?}", amqp.addresses()),
        _ => format!("{config:?}"),
    }
}

/// A documented default as TOML: a TOML value as written, else a string.
fn as_toml(value: &str) -> String {
    match format!("v = {value}").parse::<toml::Table>() {
        Ok(_) => value.to_owned(),
        Err(_) => format!("{value:?}"),
    }
}

/// The backticked literals of a table cell that holds nothing else: `` `a`, `b` ``.
fn literals(cell: &str) -> Option<Vec<&str>> {
    let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
    let parts: Vec<&str> = inner.split("`, `").collect();
    parts.iter().all(|p| !p.contains('`')).then_some(parts)
}

fn manifest(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_default_in_docs_configuration_md_is_the_codes() {
    let docs = manifest("docs/configuration.md");
    let (mut current, mut checked, mut wrong) = (None, 0, Vec::new());
    for line in docs.lines() {
        if let Some(heading) = line.strip_prefix("## `[") {
            current = section(heading.trim_start_matches('[').trim_end_matches(['`', ']']));
            continue;
        }
        let Some(section) = &current else { continue };
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | `key` | `default` | meaning |
        if section.header == "[[agents]]" {
            // | `key` | meaning, ending in Default `value` | or | `key` | kind | meaning |
            let (key, kind, meaning) = match cells.as_slice() {
                [_, key, meaning, _] => (key, "agents", meaning),
                [_, key, kind, meaning, _] => (key, kind.split(',').next().unwrap_or_default(), meaning),
                _ => continue,
            };
            let (Some(key), Some(default)) = (literals(key), meaning.split_once("Default `")) else {
                continue;
            };
            let (Some(agent), Some((default, _))) = (self::section(kind), default.1.split_once('`')) else {
                continue;
            };
            match with_and_without(&agent, key[0], &as_toml(default)) {
                Ok((bare, set)) if bare == set => checked += 1,
                Ok(_) => wrong.push(format!("[[agents]] ({kind}) {}: the docs say `{default}`", key[0])),
                Err(e) => wrong.push(e),
            }
            continue;
        }
        let [_, keys, defaults, _meaning, ..] = cells.as_slice() else { continue };
        // One key and one literal (`key` | `value`), or as many of each (`a`, `b` | `1`, `2`);
        // a default said in words is not checked.
        let (Some(keys), Some(defaults)) = (literals(keys), literals(defaults)) else { continue };
        if keys.len() != defaults.len() {
            continue;
        }
        for (key, default) in keys.into_iter().zip(defaults) {
            match with_and_without(section, key, &as_toml(default)) {
                Ok((bare, set)) if bare == set => checked += 1,
                Ok(_) => wrong.push(format!(
                    "{} {key}: the docs say `{default}`, the code's default differs",
                    section.header
                )),
                Err(e) => wrong.push(format!("{} {key} = {default}: {e}", section.header)),
            }
        }
    }
    assert!(wrong.is_empty(), "docs/configuration.md:\n{}", wrong.join("\n"));
    assert!(checked >= 60, "only {checked} defaults were read from docs/configuration.md's tables");
}

#[test]
fn every_value_set_in_config_silpgate_toml_is_the_default_but_the_local_choices() {
    // What the annotated file sets on purpose for a local run, unlike the defaults: plain HTTP
    // on loopback, and a broker to talk to.
    let local_choices = ["[http] plain", "[amqp] url"];
    let file = manifest("config/silpgate.toml");
    let (mut current, mut checked, mut wrong) = (None, 0, Vec::new());
    for line in file.lines() {
        if let Some(header) = line.strip_prefix('[').filter(|h| !h.starts_with('[')) {
            current = section(header.trim_end_matches(']'));
            continue;
        }
        if line.starts_with("[[") {
            current = None;
            continue;
        }
        let Some(section) = &current else { continue };
        let Some((key, value)) = line.split_once(" = ").filter(|_| !line.starts_with('#')) else { continue };
        if local_choices.contains(&format!("{} {key}", section.header).as_str()) {
            continue;
        }
        match with_and_without(section, key, value) {
            Ok((bare, set)) if bare == set => checked += 1,
            Ok(_) => wrong.push(format!("{} {key} = {value} is not the default", section.header)),
            Err(e) => wrong.push(e),
        }
    }
    assert!(wrong.is_empty(), "config/silpgate.toml:\n{}", wrong.join("\n"));
    assert!(checked >= 40, "only {checked} values were read from config/silpgate.toml");
}

#[test]
fn every_default_a_doc_comment_of_the_configuration_states_is_the_codes() {
    let files = ["mod.rs", "http.rs", "amqp.rs", "cluster.rs", "streams.rs"];
    let source: String =
        files.iter().map(|f| manifest(&format!("src/config/{f}"))).collect::<Vec<_>>().join("\n");
    let (mut current, mut doc, mut next) = (None, String::new(), None::<String>);
    let (mut checked, mut wrong) = (0, Vec::new());
    for line in source.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("pub struct ").and_then(|l| l.strip_suffix(" {")) {
            current = section(struct_section(name));
            continue;
        }
        if let Some(text) = line.strip_prefix("///") {
            doc.push_str(text);
            continue;
        }
        let Some(key) = line.strip_prefix("pub ").and_then(|l| l.split_once(':')).map(|(k, _)| k) else {
            if !line.starts_with("#[") {
                doc.clear();
            }
            continue;
        };
        let stated = next.take().or_else(|| {
            let (first, second) = stated_defaults(&doc)?;
            next = second;
            Some(first)
        });
        doc.clear();
        let (Some(section), Some(default)) = (&current, stated) else { continue };
        match with_and_without(section, key, &default) {
            Ok((bare, set)) if bare == set => checked += 1,
            Ok(_) => wrong.push(format!("{} {key}: its doc comment says {default}", section.header)),
            Err(e) => wrong.push(e),
        }
    }
    assert!(wrong.is_empty(), "src/config/:\n{}", wrong.join("\n"));
    assert!(checked >= 50, "only {checked} defaults were read from the doc comments");
}

/// The section a configuration struct is read from.
fn struct_section(name: &str) -> &str {
    match name {
        "SessionConfig" => "sessions",
        "StreamConfig" => "streams",
        other => other.strip_suffix("Config").map_or("", |s| match s {
            "Gateway" => "gateway",
            "Silp" => "silp",
            "Nlip" => "nlip",
            "Store" => "store",
            "Http" => "http",
            "Amqp" => "amqp",
            "Cluster" => "cluster",
            "Telemetry" => "telemetry",
            _ => "",
        }),
    }
}

/// The default a doc comment states, as TOML (`Default 30000.`, ``Default `code`.``,
/// `Default 1 MiB.`, `Default 1,000,000.`); with `Defaults A and B.`, B is the next field's.
/// A default said in words (`Default: none`) is not read.
fn stated_defaults(doc: &str) -> Option<(String, Option<String>)> {
    let (plural, rest) = match doc.split_once(" Defaults ") {
        Some((_, rest)) => (true, rest),
        None => (false, doc.split_once(" Default ")?.1),
    };
    let value = |text: &str| -> Option<(String, usize)> {
        if let Some(quoted) = text.strip_prefix('`') {
            let end = quoted.find('`')?;
            return Some((as_toml(&quoted[..end]), end + 2));
        }
        let end =
            text.find(|c: char| !(c.is_ascii_alphanumeric() || c == ',' || c == '.')).unwrap_or(text.len());
        let word = text[..end].trim_end_matches(['.', ',']);
        let number = word.replace(',', "");
        let literal = match word {
            "true" | "false" => word.to_owned(),
            _ if number.parse::<f64>().is_ok() => number,
            _ => return None,
        };
        let literal = match text[end..].strip_prefix(" MiB") {
            Some(_) => (literal.parse::<u64>().ok()? << 20).to_string(),
            None => literal,
        };
        Some((literal, end))
    };
    let (first, used) = value(rest)?;
    let second =
        if plural { rest[used..].strip_prefix(" and ").and_then(value).map(|(v, _)| v) } else { None };
    Some((first, second))
}
