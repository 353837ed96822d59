//! Schema evolution: events written by an older version are upcast when read.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use shardik_actor::ActorSystem;
use shardik_persistence::{AppendRequest, Payload, PersistSettings, Versioned};

use super::Store;
use crate::common::{persistence, T};

/// Version 1 of an event had no `currency`; version 2 adds it, and its upcaster fills in
/// the currency all version-1 deposits were made in.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum PaymentV2 {
    Paid { amount: u64, currency: String },
}

impl Versioned for PaymentV2 {
    const TYPE_NAME: &'static str = "test.Payment";
    const VERSION: u32 = 2;
    fn upcast(from: u32, mut value: serde_json::Value) -> Result<serde_json::Value, String> {
        if from == 1 {
            let body = value
                .get_mut("Paid")
                .and_then(|b| b.as_object_mut())
                .ok_or("not a Paid event")?;
            body.insert("currency".into(), "EUR".into());
        }
        Ok(value)
    }
}

pub async fn schema_evolution_upcasts_old_events<S: Store>(store: Arc<S>) {
    #[derive(Serialize)]
    enum PaymentV1 {
        Paid { amount: u64 },
    }
    let old = Payload::encode_as("test.Payment", 1, &PaymentV1::Paid { amount: 5 }).unwrap();
    let new = Payload::encode(&PaymentV2::Paid {
        amount: 7,
        currency: "CHF".into(),
    })
    .unwrap();
    let request = AppendRequest {
        persistence_id: "pay".into(),
        expected_seq_nr: 0,
        writer: 1,
        events: vec![old, new],
    };
    store.append(request).await.unwrap();
    let read: Vec<PaymentV2> = store
        .read("pay", 1, 10)
        .await
        .unwrap()
        .iter()
        .map(|e| e.payload.decode().unwrap())
        .collect();
    assert_eq!(
        read,
        [
            PaymentV2::Paid {
                amount: 5,
                currency: "EUR".into()
            },
            PaymentV2::Paid {
                amount: 7,
                currency: "CHF".into()
            },
        ]
    );
}

/// An entity whose event type gained a field recovers from events written before.
struct Till;

impl shardik_persistence::EventSourced for Till {
    type Command = shardik_actor::ReplyTo<Vec<String>>;
    type Event = PaymentV2;
    type State = Ledger;
    fn handle_command(
        &self,
        state: &Ledger,
        reply: Self::Command,
    ) -> shardik_persistence::Effect<PaymentV2, Ledger> {
        shardik_persistence::Effect::reply(reply, state.0.clone())
    }
    fn apply(state: &mut Ledger, event: &PaymentV2) {
        let PaymentV2::Paid { amount, currency } = event;
        state.0.push(format!("{amount} {currency}"));
    }
}

#[derive(Default, Serialize, Deserialize)]
struct Ledger(Vec<String>);

impl Versioned for Ledger {
    const TYPE_NAME: &'static str = "test.Ledger";
}

pub async fn entity_recovers_through_upcasts<S: Store>(store: Arc<S>) {
    #[derive(Serialize)]
    enum PaymentV1 {
        Paid { amount: u64 },
    }
    let request = AppendRequest {
        persistence_id: "till".into(),
        expected_seq_nr: 0,
        writer: 1,
        events: vec![
            Payload::encode_as("test.Payment", 1, &PaymentV1::Paid { amount: 3 }).unwrap(),
            Payload::encode(&PaymentV2::Paid {
                amount: 4,
                currency: "USD".into(),
            })
            .unwrap(),
        ],
    };
    store.append(request).await.unwrap();
    let system = ActorSystem::new("suite");
    let till = system.spawn_props(persistence(store.clone()).event_sourced_props(
        "till",
        PersistSettings::default(),
        || Till,
    ));
    assert_eq!(
        till.ask(|r| r, T).await,
        Ok(vec!["3 EUR".to_string(), "4 USD".to_string()])
    );
    system.shutdown().await;
}
