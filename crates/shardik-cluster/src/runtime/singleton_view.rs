//! What a singleton manager knows of the members beyond the current state: which confirmed
//! the hand-over, which still block a start though gone (removed without confirming, or
//! `Down` within the margin), and the last view of each, to know a removed member's age.
//! Plain data driven by events, states and the time, so its rules are unit-tested.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use super::cluster::ClusterState;
use crate::events::ClusterEvent;
use crate::member::{Member, MemberStatus, UniqueAddress};

/// See the module docs.
pub(super) struct SingletonView {
    removal_timeout: Duration,
    down_margin: Duration,
    /// Members that said they run no instance (until they announce one again).
    handed_over: BTreeSet<UniqueAddress>,
    /// Members removed without being `Down` or confirming, with the time they stop blocking.
    ghosts: BTreeMap<UniqueAddress, (Member, Instant)>,
    /// Members whose `down_margin` has started (once per member).
    margin_started: BTreeSet<UniqueAddress>,
    /// The last known view of each member, to remember the age of removed ones.
    known: BTreeMap<UniqueAddress, Member>,
    /// Members whose removal was handled (from a state or from its event), until
    /// `removal_timeout` after: the other of the two then changes nothing.
    removed: BTreeMap<UniqueAddress, Instant>,
    /// Members some state held. Only their absence from a later state is a removal: a state
    /// can also lag the events (they are published first), and a member known from its
    /// `MemberUp` alone is not gone from a state that does not hold it yet.
    in_state: BTreeSet<UniqueAddress>,
}

impl SingletonView {
    pub(super) fn new(
        removal_timeout: Duration,
        down_margin: Duration,
        members: &[Member],
    ) -> SingletonView {
        SingletonView {
            removal_timeout,
            down_margin,
            handed_over: BTreeSet::new(),
            ghosts: BTreeMap::new(),
            margin_started: BTreeSet::new(),
            known: members
                .iter()
                .map(|m| (m.node.clone(), m.clone()))
                .collect(),
            removed: BTreeMap::new(),
            in_state: members.iter().map(|m| m.node.clone()).collect(),
        }
    }

    /// The members that confirmed the hand-over.
    pub(super) fn handed_over(&self) -> &BTreeSet<UniqueAddress> {
        &self.handed_over
    }

    /// A membership event, handled at `now`.
    pub(super) fn on_event(&mut self, e: &ClusterEvent, now: Instant) {
        match e {
            ClusterEvent::MemberRemoved { node, previous } => {
                self.removed(node.clone(), *previous, now)
            }
            ClusterEvent::MemberJoined(m)
            | ClusterEvent::MemberWeaklyUp(m)
            | ClusterEvent::MemberUp(m)
            | ClusterEvent::MemberLeft(m)
            | ClusterEvent::MemberExited(m)
            | ClusterEvent::MemberDowned(m) => {
                if m.status == MemberStatus::Down {
                    self.start_margin(m, now);
                }
                self.known.insert(m.node.clone(), m.clone());
            }
            _ => {}
        }
    }

    /// `node` announced that it runs an instance.
    pub(super) fn on_hosting(&mut self, node: &UniqueAddress) {
        self.handed_over.remove(node);
    }

    /// `node` confirmed that it runs no instance.
    pub(super) fn on_handed_over(&mut self, node: UniqueAddress) {
        self.ghosts.remove(&node);
        self.handed_over.insert(node);
    }

    /// The members to decide on with `state` at `now`: those of the state, each still
    /// blocking one standing in as `Exiting` (it blocks like a member that is leaving), and
    /// the removed ones that still block. `on_removed` gets every member found removed here
    /// before its event.
    pub(super) fn members(
        &mut self,
        state: &ClusterState,
        now: Instant,
        mut on_removed: impl FnMut(&UniqueAddress),
    ) -> Vec<Member> {
        // The state may already show a `Down` whose event is still queued: its margin starts
        // now, before a decision could start an instance without it.
        for m in &state.members {
            if m.status == MemberStatus::Down {
                self.start_margin(m, now);
            }
        }
        // Members known here that the state no longer holds were removed, whether or not
        // their `MemberRemoved` was handled yet (a state can be ahead of the events: a
        // removal in a batch after other events, or events lost to a lagging receiver).
        let gone: Vec<(UniqueAddress, MemberStatus)> = self
            .known
            .values()
            .filter(|m| self.in_state.contains(&m.node) && state.member(&m.node).is_none())
            .map(|m| (m.node.clone(), m.status))
            .collect();
        for (node, previous) in gone {
            on_removed(&node);
            self.removed(node, previous, now);
        }
        self.ghosts.retain(|_, (_, until)| *until > now);
        self.removed.retain(|_, until| *until > now);
        for m in &state.members {
            self.known.insert(m.node.clone(), m.clone());
            self.in_state.insert(m.node.clone());
        }
        // What is kept per member goes with it (a late event of a removed member errs on the
        // side of waiting: a margin started again).
        let (ghosts, removed) = (&self.ghosts, &self.removed);
        let current = |n: &UniqueAddress| {
            state.member(n).is_some() || ghosts.contains_key(n) || removed.contains_key(n)
        };
        self.handed_over.retain(|n| current(n));
        self.margin_started.retain(|n| current(n));
        let mut members: Vec<Member> = state
            .members
            .iter()
            .map(|m| match self.ghosts.get(&m.node) {
                Some((ghost, _)) if m.node != state.self_node => ghost.clone(),
                _ => m.clone(),
            })
            .collect();
        members.extend(
            self.ghosts
                .values()
                .filter(|(m, _)| state.member(&m.node).is_none())
                .map(|(m, _)| m.clone()),
        );
        members
    }

    /// `node` was removed, its last status `previous`: seen in its event, or in a state that
    /// no longer holds it while the event is still queued (whichever comes first). Removed
    /// without being `Down` and without confirming, it may still be stopping an instance: it
    /// blocks a while (unknown age counts as oldest).
    fn removed(&mut self, node: UniqueAddress, previous: MemberStatus, now: Instant) {
        let m = self.known.remove(&node);
        self.in_state.remove(&node);
        if self
            .removed
            .insert(node.clone(), now + self.removal_timeout)
            .is_some_and(|until| until > now)
        {
            return; // handled already
        }
        if previous == MemberStatus::Down
            || self.handed_over.contains(&node)
            || self.ghosts.contains_key(&node)
        {
            return;
        }
        let m = m.unwrap_or_else(|| Member {
            node: node.clone(),
            status: MemberStatus::Exiting,
            roles: BTreeSet::new(),
            up_number: Some(0),
        });
        let m = Member {
            status: MemberStatus::Exiting,
            ..m
        };
        self.ghosts.insert(node, (m, now + self.removal_timeout));
    }

    /// `m` is `Down`: unless it confirmed that it runs no instance, it blocks the start of a
    /// new one for `down_margin` from now (it may still run one on the losing side of a
    /// partition until it is fenced). Started once per member, from the event or from a
    /// state that shows the `Down` before its event was handled, whichever comes first.
    fn start_margin(&mut self, m: &Member, now: Instant) {
        if self.handed_over.contains(&m.node)
            || self.down_margin.is_zero()
            || !self.margin_started.insert(m.node.clone())
        {
            return;
        }
        let ghost = Member {
            status: MemberStatus::Exiting,
            ..m.clone()
        };
        self.ghosts
            .entry(m.node.clone())
            .or_insert((ghost, now + self.down_margin));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{decide, SingletonDecision};

    const REMOVAL: Duration = Duration::from_secs(10);
    const MARGIN: Duration = Duration::from_millis(500);

    fn member(n: u64, status: MemberStatus, up: u64) -> Member {
        Member {
            node: UniqueAddress::new(format!("10.0.0.{n}:7000"), format!("n{n}"), 1),
            status,
            roles: BTreeSet::new(),
            up_number: Some(up),
        }
    }

    fn state(me: &Member, members: &[Member]) -> ClusterState {
        let mut s = ClusterState::empty(me.node.clone());
        s.members = members.to_vec();
        s
    }

    /// The host leaves (`Exiting`) and is removed in a batch of events after another one
    /// (a replacement joining), and the manager decides on the state after the removal
    /// before it handled `MemberRemoved`: the removed host, which never confirmed the
    /// hand-over, still blocks for `removal_timeout`. Before, nothing stood in for it until
    /// its event was handled, and the next oldest started a second instance while the
    /// first was still stopping.
    #[test]
    fn a_host_removed_before_its_event_is_handled_still_blocks() {
        let now = Instant::now();
        let host = member(1, MemberStatus::Exiting, 1);
        let next = member(2, MemberStatus::Up, 2);
        let newcomer = member(3, MemberStatus::Up, 3);
        let mut view = SingletonView::new(REMOVAL, MARGIN, &[host.clone(), next.clone()]);
        let before = view.members(&state(&next, &[host.clone(), next.clone()]), now, |_| {});
        assert_eq!(
            decide(&before, &next.node, None, view.handed_over()),
            SingletonDecision::WaitFor(vec![host.node.clone()])
        );
        // [MemberUp(newcomer), MemberRemoved(host)]: the first handled, the state already
        // after both.
        view.on_event(&ClusterEvent::MemberUp(newcomer.clone()), now);
        let after = state(&next, &[next.clone(), newcomer.clone()]);
        let mut cleared = Vec::new();
        let members = view.members(&after, now, |n| cleared.push(n.clone()));
        assert_eq!(cleared, std::slice::from_ref(&host.node));
        assert_eq!(
            decide(&members, &next.node, None, view.handed_over()),
            SingletonDecision::WaitFor(vec![host.node.clone()]),
            "{members:?}"
        );
        // Its event, handled next, changes nothing; the ghost goes after the timeout.
        view.on_event(
            &ClusterEvent::MemberRemoved {
                node: host.node.clone(),
                previous: MemberStatus::Exiting,
            },
            now + Duration::from_millis(1),
        );
        let members = view.members(&after, now + REMOVAL - Duration::from_millis(1), |_| {});
        assert!(matches!(
            decide(&members, &next.node, None, view.handed_over()),
            SingletonDecision::WaitFor(_)
        ));
        let members = view.members(&after, now + REMOVAL + Duration::from_millis(2), |_| {});
        assert_eq!(
            decide(&members, &next.node, None, view.handed_over()),
            SingletonDecision::Host
        );
    }

    /// A state can lag the events (they are published first): a member known from its
    /// `MemberUp` alone is not taken for removed from a state that does not hold it yet,
    /// which gave it a removal record, so that its real removal within `removal_timeout`
    /// made no ghost of its own and stopped blocking early.
    #[test]
    fn a_member_known_from_an_event_is_not_removed_by_an_older_state() {
        let now = Instant::now();
        let me = member(2, MemberStatus::Up, 2);
        let host = member(1, MemberStatus::Up, 1);
        let mut view = SingletonView::new(REMOVAL, MARGIN, std::slice::from_ref(&me));
        view.on_event(&ClusterEvent::MemberUp(host.clone()), now);
        let older = state(&me, std::slice::from_ref(&me));
        let mut cleared = Vec::new();
        view.members(&older, now, |n| cleared.push(n.clone()));
        assert!(cleared.is_empty(), "taken for removed: {cleared:?}");
        // The host leaves 4 s later and is removed without confirming: it blocks for the
        // whole `removal_timeout` from its removal.
        let t = now + Duration::from_secs(4);
        let exiting = Member {
            status: MemberStatus::Exiting,
            ..host.clone()
        };
        view.members(&state(&me, &[exiting, me.clone()]), t, |_| {});
        let after = state(&me, std::slice::from_ref(&me));
        let members = view.members(&after, t, |_| {});
        assert_eq!(
            decide(&members, &me.node, None, view.handed_over()),
            SingletonDecision::WaitFor(vec![host.node.clone()])
        );
        let members = view.members(&after, t + REMOVAL - Duration::from_millis(1), |_| {});
        assert!(matches!(
            decide(&members, &me.node, None, view.handed_over()),
            SingletonDecision::WaitFor(_)
        ));
    }

    /// A host that confirmed the hand-over and is then removed blocks nothing, whether the
    /// removal is seen in a state first or in its event, and its confirmation is forgotten
    /// once its removal is over.
    #[test]
    fn a_host_that_handed_over_is_not_waited_for_after_its_removal() {
        let now = Instant::now();
        let host = member(1, MemberStatus::Exiting, 1);
        let next = member(2, MemberStatus::Up, 2);
        let mut view = SingletonView::new(REMOVAL, MARGIN, &[host.clone(), next.clone()]);
        view.on_handed_over(host.node.clone());
        let after = state(&next, std::slice::from_ref(&next));
        let members = view.members(&after, now, |_| {});
        assert_eq!(
            decide(&members, &next.node, None, view.handed_over()),
            SingletonDecision::Host
        );
        view.on_event(
            &ClusterEvent::MemberRemoved {
                node: host.node.clone(),
                previous: MemberStatus::Exiting,
            },
            now,
        );
        let members = view.members(&after, now, |_| {});
        assert_eq!(
            decide(&members, &next.node, None, view.handed_over()),
            SingletonDecision::Host
        );
        view.members(&after, now + REMOVAL + Duration::from_millis(1), |_| {});
        assert!(view.handed_over().is_empty(), "kept past the removal");
    }

    /// A `Down` host blocks for the margin from the first time it is seen `Down`, in a state
    /// or an event, also when it is removed before the margin is over.
    #[test]
    fn a_down_host_blocks_for_the_margin_also_once_removed() {
        let now = Instant::now();
        let host = member(1, MemberStatus::Up, 1);
        let next = member(2, MemberStatus::Up, 2);
        let mut view = SingletonView::new(REMOVAL, MARGIN, &[host.clone(), next.clone()]);
        let down = Member {
            status: MemberStatus::Down,
            ..host.clone()
        };
        view.members(&state(&next, &[down, next.clone()]), now, |_| {});
        let after = state(&next, std::slice::from_ref(&next));
        let members = view.members(&after, now + MARGIN / 2, |_| {});
        assert_eq!(
            decide(&members, &next.node, None, view.handed_over()),
            SingletonDecision::WaitFor(vec![host.node.clone()])
        );
        let members = view.members(&after, now + MARGIN + Duration::from_millis(1), |_| {});
        assert_eq!(
            decide(&members, &next.node, None, view.handed_over()),
            SingletonDecision::Host
        );
    }
}
