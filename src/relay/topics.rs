//! Before any stream starts: the topics the relay publishes to exist (created when missing,
//! with `kafka.topics.create`) and serve the configuration (see [`crate::topics::check`]).
//! Until they do, the replica is not ready, with the reason, and tries again.

use std::sync::Arc;
use std::time::Duration;

use prometheus::IntGauge;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::membership::Log;
use crate::registry::Registry;
use crate::topics;

/// Between two attempts at the topics.
const RETRY: Duration = Duration::from_secs(10);

/// Who blocks the replica in the readiness, and the kind of its problem.
const WHO: &str = "topics";

/// Makes the configuration's published topics ready; false when stopped first.
pub(super) async fn ready(
    cfg: &Config,
    log: Arc<dyn Log>,
    registry: &Registry,
    unready: &IntGauge,
    stop: &CancellationToken,
) -> bool {
    let specs = topics::plan(cfg).published;
    if specs.is_empty() {
        return true;
    }
    let create = cfg.kafka.topics.create;
    loop {
        let (log, asked) = (log.clone(), specs.clone());
        let attempt = tokio::task::spawn_blocking(move || log.published(&asked, create));
        let problem = tokio::select! {
            _ = stop.cancelled() => return false,
            r = attempt => match r {
                Ok(Ok(states)) => topics::problems(&specs, &states, create).into_iter().next(),
                Ok(Err(e)) => Some(e.to_string()),
                Err(e) => Some(e.to_string()),
            },
        };
        let Some(problem) = problem else {
            registry.block_for(WHO, None);
            unready.set(0);
            return true;
        };
        registry.block_for(WHO, Some((WHO.to_string(), problem)));
        unready.set(1);
        tokio::select! {
            _ = stop.cancelled() => return false,
            _ = tokio::time::sleep(RETRY) => {}
        }
    }
}
