//! Sharding errors: a type name started twice, out-of-range settings, a region looked up with
//! the wrong message type; and asks that get no answer.

mod common;

use std::time::Duration;

use common::{item, recorders, snapshot, Msg, Probe};
use shardik_actor::{ActorSystem, AskError};
use shardik_sharding::{Sharding, ShardingError, ShardingExt};

#[tokio::test]
async fn a_type_name_can_be_started_once() {
    let system = ActorSystem::new("twice");
    let probe = Probe::new();
    let sharding = system.sharding();
    let region = sharding.start(probe.entity_type("account")).unwrap();
    assert_eq!(
        sharding.start(probe.entity_type("account")).unwrap_err(),
        ShardingError::AlreadyStarted("account".into())
    );
    // Also with another actor and message type under the same name.
    let other = shardik_sharding::EntityType::new("account", |_id: &str| Counter(0));
    assert_eq!(
        sharding.start(other).unwrap_err(),
        ShardingError::AlreadyStarted("account".into())
    );
    // The first region is untouched, and the extension is one per system.
    region.tell("a", item(0, 1));
    assert_eq!(snapshot(&region, "a").await.handled, vec![(0, 1)]);
    assert_eq!(Sharding::get(&system).type_names(), vec!["account"]);
    assert_eq!(probe.created_total(), 1);
    system.shutdown().await;
}

#[tokio::test]
async fn out_of_range_settings_are_refused_with_a_reason() {
    let system = ActorSystem::new("settings");
    let probe = Probe::new();
    let sharding = system.sharding();
    let cases = [
        (probe.entity_type(""), "", "name is empty"),
        (probe.entity_type("s").shards(0), "s", "shard count"),
        (
            probe.entity_type("s").max_live_entities(0),
            "s",
            "max_live_entities",
        ),
        (
            probe.entity_type("s").idle_timeout(Duration::ZERO),
            "s",
            "idle_timeout",
        ),
        (probe.entity_type("s").buffer_limit(0), "s", "buffer_limit"),
        (
            probe.entity_type("s").idle_timeout(Duration::MAX),
            "s",
            "idle_timeout",
        ),
    ];
    for (entity, name, needle) in cases {
        let error = sharding.start(entity).unwrap_err();
        assert!(error.to_string().contains("invalid settings"), "{error}");
        match error {
            ShardingError::InvalidSettings { name: got, problem } => {
                assert_eq!(got, name);
                assert!(problem.contains(needle), "{problem:?} should name {needle}");
            }
            other => panic!("{needle}: expected InvalidSettings, got {other:?}"),
        }
    }
    // Nothing was registered, so the name is still free.
    assert!(sharding.type_names().is_empty());
    let region = sharding
        .start(probe.entity_type("s").shards(1).buffer_limit(1))
        .unwrap();
    assert_eq!(region.shard_count(), 1);
    system.shutdown().await;
}

/// A second entity type with another message type.
struct Counter(u64);

#[derive(serde::Serialize, serde::Deserialize)]
struct Add(u64);

impl shardik_actor::Actor for Counter {
    type Msg = Add;
    async fn handle(
        &mut self,
        Add(n): Add,
        _ctx: &mut shardik_actor::Context<Self>,
    ) -> Result<(), shardik_actor::ActorError> {
        self.0 += n;
        Ok(())
    }
}

#[tokio::test]
async fn looking_up_a_region_checks_the_message_type() {
    let system = ActorSystem::new("lookup");
    let probe = Probe::new();
    let sharding = system.sharding();
    sharding.start(probe.entity_type("recorder")).unwrap();

    match sharding.region::<Add>("recorder") {
        Err(ShardingError::WrongMessageType {
            name,
            actual,
            requested,
        }) => {
            assert_eq!(name, "recorder");
            assert_eq!(actual, std::any::type_name::<Msg>());
            assert_eq!(requested, std::any::type_name::<Add>());
        }
        other => panic!("expected WrongMessageType, got {:?}", other.map(|_| ())),
    }
    assert!(matches!(sharding.region::<Msg>("nobody"), Ok(None)));

    // The looked-up region is the started one: same entities.
    let found = sharding.region::<Msg>("recorder").unwrap().unwrap();
    found.tell("a", item(0, 7));
    assert_eq!(found.type_name(), "recorder");
    let found_again = system
        .sharding()
        .region::<Msg>("recorder")
        .unwrap()
        .unwrap();
    assert_eq!(snapshot(&found_again, "a").await.handled, vec![(0, 7)]);
    assert_eq!(probe.created_total(), 1);
    system.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_ask_that_is_never_answered_times_out() {
    let (system, _probe, region) = recorders("ask-timeout", |e| e);
    let timeout = Duration::from_secs(5);

    let started = tokio::time::Instant::now();
    // The entity keeps the reply handle and never answers.
    assert_eq!(
        region.ask("a", Msg::Hoard, timeout).await,
        Err(AskError::Timeout(timeout))
    );
    assert_eq!(tokio::time::Instant::now() - started, timeout);
    assert_eq!(
        region.entity_ref("a").ask(Msg::Hoard, timeout).await,
        Err(AskError::Timeout(timeout))
    );
    // Dropping the handle unanswered fails the ask at once, without the timeout.
    let started = tokio::time::Instant::now();
    assert_eq!(
        region.ask("a", Msg::Ignore, Duration::from_secs(60)).await,
        Err(AskError::NoReply)
    );
    assert_eq!(tokio::time::Instant::now(), started);
    // The entity is fine and answers what it answers.
    assert_eq!(snapshot(&region, "a").await.incarnation, 1);
    system.shutdown().await;
}
