//! `SimConfig`: how a simulator is started (TLS, token, bookmarks, history and journal limits,
//! address, WatchList, list latency).

use std::net::SocketAddr;
use std::time::Duration;

/// How [`Sim::start`](crate::Sim::start) sets up the simulator.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Serve HTTPS with a self-signed certificate.
    pub tls: bool,
    /// Require this bearer token (401 otherwise).
    pub token: Option<String>,
    /// Interval of BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
    /// Changes kept for watch replay and old lists; older ones are compacted.
    pub history_limit: usize,
    /// Journal entries kept ([`Sim::journal`](crate::Sim::journal)); the oldest are dropped
    /// past it. `None` keeps every one, as tests that compare against the whole journal need.
    pub journal_limit: Option<usize>,
    /// The address to listen on; `None` takes a free port on 127.0.0.1.
    pub addr: Option<SocketAddr>,
    /// Serve `sendInitialEvents` watches (the WatchList feature). Off, such a watch is refused
    /// with 422, as by an API server with the feature gate disabled.
    pub watch_list: bool,
    /// How long each list request takes to answer (zero: at once), so tests can see how many
    /// run at once.
    pub list_delay: Duration,
    /// Apply a `shardSelector` to lists and watches (sharded list and watch, the
    /// `ShardedListAndWatch` gate). Off, the parameter is ignored, as by an API server with the
    /// gate off (its default).
    pub sharded_list_and_watch: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            tls: false,
            token: None,
            bookmark_interval: Duration::from_secs(1),
            history_limit: 200_000,
            journal_limit: None,
            addr: None,
            watch_list: true,
            list_delay: Duration::ZERO,
            sharded_list_and_watch: false,
        }
    }
}
