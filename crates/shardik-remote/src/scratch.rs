//! Per-thread scratch buffers that outgoing frames are built in, so building one costs no
//! allocation once the buffer has grown to the usual frame size.

use std::cell::RefCell;
use std::thread::LocalKey;

use bytes::BytesMut;

/// A buffer that can serve as scratch space.
pub(crate) trait ScratchBuf: Default {
    /// Empties it, keeping its capacity.
    fn clear(&mut self);
    /// Bytes it can hold without growing.
    fn capacity(&self) -> usize;
}

impl ScratchBuf for Vec<u8> {
    fn clear(&mut self) {
        Vec::clear(self)
    }
    fn capacity(&self) -> usize {
        Vec::capacity(self)
    }
}

impl ScratchBuf for BytesMut {
    fn clear(&mut self) {
        BytesMut::clear(self)
    }
    fn capacity(&self) -> usize {
        BytesMut::capacity(self)
    }
}

/// A scratch buffer that grew past this (one unusually large frame) is freed afterwards.
const KEEP: usize = 64 * 1024;

/// Runs `f` with this thread's scratch buffer in `key`, emptied, or with a fresh one while
/// that is in use (a message whose serialization sends another message on this thread).
pub(crate) fn with_scratch<B: ScratchBuf + 'static, T>(
    key: &'static LocalKey<RefCell<B>>,
    f: impl FnOnce(&mut B) -> T,
) -> T {
    key.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            let out = f(&mut buf);
            if buf.capacity() > KEEP {
                *buf = B::default();
            }
            out
        }
        Err(_) => f(&mut B::default()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }

    #[test]
    fn reuses_the_buffer_and_falls_back_when_nested() {
        let cap = with_scratch(&BUF, |b| {
            b.extend_from_slice(b"hello");
            // Nested use gets a fresh, empty buffer.
            with_scratch(&BUF, |inner| {
                assert!(inner.is_empty());
                inner.push(1);
            });
            assert_eq!(b, b"hello");
            b.capacity()
        });
        with_scratch(&BUF, |b| {
            assert!(b.is_empty(), "emptied before reuse");
            assert_eq!(b.capacity(), cap, "kept");
        });
        with_scratch(&BUF, |b| b.resize(KEEP + 1, 0));
        with_scratch(&BUF, |b| {
            assert!(b.capacity() <= KEEP, "an oversized buffer is freed")
        });
    }
}
