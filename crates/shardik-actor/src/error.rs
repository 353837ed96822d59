//! Errors of `tell` and `ask`.

use std::fmt;
use std::time::Duration;

/// Why a message could not be put into a mailbox. The message is handed back.
pub enum TellError<M> {
    /// The recipient has stopped (or is stopping) and accepts no more messages.
    Stopped(M),
    /// The recipient's bounded mailbox is full, or (for sharded entities) a bounded queue on
    /// the way to it: its region's buffer, or the outbound queue toward its node.
    MailboxFull(M),
}

impl<M> TellError<M> {
    /// Returns the message that could not be delivered.
    pub fn into_inner(self) -> M {
        match self {
            TellError::Stopped(m) | TellError::MailboxFull(m) => m,
        }
    }
}

impl<M: PartialEq> PartialEq for TellError<M> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (TellError::Stopped(a), TellError::Stopped(b)) => a == b,
            (TellError::MailboxFull(a), TellError::MailboxFull(b)) => a == b,
            _ => false,
        }
    }
}

impl<M: Eq> Eq for TellError<M> {}

impl<M> fmt::Debug for TellError<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TellError::Stopped(_) => f.write_str("TellError::Stopped(..)"),
            TellError::MailboxFull(_) => f.write_str("TellError::MailboxFull(..)"),
        }
    }
}

impl<M> fmt::Display for TellError<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TellError::Stopped(_) => f.write_str("the recipient actor has stopped"),
            TellError::MailboxFull(_) => f.write_str(
                "the recipient's bounded mailbox (or a bounded queue on the way) is full",
            ),
        }
    }
}

impl<M> std::error::Error for TellError<M> {}

/// Why an [`ask`](crate::ActorRef::ask) produced no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    /// No reply arrived within the timeout.
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    /// The recipient had stopped before the request could be queued.
    #[error("the recipient actor has stopped")]
    Stopped,
    /// The recipient's bounded mailbox was full, or (for sharded entities) a bounded queue on
    /// the way to it: its region's buffer, or the outbound queue toward its node.
    #[error("the recipient's bounded mailbox (or a bounded queue on the way) is full")]
    MailboxFull,
    /// The request was accepted but the reply handle was dropped unanswered: the recipient
    /// stopped before handling it, failed while handling it, or chose not to reply.
    #[error("the recipient dropped the request without replying (it stopped or failed)")]
    NoReply,
    /// The request or its reply could not be routed or encoded (used by remote and sharded
    /// asks; the text says what went wrong).
    #[error("{0}")]
    Undeliverable(String),
}

impl<M> From<TellError<M>> for AskError {
    fn from(e: TellError<M>) -> Self {
        match e {
            TellError::Stopped(_) => AskError::Stopped,
            TellError::MailboxFull(_) => AskError::MailboxFull,
        }
    }
}
