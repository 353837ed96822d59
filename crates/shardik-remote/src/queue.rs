//! The outbound queue toward one peer: a control lane that the writer always drains first and
//! a bounded user lane with the drop-newest overflow policy.

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

struct Lanes {
    control: VecDeque<Frame>,
    user: VecDeque<Frame>,
}

pub(crate) struct OutQueue {
    lanes: Mutex<Lanes>,
    user_cap: usize,
    control_cap: usize,
    /// Wakes the writer (one waiter at a time; a notification without a waiter is kept).
    pub(crate) ready: Notify,
}

impl OutQueue {
    pub(crate) fn new(user_cap: usize, control_cap: usize) -> Self {
        OutQueue {
            lanes: Mutex::new(Lanes {
                control: VecDeque::new(),
                user: VecDeque::new(),
            }),
            user_cap,
            control_cap,
            ready: Notify::new(),
        }
    }

    /// Queues a user-lane frame, or refuses it if the lane is full.
    pub(crate) fn push_user(&self, frame: Frame) -> Result<(), Full> {
        {
            let mut l = self.lanes.lock();
            if l.user.len() >= self.user_cap {
                return Err(Full::Full);
            }
            l.user.push_back(frame);
        }
        self.ready.notify_one();
        Ok(())
    }

    /// Whether the user lane is full now (a push would be refused).
    pub(crate) fn user_full(&self) -> bool {
        self.lanes.lock().user.len() >= self.user_cap
    }

    /// Queues a control-lane frame, or refuses it if the lane is full.
    pub(crate) fn push_control(&self, frame: Frame) -> Result<(), Full> {
        {
            let mut l = self.lanes.lock();
            if l.control.len() >= self.control_cap {
                return Err(Full::Full);
            }
            l.control.push_back(frame);
        }
        self.ready.notify_one();
        Ok(())
    }

    /// Moves every control frame, then up to `max_user` user frames, into `out` (control
    /// first). Returns how many frames were taken.
    pub(crate) fn take_batch(&self, out: &mut Vec<Frame>, max_user: usize) -> usize {
        let mut l = self.lanes.lock();
        let before = out.len();
        out.extend(l.control.drain(..));
        let n = l.user.len().min(max_user);
        out.extend(l.user.drain(..n));
        out.len() - before
    }

    /// True if nothing waits in either lane.
    pub(crate) fn is_empty(&self) -> bool {
        let l = self.lanes.lock();
        l.control.is_empty() && l.user.is_empty()
    }

    /// Frames waiting in the user lane.
    pub(crate) fn user_len(&self) -> usize {
        self.lanes.lock().user.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_first_and_user_bounded_drop_newest() {
        let q = OutQueue::new(2, 8);
        q.push_user(Frame::Heartbeat(100)).unwrap();
        q.push_user(Frame::Heartbeat(101)).unwrap();
        assert_eq!(q.push_user(Frame::Heartbeat(102)), Err(Full::Full));
        q.push_control(Frame::HeartbeatAck(1)).unwrap();
        let mut out = Vec::new();
        assert_eq!(q.take_batch(&mut out, 1), 2);
        assert_eq!(out, vec![Frame::HeartbeatAck(1), Frame::Heartbeat(100)]);
        out.clear();
        q.take_batch(&mut out, 10);
        assert_eq!(out, vec![Frame::Heartbeat(101)]);
        assert!(q.is_empty());
    }
}
