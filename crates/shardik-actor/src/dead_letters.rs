//! Dead letters: messages that could not be delivered. Counted, logged and exported as a
//! metric; never dropped silently.

use std::sync::atomic::{AtomicU64, Ordering};

/// How many log lines are written at `warn` before switching to one summary line per
/// [`LOG_EVERY`] dead letters (each one is still logged at `debug`).
const LOG_FIRST: u64 = 10;
const LOG_EVERY: u64 = 1_000;

/// Totals of dead letters since the system started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeadLetterStats {
    /// Messages sent to an actor that had stopped.
    pub recipient_stopped: u64,
    /// Messages rejected or dropped by a full bounded mailbox.
    pub mailbox_full: u64,
    /// Messages accepted by an actor that stopped before handling them, with no termination
    /// hook to take them.
    pub unhandled_at_stop: u64,
    /// Dead letters recorded by higher layers (such as sharding buffers that overflowed).
    pub other: u64,
}

impl DeadLetterStats {
    /// All dead letters.
    pub fn total(&self) -> u64 {
        self.recipient_stopped + self.mailbox_full + self.unhandled_at_stop + self.other
    }
}

/// Why a message became a dead letter.
#[derive(Clone, Copy, Debug)]
pub(crate) enum DeadReason {
    RecipientStopped,
    MailboxFull,
    UnhandledAtStop,
    Other(&'static str),
}

impl DeadReason {
    fn as_str(self) -> &'static str {
        match self {
            DeadReason::RecipientStopped => "recipient stopped",
            DeadReason::MailboxFull => "mailbox full",
            DeadReason::UnhandledAtStop => "unhandled when the recipient stopped",
            DeadReason::Other(s) => s,
        }
    }
}

#[derive(Default)]
pub(crate) struct DeadLetters {
    recipient_stopped: AtomicU64,
    mailbox_full: AtomicU64,
    unhandled_at_stop: AtomicU64,
    other: AtomicU64,
    total: AtomicU64,
}

impl DeadLetters {
    pub(crate) fn record(
        &self,
        system: &str,
        recipient: &dyn std::fmt::Display,
        message_type: &'static str,
        reason: DeadReason,
    ) {
        let counter = match reason {
            DeadReason::RecipientStopped => &self.recipient_stopped,
            DeadReason::MailboxFull => &self.mailbox_full,
            DeadReason::UnhandledAtStop => &self.unhandled_at_stop,
            DeadReason::Other(_) => &self.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let n = self.total.fetch_add(1, Ordering::Relaxed) + 1;
        metrics::counter!("shardik_dead_letters_total", "reason" => reason.as_str()).increment(1);
        if n <= LOG_FIRST {
            tracing::warn!(
                system,
                %recipient,
                message_type,
                reason = reason.as_str(),
                total = n,
                "dead letter"
            );
        } else if n.is_multiple_of(LOG_EVERY) {
            tracing::warn!(
                system,
                total = n,
                "{LOG_EVERY} more dead letters (latest: {message_type} to {recipient}: {})",
                reason.as_str()
            );
        } else {
            tracing::debug!(system, %recipient, message_type, reason = reason.as_str(), "dead letter");
        }
    }

    pub(crate) fn stats(&self) -> DeadLetterStats {
        DeadLetterStats {
            recipient_stopped: self.recipient_stopped.load(Ordering::Relaxed),
            mailbox_full: self.mailbox_full.load(Ordering::Relaxed),
            unhandled_at_stop: self.unhandled_at_stop.load(Ordering::Relaxed),
            other: self.other.load(Ordering::Relaxed),
        }
    }
}
