//! Messages that carry their own entity id: [`MessageExtractor`], [`Extractor`] and
//! [`ExtractingRegion`] (Akka's `extractEntityId`, actor-ts's `extractEntityMessage`).
//!
//! Extraction happens at the sender, in the region handle: the extractor reads the entity id
//! out of the message, the type's [`ShardFn`](crate::ShardFn) maps the id to its shard, and the
//! inner message travels on as if sent with [`Region::tell`] (across nodes the envelope carries
//! the extracted id and shard, never the outer message). So every route to an entity agrees on
//! its shard, whichever handle a message went through.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use compact_str::CompactString;
use shardik_actor::{AskError, ReplyTo, TellError};

use crate::handle::Region;

/// Reads the entity id out of an outer message `E` and turns `E` into the message the entity
/// handles ([`Msg`](MessageExtractor::Msg)). Implement it for a wire envelope or any message
/// type that names its entity, or build one from closures with [`Extractor`].
///
/// ```
/// use std::borrow::Cow;
/// use shardik_sharding::MessageExtractor;
///
/// /// A wire envelope: account number and command.
/// struct Wire { account: u64, amount: u64 }
///
/// struct ByAccount;
/// impl MessageExtractor<Wire> for ByAccount {
///     type Msg = u64;
///     fn entity_id<'a>(&self, msg: &'a Wire) -> Option<Cow<'a, str>> {
///         Some(Cow::Owned(msg.account.to_string()))
///     }
///     fn entity_message(&self, msg: Wire) -> u64 {
///         msg.amount
///     }
/// }
/// assert_eq!(ByAccount.entity_id(&Wire { account: 7, amount: 1 }).as_deref(), Some("7"));
/// ```
pub trait MessageExtractor<E>: Send + Sync + 'static {
    /// The message the entity receives.
    type Msg;

    /// The entity id `msg` is for; `None` if it names none (the message is then refused:
    /// [`ExtractError::NoEntityId`] and a dead letter, never a panic).
    fn entity_id<'a>(&self, msg: &'a E) -> Option<Cow<'a, str>>;

    /// The message the entity receives, once the id was found.
    fn entity_message(&self, msg: E) -> Self::Msg;
}

type IdFn<E> = Box<dyn for<'a> Fn(&'a E) -> Option<Cow<'a, str>> + Send + Sync>;

/// Pins the higher-ranked signature of an id closure.
fn id_fn<E, F>(f: F) -> F
where
    F: for<'a> Fn(&'a E) -> Option<Cow<'a, str>>,
{
    f
}

/// A [`MessageExtractor`] made of closures: one that reads the id, and optionally
/// ([`inner`](Extractor::inner)) one that unwraps the entity's message (by default the entity
/// receives the message as sent).
///
/// ```
/// use shardik_sharding::Extractor;
///
/// enum AccountMsg {
///     Deposit { account: String, amount: u64 },
///     Close { account: String },
/// }
/// impl AccountMsg {
///     fn account(&self) -> &str {
///         match self {
///             AccountMsg::Deposit { account, .. } | AccountMsg::Close { account } => account,
///         }
///     }
/// }
/// // The entity gets the whole message:
/// let by_account = Extractor::new(|m: &AccountMsg| Some(m.account()));
///
/// // A wire envelope whose body is what the entity handles:
/// struct Envelope { to: Option<String>, body: AccountMsg }
/// let unwrap = Extractor::new(|e: &Envelope| e.to.as_deref()).inner(|e: Envelope| e.body);
/// # let _ = (by_account, unwrap);
/// ```
pub struct Extractor<E, M> {
    id: IdFn<E>,
    inner: Box<dyn Fn(E) -> M + Send + Sync>,
}

impl<E: 'static> Extractor<E, E> {
    /// An extractor that reads the id with `id` (a borrow of the message) and passes the
    /// message on unchanged.
    pub fn new(id: impl for<'a> Fn(&'a E) -> Option<&'a str> + Send + Sync + 'static) -> Self {
        Extractor {
            id: Box::new(id_fn(move |m: &E| id(m).map(Cow::Borrowed))),
            inner: Box::new(|m| m),
        }
    }

    /// An extractor whose id is computed (a number, a concatenation) rather than borrowed.
    pub fn owned(id: impl Fn(&E) -> Option<String> + Send + Sync + 'static) -> Self {
        Extractor {
            id: Box::new(id_fn(move |m: &E| id(m).map(Cow::Owned))),
            inner: Box::new(|m| m),
        }
    }
}

impl<E: 'static, M: 'static> Extractor<E, M> {
    /// The entity receives `inner(message)` instead of the message (the outer type may differ
    /// from the entity's message type).
    pub fn inner<N>(self, inner: impl Fn(E) -> N + Send + Sync + 'static) -> Extractor<E, N> {
        Extractor {
            id: self.id,
            inner: Box::new(inner),
        }
    }
}

impl<E: 'static, M: 'static> MessageExtractor<E> for Extractor<E, M> {
    type Msg = M;

    fn entity_id<'a>(&self, msg: &'a E) -> Option<Cow<'a, str>> {
        (self.id)(msg)
    }

    fn entity_message(&self, msg: E) -> M {
        (self.inner)(msg)
    }
}

impl<E, M> fmt::Debug for Extractor<E, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Extractor")
            .field("outer", &std::any::type_name::<E>())
            .field("inner", &std::any::type_name::<M>())
            .finish()
    }
}

/// Why [`ExtractingRegion::try_tell`] did not send a message.
pub enum ExtractError<E, M> {
    /// The extractor found no entity id in the message (handed back).
    NoEntityId(E),
    /// The entity (or the region on its way) refused the inner message (handed back), as
    /// [`Region::try_tell`] would.
    Refused(TellError<M>),
}

impl<E, M> fmt::Debug for ExtractError<E, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExtractError::NoEntityId(_) => f.write_str("NoEntityId(..)"),
            ExtractError::Refused(e) => f.debug_tuple("Refused").field(e).finish(),
        }
    }
}

impl<E, M> fmt::Display for ExtractError<E, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExtractError::NoEntityId(_) => f.write_str(NO_ID),
            ExtractError::Refused(e) => e.fmt(f),
        }
    }
}

impl<E, M> std::error::Error for ExtractError<E, M> {}

/// Why [`ExtractingRegion::ask`] produced no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExtractAskError {
    /// The extractor found no entity id in the request (recorded as a dead letter).
    #[error("{}", NO_ID)]
    NoEntityId,
    /// The ask itself failed, as [`Region::ask`] would.
    #[error(transparent)]
    Ask(#[from] AskError),
}

const NO_ID: &str = "the message names no entity: the extractor returned no entity id";

/// A [`Region`] that takes messages carrying their own entity id: `tell(msg)` instead of
/// `tell(id, msg)`. Made by [`Region::with_extractor`]; cloning is cheap.
///
/// ```
/// use std::time::Duration;
/// use serde::{Deserialize, Serialize};
/// use shardik_actor::{Actor, ActorError, ActorSystem, Context, ReplyTo};
/// use shardik_sharding::{EntityType, Extractor, ShardingExt};
///
/// #[derive(Serialize, Deserialize)]
/// enum AccountMsg {
///     Deposit { account: String, amount: u64 },
///     Balance { account: String, reply: ReplyTo<u64> },
/// }
/// impl AccountMsg {
///     fn account(&self) -> &str {
///         match self {
///             AccountMsg::Deposit { account, .. } | AccountMsg::Balance { account, .. } => account,
///         }
///     }
/// }
///
/// struct Account { balance: u64 }
/// impl Actor for Account {
///     type Msg = AccountMsg;
///     async fn handle(&mut self, msg: AccountMsg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
///         match msg {
///             AccountMsg::Deposit { amount, .. } => self.balance += amount,
///             AccountMsg::Balance { reply, .. } => reply.reply(self.balance),
///         }
///         Ok(())
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let system = ActorSystem::new("bank");
/// let accounts = system
///     .sharding()
///     .start(EntityType::new("account", |_id: &str| Account { balance: 0 }))
///     .unwrap()
///     .with_extractor(Extractor::new(|m: &AccountMsg| Some(m.account())));
/// accounts.tell(AccountMsg::Deposit { account: "alice".into(), amount: 150 });
/// let balance = accounts
///     .ask(
///         |reply| AccountMsg::Balance { account: "alice".into(), reply },
///         Duration::from_secs(1),
///     )
///     .await
///     .unwrap();
/// assert_eq!(balance, 150);
/// system.shutdown().await;
/// # }
/// ```
pub struct ExtractingRegion<E, M> {
    region: Region<M>,
    extractor: Arc<dyn MessageExtractor<E, Msg = M>>,
}

impl<E, M> Clone for ExtractingRegion<E, M> {
    fn clone(&self) -> Self {
        ExtractingRegion {
            region: self.region.clone(),
            extractor: self.extractor.clone(),
        }
    }
}

impl<M: Send + 'static> Region<M> {
    /// A handle that sends messages of type `E` carrying their own entity id: `extractor`
    /// finds the id (and the inner message the entity receives). Works the same on one node
    /// and in a cluster, from any node.
    pub fn with_extractor<E, X>(&self, extractor: X) -> ExtractingRegion<E, M>
    where
        X: MessageExtractor<E, Msg = M>,
    {
        ExtractingRegion {
            region: self.clone(),
            extractor: Arc::new(extractor),
        }
    }
}

impl<E: 'static, M: Send + 'static> ExtractingRegion<E, M> {
    /// Sends `msg` to the entity it names, starting the entity if needed; see
    /// [`Region::tell`]. A message that names no entity, or that cannot be accepted, is
    /// recorded as a dead letter.
    pub fn tell(&self, msg: E) {
        match self.extractor.entity_id(&msg) {
            Some(id) => {
                let id = CompactString::from(&*id); // up to 24 bytes inline: no allocation
                self.region.tell(&id, self.extractor.entity_message(msg));
            }
            None => self.no_entity_id(),
        }
    }

    /// Like [`tell`](Self::tell) but hands a message back instead of recording it as a dead
    /// letter: [`ExtractError::NoEntityId`] with the message as sent if it names no entity,
    /// [`ExtractError::Refused`] with the inner message if the region or entity refused it.
    pub fn try_tell(&self, msg: E) -> Result<(), ExtractError<E, M>> {
        let Some(id) = self.extractor.entity_id(&msg) else {
            return Err(ExtractError::NoEntityId(msg));
        };
        let id = CompactString::from(&*id); // up to 24 bytes inline: no allocation
        self.region
            .try_tell(&id, self.extractor.entity_message(msg))
            .map_err(ExtractError::Refused)
    }

    /// Sends a request built around a fresh [`ReplyTo`] to the entity it names and waits up to
    /// `timeout` for the answer; see [`Region::ask`]. A request that names no entity fails at
    /// once with [`ExtractAskError::NoEntityId`] and is recorded as a dead letter.
    pub async fn ask<R>(
        &self,
        make: impl FnOnce(ReplyTo<R>) -> E,
        timeout: Duration,
    ) -> Result<R, ExtractAskError> {
        let (reply_to, rx) = ReplyTo::channel();
        let msg = make(reply_to);
        let Some(id) = self.extractor.entity_id(&msg) else {
            self.no_entity_id();
            return Err(ExtractAskError::NoEntityId);
        };
        let id = CompactString::from(&*id); // up to 24 bytes inline: no allocation
        let inner = self.extractor.entity_message(msg);
        Ok(self.region.ask_built(&id, inner, rx, timeout).await?)
    }

    /// The entity id `msg` names, as the extractor reads it.
    pub fn entity_id<'a>(&self, msg: &'a E) -> Option<Cow<'a, str>> {
        self.extractor.entity_id(msg)
    }

    /// The plain region: `(entity id, message)` sends, `entity_ref`, stats.
    pub fn region(&self) -> &Region<M> {
        &self.region
    }

    fn no_entity_id(&self) {
        self.region.system().record_dead_letter(
            &format_args!("{}/<no entity id>", self.region.type_name()),
            std::any::type_name::<E>(),
            "the extractor found no entity id in the message",
        );
    }
}

impl<E, M: 'static> fmt::Debug for ExtractingRegion<E, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtractingRegion")
            .field("region", &self.region)
            .field("outer", &std::any::type_name::<E>())
            .finish()
    }
}
