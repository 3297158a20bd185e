//! A group of replicas in memory: shards dealt round-robin over the members, handed over as
//! Kafka's cooperative protocol does (revoked from their owner, answered, then assigned), with
//! epochs that grow with each claim. A member dropped without leaving crashed: its shards move
//! at once, never revoked. Its deadline is renewed every 100 ms until then. A member cut off
//! ([`MemoryGroup::cut`]) is renewed no more and loses its shards to the others once its session
//! would have expired; healed, it learns they were lost, and the group deals again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::config::Config;
use crate::group::{Coordinator, Deadline, Event, GroupError, Membership};

/// The in-memory group. Clone it into every replica's relay.
#[derive(Clone, Default)]
pub struct MemoryGroup {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    /// A fatal error every member's client reports, once set.
    fatal: Mutex<Option<String>>,
    /// One rebalance at a time.
    rebalancing: Mutex<()>,
}

#[derive(Default)]
struct State {
    shards: u32,
    next_id: u64,
    /// Members in the group, by id (join order).
    members: BTreeMap<u64, Member>,
    /// Each shard's last epoch.
    epochs: BTreeMap<u32, u64>,
}

#[derive(Clone)]
struct Member {
    id: u64,
    events: mpsc::UnboundedSender<Event>,
    owned: BTreeSet<u32>,
    handover: Duration,
    deadline: Arc<Deadline>,
    /// Whether its ownership is renewed (and its claims reach the group): not while cut off.
    renewing: Arc<AtomicBool>,
    /// Cut off: out of the deal; the shards it owned when its session expired.
    cut: Option<Vec<u32>>,
    /// Shards it claimed again while stalled, claimed once it is answered again.
    unclaimed: Arc<Mutex<Vec<u32>>>,
}

impl MemoryGroup {
    /// Cuts the `k`-th member (in join order, counted modulo the members in the group) off the
    /// group, as a network partition from the coordinator or a freeze does: its ownership is
    /// renewed no more, and once its deadline has passed and `session` more went by (the margin
    /// by which the session outlasts the deadline), its shards go to the others, never revoked
    /// from it. Blocks until then. False when no member is left to cut.
    pub fn cut(&self, k: usize, session: Duration) -> bool {
        let Some(member) = self.nth(k) else {
            return false;
        };
        self.cut_off(&[member], session);
        true
    }

    /// The `k`-th member not cut off, in join order, counted modulo their number.
    fn nth(&self, k: usize) -> Option<Member> {
        let st = self.inner.state.lock().expect("group lock poisoned");
        let members: Vec<&Member> = st.members.values().filter(|m| m.cut.is_none()).collect();
        (!members.is_empty()).then(|| members[k % members.len()].clone())
    }

    /// Answers none of the `k`-th member's renewals for `stall` (counted as in
    /// [`MemoryGroup::cut`]), then renews it again, as a broker that stalls that long answers
    /// them late, while the group moves nothing. Blocks for `stall`.
    pub fn stall(&self, k: usize, stall: Duration) {
        let Some(member) = self.nth(k) else {
            return;
        };
        member.renewing.store(false, Ordering::Relaxed);
        std::thread::sleep(stall);
        member.renewing.store(true, Ordering::Relaxed);
        let unclaimed =
            std::mem::take(&mut *member.unclaimed.lock().expect("unclaimed lock poisoned"));
        self.claim_again(member.id, &unclaimed);
    }

    /// Claims `shards` again for member `id`, as its group client does after a fence: a
    /// claim is a commit the group checks, so none reaches it from a member cut off or
    /// stalled; a stalled member's claims are sent once it is answered again.
    fn claim_again(&self, id: u64, shards: &[u32]) {
        let mut st = self.inner.state.lock().expect("group lock poisoned");
        let Some(m) = st.members.get(&id).cloned() else {
            return;
        };
        if !m.renewing.load(Ordering::Relaxed) {
            if m.cut.is_none() {
                m.unclaimed
                    .lock()
                    .expect("unclaimed lock poisoned")
                    .extend(shards);
            }
            return;
        }
        let claims: Vec<(u32, u64)> = shards
            .iter()
            .filter(|s| m.owned.contains(s))
            .map(|s| {
                let e = st.epochs.entry(*s).or_insert(0);
                *e += 1;
                (*s, *e)
            })
            .collect();
        if !claims.is_empty() {
            // A claim is a commit the group accepted: it proves ownership, as in Kafka.
            m.deadline.renew(tokio::time::Instant::now());
            let _ = m.events.send(Event::Claimed(claims));
        }
    }

    /// Cuts every member off at once, as the coordinator's broker going away past the
    /// sessions does: each holds its shards, then fences them, and they wait, owned by none, until
    /// [`MemoryGroup::heal`]. Blocks until every deadline and `session` more passed.
    pub fn cut_all(&self, session: Duration) {
        let members: Vec<Member> = {
            let st = self.inner.state.lock().expect("group lock poisoned");
            st.members
                .values()
                .filter(|m| m.cut.is_none())
                .cloned()
                .collect()
        };
        self.cut_off(&members, session);
    }

    fn cut_off(&self, members: &[Member], session: Duration) {
        for member in members {
            member.renewing.store(false, Ordering::Relaxed);
        }
        while !members.iter().all(|m| m.deadline.passed()) {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(session);
        {
            let mut st = self.inner.state.lock().expect("group lock poisoned");
            for member in members {
                if let Some(m) = st.members.get_mut(&member.id) {
                    m.cut = Some(std::mem::take(&mut m.owned).into_iter().collect());
                }
            }
        }
        self.rebalance();
    }

    /// Fails every member's client fatally, as a Kafka consumer fenced as a static member.
    pub fn fail_fatally(&self, reason: &str) {
        *self.inner.fatal.lock().expect("fatal lock poisoned") = Some(reason.to_string());
        let st = self.inner.state.lock().expect("group lock poisoned");
        for m in st.members.values() {
            let _ = m.events.send(Event::Fatal(reason.to_string()));
        }
    }

    /// Forgets every shard's epoch, as a group whose committed offsets are gone (offsets
    /// retention past an empty group, the group deleted, a new Kafka cluster): the next claims
    /// start again at 1.
    pub fn forget_epochs(&self) {
        self.inner
            .state
            .lock()
            .expect("group lock poisoned")
            .epochs
            .clear();
    }

    /// Lets every member cut off back: it learns that the shards it owned were lost (waiting
    /// for its answer, as a rebalance does), and the group deals again.
    pub fn heal(&self) {
        let healed: Vec<(Member, Vec<u32>)> = {
            let mut st = self.inner.state.lock().expect("group lock poisoned");
            st.members
                .values_mut()
                .filter_map(|m| {
                    let lost = m.cut.take()?;
                    Some((m.clone(), lost))
                })
                .collect()
        };
        // Renewed only once it learnt of the loss, as a Kafka member whose session expired
        // cannot commit again before it rejoins: a renewal first would end its hold over
        // shards the others own now.
        for (member, shards) in healed {
            member.revoke(shards, true);
            member.renewing.store(true, Ordering::Relaxed);
        }
        self.rebalance();
    }

    /// Deals the shards round-robin over the members: revokes what moves (waiting for each
    /// handover), then assigns it under new epochs.
    fn rebalance(&self) {
        let _one = self
            .inner
            .rebalancing
            .lock()
            .expect("rebalance lock poisoned");
        let (revokes, shards) = {
            let st = self.inner.state.lock().expect("group lock poisoned");
            let target = st.target();
            let revokes: Vec<(Member, Vec<u32>)> = st
                .members
                .values()
                .map(|m| {
                    let keep = target.get(&m.id).cloned().unwrap_or_default();
                    (m.clone(), m.owned.difference(&keep).copied().collect())
                })
                .filter(|(_, r): &(Member, Vec<u32>)| !r.is_empty())
                .collect();
            (revokes, st.shards)
        };
        for (member, shards) in revokes {
            member.revoke(shards.clone(), false);
            let mut st = self.inner.state.lock().expect("group lock poisoned");
            if let Some(m) = st.members.get_mut(&member.id) {
                for s in &shards {
                    m.owned.remove(s);
                }
            }
        }
        let mut st = self.inner.state.lock().expect("group lock poisoned");
        let target = st.target();
        let owned: BTreeSet<u32> = st.members.values().flat_map(|m| m.owned.clone()).collect();
        for (id, want) in target {
            let fresh: Vec<u32> = want
                .iter()
                .filter(|s| !owned.contains(s) && **s < shards)
                .copied()
                .collect();
            if fresh.is_empty() {
                continue;
            }
            let claims: Vec<(u32, u64)> = fresh
                .iter()
                .map(|s| {
                    let e = st.epochs.entry(*s).or_insert(0);
                    *e += 1;
                    (*s, *e)
                })
                .collect();
            let m = st.members.get_mut(&id).expect("a member");
            m.owned.extend(fresh);
            // A claim is a commit the group accepted: it proves ownership, as in Kafka.
            if m.renewing.load(Ordering::Relaxed) {
                m.deadline.renew(tokio::time::Instant::now());
            }
            let _ = m.events.send(Event::Claimed(claims));
        }
    }
}

impl Member {
    /// Tells the member `shards` are revoked (`lost`: taken from it already) and waits for its
    /// answer, as a rebalance does, at most its handover bound.
    fn revoke(&self, shards: Vec<u32>, lost: bool) {
        if shards.is_empty() {
            return;
        }
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        if self
            .events
            .send(Event::Revoked { shards, lost, done })
            .is_ok()
        {
            let _ = wait.recv_timeout(self.handover);
        }
    }
}

impl State {
    /// Which shards each member should own: round-robin in join order.
    fn target(&self) -> BTreeMap<u64, BTreeSet<u32>> {
        let ids: Vec<u64> = self
            .members
            .values()
            .filter(|m| m.cut.is_none())
            .map(|m| m.id)
            .collect();
        let mut target: BTreeMap<u64, BTreeSet<u32>> = BTreeMap::new();
        if ids.is_empty() {
            return target;
        }
        for s in 0..self.shards {
            target
                .entry(ids[s as usize % ids.len()])
                .or_default()
                .insert(s);
        }
        target
    }
}

/// One member's side.
struct Joined {
    group: MemoryGroup,
    id: u64,
    deadline: Arc<Deadline>,
    stop: Arc<AtomicBool>,
}

impl Coordinator for MemoryGroup {
    fn join(
        &self,
        cfg: &Config,
        _identity: &str,
        handover: Duration,
    ) -> Result<(Box<dyn Membership>, mpsc::UnboundedReceiver<Event>), GroupError> {
        let (events, rx) = mpsc::unbounded_channel();
        if let Some(reason) = self
            .inner
            .fatal
            .lock()
            .expect("fatal lock poisoned")
            .clone()
        {
            let _ = events.send(Event::Fatal(reason));
        }
        let deadline = Arc::new(
            Deadline::new(Duration::from_millis(u64::from(
                cfg.sharding.ownership_deadline_ms,
            )))
            .holding(cfg.sharding.hold_grace()),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let renewing = Arc::new(AtomicBool::new(true));
        {
            // Proves ownership every 100 ms while in the group, and not cut off: on the
            // runtime's clock where it joined from one (paused in a test, it advances with it).
            let (deadline, stop, renewing) = (deadline.clone(), stop.clone(), renewing.clone());
            let renew = move || {
                if renewing.load(Ordering::Relaxed) {
                    deadline.renew(tokio::time::Instant::now());
                }
                !stop.load(Ordering::Relaxed)
            };
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(async move {
                        while renew() {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    });
                }
                Err(_) => {
                    std::thread::spawn(move || {
                        while renew() {
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    });
                }
            }
        }
        let id = {
            let mut st = self.inner.state.lock().expect("group lock poisoned");
            st.shards = cfg.sharding.shards;
            st.next_id += 1;
            let id = st.next_id;
            st.members.insert(
                id,
                Member {
                    id,
                    events,
                    owned: BTreeSet::new(),
                    handover,
                    deadline: deadline.clone(),
                    renewing,
                    cut: None,
                    unclaimed: Arc::default(),
                },
            );
            id
        };
        self.rebalance();
        let joined = Joined {
            group: self.clone(),
            id,
            deadline,
            stop,
        };
        Ok((Box::new(joined), rx))
    }

    /// Refused while any member is in the group, as Kafka's coordinator refuses a commit from
    /// outside it; otherwise every shard's epoch is raised.
    fn claim_idle(&self, cfg: &Config) -> Result<BTreeMap<u32, u64>, GroupError> {
        let mut st = self.inner.state.lock().expect("group lock poisoned");
        if !st.members.is_empty() {
            return Err(GroupError::Busy(format!("{} members", st.members.len())));
        }
        Ok((0..cfg.sharding.shards)
            .map(|s| {
                let e = st.epochs.entry(s).or_insert(0);
                *e += 1;
                (s, *e)
            })
            .collect())
    }
}

impl Membership for Joined {
    fn deadline(&self) -> Arc<Deadline> {
        self.deadline.clone()
    }

    fn reclaim(&self, shards: &[u32]) {
        self.group.claim_again(self.id, shards);
    }

    fn leave(self: Box<Self>) {
        // Hands everything over first: the member stays until its shards are revoked.
        let member = {
            let st = self.group.inner.state.lock().expect("group lock poisoned");
            st.members.get(&self.id).cloned()
        };
        if let Some(member) = member {
            member.revoke(member.owned.iter().copied().collect(), false);
        }
        self.crash();
    }
}

impl Joined {
    /// Out of the group without a handover; the others take its shards.
    fn crash(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let gone = {
            let mut st = self.group.inner.state.lock().expect("group lock poisoned");
            st.members.remove(&self.id).is_some()
        };
        if gone {
            self.group.rebalance();
        }
    }
}

impl Drop for Joined {
    /// A member dropped without leaving crashed: its shards move at once.
    fn drop(&mut self) {
        self.crash();
    }
}
