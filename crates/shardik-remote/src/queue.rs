//! The outbound queue of one lane toward one peer: bounded, with the drop-newest overflow
//! policy, drained by the writer of that lane's connection.

use std::collections::VecDeque;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::frame::Frame;

/// Why a frame was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// The lane is at capacity; the frame was dropped (drop newest).
    Full,
}

pub(crate) struct OutQueue {
    frames: Mutex<VecDeque<Frame>>,
    cap: usize,
    /// Wakes the writer (one waiter at a time; a notification without a waiter is kept).
    pub(crate) ready: Notify,
}

impl OutQueue {
    pub(crate) fn new(cap: usize) -> Self {
        OutQueue {
            frames: Mutex::new(VecDeque::new()),
            cap,
            ready: Notify::new(),
        }
    }

    /// Queues a frame, or refuses it if the queue is full.
    pub(crate) fn push(&self, frame: Frame) -> Result<(), Full> {
        {
            let mut q = self.frames.lock();
            if q.len() >= self.cap {
                return Err(Full::Full);
            }
            q.push_back(frame);
        }
        self.ready.notify_one();
        Ok(())
    }

    /// Whether a push would be refused now.
    pub(crate) fn is_full(&self) -> bool {
        self.frames.lock().len() >= self.cap
    }

    /// Moves up to `max` frames, oldest first, into `out`. Returns how many.
    pub(crate) fn take_batch(&self, out: &mut Vec<Frame>, max: usize) -> usize {
        let mut q = self.frames.lock();
        let n = q.len().min(max);
        out.extend(q.drain(..n));
        n
    }

    /// True if nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.frames.lock().is_empty()
    }

    /// Frames waiting.
    pub(crate) fn len(&self) -> usize {
        self.frames.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_drop_newest_and_fifo_batches() {
        let q = OutQueue::new(2);
        q.push(Frame::Heartbeat(100)).unwrap();
        q.push(Frame::Heartbeat(101)).unwrap();
        assert!(q.is_full());
        assert_eq!(q.push(Frame::Heartbeat(102)), Err(Full::Full));
        let mut out = Vec::new();
        assert_eq!(q.take_batch(&mut out, 1), 1);
        assert_eq!(out, vec![Frame::Heartbeat(100)]);
        out.clear();
        assert_eq!(q.len(), 1);
        q.take_batch(&mut out, 10);
        assert_eq!(out, vec![Frame::Heartbeat(101)]);
        assert!(q.is_empty());
    }
}
