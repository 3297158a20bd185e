//! The simulator as a process, for the demo and manual exploration.

use std::path::PathBuf;
use std::time::Duration;

use watchrelay_sim::{ChurnSpec, Sim, SimConfig};

const USAGE: &str =
    "usage: watchrelay-sim [--addr 127.0.0.1:0] [--tls] [--token T] [--kubeconfig-out FILE]
                      [--churn-rate N] [--namespaces a,b] [--resources pods,deployments.apps,...]
                      [--bookmark-interval-ms N]";

fn main() {
    if let Err(e) = run() {
        eprintln!("watchrelay-sim: {e}\n{USAGE}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), String> {
    // A long-running simulator keeps a bounded journal: nobody reads it whole.
    let mut cfg = SimConfig {
        journal_limit: Some(100_000),
        ..SimConfig::default()
    };
    let mut kubeconfig: Option<PathBuf> = None;
    let mut rate = 0.0;
    let mut namespaces = vec!["default".to_string()];
    let mut resources = vec!["pods".to_string()];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--addr" => cfg.addr = Some(value()?.parse().map_err(|e| format!("--addr: {e}"))?),
            "--tls" => cfg.tls = true,
            "--token" => cfg.token = Some(value()?),
            "--kubeconfig-out" => kubeconfig = Some(value()?.into()),
            "--churn-rate" => rate = value()?.parse().map_err(|e| format!("--churn-rate: {e}"))?,
            "--namespaces" => namespaces = value()?.split(',').map(str::to_string).collect(),
            "--resources" => resources = value()?.split(',').map(str::to_string).collect(),
            "--bookmark-interval-ms" => {
                cfg.bookmark_interval = Duration::from_millis(
                    value()?
                        .parse()
                        .map_err(|e| format!("--bookmark-interval-ms: {e}"))?,
                )
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let sim = Sim::start(cfg).await.map_err(|e| e.to_string())?;
        for ns in &namespaces {
            let _ = sim.create("namespaces", None, watchrelay_sim::objects::namespace(ns));
        }
        if let Some(path) = &kubeconfig {
            sim.write_kubeconfig(path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        println!("watchrelay-sim listening on {}", sim.url());
        let churn = (rate > 0.0).then(|| {
            sim.start_churn(ChurnSpec {
                rate_per_sec: rate,
                namespaces,
                resources,
                max_objects_per_kind: 20,
                total_events: None,
            })
        });
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| e.to_string())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        drop(churn);
        sim.shutdown();
        Ok(())
    })
}
