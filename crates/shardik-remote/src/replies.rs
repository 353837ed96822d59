//! Reply slots: local askers waiting for answers from other nodes, and the
//! [`WireContext`](shardik_actor::wire::WireContext) that exports and imports them.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use shardik_actor::wire::{PayloadFormat, ReplyDeliver, ReplySink, WireContext, WireReplyAddr};
use tokio::sync::oneshot;

use crate::frame::{Frame, ReplyFailure};
use crate::node::Node;

struct Pending {
    deliver: ReplyDeliver,
    peer: Arc<str>,
    created: Instant,
    /// Kept until then by the sweep instead of `max_reply_wait` after `created`: the slot
    /// belongs to an ask, which forgets it at its own timeout (this is the backstop if the
    /// ask's future is dropped before).
    keep_until: Option<Instant>,
    on_fail: Option<oneshot::Sender<(ReplyFailure, String)>>,
}

/// The peer an answer (a reply or a reply failure) came from.
pub(crate) struct AnswerFrom<'a> {
    /// The key of the peer whose connection carried it (its address).
    pub(crate) key: &'a str,
    /// Whether a slot's peer, known under another key, is that same node (dialed under an
    /// address other than the one it advertises, say).
    pub(crate) same_node: &'a dyn Fn(&str) -> bool,
}

/// What became of an answer to a reply slot.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answered {
    /// The slot took it.
    Delivered,
    /// No such slot (late after the ask's timeout, or made up).
    Unknown,
    /// The slot waits on an answer from another node: ignored, the slot stays.
    NotFromItsPeer,
}

/// Reply slots of this node, numbered from a random start so that a stale reply meant for a
/// previous incarnation is very unlikely to match a slot of this one.
pub(crate) struct Replies {
    next: AtomicU64,
    pending: Mutex<HashMap<u64, Pending>>,
}

thread_local! {
    /// Slots exported by the encode running on this thread (see [`capture`]).
    static CAPTURED: RefCell<Option<Vec<u64>>> = const { RefCell::new(None) };
    /// Reply guards dropped during the dispatch running on this thread (see [`dispatching`]).
    static DROPPED: RefCell<Option<Vec<ReplyGuard>>> = const { RefCell::new(None) };
}

/// Runs an encode and returns the reply slots it exported along with its result.
pub(crate) fn capture<T>(f: impl FnOnce() -> T) -> (T, Vec<u64>) {
    /// Restores the outer capture even if `f` panics.
    struct Restore(Option<Option<Vec<u64>>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(prev) = self.0.take() {
                let _ = CAPTURED.try_with(|c| *c.borrow_mut() = prev);
            }
        }
    }
    let prev = CAPTURED.with(|c| c.borrow_mut().replace(Vec::new()));
    let mut restore = Restore(Some(prev));
    let out = f();
    let prev = restore.0.take().expect("set above");
    let ids = CAPTURED.with(|c| std::mem::replace(&mut *c.borrow_mut(), prev));
    (out, ids.unwrap_or_default())
}

/// Runs a dispatch (decode and tell). Reply handles dropped unanswered while it runs (because
/// the payload failed to decode halfway, or the recipient refused the message) are not
/// reported one by one: if the dispatch fails, the caller reports the precise failure for all
/// of the message's slots; if it succeeds, they are reported as unanswered.
pub(crate) fn dispatching<E>(f: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
    /// Restores the outer state even if `f` panics (the deferred guards are then dropped
    /// disarmed: the asker times out).
    struct Restore(Option<Option<Vec<ReplyGuard>>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(prev) = self.0.take() {
                if let Ok(Some(mut deferred)) =
                    DROPPED.try_with(|c| std::mem::replace(&mut *c.borrow_mut(), prev))
                {
                    deferred.iter_mut().for_each(ReplyGuard::disarm);
                }
            }
        }
    }
    let prev = DROPPED.with(|c| c.borrow_mut().replace(Vec::new()));
    let mut restore = Restore(Some(prev));
    let out = f();
    let prev = restore.0.take().expect("set above");
    let dropped = DROPPED.with(|c| std::mem::replace(&mut *c.borrow_mut(), prev));
    let dropped = dropped.unwrap_or_default();
    if out.is_ok() {
        for mut g in dropped {
            g.send_no_reply();
        }
    } else {
        for mut g in dropped {
            g.disarm();
        }
    }
    out
}

/// An instant no ask timeout reaches (for timeouts such as `Duration::MAX`).
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

impl Replies {
    pub(crate) fn new() -> Self {
        let start = getrandom::u64().unwrap_or(1) >> 2;
        Replies {
            next: AtomicU64::new(start.max(1)),
            pending: Mutex::new(HashMap::new()),
        }
    }

    fn export(&self, deliver: ReplyDeliver, peer: Arc<str>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.pending.lock().insert(
            id,
            Pending {
                deliver,
                peer,
                created: Instant::now(),
                keep_until: None,
                on_fail: None,
            },
        );
        CAPTURED.with(|c| {
            if let Some(v) = c.borrow_mut().as_mut() {
                v.push(id);
            }
        });
        id
    }

    /// Hands the slots `ids` (just exported) to an ask that waits up to `timeout`: the sweep
    /// keeps them that long (plus a second) even past `max_reply_wait`, and the first one's
    /// failure is told to `tx`.
    pub(crate) fn owned_by_ask(
        &self,
        ids: &[u64],
        timeout: Duration,
        tx: oneshot::Sender<(ReplyFailure, String)>,
    ) {
        let until = Instant::now()
            .checked_add(timeout.saturating_add(Duration::from_secs(1)))
            .unwrap_or_else(far_future);
        let mut map = self.pending.lock();
        for id in ids {
            if let Some(p) = map.get_mut(id) {
                p.keep_until = Some(until);
            }
        }
        if let Some(p) = ids.first().and_then(|id| map.get_mut(id)) {
            p.on_fail = Some(tx);
        }
    }

    /// Completes slot `id` with an encoded answer that came from `from` (see [`AnswerFrom`]).
    /// A slot that waits on another node's answer is left alone: any peer could otherwise
    /// answer asks sent to other nodes, guessing their slots (they are numbered in sequence).
    pub(crate) fn complete(
        &self,
        id: u64,
        payload: &[u8],
        from: &AnswerFrom<'_>,
    ) -> Result<Answered, String> {
        let p = {
            let mut map = self.pending.lock();
            match map.get(&id) {
                None => return Ok(Answered::Unknown),
                Some(p) if *p.peer == *from.key => map.remove(&id),
                Some(p) => {
                    // Another peer key: the same node under another address, or not. Told
                    // apart outside the lock (it takes the peers' locks).
                    let peer = p.peer.clone();
                    drop(map);
                    if !(from.same_node)(&peer) {
                        return Ok(Answered::NotFromItsPeer);
                    }
                    self.pending.lock().remove(&id)
                }
            }
        };
        let Some(p) = p else {
            return Ok(Answered::Unknown);
        };
        // The reply type's `Deserialize` runs here, on the connection's reader task: a panic
        // in it fails this reply (the asker's channel closes), not the connection.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (p.deliver)(payload)))
            .unwrap_or_else(|panic| {
                Err(format!(
                    "decoding the reply panicked: {}",
                    crate::error::panic_message(&*panic)
                ))
            })
            .map(|()| Answered::Delivered)
    }

    /// Fails the given slots; an ask waiting on one of them learns why. For failures this
    /// node decides itself (the peer stayed unreachable, restarted); those a peer sends go
    /// through [`fail_from`](Self::fail_from).
    pub(crate) fn fail(&self, ids: &[u64], failure: ReplyFailure, reason: &str) {
        let removed: Vec<Pending> = {
            let mut map = self.pending.lock();
            ids.iter().filter_map(|id| map.remove(id)).collect()
        };
        Self::tell_failed(removed, failure, reason);
    }

    /// Fails the slots among `ids` that wait on an answer from `from`, which sent the
    /// failure; the others are left alone (see [`complete`](Self::complete)). Returns how
    /// many of `ids` were slots waiting on another node.
    pub(crate) fn fail_from(
        &self,
        ids: &[u64],
        from: &AnswerFrom<'_>,
        failure: ReplyFailure,
        reason: &str,
    ) -> usize {
        let mut removed = Vec::new();
        // Slots of another peer key, told apart outside the lock.
        let mut elsewhere: Vec<(u64, Arc<str>)> = Vec::new();
        {
            let mut map = self.pending.lock();
            for id in ids {
                match map.get(id) {
                    None => {}
                    Some(p) if *p.peer == *from.key => removed.extend(map.remove(id)),
                    Some(p) => elsewhere.push((*id, p.peer.clone())),
                }
            }
        }
        let mut foreign = 0;
        if !elsewhere.is_empty() {
            let mut same: HashMap<Arc<str>, bool> = HashMap::new();
            elsewhere.retain(|(_, peer)| {
                let ok = *same
                    .entry(peer.clone())
                    .or_insert_with(|| (from.same_node)(peer));
                foreign += usize::from(!ok);
                ok
            });
            let mut map = self.pending.lock();
            removed.extend(elsewhere.iter().filter_map(|(id, _)| map.remove(id)));
        }
        Self::tell_failed(removed, failure, reason);
        foreign
    }

    /// Tells the asks among `removed` (slots already taken out, dropped here, outside the
    /// lock) why they failed.
    fn tell_failed(removed: Vec<Pending>, failure: ReplyFailure, reason: &str) {
        for p in removed {
            if let Some(tx) = p.on_fail {
                let _ = tx.send((failure, reason.to_string()));
            }
            // Dropping `deliver` closes the asker's channel.
        }
    }

    /// The peers some slot waits on an answer from.
    pub(crate) fn peers_waited_on(&self) -> std::collections::HashSet<Arc<str>> {
        self.pending
            .lock()
            .values()
            .map(|p| p.peer.clone())
            .collect()
    }

    /// Forgets slots without an answer (an ask timed out, or the message carrying them was
    /// not sent).
    ///
    /// Like every removal here, the slots are dropped after the lock is released: a relay
    /// slot's `deliver` holds the reply handle it relays to, and dropping that unanswered
    /// tells its node `ReplyFailed`. When that node is this one (a handle that came back
    /// through the node's own address), the frame is handled in place, by [`Replies::fail`],
    /// which takes the lock again.
    pub(crate) fn forget(&self, ids: &[u64]) {
        let removed: Vec<Pending> = {
            let mut map = self.pending.lock();
            ids.iter().filter_map(|id| map.remove(id)).collect()
        };
        drop(removed);
    }

    /// Fails every slot waiting on `peer` that was exported before `cutoff` and is not in
    /// `queued` (the peer restarted: those requests went to its old incarnation and will
    /// never be answered). Later slots, and those of requests still waiting in the outbound
    /// queues (`queued`), go to the new incarnation: a request can wait in a queue from
    /// before the cutoff, behind a backlog the old incarnation was slow to read.
    pub(crate) fn fail_peer(
        &self,
        peer: &str,
        cutoff: Instant,
        queued: &std::collections::HashSet<u64>,
        reason: &str,
    ) {
        let ids: Vec<u64> = self
            .pending
            .lock()
            .iter()
            .filter(|(id, p)| &*p.peer == peer && p.created < cutoff && !queued.contains(id))
            .map(|(id, _)| *id)
            .collect();
        self.fail(&ids, ReplyFailure::Undeliverable, reason);
    }

    /// Forgets slots older than `max_age`, and those of asks past their timeout. Returns
    /// how many.
    pub(crate) fn sweep(&self, max_age: Duration) -> usize {
        self.sweep_at(Instant::now(), max_age)
    }

    fn sweep_at(&self, now: Instant, max_age: Duration) -> usize {
        // Dropped after the lock is released (see `forget`).
        let expired: Vec<Pending> = {
            let mut map = self.pending.lock();
            let ids: Vec<u64> = map
                .iter()
                .filter(|(_, p)| match p.keep_until {
                    Some(until) => now >= until,
                    None => now.saturating_duration_since(p.created) >= max_age,
                })
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| map.remove(id)).collect()
        };
        expired.len()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.pending.lock().len()
    }
}

/// The wire context used when encoding for, or decoding from, one peer.
pub(crate) struct PeerWire {
    pub(crate) node: Weak<Node>,
    /// The peer's advertised address.
    pub(crate) peer: Arc<str>,
    /// The node's payload format, which replies travel in too.
    pub(crate) format: PayloadFormat,
}

impl WireContext for PeerWire {
    fn payload_format(&self) -> PayloadFormat {
        self.format.clone()
    }

    fn export_reply(&self, deliver: ReplyDeliver) -> Result<WireReplyAddr, String> {
        let node = self
            .node
            .upgrade()
            .ok_or("the remote layer has shut down")?;
        let id = node.replies.export(deliver, self.peer.clone());
        Ok(WireReplyAddr {
            node: node.addr.to_string(),
            id,
        })
    }

    fn import_reply(self: Arc<Self>, addr: WireReplyAddr) -> Result<ReplySink, String> {
        let node = self
            .node
            .upgrade()
            .ok_or("the remote layer has shut down")?;
        // Answers go back to the node the message came from, whatever address the reply
        // handle names (so a peer cannot make this node send to third parties).
        if *addr.node != *self.peer {
            tracing::debug!(
                named = %addr.node,
                sender = %self.peer,
                "reply handle names another node than its sender; answering the sender"
            );
        }
        // The guard holds the peer: an answer is owed to it, so it is not forgotten (see
        // `Node::forget_idle_peers`) while the handle lives.
        let mut guard = ReplyGuard {
            peer: Some(node.peer(&self.peer)),
            id: addr.id,
            armed: true,
        };
        Ok(Box::new(move |bytes: Vec<u8>| {
            guard.armed = false;
            if let Some(peer) = &guard.peer {
                peer.send_reply(Frame::Reply {
                    id: guard.id,
                    payload: Bytes::from(bytes),
                });
            }
        }))
    }
}

/// Tells the asker when a reply handle from its node is dropped unanswered, so a remote ask
/// fails at once with `NoReply` like a local one.
struct ReplyGuard {
    peer: Option<Arc<crate::peer::Peer>>,
    id: u64,
    armed: bool,
}

impl ReplyGuard {
    fn disarm(&mut self) {
        self.armed = false;
    }

    fn send_no_reply(&mut self) {
        if !std::mem::replace(&mut self.armed, false) {
            return;
        }
        if let Some(peer) = &self.peer {
            peer.send_reply(Frame::ReplyFailed {
                ids: vec![self.id],
                failure: ReplyFailure::NoReply,
                reason: "the recipient dropped the request without replying".into(),
            });
        }
    }
}

impl Drop for ReplyGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let deferred = DROPPED
            .try_with(|c| match c.try_borrow_mut() {
                Ok(mut slot) => match slot.as_mut() {
                    Some(v) => {
                        v.push(ReplyGuard {
                            peer: self.peer.take(),
                            id: self.id,
                            armed: true,
                        });
                        true
                    }
                    None => false,
                },
                Err(_) => false,
            })
            .unwrap_or(false);
        if !deferred {
            self.send_no_reply();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_complete_fail_forget_and_sweep() {
        let r = Replies::new();
        let (tx, mut rx) = oneshot::channel::<u32>();
        let deliver: ReplyDeliver = Box::new(move |b: &[u8]| {
            let _ = tx.send(rmp_serde::from_slice(b).map_err(|e| e.to_string())?);
            Ok(())
        });
        let (id, ids) = capture(|| r.export(deliver, "p".into()));
        assert_eq!(ids, vec![id]);
        let from_p = from("p", &|_| false);
        assert_eq!(
            r.complete(id, &rmp_serde::to_vec(&7u32).unwrap(), &from_p),
            Ok(Answered::Delivered)
        );
        assert_eq!(rx.try_recv(), Ok(7));
        assert_eq!(r.complete(id, b"", &from_p), Ok(Answered::Unknown));

        let (tx, mut rx) = oneshot::channel::<u32>();
        let id = r.export(
            Box::new(move |_| {
                drop(tx);
                Ok(())
            }),
            "p".into(),
        );
        let (ftx, mut frx) = oneshot::channel();
        r.owned_by_ask(&[id], Duration::from_secs(5), ftx);
        r.fail(&[id], ReplyFailure::UnknownRecipient, "nobody");
        assert_eq!(frx.try_recv().unwrap().0, ReplyFailure::UnknownRecipient);
        assert!(rx.try_recv().is_err());

        let a = r.export(Box::new(|_| Ok(())), "p".into());
        let _b = r.export(Box::new(|_| Ok(())), "q".into());
        r.forget(&[a]);
        assert_eq!(r.len(), 1);
        let none = std::collections::HashSet::new();
        r.fail_peer(
            "q",
            Instant::now() - Duration::from_secs(60),
            &none,
            "restarted",
        );
        assert_eq!(r.len(), 1, "slots newer than the cutoff stay");
        r.fail_peer(
            "q",
            Instant::now(),
            &std::collections::HashSet::from([_b]),
            "restarted",
        );
        assert_eq!(r.len(), 1, "slots of requests still queued stay");
        r.fail_peer("q", Instant::now(), &none, "restarted");
        assert_eq!(r.len(), 0);
        r.export(Box::new(|_| Ok(())), "p".into());
        assert_eq!(r.sweep(Duration::ZERO), 1);
    }

    fn from<'a>(key: &'a str, same_node: &'a dyn Fn(&str) -> bool) -> AnswerFrom<'a> {
        AnswerFrom { key, same_node }
    }

    /// A slot takes an answer, or a failure, only from the peer it waits on: under the same
    /// key, or under another key that is the same node. Answers from other peers leave it
    /// waiting. (Before, any peer could answer or fail any slot of the node.)
    #[test]
    fn slots_take_answers_only_from_their_peer() {
        let r = Replies::new();
        let (tx, mut rx) = oneshot::channel::<u32>();
        let id = r.export(
            Box::new(move |b: &[u8]| {
                let _ = tx.send(rmp_serde::from_slice(b).map_err(|e| e.to_string())?);
                Ok(())
            }),
            "q".into(),
        );
        let (ftx, mut frx) = oneshot::channel();
        r.owned_by_ask(&[id], Duration::from_secs(5), ftx);
        let answer = rmp_serde::to_vec(&7u32).unwrap();
        let stranger = from("m", &|_| false);
        assert_eq!(
            r.complete(id, &answer, &stranger),
            Ok(Answered::NotFromItsPeer)
        );
        assert_eq!(
            r.fail_from(&[id, id + 1], &stranger, ReplyFailure::NoReply, "x"),
            1
        );
        assert_eq!(r.len(), 1, "the slot still waits");
        assert!(frx.try_recv().is_err() && rx.try_recv().is_err());
        // The same node under another address (dialed as `q`, advertising `q2`).
        let alias = |k: &str| k == "q";
        let q2 = from("q2", &alias);
        assert_eq!(r.complete(id, &answer, &q2), Ok(Answered::Delivered));
        assert_eq!(rx.try_recv(), Ok(7));

        let a = r.export(Box::new(|_| Ok(())), "q".into());
        let b = r.export(Box::new(|_| Ok(())), "p".into());
        let (ftx, mut frx) = oneshot::channel();
        r.owned_by_ask(&[a], Duration::from_secs(5), ftx);
        let q = from("q", &|_| false);
        assert_eq!(r.fail_from(&[a, b], &q, ReplyFailure::NoReply, "gone"), 1);
        assert_eq!(
            frx.try_recv().unwrap(),
            (ReplyFailure::NoReply, "gone".into())
        );
        assert_eq!(r.len(), 1, "p's slot stays");
        assert_eq!(r.fail_from(&[b], &q2, ReplyFailure::NoReply, "x"), 1);
        assert_eq!(
            r.fail_from(&[b], &from("p", &|_| false), ReplyFailure::NoReply, "x"),
            0
        );
        assert_eq!(r.len(), 0);
    }

    /// Calls back into its `Replies` when dropped, as a relay slot's reply handle to this
    /// very node does (its `ReplyFailed` is handled in place).
    struct FailsOnDrop(Arc<Replies>, u64);

    impl Drop for FailsOnDrop {
        fn drop(&mut self) {
            self.0.fail(&[self.1], ReplyFailure::NoReply, "dropped");
        }
    }

    /// A slot whose drop re-enters the slots (forgotten or swept) does not deadlock: slots
    /// are dropped after the lock is released. Run on a thread of its own so that a deadlock
    /// fails the test instead of hanging it.
    #[test]
    fn dropping_a_forgotten_or_swept_slot_may_reenter_the_slots() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = Arc::new(Replies::new());
            let (tx, mut rx) = oneshot::channel::<()>();
            let relayed = r.export(
                Box::new(move |_| {
                    drop(tx);
                    Ok(())
                }),
                "p".into(),
            );
            let guard = FailsOnDrop(r.clone(), relayed);
            let relay = r.export(
                Box::new(move |_| {
                    let _keep = &guard;
                    Ok(())
                }),
                "q".into(),
            );
            r.forget(&[relay]);
            assert!(rx.try_recv().is_err(), "the relayed slot failed: closed");
            assert_eq!(r.len(), 0);

            // The relayed slot is an ask's, kept past the sweep; the relay slot is swept.
            let relayed = r.export(Box::new(|_| Ok(())), "p".into());
            let (ftx, mut frx) = oneshot::channel();
            r.owned_by_ask(&[relayed], Duration::from_secs(3600), ftx);
            let guard = FailsOnDrop(r.clone(), relayed);
            r.export(
                Box::new(move |_| {
                    let _keep = &guard;
                    Ok(())
                }),
                "q".into(),
            );
            let swept = r.sweep_at(Instant::now() + Duration::from_secs(1), Duration::ZERO);
            assert_eq!(swept, 1, "the relay slot was swept");
            assert_eq!(frx.try_recv().unwrap().0, ReplyFailure::NoReply);
            assert_eq!(r.len(), 0, "its drop failed the relayed slot");
            done.send(()).unwrap();
        });
        finished
            .recv_timeout(Duration::from_secs(10))
            .expect("forgetting and sweeping finish (no deadlock)");
    }

    /// The sweep forgets hand-made slots after `max_reply_wait`, but an ask's slots only
    /// after the ask's own timeout, however much longer that is.
    #[test]
    fn the_sweep_keeps_an_asks_slots_until_its_timeout() {
        let r = Replies::new();
        let max_wait = Duration::from_secs(600);
        let ((a, b), ids) = capture(|| {
            (
                r.export(Box::new(|_| Ok(())), "p".into()),
                r.export(Box::new(|_| Ok(())), "p".into()),
            )
        });
        let (ftx, _frx) = oneshot::channel();
        assert_eq!(ids, vec![a, b]);
        r.owned_by_ask(&ids, Duration::from_secs(3600), ftx);
        let plain = r.export(Box::new(|_| Ok(())), "p".into());
        let now = Instant::now();
        assert_eq!(r.sweep_at(now + Duration::from_secs(601), max_wait), 1);
        assert!(
            !r.pending.lock().contains_key(&plain),
            "the hand-made slot went"
        );
        assert_eq!(r.len(), 2, "the ask's slots stay past max_reply_wait");
        assert_eq!(r.sweep_at(now + Duration::from_secs(3599), max_wait), 0);
        assert_eq!(r.sweep_at(now + Duration::from_secs(3602), max_wait), 2);
        // A timeout no clock reaches does not overflow.
        let id = r.export(Box::new(|_| Ok(())), "p".into());
        let (ftx, _frx) = oneshot::channel();
        r.owned_by_ask(&[id], Duration::MAX, ftx);
        assert_eq!(
            r.sweep_at(now + Duration::from_secs(86_400 * 365), max_wait),
            0
        );
    }
}
