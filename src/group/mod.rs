//! The replicas' group: which shards this replica owns, as Kafka's group coordinator assigns
//! them ([`Kafka`]; [`Coordinator`] is the seam a test double takes).
//!
//! The group subscribes to an empty topic with one partition per shard: partition `k` assigned
//! is shard `k` owned. Assignment is the coordinator's (cooperative: only moving shards stop);
//! nothing here allocates. Two threads of their own serve it, never the runtime's: the rebalance
//! callbacks block while shards hand over, and a runtime of one worker thread would deadlock.
//!
//! # Claims, epochs and the ownership deadline
//! A shard assigned is first claimed: its committed offset on the group's topic, plus one, is
//! committed as its new owner epoch. Commits are checked against the member's generation (its
//! epoch under KIP-848), so a successful one proves ownership when it was sent; every owner of a
//! shard has a higher epoch than the one before. The claimed shards are committed again every
//! second; each success pushes the [`Deadline`] to `ownershipDeadlineMs` past when it was sent.
//! A replica whose deadline passes (cut from the coordinator, frozen, or its broker stalled)
//! takes nothing for its shards and starts no commit until a renewal proves ownership again;
//! half the session's margin later with none it must stop producing for every shard it holds:
//! it is the relay's to fence them.
//!
//! # Handover
//! A shard revoked is reported as [`Event::Revoked`] and the callback blocks until the relay says
//! its streams stopped, drained and wrote their final positions (bounded by the drain budget),
//! so the next owner starts from them. A lost assignment (the session expired) is reported the
//! same way with `lost`: nothing may be drained any more.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::Config;

mod kafka;

pub use kafka::Kafka;

/// What the group tells the relay.
#[derive(Debug)]
pub enum Event {
    /// Shards now owned, each with its owner epoch.
    Claimed(Vec<(u32, u64)>),
    /// Shards taken away. The rebalance waits for `done` (or the drain budget): hand them over
    /// first. `lost`: the assignment was lost (the session expired); nothing may be written.
    Revoked {
        /// The shards.
        shards: Vec<u32>,
        /// The assignment was lost: fence them, nothing may be written.
        lost: bool,
        /// Answered once they are handed over.
        done: std::sync::mpsc::SyncSender<()>,
    },
    /// The group's client failed beyond repair (a Kafka consumer's fatal error, e.g. fenced as
    /// a static member): the process must restart. Sent once.
    Fatal(String),
}

/// Until when this replica may act as the owner of its shards: pushed forward by every commit
/// the coordinator accepts, `span` past when it was sent. On tokio's clock (the real one outside
/// a runtime, or in production), so fencing is tested on paused time.
///
/// Once it has passed the replica *holds* its shards: it takes no record for them and starts no
/// commit of a transaction, but keeps what it took. A renewal sent before the deadline may still be
/// answered: a broker that stalls for seconds answers every request late, while the group
/// moved nothing. Such an answer, or any renewal proving ownership again, ends the hold and the
/// shards go on as if nothing happened. Only once the deadline has passed by `grace` with no
/// renewal does it *lapse*, and the replica fences its shards (half the margin by which the
/// session outlasts the deadline: the group may move them soon after).
#[derive(Debug)]
pub struct Deadline {
    base: Instant,
    /// Milliseconds past `base`.
    until: AtomicU64,
    span: Duration,
    grace: Duration,
}

/// How often a replica holding its shards looks whether a renewal ended the hold.
const HOLD_LOOK: Duration = Duration::from_millis(100);

impl Deadline {
    /// A deadline `span` past each renewal, passed until the first, lapsing as soon as it
    /// passes (see [`Deadline::holding`]).
    pub fn new(span: Duration) -> Self {
        Self {
            base: Instant::now(),
            until: AtomicU64::new(0),
            span,
            grace: Duration::ZERO,
        }
    }

    /// The same deadline, held for `grace` once passed before it lapses.
    #[must_use]
    pub fn holding(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Ownership was proven at `sent` (a commit sent then succeeded).
    pub fn renew(&self, sent: Instant) {
        let until = (sent + self.span).duration_since(self.base).as_millis() as u64;
        self.until.fetch_max(until, Ordering::Relaxed);
    }

    /// Whether ownership can no longer be assumed: nothing is taken or committed for the
    /// shards (held, or lapsed).
    pub fn passed(&self) -> bool {
        self.base.elapsed().as_millis() as u64 >= self.until.load(Ordering::Relaxed)
    }

    /// Whether it passed `grace` ago with no renewal since: the shards are to be fenced.
    pub fn lapsed(&self) -> bool {
        self.base.elapsed() >= self.until() + self.grace
    }

    /// How long until it passes (zero once it has).
    pub fn left(&self) -> Duration {
        self.until().saturating_sub(self.base.elapsed())
    }

    /// When to look at it next from `now`: when it passes, and while held, often enough to see
    /// the hold end soon, and when it lapses.
    pub fn next_look(&self, now: Instant) -> Instant {
        if !self.passed() {
            return now + self.left();
        }
        let lapses = self.base + self.until() + self.grace;
        lapses.max(now).min(now + HOLD_LOOK)
    }

    fn until(&self) -> Duration {
        Duration::from_millis(self.until.load(Ordering::Relaxed))
    }
}

/// Why joining the group failed.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// The group's Kafka client could not be created (librdkafka refused its configuration).
    #[error("creating the shard group's consumer: {0}")]
    Client(String),
    /// Subscribing to the group's topic failed.
    #[error("subscribing to {topic}: {message}")]
    Subscribe {
        /// The group's topic.
        topic: String,
        /// What the client said.
        message: String,
    },
    /// Joining panicked.
    #[error("joining the shard group panicked: {0}")]
    Panicked(String),
    /// The group has members: a claim made outside it was refused (see
    /// [`Coordinator::claim_idle`]).
    #[error("the shard group has members (replicas of the release are running): {0}")]
    Busy(String),
    /// The shards' epochs could not be read or committed.
    #[error("claiming the shards outside the group: {0}")]
    Claim(String),
    /// A thread of the group could not be started.
    #[error("starting the shard group's {thread} thread: {source}")]
    Thread {
        /// Which thread.
        thread: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

/// Where replicas meet to share the shards: Kafka's group coordinator ([`Kafka`]), or a test
/// double.
pub trait Coordinator: Send + Sync {
    /// Joins the group of `cfg`'s release as `identity`; what the group tells the relay comes in
    /// order on the receiver. `handover` bounds how long a revoke waits for the relay. Blocks.
    fn join(
        &self,
        cfg: &Config,
        identity: &str,
        handover: Duration,
    ) -> Result<(Box<dyn Membership>, mpsc::UnboundedReceiver<Event>), GroupError>;

    /// Claims every shard of `cfg`'s release from outside the group, for a tool that must run
    /// while no replica does: each shard's epoch is raised as a member's claim raises it, by
    /// a commit the coordinator accepts only while the group has no member (as it accepts an
    /// administrator's offset reset). The epochs so claimed; [`GroupError::Busy`] while a
    /// replica is in the group. Blocks.
    fn claim_idle(&self, cfg: &Config) -> Result<BTreeMap<u32, u64>, GroupError>;
}

/// One replica's membership in the group.
pub trait Membership: Send + Sync {
    /// Until when this replica may act as the owner of what it claimed.
    fn deadline(&self) -> Arc<Deadline>;

    /// Claims `shards` again, under new epochs, if the group still assigns them to this
    /// replica: after they were fenced while it may still own them.
    fn reclaim(&self, shards: &[u32]);

    /// Leaves the group: every owned shard is revoked (and handed over, while the relay still
    /// answers [`Event::Revoked`]) before this returns. Blocks.
    fn leave(self: Box<Self>);
}
