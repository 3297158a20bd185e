use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use watchrelay::config::{Config, KubernetesConfig};
use watchrelay::Relay;

const USAGE: &str = "usage:
  watchrelay run --config FILE      relay the configured channels to Kafka
  watchrelay check-config FILE      validate a configuration file and exit
  watchrelay --version";

fn main() {
    // One line with the whole chain of causes, never a backtrace: these are user errors
    // (a bad file, an unreachable API server), not bugs.
    if let Err(e) = cli() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn cli() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["check-config", file] => {
            let cfg = Config::load(&PathBuf::from(file))
                .with_context(|| format!("{file} is not valid"))?;
            println!("{file}: ok ({} channels)", cfg.channels.len());
            for c in &cfg.channels {
                println!(
                    "  {} {} -> {} ({:?})",
                    c.name, c.path.template, c.topic, c.scope
                );
            }
            Ok(())
        }
        ["run", "--config", file] | ["run", "-c", file] => run(PathBuf::from(file)),
        ["--version"] | ["version"] => {
            println!("watchrelay {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        _ => bail!("{USAGE}"),
    }
}

fn run(file: PathBuf) -> Result<()> {
    let cfg = Config::load(&file).with_context(|| format!("{} is not valid", file.display()))?;
    let filter =
        EnvFilter::try_from_env("WATCHRELAY_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    if std::env::var("WATCHRELAY_LOG_FORMAT").as_deref() == Ok("json") {
        tracing_subscriber::fmt()
            .json()
            .with_writer(std::io::stderr)
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(filter)
            .init();
    }
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
        let relay = Relay::new(cfg, client);
        spawn_signal_handler(relay.shutdown())?;
        let http_cancel = CancellationToken::new();
        if !listen.is_empty() {
            let addr: std::net::SocketAddr = listen
                .parse()
                .with_context(|| format!("http.listen {listen:?} is not an address"))?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding http.listen {addr}"))?;
            tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
            tokio::spawn(watchrelay::http::serve(
                listener,
                relay.metrics(),
                relay.registry(),
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
    let options = KubeConfigOptions {
        context: k.context.clone(),
        ..Default::default()
    };
    let config = match &k.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubernetes.kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options).await?
        }
        None if k.context.is_some() => kube::Config::from_kubeconfig(&options).await?,
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(config)?)
}
