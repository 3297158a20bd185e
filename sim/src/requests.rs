//! What the simulator was asked for, for tests and benchmarks to assert: collection lists and
//! watches opened, watches open now, the most lists in flight at once, and every request by
//! resource and verb.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Counters of the requests the simulator served.
#[derive(Default)]
pub(crate) struct Requests {
    lists: AtomicU64,
    unpaged_lists: AtomicU64,
    lists_in_flight: AtomicU64,
    peak_lists_in_flight: AtomicU64,
    watches_opened: AtomicU64,
    initial_events_watches: AtomicU64,
    watches_open: AtomicU64,
    /// Requests by resource (its plural) and verb (`list`, `watch`, `get`, `create`,
    /// `update`, `patch`, `delete`).
    by_verb: Mutex<BTreeMap<(String, &'static str), u64>>,
}

/// A snapshot of the requests the simulator counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// Collection list requests (each page counts).
    pub lists: u64,
    /// Of those, requests for a whole collection at once (no `limit`).
    pub unpaged_lists: u64,
    /// The most list requests in flight at once.
    pub peak_lists_in_flight: u64,
    /// Watch requests accepted, `sendInitialEvents` ones included.
    pub watches_opened: u64,
    /// Of those, watches that began with the current state (`sendInitialEvents`).
    pub initial_events_watches: u64,
    /// Watches open now.
    pub watches_open: u64,
}

/// Counts a request in flight until dropped.
pub(crate) struct InFlight<'a>(&'a AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Requests {
    /// A list request begins (`paged`: with a limit); it ends when the guard is dropped.
    pub fn list(&self, paged: bool) -> InFlight<'_> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        if !paged {
            self.unpaged_lists.fetch_add(1, Ordering::SeqCst);
        }
        let now = self.lists_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak_lists_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(&self.lists_in_flight)
    }

    /// A watch opens; it is open until the guard is dropped.
    pub fn watch(&self, initial_events: bool) -> InFlight<'_> {
        self.watches_opened.fetch_add(1, Ordering::SeqCst);
        if initial_events {
            self.initial_events_watches.fetch_add(1, Ordering::SeqCst);
        }
        self.watches_open.fetch_add(1, Ordering::SeqCst);
        InFlight(&self.watches_open)
    }

    /// A request for `resource` (its plural) with `verb`.
    pub fn verb(&self, resource: &str, verb: &'static str) {
        *self
            .by_verb
            .lock()
            .expect("requests lock poisoned")
            .entry((resource.to_string(), verb))
            .or_default() += 1;
    }

    /// Requests for `resource` so far, by verb.
    pub fn verbs(&self, resource: &str) -> BTreeMap<&'static str, u64> {
        self.by_verb
            .lock()
            .expect("requests lock poisoned")
            .iter()
            .filter(|((r, _), _)| r == resource)
            .map(|((_, v), n)| (*v, *n))
            .collect()
    }

    pub fn counts(&self) -> RequestCounts {
        RequestCounts {
            lists: self.lists.load(Ordering::SeqCst),
            unpaged_lists: self.unpaged_lists.load(Ordering::SeqCst),
            peak_lists_in_flight: self.peak_lists_in_flight.load(Ordering::SeqCst),
            watches_opened: self.watches_opened.load(Ordering::SeqCst),
            initial_events_watches: self.initial_events_watches.load(Ordering::SeqCst),
            watches_open: self.watches_open.load(Ordering::SeqCst),
        }
    }

    /// Starts counting afresh (watches open now stay counted as open).
    pub fn reset(&self) {
        for c in [
            &self.lists,
            &self.unpaged_lists,
            &self.watches_opened,
            &self.initial_events_watches,
        ] {
            c.store(0, Ordering::SeqCst);
        }
        self.by_verb.lock().expect("requests lock poisoned").clear();
        self.peak_lists_in_flight.store(
            self.lists_in_flight.load(Ordering::SeqCst),
            Ordering::SeqCst,
        );
    }
}
