//! # shardik-remote
//!
//! Remoting for shardik: actors on different nodes talk over two TCP connections per node
//! pair, a control connection (heartbeats, cluster gossip) that user traffic cannot starve and
//! a user connection, with length-prefixed frames, a writer that batches many frames per
//! write, an authenticated handshake, reconnects with exponential backoff, bounded queues and
//! a pluggable payload format (MessagePack with named fields by default, or JSON).
//!
//! ```
//! use std::time::Duration;
//! use serde::{Deserialize, Serialize};
//! use shardik_actor::{Actor, ActorError, ActorSystem, Context, ReplyTo};
//! use shardik_remote::{Remote, RemoteConfig};
//!
//! #[derive(Serialize, Deserialize)]
//! enum Greeter {
//!     Greet { name: String, reply: ReplyTo<String> },
//! }
//!
//! struct GreeterActor;
//! impl Actor for GreeterActor {
//!     type Msg = Greeter;
//!     async fn handle(&mut self, msg: Greeter, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
//!         let Greeter::Greet { name, reply } = msg;
//!         reply.reply(format!("hello, {name}"));
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // Two nodes in one process; in production each runs in its own.
//! let sys_a = ActorSystem::new("a");
//! let sys_b = ActorSystem::new("b");
//! let cfg = |id: &str| RemoteConfig::new("demo", id).secret(b"0123456789abcdef0123456789abcdef".to_vec());
//! let a = Remote::start(&sys_a, cfg("node-a")).await.unwrap();
//! let b = Remote::start(&sys_b, cfg("node-b")).await.unwrap();
//!
//! b.register("/user/greeter", sys_b.spawn(GreeterActor));
//! let greeter = a.lookup::<Greeter>("/user/greeter", b.addr());
//! let answer = greeter
//!     .ask(|reply| Greeter::Greet { name: "world".into(), reply }, Duration::from_secs(5))
//!     .await
//!     .unwrap();
//! assert_eq!(answer, "hello, world");
//!
//! sys_a.shutdown().await;
//! sys_b.shutdown().await;
//! # }
//! ```
//!
//! ## Pieces
//! - [`frame`] and [`codec`]: the frames and their byte layout, a decoder that never panics.
//! - [`RemoteConfig`], [`Remote`]: start a node, register actors, look remote ones up.
//! - [`RemoteRef`]: `tell` and `ask` to a remote actor, like [`shardik_actor::ActorRef`].
//! - [`FaultInjector`]: cut, delay and heal links between named nodes in tests.
//! - [`PayloadFormat`], [`PayloadCodec`], [`JsonCodec`]: the serde format of payloads.
//!
//! See `docs/remoting.md` for what is secure and what is not, the overflow policy and limits.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod codec;
mod config;
mod error;
mod fault;
pub mod frame;
mod handshake;
mod handshake_slots;
mod json;
mod node;
mod peer;
mod queue;
mod registry;
mod remote;
mod remote_ref;
mod replies;
mod scratch;
mod stats;
mod tls;

pub use config::RemoteConfig;
pub use error::{DecodeError, FrameError, HandshakeError, RemoteError};
pub use fault::FaultInjector;
pub use frame::{Lane, NodeIdentity, RejectReason};
pub use json::JsonCodec;
pub use peer::ConnectionInfo;
pub use registry::{decode_payload, Decoder};
pub use remote::Remote;
pub use remote_ref::{Refused, RemoteRef, SendError};
/// The payload format seam, re-exported from [`shardik_actor::wire`].
pub use shardik_actor::wire::{PayloadCodec, PayloadFormat, Visit};
pub use stats::{RemoteEvent, RemoteStats};
pub use tls::TlsConfig;
