//! Properties of the gossip merge under random concurrent histories.

use super::*;
use proptest::prelude::*;

fn n(i: u8) -> UniqueAddress {
    UniqueAddress::new(format!("h:{i}"), format!("n{i}"), 1)
}

const NODES: u8 = 4;

fn base() -> Gossip {
    let mut g = Gossip::new();
    for i in 0..NODES {
        g.add_joining(n(i), BTreeSet::new()).unwrap();
        g.set_status(&n(i), MemberStatus::Up).unwrap();
        g.set_up_number(&n(i), u64::from(i) + 1);
    }
    g.touch(&n(0));
    g
}

#[derive(Clone, Debug)]
enum Op {
    /// Replica `r` (node `r`) moves `node` to a state (invalid moves are refused).
    Status(u8, u8, u8),
    /// Replica `r` flags or clears `subject` as its own observation.
    Flag(u8, u8, bool),
    /// Replica `r` receives the gossip of replica `from`.
    Receive(u8, u8),
    /// Replica `r` stamps its unstamped removals with time `t` (as a leader does), in a new
    /// version if that changed anything.
    Stamp(u8, u8),
    /// Replica `r` loses every removal time, as a state passed on by a node of an older
    /// release arrives (no new version).
    Forget(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..NODES, 0..NODES, 0u8..7).prop_map(|(r, m, s)| Op::Status(r, m, s)),
        (0..NODES, 0..NODES, any::<bool>()).prop_map(|(r, s, f)| Op::Flag(r, s, f)),
        (0..NODES, 0..NODES).prop_map(|(r, f)| Op::Receive(r, f)),
        (0..NODES, 1u8..9).prop_map(|(r, t)| Op::Stamp(r, t)),
        (0..NODES).prop_map(Op::Forget),
    ]
}

/// Runs a history; returns the replicas and every (node, state) any replica ever had.
fn run(ops: &[Op]) -> Vec<Gossip> {
    let mut reps: Vec<Gossip> = (0..NODES).map(|_| base()).collect();
    for op in ops {
        match *op {
            Op::Status(r, m, s) => {
                let g = &mut reps[r as usize];
                if g.member(&n(r)).is_none() || (m == r && s == 6) {
                    continue; // a removed node no longer authors versions
                }
                if g.set_status(&n(m), MemberStatus::ALL[s as usize]) == Ok(true) {
                    g.touch(&n(r));
                }
            }
            Op::Flag(r, s, unreachable) => {
                let g = &mut reps[r as usize];
                if g.member(&n(r)).is_none() || g.member(&n(s)).is_none() {
                    continue;
                }
                let changed = if unreachable {
                    g.reachability_mut().unreachable(&n(r), &n(s))
                } else {
                    g.reachability_mut().reachable(&n(r), &n(s))
                };
                if changed {
                    g.touch(&n(r));
                }
            }
            Op::Receive(r, from) => {
                if reps[r as usize].member(&n(r)).is_none() {
                    continue; // a removed node has shut down
                }
                let remote = reps[from as usize].clone();
                reps[r as usize].receive(&remote, &n(r));
            }
            Op::Stamp(r, t) => {
                let g = &mut reps[r as usize];
                if g.member(&n(r)).is_some() && g.settle_tombstones(u64::from(t), 0) {
                    g.touch(&n(r));
                }
            }
            Op::Forget(r) => {
                for at in reps[r as usize].tombstones.values_mut() {
                    *at = 0;
                }
            }
        }
    }
    reps
}

fn state(g: &Gossip, m: &UniqueAddress) -> MemberStatus {
    if g.is_tombstoned(m) {
        MemberStatus::Removed
    } else {
        g.member(m).map_or(MemberStatus::Joining, |m| m.status)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn merge_is_commutative_associative_idempotent(ops in proptest::collection::vec(op(), 0..40)) {
        let r = run(&ops);
        let (a, b, c) = (&r[0], &r[1], &r[2]);
        prop_assert_eq!(a.merge(b), b.merge(a));
        prop_assert_eq!(a.merge(b).merge(c), a.merge(&b.merge(c)));
        let mut aa = a.merge(a);
        aa.seen = a.seen.clone();
        prop_assert_eq!(&aa, a);
    }

    #[test]
    fn merge_never_moves_a_member_back(ops in proptest::collection::vec(op(), 0..40)) {
        let r = run(&ops);
        for x in &r {
            for y in &r {
                let m = x.merge(y);
                for i in 0..NODES {
                    let s = state(&m, &n(i));
                    prop_assert!(s >= state(x, &n(i)) && s >= state(y, &n(i)));
                }
                for t in m.tombstones().keys() {
                    prop_assert!(m.member(t).is_none(), "tombstoned member is back");
                }
                // the merged version dominates each input, up to the pruned entries of removed
                // members
                let mut xv = x.version().clone();
                for t in m.tombstones().keys() {
                    xv.prune(&t.key());
                }
                prop_assert!(matches!(m.version().compare(&xv), Ordering::After | Ordering::Same));
            }
        }
    }

    #[test]
    fn receiving_everything_converges_to_one_state(ops in proptest::collection::vec(op(), 0..40)) {
        let mut r = run(&ops);
        // two full rounds of everyone receiving everyone
        let live: Vec<usize> = (0..r.len()).filter(|i| r[*i].member(&n(*i as u8)).is_some()).collect();
        // anti-entropy rounds until every live replica holds the same version (bounded)
        for _ in 0..10 {
            for &i in &live {
                for &j in &live {
                    if r[i].member(&n(i as u8)).is_none() || r[j].member(&n(j as u8)).is_none() {
                        continue; // removed meanwhile: shut down
                    }
                    let remote = r[j].clone();
                    r[i].receive(&remote, &n(i as u8));
                }
            }
            let still: Vec<usize> = live.iter().copied().filter(|i| r[*i].member(&n(*i as u8)).is_some()).collect();
            if still.iter().all(|i| r[*i].version() == r[still[0]].version()) {
                break;
            }
        }
        let live: Vec<usize> = live.into_iter().filter(|i| r[*i].member(&n(*i as u8)).is_some()).collect();
        let Some(&first) = live.first() else {
            return Ok(());
        };
        for &i in &live {
            let (g, f) = (&r[i], &r[first]);
            prop_assert_eq!(g.members().collect::<Vec<_>>(), f.members().collect::<Vec<_>>());
            prop_assert_eq!(g.version(), f.version());
            prop_assert_eq!(g.reachability(), f.reachability());
            prop_assert_eq!(g.tombstones(), f.tombstones());
        }
    }
}
