//! Schema evolution: user messages use MessagePack with named fields, so a field added with
//! `#[serde(default)]` is ignored by an older reader and defaulted by a newer one.

mod common;

use common::*;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, Context};
use tokio::sync::mpsc;

mod v1 {
    use super::*;
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Order {
        pub id: u64,
        pub item: String,
    }
}

mod v2 {
    use super::*;
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Order {
        pub id: u64,
        pub item: String,
        #[serde(default)]
        pub priority: u8,
    }
}

struct Sink<M>(mpsc::UnboundedSender<M>);

impl<M: Send + 'static> Actor for Sink<M> {
    type Msg = M;
    async fn handle(&mut self, msg: M, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        let _ = self.0.send(msg);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_and_new_nodes_read_each_other() {
    let (sys_old, old) = node("old").await;
    let (sys_new, new) = node("new").await;
    let (tx_old, mut rx_old) = mpsc::unbounded_channel::<v1::Order>();
    let (tx_new, mut rx_new) = mpsc::unbounded_channel::<v2::Order>();
    old.register("/user/orders", sys_old.spawn(Sink(tx_old)));
    new.register("/user/orders", sys_new.spawn(Sink(tx_new)));

    // New to old: the added field is ignored.
    new.lookup::<v2::Order>("/user/orders", old.addr())
        .tell(v2::Order {
            id: 1,
            item: "book".into(),
            priority: 7,
        });
    assert_eq!(
        next(&mut rx_old).await,
        v1::Order {
            id: 1,
            item: "book".into()
        }
    );

    // Old to new: the missing field takes its default.
    old.lookup::<v1::Order>("/user/orders", new.addr())
        .tell(v1::Order {
            id: 2,
            item: "pen".into(),
        });
    assert_eq!(
        next(&mut rx_new).await,
        v2::Order {
            id: 2,
            item: "pen".into(),
            priority: 0
        }
    );
    assert_eq!(old.stats().decode_errors + new.stats().decode_errors, 0);
}
