//! The deployment files agree with the configuration they deploy.

use serde_json::Value;
use silpgate::config::Config;
use silpgate::transport::amqp::topology::Topology;
use std::collections::BTreeSet;
use std::path::Path;

fn root(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

#[test]
fn every_configuration_file_loads_and_validates() {
    let mut checked = 0;
    for entry in std::fs::read_dir(root("config")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            Config::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            checked += 1;
        }
    }
    assert!(checked > 0, "config/ holds configuration files");
}

#[test]
fn the_rabbitmq_definitions_hold_the_topology_silpgate_declares() {
    let config = Config::load(&root("config/silpgate.toml")).unwrap();
    let topology = Topology::from_config(config.amqp.as_ref().expect("[amqp]"), &config.agents);
    let text = std::fs::read_to_string(root("deploy/rabbitmq/definitions.json")).unwrap();
    let defs: Value = serde_json::from_str(&text).expect("definitions.json is JSON");

    let exchanges: BTreeSet<(String, String)> = defs["exchanges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            assert_eq!(x["durable"], true, "{x}");
            (x["name"].as_str().unwrap().to_owned(), x["type"].as_str().unwrap().to_owned())
        })
        .collect();
    let expected: BTreeSet<_> =
        topology.exchanges.iter().map(|(n, k)| (n.clone(), (*k).to_owned())).collect();
    assert_eq!(exchanges, expected);

    let queues: BTreeSet<(String, Option<String>, Option<u64>)> = defs["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            let args = &q["arguments"];
            assert_eq!(args["x-queue-type"], "quorum", "{q}");
            assert_eq!(q["durable"], true, "{q}");
            (
                q["name"].as_str().unwrap().to_owned(),
                args["x-dead-letter-exchange"].as_str().map(str::to_owned),
                args["x-delivery-limit"].as_u64(),
            )
        })
        .collect();
    let expected: BTreeSet<_> = topology
        .queues
        .iter()
        .map(|q| (q.name.clone(), q.dead_letter_exchange.clone(), q.delivery_limit.map(u64::from)))
        .collect();
    assert_eq!(queues, expected);

    let bindings: BTreeSet<(String, String, String)> = defs["bindings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["destination"].as_str().unwrap().to_owned(),
                b["source"].as_str().unwrap().to_owned(),
                b["routing_key"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(bindings, topology.bindings.iter().cloned().collect());
}

#[test]
fn every_grafana_panel_charts_a_metric_silpgate_exports() {
    let text = std::fs::read_to_string(root("deploy/grafana/silpgate.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert!(dashboard["title"].is_string() && dashboard["panels"].is_array(), "a Grafana dashboard");
    let exported = silpgate::metrics::get().names();
    let mut charted = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let targets = panel["targets"].as_array().expect("every panel has queries");
        assert!(!targets.is_empty(), "{}", panel["title"]);
        for target in targets {
            let expr = target["expr"].as_str().expect("a PromQL query");
            let names: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("silpgate_"))
                .collect();
            assert!(!names.is_empty(), "{}: {expr} names no silpgate metric", panel["title"]);
            for name in names {
                let family =
                    ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
                assert!(exported.iter().any(|e| e == family), "{}: {name} is not exported", panel["title"]);
                charted.insert(family.to_owned());
            }
        }
    }
    let exported: BTreeSet<String> = exported.iter().cloned().collect();
    assert_eq!(charted, exported, "every exported metric is charted somewhere");
}
