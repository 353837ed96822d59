//! The outbound queue of one lane toward one peer: bounded in frames and in bytes, with the
//! drop-newest overflow policy, drained by the writer of that lane's connection.
//!
//! The queue holds frames already encoded, length prefix included, in the bytes the writer
//! hands to the socket: a sender encodes its frame on its own thread (into a per-thread
//! scratch buffer, outside the lock) and appends it under the lock with one copy. The bytes
//! are kept in *segments* of at most `per_write` frames each; the writer takes the oldest
//! segment and writes it whole, then gives its buffer back for reuse. So a
//! message costs the sender no allocation and the writer no per-frame work.
//!
//! Only the writer of the lane's current connection takes frames: the queue records which
//! connection that is ([`OutQueue::assign`]), and a writer of a connection that was replaced
//! or ended gets nothing, even if it comes back from a long write before it sees that its
//! connection was cancelled. (Before, such a writer took the next frame and wrote it to a
//! dead socket: the frame was lost although a new connection was up.)

use std::collections::VecDeque;

use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::sync::Notify;

/// Why a frame was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// The lane is at capacity; the frame was dropped (drop newest).
    Full,
}

/// Encoded frames the writer writes whole, in one go.
#[derive(Debug, Default)]
pub(crate) struct Segment {
    /// Whole frames, length prefixes included.
    pub(crate) bytes: BytesMut,
    /// How many frames `bytes` holds.
    pub(crate) frames: usize,
}

#[derive(Default)]
struct Inner {
    segments: VecDeque<Segment>,
    /// Frames in all segments.
    frames: usize,
    /// Bytes in all segments.
    bytes: usize,
    /// Emptied buffers the writer gave back.
    spare: Vec<BytesMut>,
    /// The connection whose writer may take frames, if any.
    writer: Option<u64>,
}

/// A buffer that grew past this is freed after its write instead of kept for reuse.
const KEEP_CAPACITY: usize = 4 << 20;
/// Buffers kept for reuse.
const KEEP_SPARE: usize = 2;

pub(crate) struct OutQueue {
    inner: Mutex<Inner>,
    cap: usize,
    /// Bytes the waiting frames may take (a frame into an empty queue is always taken).
    max_bytes: usize,
    per_write: usize,
    /// Wakes the writer (one waiter at a time; a notification without a waiter is kept).
    pub(crate) ready: Notify,
}

impl OutQueue {
    /// A queue of at most `cap` frames and `max_bytes` bytes (but always room for one
    /// frame), cut into writes of at most `per_write` frames.
    pub(crate) fn new(cap: usize, per_write: usize, max_bytes: usize) -> Self {
        OutQueue {
            inner: Mutex::new(Inner::default()),
            cap,
            max_bytes,
            per_write: per_write.max(1),
            ready: Notify::new(),
        }
    }

    /// Queues one encoded frame (`frame` is its length prefix and body), or refuses it if
    /// the queue is full: it holds `cap` frames, or the frame would take it past
    /// `max_bytes` (unless it is empty).
    pub(crate) fn push(&self, frame: &[u8]) -> Result<(), Full> {
        let was_empty = {
            let mut q = self.inner.lock();
            if q.frames >= self.cap
                || (q.frames > 0 && q.bytes.saturating_add(frame.len()) > self.max_bytes)
            {
                return Err(Full::Full);
            }
            let was_empty = q.frames == 0;
            let open = q.segments.back().is_some_and(|s| s.frames < self.per_write);
            if !open {
                let bytes = q.spare.pop().unwrap_or_default();
                q.segments.push_back(Segment { bytes, frames: 0 });
            }
            let seg = q.segments.back_mut().expect("a segment is open");
            seg.bytes.extend_from_slice(frame);
            seg.frames += 1;
            q.frames += 1;
            q.bytes += frame.len();
            was_empty
        };
        // The writer takes segments until the queue is empty before it waits again, so only
        // the push that makes the queue non-empty needs to wake it.
        if was_empty {
            self.ready.notify_one();
        }
        Ok(())
    }

    /// Whether a push would be refused now, whatever its size (the queue holds `cap`
    /// frames or `max_bytes` bytes).
    pub(crate) fn is_full(&self) -> bool {
        let q = self.inner.lock();
        q.frames >= self.cap || q.bytes >= self.max_bytes
    }

    /// Makes connection `writer` the only one whose writer takes frames, and wakes it if
    /// frames wait.
    pub(crate) fn assign(&self, writer: u64) {
        let waiting = {
            let mut q = self.inner.lock();
            q.writer = Some(writer);
            q.frames > 0
        };
        if waiting {
            self.ready.notify_one();
        }
    }

    /// Connection `writer` ended: if it was the assigned one, frames now wait for the next.
    pub(crate) fn release(&self, writer: u64) {
        let mut q = self.inner.lock();
        if q.writer == Some(writer) {
            q.writer = None;
        }
    }

    /// No connection's writer takes frames until the next [`assign`](Self::assign), whichever
    /// was assigned (its connection ended, perhaps without having released the lane yet).
    pub(crate) fn unassign(&self) {
        self.inner.lock().writer = None;
    }

    /// Takes the oldest segment, if any and if `writer` is the assigned connection.
    pub(crate) fn take(&self, writer: u64) -> Option<Segment> {
        let mut q = self.inner.lock();
        if q.writer != Some(writer) {
            return None;
        }
        let seg = q.segments.pop_front()?;
        q.frames -= seg.frames;
        q.bytes -= seg.bytes.len();
        Some(seg)
    }

    /// Gives a written segment's buffer back for reuse.
    pub(crate) fn recycle(&self, mut bytes: BytesMut) {
        if bytes.capacity() > KEEP_CAPACITY {
            return;
        }
        bytes.clear();
        let mut q = self.inner.lock();
        if q.spare.len() < KEEP_SPARE {
            q.spare.push(bytes);
        }
    }

    /// Adds the reply slots of the message frames waiting (not taken by any writer) to
    /// `into`: their requests have not left this node. Walks every waiting frame, so it is
    /// for rare events (a peer restarted), not the message path.
    pub(crate) fn queued_reply_ids(&self, into: &mut std::collections::HashSet<u64>) {
        reply_ids_in(&self.inner.lock().segments, into);
    }

    /// Drops every waiting frame unless a connection's writer takes frames (one is
    /// assigned); returns how many were dropped and the reply slots of the requests among
    /// them (see [`queued_reply_ids`](Self::queued_reply_ids)). For a peer given up on: rare.
    pub(crate) fn drop_waiting(&self) -> (usize, Vec<u64>) {
        let segments = {
            let mut q = self.inner.lock();
            if q.writer.is_some() || q.frames == 0 {
                return (0, Vec::new());
            }
            q.frames = 0;
            q.bytes = 0;
            std::mem::take(&mut q.segments)
        };
        let frames = segments.iter().map(|seg| seg.frames).sum();
        let mut ids = std::collections::HashSet::new();
        reply_ids_in(&segments, &mut ids);
        (frames, ids.into_iter().collect())
    }

    /// True if nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.inner.lock().frames == 0
    }

    /// Frames waiting.
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().frames
    }
}

/// Adds the reply slots of the message frames in `segments` (length-prefixed frames, as
/// queued) to `into`.
fn reply_ids_in<'a>(
    segments: impl IntoIterator<Item = &'a Segment>,
    into: &mut std::collections::HashSet<u64>,
) {
    for seg in segments {
        let mut rest = &seg.bytes[..];
        while rest.len() >= 4 {
            let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            let end = (4 + len).min(rest.len());
            into.extend(crate::frame::queued_reply_ids(&rest[..end]));
            rest = &rest[end..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_drop_newest_and_fifo_segments() {
        let q = OutQueue::new(3, 2, usize::MAX);
        q.assign(1);
        q.push(b"a").unwrap();
        q.push(b"b").unwrap();
        q.push(b"c").unwrap();
        assert!(q.is_full());
        assert_eq!(q.push(b"d"), Err(Full::Full));
        assert_eq!(q.len(), 3);
        let first = q.take(1).unwrap();
        assert_eq!((&first.bytes[..], first.frames), (&b"ab"[..], 2));
        assert_eq!(q.len(), 1);
        q.recycle(first.bytes);
        q.push(b"e").unwrap();
        let second = q.take(1).unwrap();
        assert_eq!((&second.bytes[..], second.frames), (&b"ce"[..], 2));
        assert!(q.is_empty());
        assert!(q.take(1).is_none());
    }

    /// The bytes waiting are bounded too: a frame that would take a non-empty queue past
    /// the bound is refused, one into an empty queue is always taken, and what a writer
    /// takes makes room again.
    #[test]
    fn bounded_in_bytes_with_room_for_one_frame() {
        let q = OutQueue::new(100, 10, 10);
        q.assign(1);
        q.push(&[1; 25])
            .expect("an empty queue takes a frame of any size");
        assert!(q.is_full());
        assert_eq!(q.push(b"x"), Err(Full::Full));
        q.take(1).unwrap();
        q.push(&[2; 6]).unwrap();
        q.push(&[3; 4]).unwrap();
        assert!(q.is_full());
        assert_eq!(q.push(b"y"), Err(Full::Full));
        assert_eq!(q.len(), 2);
        q.unassign();
        assert_eq!(q.drop_waiting().0, 2);
        q.push(&[4; 10]).unwrap();
        assert_eq!(
            q.push(b"z"),
            Err(Full::Full),
            "dropped frames no longer count, these do"
        );
    }

    /// A whole message frame naming reply slots `ids`.
    fn message(ids: &[u64]) -> Vec<u8> {
        let header = crate::frame::message_header("/user/a", None, "t::Msg", ids).unwrap();
        let mut frame = Vec::new();
        crate::frame::begin_message(&mut frame, &header);
        frame.extend_from_slice(b"payload");
        crate::frame::finish_frame(&mut frame, 1 << 20).unwrap();
        frame
    }

    /// The reply slots of the frames still waiting are found, across segments and among
    /// other frames; those of frames a writer took are not.
    #[test]
    fn the_reply_slots_of_waiting_message_frames_are_found() {
        let q = OutQueue::new(10, 2, usize::MAX);
        q.assign(1);
        q.push(&message(&[1, 2])).unwrap();
        q.push(&message(&[])).unwrap();
        q.push(&[0, 0, 0, 1, 9]).unwrap(); // a frame of another kind
        q.push(&message(&[3])).unwrap();
        q.push(&message(&[u64::MAX])).unwrap();
        let mut ids = std::collections::HashSet::new();
        q.queued_reply_ids(&mut ids);
        assert_eq!(ids, [1, 2, 3, u64::MAX].into());
        assert_eq!(q.take(1).unwrap().frames, 2, "the first segment is written");
        ids.clear();
        q.queued_reply_ids(&mut ids);
        assert_eq!(ids, [3, u64::MAX].into());
    }

    #[test]
    fn recycled_buffers_are_reused_empty() {
        let q = OutQueue::new(10, 1, usize::MAX);
        q.assign(1);
        q.push(b"xyz").unwrap();
        let seg = q.take(1).unwrap();
        let cap = seg.bytes.capacity();
        q.recycle(seg.bytes);
        q.push(b"k").unwrap();
        let again = q.take(1).unwrap();
        assert_eq!(&again.bytes[..], b"k");
        assert_eq!(again.bytes.capacity(), cap);
    }

    #[test]
    fn only_the_push_that_fills_an_empty_queue_wakes_the_writer() {
        use futures_util::FutureExt;
        let q = OutQueue::new(10, 10, usize::MAX);
        q.assign(1);
        q.push(b"1").unwrap();
        q.push(b"2").unwrap();
        // One stored permit from the first push ...
        assert!(q.ready.notified().now_or_never().is_some());
        // ... and none from the second.
        assert!(q.ready.notified().now_or_never().is_none());
        assert_eq!(q.take(1).unwrap().frames, 2);
        q.push(b"3").unwrap();
        assert!(q.ready.notified().now_or_never().is_some());
    }

    #[test]
    fn only_the_current_connections_writer_takes_frames() {
        use futures_util::FutureExt;
        let q = OutQueue::new(10, 10, usize::MAX);
        // Frames queued while no connection is up wait for one.
        q.push(b"1").unwrap();
        assert!(q.ready.notified().now_or_never().is_some());
        assert!(q.take(1).is_none());
        // Assigning a connection wakes its writer, which takes them.
        q.assign(1);
        assert!(q.ready.notified().now_or_never().is_some());
        assert_eq!(&q.take(1).unwrap().bytes[..], b"1");
        // Connection 2 replaces 1: the old writer, back from a long write, gets nothing.
        q.assign(2);
        q.push(b"2").unwrap();
        assert!(q.take(1).is_none());
        // An old connection ending does not take the lane from the new one.
        q.release(1);
        assert_eq!(&q.take(2).unwrap().bytes[..], b"2");
        // Unassigned, no writer takes frames, not even the current one's.
        q.unassign();
        q.push(b"u").unwrap();
        assert!(q.take(2).is_none());
        q.assign(2);
        assert_eq!(&q.take(2).unwrap().bytes[..], b"u");
        // The current one ending leaves frames for the next.
        q.release(2);
        q.push(b"3").unwrap();
        assert!(q.take(2).is_none());
        assert_eq!(q.len(), 1);
        q.assign(3);
        assert_eq!(&q.take(3).unwrap().bytes[..], b"3");
    }
}
