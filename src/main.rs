//! The `watchrelay` command line.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use watchrelay::catalogue::CATALOGUE;
use watchrelay::checkpoint::Store;
use watchrelay::config::{Config, KubernetesConfig};
use watchrelay::Relay;

/// The commit the binary was built from (see build.rs), or `unknown`.
const COMMIT: &str = env!("WATCHRELAY_COMMIT");
/// `--version`'s long form: the version and the commit.
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("WATCHRELAY_COMMIT"),
    ")"
);

/// `println!` to standard output that returns the write's error instead of panicking: a reader
/// that goes away (`watchrelay channels | head -1`) ends the command quietly (see `main`).
macro_rules! outln {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout().lock(), $($arg)*)?
    };
}

/// `print!` likewise.
macro_rules! out {
    ($($arg:tt)*) => {
        write!(std::io::stdout().lock(), $($arg)*)?
    };
}

/// Relays Kubernetes watch streams into Kafka topics as AsyncAPI-shaped envelopes.
#[derive(Parser)]
#[command(name = "watchrelay", version, long_version = LONG_VERSION, propagate_version = true)]
struct Cli {
    /// Log filter, e.g. `info` or `watchrelay=debug` (logs go to standard error).
    #[arg(long, global = true, env = "WATCHRELAY_LOG", default_value = "info")]
    log: String,
    /// Log format.
    #[arg(long, global = true, env = "WATCHRELAY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    /// Lines for a person.
    Text,
    /// One JSON document, for scripts.
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum TopicsOutput {
    /// One row a topic.
    Table,
    /// `kafka-topics.sh --create` lines, for a Kafka managed elsewhere.
    Commands,
}

#[derive(Clone, Copy, ValueEnum)]
enum RbacOutput {
    /// The permissions, as JSON: what the chart's RBAC is checked against.
    Needs,
    /// Roles and bindings granting them, as a `List` for `kubectl apply -f -`.
    Manifests,
}

#[derive(Args)]
struct ConfigFile {
    /// The configuration file.
    #[arg(short, long, value_name = "FILE", env = "WATCHRELAY_CONFIG")]
    config: PathBuf,
}

impl ConfigFile {
    fn load(&self) -> Result<Config> {
        load(&self.config)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Relay the configured channels to Kafka.
    Run {
        #[command(flatten)]
        config: ConfigFile,
        /// Print envelopes as JSON lines on standard output instead of producing to Kafka; read
        /// and write no checkpoint, take no Lease, need no broker.
        #[arg(long)]
        dry_run: bool,
    },
    /// Validate a configuration file and list the channels it resolves to.
    CheckConfig {
        /// The configuration file (or `--config FILE`).
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
        /// The configuration file.
        #[arg(short, long, value_name = "FILE", env = "WATCHRELAY_CONFIG")]
        config: Option<PathBuf>,
        /// Also check what a replica would meet at start, creating and writing nothing: the
        /// topics on the broker (an existing one with fewer partitions than configured, or not
        /// compacted where tombstones need it, is an error; so is a missing one with
        /// `kafka.topics.create: false`) and the release's checkpoint ConfigMaps (a changed
        /// membership topic, shard count or shards' topic, a change moving keys between
        /// shards). The chart's pre-install and pre-upgrade hook runs it.
        #[arg(long)]
        live: bool,
    },
    /// Print every topic a configuration names, with its partitions, replication and
    /// configurations: as a table, or as `kafka-topics.sh` commands that create them.
    Topics {
        #[command(flatten)]
        config: ConfigFile,
        /// How to print them.
        #[arg(short, long, value_enum, default_value_t = TopicsOutput::Table)]
        output: TopicsOutput,
    },
    /// List the channel catalogue: operationId, watch path, message.
    Channels {
        /// How to print it.
        #[arg(short, long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Print the AsyncAPI 3.0 document of what a configuration publishes.
    Asyncapi {
        #[command(flatten)]
        config: ConfigFile,
        /// Read each channel's object schema from the API server (`/openapi/v3`).
        #[arg(long)]
        cluster: bool,
    },
    /// Show each stream's saved position and its age, and the leader.
    Status {
        #[command(flatten)]
        config: ConfigFile,
        /// How to print it.
        #[arg(short, long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Ask the running relay to relist a channel's streams (or `all`) and reconcile.
    Resync {
        #[command(flatten)]
        config: ConfigFile,
        /// A channel name from the configuration, or `all`.
        channel: String,
        /// Re-announce only objects changed since each stream's position (as after a 410),
        /// instead of every object.
        #[arg(long)]
        delta: bool,
    },
    /// Fan out the streams a sharded release kept whole from before fan-out: each shard's part
    /// takes its objects and resumes from the stream's position, so consumers see every change
    /// and no retraction. Scale the release to zero first: refused while a replica runs.
    SplitWhole {
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Print the Kubernetes permissions a configuration needs, as JSON: list and watch per
    /// resource, cluster-wide or per namespace, and the relay's own ConfigMap and Lease.
    Rbac {
        #[command(flatten)]
        config: ConfigFile,
        /// What to print.
        #[arg(short, long, value_enum, default_value_t = RbacOutput::Needs)]
        output: RbacOutput,
        /// With `-o manifests`: the service account the relay runs as, `NAMESPACE/NAME`
        /// (default: `watchrelay` in the checkpoint's namespace); it must exist.
        #[arg(long, value_name = "NAMESPACE/NAME")]
        service_account: Option<String>,
        /// With `-o manifests`: the name of every object (default: the checkpoint's namespace
        /// and name, `<namespace>-<name>`, unique to the release across the cluster).
        #[arg(long)]
        name: Option<String>,
    },
    /// Print the version and the commit the binary was built from.
    Version,
}

fn main() {
    let cli = Cli::parse();
    // One line with the whole chain of causes, never a backtrace: these are user errors
    // (a bad file, an unreachable API server), not bugs.
    if let Err(e) = dispatch(cli) {
        // The reader of standard output went away: nothing more to say to it.
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
        {
            return;
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// `check-config --live`: the topics as the broker has them and the release as its checkpoint
/// ConfigMaps hold it, judged as a replica of `cfg` would at start.
fn check_live(cfg: &Config) -> Result<()> {
    // The broker gets as long as the API server: an unreachable one is said to be, well within
    // the preflight Job's deadline.
    let topics = block_on(async {
        let cfg = cfg.clone();
        let checked = tokio::task::spawn_blocking(move || check_topics(&cfg));
        match tokio::time::timeout(LIVE_TIMEOUT, checked).await {
            Ok(checked) => checked?,
            Err(_) => bail!("the Kafka brokers did not answer within {LIVE_TIMEOUT:?}"),
        }
    });
    let release = block_on(async {
        let client = kube_client(&cfg.kubernetes).await?;
        let answer =
            tokio::time::timeout(LIVE_TIMEOUT, watchrelay::relay::preflight(cfg, &client)).await;
        match answer {
            Ok(Ok(())) => Ok(()),
            Ok(Err(refusal)) => bail!("{refusal}"),
            Err(_) => bail!("the API server did not answer within {LIVE_TIMEOUT:?}"),
        }
    });
    match (topics, release) {
        (Ok(()), Ok(())) => {
            outln!("  the release's checkpoints: ok");
            Ok(())
        }
        (Err(t), Err(r)) => bail!("{t}; {r}"),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// How long `check-config --live` waits for the brokers, and then for the API server.
const LIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The published topics as the broker has them, judged as the relay judges them at start.
fn check_topics(cfg: &Config) -> Result<()> {
    let specs = watchrelay::topics::plan(cfg).published;
    let connection = cfg.kafka.connection_config();
    let states = watchrelay::topics::admin::describe(&connection, &specs)?;
    let create = cfg.kafka.topics.create;
    for (spec, state) in specs.iter().zip(&states) {
        match state {
            None if create => outln!("  topic {}: missing; created at start", spec.name),
            None => outln!("  topic {}: missing", spec.name),
            Some(state) => outln!("  topic {}: {} partitions", spec.name, state.partitions),
        }
    }
    let problems = watchrelay::topics::problems(&specs, &states, create);
    if problems.is_empty() {
        return Ok(());
    }
    bail!("{}", problems.join("; "))
}

/// The configuration in `file`; an error says whether the file could not be read or is not
/// valid, and names the field (each cause once).
fn load(file: &std::path::Path) -> Result<Config> {
    match Config::load(file) {
        Ok(cfg) => Ok(cfg),
        Err(e @ watchrelay::config::ConfigError::Read { .. }) => Err(e.into()),
        Err(e) => Err(anyhow::Error::new(e).context(format!("{} is not valid", file.display()))),
    }
}

fn logging(cli: &Cli) -> Result<()> {
    let filter = EnvFilter::try_new(&cli.log).with_context(|| format!("--log {:?}", cli.log))?;
    let fmt = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match cli.log_format {
        LogFormat::Json => fmt.json().init(),
        LogFormat::Text => fmt.init(),
    }
    Ok(())
}

/// A runtime for one-shot commands.
fn block_on<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

fn dispatch(cli: Cli) -> Result<()> {
    match &cli.command {
        Command::Run { config, dry_run } => {
            let cfg = config.load()?;
            logging(&cli)?;
            run(cfg, *dry_run)
        }
        Command::CheckConfig { file, config, live } => {
            let file = file
                .as_ref()
                .or(config.as_ref())
                .context("name the configuration file: check-config FILE (or --config FILE)")?;
            let cfg = load(file)?;
            outln!("{}: ok ({} channels)", file.display(), cfg.channels.len());
            let reach = watchrelay::rbac::needs(&cfg).cluster_wide;
            for c in &cfg.channels {
                // A topic naming the namespace is one per namespace: shown as its template.
                let per_namespace = c.path.namespaced && c.topic.contains("{namespace}");
                let topic = c.topic_for(&cfg.cluster_name, per_namespace.then_some("{namespace}"));
                outln!("  {} {} -> {topic} ({})", c.name, c.path.template, c.scope);
                match reach.get(&c.name) {
                    Some(why) => outln!("    reads cluster-wide: {why}"),
                    None => outln!("    reads only the namespaces it lists"),
                }
            }
            if *live {
                // Retried reads say why on standard error (an ACL, an unreachable server).
                logging(&cli)?;
                check_live(&cfg)?;
            }
            Ok(())
        }
        Command::Topics { config, output } => {
            let cfg = config.load()?;
            let plan = watchrelay::topics::plan(&cfg);
            match output {
                TopicsOutput::Table => out!("{}", watchrelay::topics::table(&plan)),
                TopicsOutput::Commands => out!(
                    "{}",
                    watchrelay::topics::commands(&plan, &cfg.kafka.bootstrap_servers)
                ),
            }
            Ok(())
        }
        Command::Channels { output } => {
            match output {
                Output::Json => {
                    let list: Vec<_> = CATALOGUE
                        .iter()
                        .map(|c| {
                            let p = watchrelay::catalogue::ChannelPath::parse(c.path)
                                .expect("catalogue paths are valid");
                            serde_json::json!({
                                "operationId": c.operation_id, "path": c.path, "message": c.message,
                                "group": p.group, "resource": p.resource, "namespaced": p.namespaced,
                            })
                        })
                        .collect();
                    outln!("{}", serde_json::to_string_pretty(&list)?);
                }
                Output::Text => {
                    let w = CATALOGUE
                        .iter()
                        .map(|c| c.operation_id.len())
                        .max()
                        .unwrap_or(0);
                    let p = CATALOGUE.iter().map(|c| c.path.len()).max().unwrap_or(0);
                    outln!("{:w$}  {:p$}  MESSAGE", "OPERATIONID", "PATH");
                    for c in CATALOGUE {
                        outln!("{:w$}  {:p$}  {}", c.operation_id, c.path, c.message);
                    }
                }
            }
            Ok(())
        }
        Command::Asyncapi { config, cluster } => {
            let cfg = config.load()?;
            let schemas = if *cluster {
                let channels = cfg.channels.clone();
                let k = cfg.kubernetes.clone();
                Some(block_on(async move {
                    let client = kube_client(&k).await?;
                    watchrelay::openapi::cluster_schemas(&client, &channels)
                        .await
                        .context("reading object schemas from the cluster")
                })?)
            } else {
                None
            };
            let doc = watchrelay::asyncapi::document(&cfg, schemas.as_ref());
            outln!("{}", serde_json::to_string_pretty(&doc)?);
            Ok(())
        }
        Command::Status { config, output } => {
            let cfg = config.load()?;
            let status = block_on(async {
                let client = kube_client(&cfg.kubernetes).await?;
                watchrelay::status::read(client, &cfg)
                    .await
                    .context("reading the checkpoint and the Lease")
            })?;
            match output {
                Output::Json => outln!("{}", serde_json::to_string_pretty(&status)?),
                Output::Text => out!("{}", watchrelay::status::text(&status)),
            }
            Ok(())
        }
        Command::SplitWhole { config } => {
            let cfg = config.load()?;
            logging(&cli)?;
            let splits = block_on(async {
                let client = kube_client(&cfg.kubernetes).await?;
                Relay::new(cfg, client)
                    .split_whole()
                    .await
                    .map_err(anyhow::Error::from)
            })?;
            if splits.is_empty() {
                outln!("no stream is kept whole: nothing to split");
            }
            for s in &splits {
                let members: usize = s.members.values().sum();
                let from = s.position.as_deref().unwrap_or("none: each part lists");
                outln!(
                    "{} (shard {}): {members} members handed to {} parts, each resuming from resourceVersion {from}",
                    s.stream,
                    s.shard,
                    s.members.len()
                );
            }
            Ok(())
        }
        Command::Resync {
            config,
            channel,
            delta,
        } => {
            let cfg = config.load()?;
            if channel != "all" && !cfg.channels.iter().any(|c| &c.name == channel) {
                let names: Vec<&str> = cfg.channels.iter().map(|c| c.name.as_str()).collect();
                bail!(
                    "no channel {channel:?} in {}; channels: {}, or all",
                    config.config.display(),
                    names.join(", ")
                );
            }
            // A sharded release takes requests on each shard's ConfigMap.
            let names = if cfg.sharding.enabled {
                cfg.sharding.configmaps(&cfg.checkpoint.name)
            } else {
                vec![cfg.checkpoint.name.clone()]
            };
            let request = watchrelay::checkpoint::resync_request(channel, *delta);
            let asked = block_on(async {
                let client = kube_client(&cfg.kubernetes).await?;
                let mut asked = 0;
                let mut last = None;
                for name in &names {
                    let store = Store::new(client.clone(), &cfg.checkpoint.namespace, name);
                    match store.request_resync(&request).await {
                        Ok(()) => asked += 1,
                        Err(e) => last = Some(e),
                    }
                }
                match last {
                    Some(e) if asked == 0 => Err(anyhow::Error::new(e).context(
                        "the relay has not written its checkpoint ConfigMap yet, or it cannot be patched",
                    )),
                    _ => Ok(asked),
                }
            })?;
            outln!(
                "resync of {channel} requested on {asked} ConfigMap(s) in {} ({}); the running relay takes it within seconds",
                cfg.checkpoint.namespace, cfg.checkpoint.name
            );
            Ok(())
        }
        Command::Rbac {
            config,
            output,
            service_account,
            name,
        } => {
            let cfg = config.load()?;
            let needs = watchrelay::rbac::needs(&cfg);
            let out = match output {
                RbacOutput::Needs => serde_json::to_value(&needs)?,
                RbacOutput::Manifests => {
                    let (namespace, account) = match &service_account {
                        Some(sa) => sa
                            .split_once('/')
                            .filter(|(ns, n)| !ns.is_empty() && !n.is_empty())
                            .ok_or_else(|| {
                                anyhow::anyhow!("--service-account {sa:?} is not NAMESPACE/NAME")
                            })?,
                        None => (cfg.checkpoint.namespace.as_str(), "watchrelay"),
                    };
                    let c = &cfg.checkpoint;
                    let name = name
                        .clone()
                        .unwrap_or_else(|| format!("{}-{}", c.namespace, c.name));
                    watchrelay::rbac::manifests(&needs, &name, namespace, account)
                }
            };
            outln!("{}", serde_json::to_string_pretty(&out)?);
            Ok(())
        }
        Command::Version => {
            outln!("watchrelay {}", env!("CARGO_PKG_VERSION"));
            outln!("commit: {COMMIT}");
            Ok(())
        }
    }
}

fn run(cfg: Config, dry_run: bool) -> Result<()> {
    let mut runtime = match cfg.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    };
    runtime.enable_all().build()?.block_on(async move {
        let client = kube_client(&cfg.kubernetes)
            .await
            .context("connecting to the Kubernetes API")?;
        let listen = cfg.http.listen.clone();
        let asyncapi = serde_json::to_vec_pretty(&watchrelay::asyncapi::document(&cfg, None))?;
        let mut relay = Relay::new(cfg, client);
        if dry_run {
            tracing::info!(
                "dry run: envelopes go to standard output; no checkpoint is read or written"
            );
            relay = relay.dry_run();
        }
        spawn_signal_handler(relay.shutdown())?;
        let http_cancel = CancellationToken::new();
        if !listen.is_empty() {
            let addr: std::net::SocketAddr = listen
                .parse()
                .with_context(|| format!("http.listen {listen:?} is not an address"))?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding http.listen {addr}"))?;
            tracing::info!(%addr, "serving /metrics, /healthz, /readyz and /asyncapi.json");
            tokio::spawn(watchrelay::http::serve(
                listener,
                watchrelay::http::Served {
                    metrics: relay.metrics(),
                    registry: relay.registry(),
                    asyncapi: asyncapi.into(),
                },
                http_cancel.clone(),
            ));
        }
        let result = relay.run().await;
        http_cancel.cancel();
        result.context("relay failed")
    })
}

/// First SIGTERM/SIGINT drains; a second one exits at once.
fn spawn_signal_handler(shutdown: CancellationToken) -> Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        for n in 0.. {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if n == 0 {
                tracing::info!("signal received: draining (send again to abort)");
                shutdown.cancel();
            } else {
                tracing::warn!("second signal: aborting without draining");
                std::process::exit(130);
            }
        }
    });
    Ok(())
}

async fn kube_client(k: &KubernetesConfig) -> Result<kube::Client> {
    Ok(watchrelay::kubeclient::connect(k).await?)
}
