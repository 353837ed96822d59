//! What an `Effect` does: several events at once, follow-ups in order after the persist,
//! stopping after a persist, and nothing at all.

mod common;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use shardik_actor::{ActorSystem, ReplyTo};
use shardik_persistence::{
    Effect, EventSourced, InMemoryStore, Journal, PersistSettings, Versioned,
};
use tokio::sync::mpsc;

use common::{persistence, T};

enum ListCmd {
    /// Adds the items atomically; reports each follow-up on the channel, then replies.
    AddAll(Vec<String>, mpsc::UnboundedSender<String>, ReplyTo<usize>),
    /// Adds one item, then stops.
    AddAndStop(String, ReplyTo<usize>),
    Ignore,
    Len(ReplyTo<usize>),
}

#[derive(Serialize, Deserialize)]
struct Added(String);
impl Versioned for Added {
    const TYPE_NAME: &'static str = "test.Added";
}

#[derive(Default, Serialize, Deserialize)]
struct Items(Vec<String>);
impl Versioned for Items {
    const TYPE_NAME: &'static str = "test.Items";
}

struct List;

impl EventSourced for List {
    type Command = ListCmd;
    type Event = Added;
    type State = Items;

    fn handle_command(&self, state: &Items, cmd: ListCmd) -> Effect<Added, Items> {
        match cmd {
            ListCmd::AddAll(items, seen, reply) => {
                let first = seen.clone();
                Effect::persist_all(items.into_iter().map(Added))
                    .then(move |s: &Items| first.send(format!("then sees {}", s.0.len())).unwrap())
                    .then_reply(reply, move |s: &Items| {
                        seen.send("reply".into()).unwrap();
                        s.0.len()
                    })
            }
            ListCmd::AddAndStop(item, reply) => Effect::persist(Added(item))
                .then_reply(reply, |s: &Items| s.0.len())
                .then_stop(),
            ListCmd::Ignore => Effect::none(),
            ListCmd::Len(reply) => Effect::reply(reply, state.0.len()),
        }
    }

    fn apply(state: &mut Items, event: &Added) {
        state.0.push(event.0.clone());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ups_run_in_order_after_all_events_are_applied() {
    let store = Arc::new(InMemoryStore::new());
    let system = ActorSystem::new("effects");
    let list = system.spawn_props(persistence(store.clone()).event_sourced_props(
        "list",
        PersistSettings::default(),
        || List,
    ));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let items = vec!["a".to_string(), "b".into(), "c".into()];
    assert_eq!(list.ask(|r| ListCmd::AddAll(items, tx, r), T).await, Ok(3));
    assert_eq!(rx.recv().await.as_deref(), Some("then sees 3"));
    assert_eq!(rx.recv().await.as_deref(), Some("reply"));
    assert_eq!(store.highest_seq_nr("list").await, Ok(3));
    list.tell(ListCmd::Ignore);
    assert_eq!(list.ask(ListCmd::Len, T).await, Ok(3));
    assert_eq!(store.highest_seq_nr("list").await, Ok(3));
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn then_stop_stops_after_the_persist_and_the_reply() {
    let store = Arc::new(InMemoryStore::new());
    let system = ActorSystem::new("effects");
    let list = system.spawn_props(persistence(store.clone()).event_sourced_props(
        "list",
        PersistSettings::default(),
        || List,
    ));
    assert_eq!(
        list.ask(|r| ListCmd::AddAndStop("x".into(), r), T).await,
        Ok(1)
    );
    list.terminated().await;
    assert_eq!(store.highest_seq_nr("list").await, Ok(1));
    system.shutdown().await;
}
