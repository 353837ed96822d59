//! Custom extraction on one node: messages that carry their own entity id reach the one
//! incarnation of that id (the same one `(id, message)` sends reach), the entity gets the
//! inner message, a message without an id is a typed error and a dead letter, and a custom
//! shard function is what every route and passivation use.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, ActorSystem, Context, ReplyTo};
use shardik_sharding::{
    EntityType, ExtractAskError, ExtractError, Extractor, MessageExtractor, ShardingExt,
};

const ASK: Duration = Duration::from_secs(5);

/// What the entity handles.
#[derive(Serialize, Deserialize)]
enum Inner {
    Add(u64),
    Sum(ReplyTo<(u64, u64)>),
}

/// What callers send: a wire envelope naming its entity (or not).
struct Wire {
    to: Option<String>,
    body: Inner,
}

/// Incarnations started per entity id.
type Started = Arc<Mutex<HashMap<String, u64>>>;

struct Counter {
    incarnation: u64,
    sum: u64,
}

impl Actor for Counter {
    type Msg = Inner;
    async fn handle(&mut self, msg: Inner, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Inner::Add(n) => self.sum += n,
            Inner::Sum(reply) => reply.reply((self.incarnation, self.sum)),
        }
        Ok(())
    }
}

fn counters(started: &Started) -> EntityType<Counter> {
    let started = started.clone();
    EntityType::new("counter", move |id: &str| {
        let mut s = started.lock();
        let n = s.entry(id.to_string()).or_default();
        *n += 1;
        Counter {
            incarnation: *n,
            sum: 0,
        }
    })
    .shards(16)
}

fn wire(to: &str, body: Inner) -> Wire {
    Wire {
        to: Some(to.to_string()),
        body,
    }
}

#[tokio::test]
async fn extracted_messages_reach_the_one_incarnation_with_the_inner_message() {
    let system = ActorSystem::new("extract-routing");
    let started = Started::default();
    let region = system.sharding().start(counters(&started)).unwrap();
    let wires =
        region.with_extractor(Extractor::new(|w: &Wire| w.to.as_deref()).inner(|w: Wire| w.body));
    for i in 0..10u64 {
        wires.tell(wire("a", Inner::Add(i)));
        wires.try_tell(wire("b", Inner::Add(2 * i))).unwrap();
        // The plain API reaches the same incarnation.
        region.tell("a", Inner::Add(100));
    }
    let (inc_a, sum_a) = wires.ask(|r| wire("a", Inner::Sum(r)), ASK).await.unwrap();
    let (inc_b, sum_b) = region.ask("b", Inner::Sum, ASK).await.unwrap();
    assert_eq!((inc_a, sum_a), (1, 45 + 1000));
    assert_eq!((inc_b, sum_b), (1, 90));
    assert_eq!(started.lock().len(), 2);
    assert_eq!(region.stats().spawned_total, 2);
    assert_eq!(
        wires.entity_id(&wire("a", Inner::Add(0))).as_deref(),
        Some("a")
    );
    system.shutdown().await;
}

#[tokio::test]
async fn a_message_without_an_entity_id_is_a_typed_error_and_a_dead_letter() {
    let system = ActorSystem::new("extract-no-id");
    let started = Started::default();
    let region = system.sharding().start(counters(&started)).unwrap();
    let wires =
        region.with_extractor(Extractor::new(|w: &Wire| w.to.as_deref()).inner(|w: Wire| w.body));
    let lost = || Wire {
        to: None,
        body: Inner::Add(1),
    };

    let before = system.dead_letters().other;
    wires.tell(lost());
    assert_eq!(system.dead_letters().other, before + 1);

    // try_tell hands the message back as sent.
    match wires.try_tell(lost()) {
        Err(ExtractError::NoEntityId(w)) => assert!(matches!(w.body, Inner::Add(1))),
        other => panic!("expected NoEntityId, got {:?}", other.err()),
    }
    let err = wires.try_tell(lost()).unwrap_err();
    assert!(err.to_string().contains("no entity id"), "{err}");

    // ask fails at once (no timeout) and records a dead letter.
    let res = tokio::time::timeout(
        Duration::from_secs(1),
        wires.ask(
            |r| Wire {
                to: None,
                body: Inner::Sum(r),
            },
            Duration::from_secs(60),
        ),
    )
    .await
    .expect("answered at once");
    assert_eq!(res, Err(ExtractAskError::NoEntityId));
    assert_eq!(system.dead_letters().other, before + 2);
    assert!(started.lock().is_empty(), "no entity was started");

    // Refusals after extraction keep their meaning: shutting down refuses the inner message.
    system.shutdown().await;
    match wires.try_tell(wire("a", Inner::Add(1))) {
        Err(ExtractError::Refused(e)) => assert!(matches!(e.into_inner(), Inner::Add(1))),
        other => panic!("expected Refused, got {:?}", other.err()),
    }
    assert_eq!(
        wires.ask(|r| wire("a", Inner::Sum(r)), ASK).await,
        Err(ExtractAskError::Ask(shardik_actor::AskError::Stopped))
    );
}

/// An extractor written as a trait impl: numeric ids computed from the message.
struct ByNumber;

impl MessageExtractor<(u32, u64)> for ByNumber {
    type Msg = Inner;
    fn entity_id<'a>(&self, msg: &'a (u32, u64)) -> Option<std::borrow::Cow<'a, str>> {
        Some(msg.0.to_string().into())
    }
    fn entity_message(&self, msg: (u32, u64)) -> Inner {
        Inner::Add(msg.1)
    }
}

#[tokio::test]
async fn a_custom_shard_function_places_entities_and_passivation_follows_it() {
    let system = ActorSystem::new("extract-shard-fn");
    let started = Started::default();
    // Numeric ids: shard = id mod 16; anything else, and results out of range, still land in
    // a shard that exists.
    let region = system
        .sharding()
        .start(
            counters(&started).shard_fn(|id: &str, _shards: u32| id.parse::<u32>().unwrap_or(99)),
        )
        .unwrap();
    assert_eq!(region.shard_of("13"), 13);
    assert_eq!(region.shard_of("29"), 13);
    assert_eq!(region.shard_of("x"), 99 % 16);
    assert_eq!(region.entity_ref("5").shard(), 5);

    let numbers = region.with_extractor(ByNumber);
    for id in [13u32, 29, 5] {
        numbers.tell((id, 1));
    }
    for id in ["13", "29", "5"] {
        assert_eq!(region.ask(id, Inner::Sum, ASK).await.unwrap(), (1, 1));
    }
    let counts = region.shard_entity_counts();
    assert_eq!(counts[13], 2);
    assert_eq!(counts[5], 1);
    assert_eq!(counts.iter().sum::<usize>(), 3);

    // Passivation finds the entity in its custom shard; a message sent meanwhile waits and
    // starts a new incarnation once the old one is gone (its termination is booked in the
    // right shard, or the ask would never be answered).
    assert!(region.passivate("29"));
    assert_eq!(region.ask("29", Inner::Sum, ASK).await.unwrap(), (2, 0));
    assert_eq!(region.ask("13", Inner::Sum, ASK).await.unwrap(), (1, 1));
    system.shutdown().await;
}
