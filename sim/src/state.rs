//! What the [`crate::Sim`] handles share with the server: the store, the faults armed by tests,
//! the configuration, the open watches' token and the request counters. The handle's methods
//! change it (`sim`, `faults`, `churn`); the server and the watches read it.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Mutex;

use tokio_util::sync::CancellationToken;

use crate::requests::Requests;
use crate::store::Store;
use crate::tls::Tls;
use crate::SimConfig;

/// The state shared by the [`crate::Sim`] handles and the server.
pub(crate) struct Inner {
    pub store: Mutex<Store>,
    pub faults: Faults,
    pub cfg: SimConfig,
    /// Cancelled to drop every open watch; replaced by a fresh token afterwards.
    pub watches: Mutex<CancellationToken>,
    pub shutdown: CancellationToken,
    pub tls: Option<Tls>,
    pub requests: Requests,
}

/// A fault for the next requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// 500 Internal Server Error.
    ServerError,
    /// 429 Too Many Requests with a Retry-After header.
    TooManyRequests {
        /// Seconds the Retry-After header asks the client to wait.
        retry_after_secs: u32,
    },
}

/// Faults armed by tests (see `faults`), consumed by the server.
#[derive(Default)]
pub(crate) struct Faults {
    pub fail: Mutex<Option<(usize, Fault)>>,
    pub cut_line: AtomicBool,
    pub stall_watch: AtomicBool,
    /// The resource (`plural[.group]`) whose next watch stalls.
    pub stall_watch_of: Mutex<Option<String>>,
    pub malformed: AtomicBool,
    pub denied: Mutex<Vec<String>>,
    /// List requests with a continue token still to fail (500).
    pub fail_continued: AtomicUsize,
    /// The resource whose watches from a position are still to be refused as too large (504),
    /// and how many.
    pub lag_watches: Mutex<Option<(String, usize)>>,
    /// The resource whose next list answer is held back once its page is read.
    pub hold_list: Mutex<Option<String>>,
    /// A list answer is held back now.
    pub holding: AtomicBool,
    /// Lets a held list answer go.
    pub release: tokio::sync::Notify,
}
