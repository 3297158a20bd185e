//! The outbox's side of the membership: the records its ledger asks for, produced before what
//! announces an object (joins) and after its DELETED (tombstones), and their reports.

use super::{gauge, Failure, Outbox, OutboxError, IN_REPORT};
use crate::event::Meta;
use crate::membership::ledger::{Admission, Settled};
use crate::membership::Change;
use crate::producer::{DeliveryError, Receipt, Refused, Sent};

impl Outbox {
    /// After entries were acknowledged: the checkpoint moved (`moved`), the gauges follow, and
    /// the objects whose DELETED is now in the acknowledged prefix leave the members.
    pub(super) fn note(&mut self, moved: bool) {
        self.moved |= moved;
        self.m.in_flight.set(gauge(self.tracker.in_flight()));
        self.ledger.left(self.tracker.take_left());
        self.send_leaves();
        self.m.members.set(gauge(self.ledger.members().len()));
    }

    /// Produces the membership tombstones of objects that left. One the producer cannot take
    /// now waits for the next call, one that fails is produced again, and the final drain
    /// waits for them; only a crash can lose one, which leaves a member too many (it costs a
    /// superfluous inferred DELETED, published before anything live on its key).
    pub(super) fn send_leaves(&mut self) {
        while let Some(t) = self.ledger.next_tombstone() {
            let receipt = Receipt::new(self.inbox.clone(), t.n, Sent::Unordered);
            match self.producer.send(&t.record, receipt) {
                Ok(()) => self.ledger.tombstone_taken(t),
                Err(Refused::Full(_)) => {
                    self.ledger.tombstone_refused(t);
                    return;
                }
                Err(e) => {
                    tracing::warn!(stream = %self.stream, uid = %t.uid, error = ?e, "membership tombstone not produced")
                }
            }
        }
    }

    /// The report of membership tombstone `n`: one that failed is produced again.
    pub(super) fn settle_leave(&mut self, n: u64, result: Result<(), DeliveryError>) {
        let delivered = result.is_ok();
        if let Some(uid) = self.ledger.settle_leave(n, delivered) {
            tracing::warn!(stream = %self.stream, %uid, error = ?result.err(), "membership tombstone not delivered; producing it again");
            self.send_leaves();
        }
    }

    /// Produces what `admission` asks before an entry. Returns whether the entry must wait
    /// for a pending join.
    async fn admit(&mut self, admission: Admission) -> Result<bool, OutboxError> {
        let join = match admission {
            // The members gauge follows in `note`, after the entry is pushed.
            Admission::Free => return Ok(false),
            Admission::Waits => return Ok(true),
            Admission::Join(join) => join,
        };
        let receipt = Receipt::new(self.inbox.clone(), join.n, Sent::Join);
        if self
            .offer(&join.record, receipt, None, false)
            .await?
            .is_some()
        {
            return Err(self.fail(Failure::MembershipTooLarge));
        }
        self.ledger.joined(join);
        Ok(true)
    }

    /// The report of membership join `n`: an acknowledged join makes its object a member and
    /// lets go what waited for it.
    pub(super) async fn settle_join(
        &mut self,
        n: u64,
        result: Result<(), DeliveryError>,
    ) -> Result<(), OutboxError> {
        match self.ledger.settle_join(n, result.is_ok()) {
            Settled::Unknown => Ok(()),
            Settled::Member => {
                self.m.members.set(gauge(self.ledger.members().len()));
                // It may have left already (its DELETED reported first): its tombstone goes.
                self.send_leaves();
                self.release().await
            }
            Settled::Failed => {
                let e = result.expect_err("a failed join has an error");
                self.m.error(IN_REPORT, e.class());
                Err(self.fail(Failure::Membership(e)))
            }
        }
    }

    /// What `change` means for the entry it comes with: the object that leaves once the entry
    /// is delivered, and whether the entry must wait for a join (produced here when needed).
    pub(super) async fn membership_change(
        &mut self,
        change: Option<Change>,
        meta: Option<&Meta>,
    ) -> Result<(Option<String>, bool), OutboxError> {
        let (leaves, admission) =
            self.ledger
                .change(change, meta, &self.route.topic, &self.route.key);
        Ok((leaves, self.admit(admission).await?))
    }
}
