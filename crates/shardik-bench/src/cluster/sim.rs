//! The convergence baseline: the same membership protocol on an in-memory network with
//! instant delivery, stepped in [`STEP_MS`] of simulated time.

use std::collections::VecDeque;

use shardik_cluster::member::{MemberStatus, UniqueAddress};
use shardik_cluster::node::MembershipNode;
use shardik_cluster::protocol::{Action, Input};
use shardik_cluster::runtime::ClusterConfig;

/// Simulated milliseconds per step.
pub const STEP_MS: u64 = 10;

/// Simulated milliseconds until `n` nodes with `cfg`'s timing all see each other `Up`:
/// node 0 forms the cluster at time 0, the others send their join to it at time 0.
pub fn converge_ms(n: usize, cfg: &ClusterConfig) -> u64 {
    let ids: Vec<UniqueAddress> = (0..n)
        .map(|i| UniqueAddress::new(format!("10.0.0.{i}:2552"), format!("n{i}"), 1))
        .collect();
    let mut nodes: Vec<MembershipNode> = ids
        .iter()
        .map(|id| MembershipNode::new(cfg.node_config(id.clone())))
        .collect();
    let index = |addr: &str| ids.iter().position(|id| id.address == addr);
    let mut queue: VecDeque<(usize, Action)> = VecDeque::new();
    let tick = cfg.tick_interval.as_millis() as u64;
    let heartbeat = cfg.heartbeat_interval.as_millis() as u64;
    for (i, node) in nodes.iter_mut().enumerate() {
        let input = if i == 0 {
            Input::Join(ids[0].clone(), Default::default())
        } else {
            Input::JoinSeeds(vec![ids[0].address.clone()])
        };
        queue.extend(node.handle(input).into_iter().map(|a| (i, a)));
    }
    let mut now = 0;
    loop {
        while let Some((from, action)) = queue.pop_front() {
            let (to, input) = match action {
                Action::SendGossip(to, g) => (to.address, Input::Gossip(ids[from].clone(), g)),
                Action::SendHeartbeat(to) => {
                    (to.address, Input::HeartbeatFrom(ids[from].clone(), now))
                }
                Action::SendWatch { to, joining } => (
                    to.address,
                    Input::WatchFrom {
                        from: ids[from].clone(),
                        joining,
                        at: now,
                    },
                ),
                Action::SendJoin(addr) => {
                    (addr, Input::Join(ids[from].clone(), Default::default()))
                }
                Action::SendJoinReminder(to) => (
                    to.address,
                    Input::JoinReminder(ids[from].clone(), Default::default()),
                ),
                Action::Event(_) | Action::ShutdownSelf => continue,
            };
            if let Some(t) = index(&to) {
                queue.extend(nodes[t].handle(input).into_iter().map(|a| (t, a)));
            }
        }
        let all_up = nodes.iter().all(|node| {
            let g = node.gossip();
            g.members().count() == n && g.members().all(|m| m.status == MemberStatus::Up)
        });
        if all_up || now > 600_000 {
            return now;
        }
        now += STEP_MS;
        for (i, node) in nodes.iter_mut().enumerate() {
            if now % tick < STEP_MS {
                queue.extend(node.handle(Input::Tick(now)).into_iter().map(|a| (i, a)));
            }
            if now % heartbeat < STEP_MS {
                queue.extend(
                    node.handle(Input::HeartbeatTick(now))
                        .into_iter()
                        .map(|a| (i, a)),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_nodes_converge_in_the_simulation() {
        let ms = converge_ms(3, &crate::cluster::node_config("sim"));
        assert!(ms > 0 && ms < 30_000, "{ms}");
    }
}
