//! The command line: argument definitions (clap) and dispatch. Exit codes: 0 success, 1 an
//! input was invalid, 2 usage error.

mod agents;
mod cluster;
mod input;
mod lines;
mod nlip;
mod silp;
mod store;
mod tokens;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "silpgate",
    version,
    about = "Carries SILP payloads inside NLIP envelopes between AI agents"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Compile, decode, validate and hash SILP payloads.
    #[command(subcommand)]
    Silp(silp::SilpCommand),
    /// Read and write NLIP envelopes.
    #[command(subcommand)]
    Nlip(nlip::NlipCommand),
    /// Run the gateway core.
    #[command(subcommand)]
    Gateway(nlip::GatewayCommand),
    /// Verify, export and inspect the compile.lock.
    #[command(subcommand)]
    Lock(store::LockCommand),
    /// Inspect conversation sessions.
    #[command(subcommand)]
    Sessions(store::SessionsCommand),
    /// Check a configuration file.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Check that the configured agents can be reached.
    #[command(subcommand)]
    Agents(agents::AgentsCommand),
    /// Ask a running cluster instance what it serves.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Run the daemon: the HTTP and WebSocket front door on the configured store.
    Run {
        /// Configuration file; the built-in defaults when absent.
        #[arg(long)]
        config: Option<std::path::PathBuf>,
        /// Listen on this address instead of the configured one (ADDR:PORT; port 0: any).
        #[arg(long)]
        listen: Option<String>,
        /// Use this store directory instead of the configured one.
        #[arg(long)]
        store: Option<std::path::PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Parse and check FILE: exit 0 when valid, else exit 1 with the error, its line and column.
    Check { file: std::path::PathBuf },
    /// Print the RabbitMQ definitions (exchanges, queues, bindings) FILE makes silpgate
    /// declare, in the virtual host its broker URI names, for operators who pre-declare
    /// (`load_definitions`).
    Definitions { file: std::path::PathBuf },
    /// Have a running instance read its configuration file again (`POST /admin/reload`):
    /// agents, routes, [auth], the HTTP tokens and the log filter change without a restart; a
    /// file that changes anything else, or fails `config check`, is refused and the old one
    /// stays.
    Reload {
        /// The instance's configuration: its `http.listen` address is asked.
        #[arg(long, conflicts_with = "url")]
        config: Option<std::path::PathBuf>,
        /// The instance's plain-HTTP address, e.g. `http://127.0.0.1:8787`.
        #[arg(long)]
        url: Option<String>,
        /// The environment variable holding a token of a principal with the `admin` role.
        #[arg(long, default_value = "SILPGATE_ADMIN_TOKEN")]
        token_env: String,
    },
}

/// Exit status for an invalid input.
pub const EXIT_INVALID: u8 = 1;
/// Exit status for a usage error (clap uses the same).
pub const EXIT_USAGE: u8 = 2;

/// Loads a configuration file and checks what the parts read from it for themselves: the
/// broker addresses and certificates (unless the addresses come from the environment at start).
fn load_config(path: &std::path::Path) -> Result<crate::config::Config, String> {
    let config = crate::config::Config::load(path).map_err(|e| e.to_string())?;
    if let Some(amqp) = config.amqp.as_ref().filter(|amqp| amqp.url_env.is_none()) {
        crate::broker::addresses::Addresses::of(amqp)?;
    }
    Ok(config)
}

fn run_daemon(config: Option<std::path::PathBuf>, overrides: crate::daemon::Overrides) -> ExitCode {
    let config = match config {
        Some(path) => load_config(&path),
        None => Ok(crate::config::Config::default()),
    };
    let config = match config {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    // Every rustls client (the OTLP exporter's, HTTP agents') takes the process's provider;
    // ring is the one silpgate builds with. Installed before the exporter builds its client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Before the runtime: the OTLP exporter runs its own blocking client on its own thread.
    let telemetry = match crate::telemetry::init(&config.telemetry) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    let result = runtime.block_on(async {
        let daemon = crate::daemon::start(config, overrides).await?;
        let url = daemon.base_url().map_err(crate::daemon::RunError::Serve)?;
        // Before the banner: whoever reads it may signal at once.
        let shutdown = crate::daemon::signals()?;
        eprintln!("silpgate: listening on {url} (POST /nlip, GET /nlip/ws, /nlip/ws/text)");
        daemon.serve(shutdown).await
    });
    drop(runtime);
    telemetry.shutdown();
    match result {
        Ok(()) => {
            eprintln!("silpgate: stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Silp(command) => silp::run(command),
        Command::Nlip(command) => nlip::run_nlip(command),
        Command::Gateway(command) => nlip::run_gateway(command),
        Command::Lock(command) => store::run_lock(command),
        Command::Sessions(command) => store::run_sessions(command),
        Command::Cluster(command) => cluster::run(command),
        Command::Agents(command) => agents::run(command),
        Command::Config(ConfigCommand::Check { file }) => match load_config(&file) {
            Ok(_) => {
                println!("ok: {} is a valid configuration", file.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(EXIT_INVALID)
            }
        },
        Command::Config(ConfigCommand::Definitions { file }) => match crate::config::Config::load(&file) {
            Ok(config) => match &config.amqp {
                Some(amqp) => {
                    let mut topology = crate::broker::topology::Topology::from_config(
                        amqp,
                        config.cluster.as_ref(),
                        &config.agents,
                    );
                    if config.a2a.pushes() {
                        topology = topology.with_push_queue(&config.a2a.push_queue, amqp);
                    }
                    let (uris, key) = amqp.addresses();
                    let first = uris.first().map_or("", String::as_str);
                    match crate::broker::addresses::parse(first, &key) {
                        Ok(address) => {
                            println!("{:#}", topology.definitions(&address.uri.vhost));
                            ExitCode::SUCCESS
                        }
                        Err(e) => {
                            eprintln!("error: {e}");
                            ExitCode::from(EXIT_INVALID)
                        }
                    }
                }
                None => {
                    eprintln!("error: {} has no [amqp] section: silpgate declares nothing", file.display());
                    ExitCode::from(EXIT_INVALID)
                }
            },
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(EXIT_INVALID)
            }
        },
        Command::Config(ConfigCommand::Reload { config, url, token_env }) => {
            cluster::reload(config, url, &token_env)
        }
        Command::Run { config, listen, store } => {
            let config_file = config.clone();
            run_daemon(config, crate::daemon::Overrides { listen, store, config_file })
        }
    }
}
