//! # shardik-actor
//!
//! The local actor runtime of [shardik](https://example.invalid/shardik): typed actors with
//! `async` handlers, cheap [`ActorRef`]s with non-blocking [`tell`](ActorRef::tell) and
//! [`ask`](ActorRef::ask) with a timeout, supervision with restart limits and backoff, timers,
//! death watch, bounded or unbounded mailboxes and an orderly shutdown.
//!
//! ```
//! use std::time::Duration;
//! use shardik_actor::{Actor, ActorError, ActorSystem, Context, ReplyTo};
//!
//! enum CounterMsg {
//!     Add(u64),
//!     Get(ReplyTo<u64>),
//! }
//!
//! #[derive(Default)]
//! struct Counter(u64);
//!
//! impl Actor for Counter {
//!     type Msg = CounterMsg;
//!     async fn handle(&mut self, msg: CounterMsg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
//!         match msg {
//!             CounterMsg::Add(n) => self.0 += n,
//!             CounterMsg::Get(reply) => reply.reply(self.0),
//!         }
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let system = ActorSystem::new("docs");
//! let counter = system.spawn(Counter::default());
//! counter.tell(CounterMsg::Add(2));
//! counter.tell(CounterMsg::Add(3));
//! let total = counter.ask(CounterMsg::Get, Duration::from_secs(1)).await.unwrap();
//! assert_eq!(total, 5);
//! system.shutdown().await;
//! # }
//! ```
//!
//! ## How it runs
//! An actor is a *cell*: its state, a mailbox and a scheduling flag. A cell with no work has no
//! tokio task; the first message schedules one, which processes up to
//! [`Props::throughput`] messages per turn, yields, and ends when the mailbox is empty. An idle
//! actor therefore costs a few hundred bytes and no task. System messages (stop, terminated)
//! overtake queued user messages. See `docs/semantics.md` for the guarantees.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod actor;
mod actor_ref;
mod cell;
mod context;
mod dead_letters;
pub mod deadline;
mod dispatcher;
mod error;
mod mailbox;
mod payload;
mod props;
mod reply;
mod supervision;
mod system;
pub mod wire;

pub use actor::{Actor, ActorError, ActorId, StopReason, Terminated, Termination};
pub use actor_ref::ActorRef;
pub use cell::panic_message;
pub use context::{Context, TimerId};
pub use dead_letters::DeadLetterStats;
pub use error::{AskError, TellError};
pub use mailbox::{MailboxConfig, OverflowPolicy};
pub use props::{ActorSettings, Props, DEFAULT_THROUGHPUT};
pub use reply::ReplyTo;
pub use supervision::{RestartPolicy, SupervisorStrategy};
pub use system::{ActorSystem, ShutdownError, SystemConfig};
