//! Throughput (messages per scheduling turn) changes scheduling, never results.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shardik_actor::{
    Actor, ActorError, ActorRef, ActorSystem, Context, Props, ReplyTo, DEFAULT_THROUGHPUT,
};

enum Msg {
    Add(u64),
    Totals(ReplyTo<(u64, u64, u64)>),
}

/// Counts messages, sums them, and checks they come in the order one sender sent them.
#[derive(Default)]
struct Summer {
    count: u64,
    sum: u64,
    out_of_order: u64,
    last: u64,
}

impl Actor for Summer {
    type Msg = Msg;

    async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Msg::Add(n) => {
                if n <= self.last && self.count > 0 {
                    self.out_of_order += 1;
                }
                self.last = n;
                self.count += 1;
                self.sum += n;
            }
            Msg::Totals(r) => r.reply((self.count, self.sum, self.out_of_order)),
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_to_many_actors_is_fully_processed_whatever_the_throughput() {
    const ACTORS: usize = 300;
    const PER_ACTOR: u64 = 200;
    for throughput in [1, 3, DEFAULT_THROUGHPUT] {
        let system = ActorSystem::new("flood");
        let actors: Vec<ActorRef<Msg>> = (0..ACTORS)
            .map(|_| system.spawn_props(Props::new(Summer::default).throughput(throughput)))
            .collect();
        // Two senders, each owning half of the actors, interleaving across them.
        let halves: Vec<Vec<ActorRef<Msg>>> =
            actors.chunks(ACTORS / 2).map(|c| c.to_vec()).collect();
        let senders: Vec<_> = halves
            .into_iter()
            .map(|half| {
                tokio::spawn(async move {
                    for n in 1..=PER_ACTOR {
                        for a in &half {
                            a.tell(Msg::Add(n));
                        }
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        for s in senders {
            s.await.unwrap();
        }
        for a in &actors {
            let (count, sum, out_of_order) =
                a.ask(Msg::Totals, Duration::from_secs(30)).await.unwrap();
            assert_eq!(count, PER_ACTOR, "throughput {throughput}");
            assert_eq!(
                sum,
                PER_ACTOR * (PER_ACTOR + 1) / 2,
                "throughput {throughput}"
            );
            assert_eq!(out_of_order, 0, "throughput {throughput}");
        }
        assert_eq!(system.dead_letters().total(), 0);
        system.shutdown().await;
        assert_eq!(system.live_actors(), 0);
    }
}

/// A token passed around a ring of actors: every hop is a new message to an idle actor,
/// so this exercises going idle and being rescheduled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_goes_around_a_ring_whatever_the_throughput() {
    enum Ring {
        Next(ActorRef<Ring>),
        Token(u64, ReplyTo<u64>),
    }
    struct Node {
        next: Option<ActorRef<Ring>>,
    }
    impl Actor for Node {
        type Msg = Ring;
        async fn handle(&mut self, msg: Ring, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
            match msg {
                Ring::Next(n) => self.next = Some(n),
                Ring::Token(0, r) => r.reply(0),
                Ring::Token(hops, r) => self
                    .next
                    .as_ref()
                    .expect("wired")
                    .tell(Ring::Token(hops - 1, r)),
            }
            Ok(())
        }
    }
    for throughput in [1, DEFAULT_THROUGHPUT] {
        let system = ActorSystem::new("ring");
        let nodes: Vec<_> = (0..50)
            .map(|_| system.spawn_props(Props::new(|| Node { next: None }).throughput(throughput)))
            .collect();
        for (i, n) in nodes.iter().enumerate() {
            n.tell(Ring::Next(nodes[(i + 1) % nodes.len()].clone()));
        }
        // Several tokens circulate at once.
        let asks: Vec<_> = (0..8)
            .map(|k| {
                let start = nodes[k * 5].clone();
                tokio::spawn(async move {
                    start
                        .ask(|r| Ring::Token(10_000, r), Duration::from_secs(60))
                        .await
                })
            })
            .collect();
        for a in asks {
            assert_eq!(a.await.unwrap(), Ok(0));
        }
        system.shutdown().await;
    }
}

/// An actor with a long backlog yields between batches, so on a single thread another actor
/// still gets to answer before the backlog is done.
#[tokio::test]
async fn a_busy_actor_yields_to_others_between_batches() {
    struct Slow(Arc<AtomicUsize>);
    impl Actor for Slow {
        type Msg = ();
        async fn handle(&mut self, _m: (), _ctx: &mut Context<Self>) -> Result<(), ActorError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }
    for throughput in [1, DEFAULT_THROUGHPUT] {
        const BACKLOG: usize = 100_000;
        let system = ActorSystem::new("fair");
        let handled = Arc::new(AtomicUsize::new(0));
        let slow =
            system.spawn_props(Props::from_instance(Slow(handled.clone())).throughput(throughput));
        let quick = system.spawn_props(Props::new(Summer::default));
        for _ in 0..BACKLOG {
            slow.tell(());
        }
        quick.tell(Msg::Add(1));
        let (count, _, _) = quick
            .ask(Msg::Totals, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(count, 1);
        let at_reply = handled.load(Ordering::SeqCst);
        assert!(
            at_reply < BACKLOG,
            "throughput {throughput}: the backlog ran to the end first"
        );
        slow.graceful_stop();
        slow.terminated().await;
        assert_eq!(handled.load(Ordering::SeqCst), BACKLOG);
        system.shutdown().await;
    }
}
