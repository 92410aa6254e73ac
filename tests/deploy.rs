//! The deployment files agree with the configuration they deploy.

use serde_json::Value;
use silpgate::broker::topology::Topology;
use silpgate::config::Config;
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
fn the_rabbitmq_definitions_hold_the_topology_a_cluster_node_declares() {
    let config = Config::load(&root("config/cluster-node.toml")).unwrap();
    let topology =
        Topology::from_config(config.amqp.as_ref().expect("[amqp]"), config.cluster.as_ref(), &config.agents);
    let declared = topology.definitions("/");
    let text = std::fs::read_to_string(root("deploy/rabbitmq/definitions.json")).unwrap();
    let defs: Value = serde_json::from_str(&text).expect("definitions.json is JSON");
    for kind in ["exchanges", "queues", "bindings"] {
        let set = |v: &Value| -> BTreeSet<String> {
            v[kind]
                .as_array()
                .unwrap_or_else(|| panic!("{kind} is a list"))
                .iter()
                .map(Value::to_string)
                .collect()
        };
        assert_eq!(set(&defs), set(&declared), "{kind} in deploy/rabbitmq/definitions.json");
    }
    // The cluster's pieces are all there: P partition queues with single active consumer, a
    // changelog stream each, the lock stream, and the consistent-hash exchange.
    let queues = defs["queues"].as_array().unwrap();
    let with = |key: &str, value: Value| queues.iter().filter(|q| q["arguments"][key] == value).count();
    let cluster = config.cluster.as_ref().expect("[cluster]");
    let partitions = usize::from(cluster.partitions);
    assert_eq!(
        with("x-single-active-consumer", Value::Bool(true)),
        partitions + config.amqp.as_ref().unwrap().inbound.len()
    );
    assert_eq!(with("x-queue-type", Value::from("stream")), partitions + 1);
    assert!(defs["exchanges"].as_array().unwrap().iter().any(|x| x["type"] == "x-consistent-hash"));
    // The plugin the exchange needs is enabled.
    let plugins = std::fs::read_to_string(root("deploy/rabbitmq/enabled_plugins")).unwrap();
    assert!(plugins.contains("rabbitmq_consistent_hash_exchange"), "{plugins}");
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

/// A YAML file's documents, read by PyYAML (tests/run.sh installs it) and handed over as JSON.
fn yaml_documents(path: &str) -> Vec<Value> {
    let python = std::env::var_os("SILPGATE_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root("target/pyenv/bin/python"));
    let out = std::process::Command::new(&python)
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(root(path))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} ({e}); tests/run.sh installs PyYAML", python.display()));
    assert!(out.status.success(), "{path} is not valid YAML: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn port_of(address: &str) -> u64 {
    address
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches(|c: char| !c.is_ascii_digit()).parse().ok())
        .unwrap()
}

#[test]
fn the_deployment_files_parse_and_agree_with_the_cluster_node_configuration() {
    let text = std::fs::read_to_string(root("config/cluster-node.toml")).unwrap();
    let config = Config::parse(&text).unwrap();
    let port = port_of(&config.http.listen);

    let configmap = &yaml_documents("deploy/kubernetes/configmap.yaml")[0];
    assert_eq!(
        configmap["data"]["silpgate.toml"].as_str().unwrap().trim_end(),
        text.trim_end(),
        "the ConfigMap is config/cluster-node.toml"
    );

    let statefulset = &yaml_documents("deploy/kubernetes/statefulset.yaml")[0];
    assert_eq!(statefulset["kind"], "StatefulSet");
    let pod = &statefulset["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(container["ports"][0]["containerPort"], port);
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], port, "{probe}");
        assert_eq!(container[probe]["httpGet"]["scheme"] == "HTTPS", config.tls(), "{probe} scheme");
    }
    let mounts = container["volumeMounts"].as_array().unwrap();
    let store_mount = mounts.iter().find(|m| m["name"] == "store").expect("a volume for the store");
    assert!(
        config.store.path.starts_with(store_mount["mountPath"].as_str().unwrap()),
        "the store is on the pod's volume"
    );
    assert_eq!(
        statefulset["spec"]["volumeClaimTemplates"][0]["metadata"]["name"], "store",
        "one volume per pod"
    );
    let env: Vec<&str> =
        container["env"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    for needed in [
        config.amqp.as_ref().unwrap().password_env.as_deref(),
        config.http.tokens_env.as_deref(),
        config.store.hmac_key_env.as_deref(),
    ] {
        assert!(env.contains(&needed.unwrap()), "{needed:?} is set from a secret");
    }
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(grace > config.amqp.as_ref().unwrap().drain_secs, "Kubernetes waits for the drain");

    for service in yaml_documents("deploy/kubernetes/service.yaml") {
        assert_eq!(service["spec"]["ports"][0]["targetPort"], port);
    }

    let collector = &yaml_documents("deploy/otel/collector.yaml")[0];
    let otlp_http = collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"].as_str().unwrap();
    let endpoint = config.telemetry.otlp_endpoint.as_deref().expect("the cluster config exports traces");
    assert_eq!(port_of(otlp_http), port_of(endpoint.trim_end_matches("/v1/traces")));
    assert!(
        collector["service"]["pipelines"]["traces"]["receivers"]
            .as_array()
            .unwrap()
            .contains(&Value::from("otlp"))
    );
    let metrics_endpoint =
        config.telemetry.otlp_metrics_endpoint.as_deref().expect("the cluster config pushes metrics");
    assert_eq!(port_of(otlp_http), port_of(metrics_endpoint.trim_end_matches("/v1/metrics")));
    let metrics_receivers = &collector["service"]["pipelines"]["metrics"]["receivers"];
    assert!(metrics_receivers.as_array().unwrap().contains(&Value::from("otlp")));
    let annotations = &statefulset["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/port"], port.to_string().as_str());
    assert_eq!(annotations["prometheus.io/path"], "/metrics");

    let dockerfile = std::fs::read_to_string(root("deploy/Dockerfile")).unwrap();
    assert!(dockerfile.contains(&format!("EXPOSE {port}")));
    assert!(dockerfile.matches("FROM ").count() >= 2, "a multi-stage build");
}

/// `silpgate config definitions`, as an operator runs it: every queue silpgate declares is
/// listed (the A2A push queue too, when push is on), in the virtual host its broker URI names;
/// a file without `[amqp]` is refused saying so.
#[test]
fn config_definitions_lists_what_silpgate_declares_in_its_virtual_host() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("definitions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("silpgate.toml");
    let definitions = |text: &str| {
        std::fs::write(&file, text).unwrap();
        // Bounded: `timeout` stops a hung command, and the status check fails (124).
        std::process::Command::new("timeout")
            .arg("60")
            .arg(env!("CARGO_BIN_EXE_silpgate"))
            .args(["config", "definitions"])
            .arg(&file)
            .output()
            .expect("silpgate runs")
    };
    let out = definitions(
        "[amqp]\nurl = \"amqp://guest:guest@broker:5672/prod\"\n[a2a]\npush_origins = [\"https://hooks.example.com\"]\n",
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let defs: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let queues: BTreeSet<&str> =
        defs["queues"].as_array().unwrap().iter().filter_map(|q| q["name"].as_str()).collect();
    for queue in ["silpgate.in", "silpgate.dead", "silpgate.a2a.push"] {
        assert!(queues.contains(queue), "{queue} in {queues:?}");
    }
    for kind in ["exchanges", "queues", "bindings"] {
        let entries = defs[kind].as_array().unwrap();
        assert!(!entries.is_empty() && entries.iter().all(|e| e["vhost"] == "prod"), "{kind}: {entries:?}");
    }
    let out = definitions("[http]\nplain = true\n");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no [amqp] section"));
}
