//! Fault injection: the faults tests arm on a [`Sim`] (failed requests, failed later pages,
//! broken, stalled or dropped watches, denied resources). The server consumes them from the
//! shared state (`state`).

use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;

use crate::state::Fault;
use crate::Sim;

impl Sim {
    /// Ends every open watch cleanly, as an API server restart or a load balancer would.
    pub fn drop_watches(&self) {
        let mut w = self.inner.watches.lock().expect("watches lock poisoned");
        w.cancel();
        *w = CancellationToken::new();
    }

    /// Refuses the next `n` watches of `resource` (its plural) from a position with 504 "Too
    /// large resource version", as an API server whose watch cache lags the one that served the
    /// position does, though the position is not ahead of the history: a list from etcd is not
    /// behind it.
    pub fn lag_next_watches(&self, resource: &str, n: usize) {
        *self
            .inner
            .faults
            .lag_watches
            .lock()
            .expect("faults lock poisoned") = Some((resource.to_string(), n));
    }

    /// How many of the 504s armed by [`Sim::lag_next_watches`] are still to be served.
    pub fn lagging_watches(&self) -> usize {
        self.inner
            .faults
            .lag_watches
            .lock()
            .expect("faults lock poisoned")
            .as_ref()
            .map_or(0, |(_, n)| *n)
    }

    /// Fails the next `n` list requests that carry a continue token (a later page), with 500.
    pub fn fail_next_pages(&self, n: usize) {
        self.inner.faults.fail_continued.store(n, Ordering::Relaxed);
    }

    /// How many of the failures armed by [`Sim::fail_next_pages`] are still to be served.
    pub fn pages_to_fail(&self) -> usize {
        self.inner.faults.fail_continued.load(Ordering::Relaxed)
    }

    /// Holds back the answer to the next list of `resource` (its plural) once its page is read
    /// at its snapshot, until [`Sim::release_list`]: a list that takes long (a large
    /// collection) while the objects it read go on changing.
    pub fn hold_next_list(&self, resource: &str) {
        *self
            .inner
            .faults
            .hold_list
            .lock()
            .expect("faults lock poisoned") = Some(resource.to_string());
    }

    /// Whether a list answer is held back now.
    pub fn list_held(&self) -> bool {
        self.inner.faults.holding.load(Ordering::SeqCst)
    }

    /// Lets the list answer held back by [`Sim::hold_next_list`] go.
    pub fn release_list(&self) {
        self.inner.faults.release.notify_one();
    }

    /// Fails the next `n` resource requests (discovery and `/version` are spared).
    pub fn fail_next(&self, n: usize, fault: Fault) {
        *self.inner.faults.fail.lock().expect("faults lock poisoned") = Some((n, fault));
    }

    /// Disarms the failures armed by [`Sim::fail_next`] still to be served.
    pub fn stop_failing(&self) {
        *self.inner.faults.fail.lock().expect("faults lock poisoned") = None;
    }

    /// How many of the failures armed by [`Sim::fail_next`] are still to be served.
    pub fn pending_failures(&self) -> usize {
        self.inner
            .faults
            .fail
            .lock()
            .expect("faults lock poisoned")
            .map_or(0, |(n, _)| n)
    }

    /// The next event line written on any watch is cut in half and the connection aborted.
    pub fn cut_next_watch_line(&self) {
        self.inner.faults.cut_line.store(true, Ordering::SeqCst);
    }

    /// The next watch is accepted and then sends nothing at all, no event and no bookmark, as
    /// over a half-open connection, until the client gives up on it.
    pub fn stall_next_watch(&self) {
        self.inner.faults.stall_watch.store(true, Ordering::SeqCst);
    }

    /// The next watch of `resource` (`plural[.group]`) stalls, as [`Sim::stall_next_watch`]
    /// does: a client whose watch of it went quiet over a half-open connection.
    pub fn stall_next_watch_of(&self, resource: &str) {
        *self
            .inner
            .faults
            .stall_watch_of
            .lock()
            .expect("faults lock poisoned") = Some(resource.to_string());
    }

    /// Whether the stall armed by [`Sim::stall_next_watch_of`] still waits for its watch.
    pub fn watch_stall_armed(&self) -> bool {
        self.inner
            .faults
            .stall_watch_of
            .lock()
            .expect("faults lock poisoned")
            .is_some()
    }

    /// The next event written on any watch is preceded by a line that is not JSON.
    pub fn inject_malformed_line(&self) {
        self.inner.faults.malformed.store(true, Ordering::SeqCst);
    }

    /// Requests for `resource` (`plural[.group]`) get 403 Forbidden from now on.
    pub fn deny(&self, resource: &str) {
        self.inner
            .faults
            .denied
            .lock()
            .expect("faults lock poisoned")
            .push(resource.to_string());
    }

    /// Lifts [`Sim::deny`] for `resource`.
    pub fn allow(&self, resource: &str) {
        self.inner
            .faults
            .denied
            .lock()
            .expect("faults lock poisoned")
            .retain(|r| r != resource);
    }
}
