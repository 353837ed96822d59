//! Cutting frames out of a byte stream and writing them into one.
//!
//! A frame on the wire is a `u32` big-endian body length followed by the body
//! ([`Frame::encode_body`]). A length over the configured maximum (default
//! [`DEFAULT_MAX_FRAME_LEN`], 4 MiB) is rejected before any of the body is buffered, so a
//! peer cannot make a node allocate more than the limit per connection.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::error::FrameError;
use crate::frame::Frame;

/// Default maximum frame body size: 4 MiB.
pub const DEFAULT_MAX_FRAME_LEN: usize = 4 * 1024 * 1024;

/// Length prefix size.
pub const LEN_PREFIX: usize = 4;

/// A [`tokio_util::codec`] codec for [`Frame`]s with a maximum body size.
#[derive(Clone, Copy, Debug)]
pub struct FrameCodec {
    max_frame_len: usize,
}

impl FrameCodec {
    /// A codec that refuses bodies longer than `max_frame_len` bytes.
    pub fn new(max_frame_len: usize) -> Self {
        FrameCodec {
            max_frame_len: max_frame_len.min(u32::MAX as usize),
        }
    }

    /// The configured maximum body size.
    pub fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }
}

impl Default for FrameCodec {
    fn default() -> Self {
        FrameCodec::new(DEFAULT_MAX_FRAME_LEN)
    }
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        match cut_body(src, self.max_frame_len)? {
            Some(body) => Frame::decode_body(body).map(Some),
            None => Ok(None),
        }
    }
}

/// Like [`FrameCodec`] but yields raw frame bodies, so that a connection can skip a body that
/// does not parse and keep reading (only a bad length prefix ends the stream).
#[derive(Clone, Copy, Debug)]
pub struct BodyCodec {
    max_frame_len: usize,
}

impl BodyCodec {
    /// A codec that refuses bodies longer than `max_frame_len` bytes.
    pub fn new(max_frame_len: usize) -> Self {
        BodyCodec {
            max_frame_len: max_frame_len.min(u32::MAX as usize),
        }
    }
}

impl BodyCodec {
    /// Changes the limit (after the handshake, whose frames have a smaller one).
    pub fn set_max_frame_len(&mut self, max_frame_len: usize) {
        self.max_frame_len = max_frame_len.min(u32::MAX as usize);
    }
}

/// The largest frame accepted while a connection is in its handshake (which exchanges small
/// frames: identities, nonces, proofs). A peer not yet authenticated cannot make this node
/// buffer a `max_frame_len` body.
pub const HANDSHAKE_MAX_FRAME_LEN: usize = 64 * 1024;

impl Default for BodyCodec {
    fn default() -> Self {
        BodyCodec::new(DEFAULT_MAX_FRAME_LEN)
    }
}

impl Decoder for BodyCodec {
    type Item = Bytes;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Bytes>, FrameError> {
        cut_body(src, self.max_frame_len)
    }
}

/// Cuts one frame body off the front of `src` (zero-copy), if a whole one is there.
fn cut_body(src: &mut BytesMut, max: usize) -> Result<Option<Bytes>, FrameError> {
    if src.len() < LEN_PREFIX {
        return Ok(None);
    }
    let len = u32::from_be_bytes([src[0], src[1], src[2], src[3]]) as usize;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    if src.len() < LEN_PREFIX + len {
        src.reserve(LEN_PREFIX + len - src.len());
        return Ok(None);
    }
    src.advance(LEN_PREFIX);
    Ok(Some(src.split_to(len).freeze()))
}

impl Encoder<&Frame> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: &Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        encode_frame(frame, dst, self.max_frame_len)
    }
}

/// Appends `frame` with its length prefix to `dst`. A body over `max_frame_len` is refused
/// (and `dst` left as it was), so the receiver never sees an oversized frame from us.
pub fn encode_frame(
    frame: &Frame,
    dst: &mut BytesMut,
    max_frame_len: usize,
) -> Result<(), FrameError> {
    let start = dst.len();
    dst.put_u32(0);
    if let Err(e) = frame.encode_body(dst) {
        dst.truncate(start);
        return Err(e);
    }
    let len = dst.len() - start - LEN_PREFIX;
    if len > max_frame_len {
        dst.truncate(start);
        return Err(FrameError::TooLarge {
            len,
            max: max_frame_len,
        });
    }
    dst[start..start + LEN_PREFIX].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::tests::samples;
    use proptest::prelude::*;

    fn encode_all(frames: &[Frame]) -> BytesMut {
        let mut buf = BytesMut::new();
        for f in frames {
            encode_frame(f, &mut buf, DEFAULT_MAX_FRAME_LEN).unwrap();
        }
        buf
    }

    /// Feeds `bytes` to a fresh decoder in chunks, collecting frames until the first error.
    fn feed(bytes: &[u8], chunk: usize, max: usize) -> (Vec<Frame>, Option<FrameError>) {
        let mut codec = FrameCodec::new(max);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in bytes.chunks(chunk.max(1)) {
            buf.extend_from_slice(piece);
            loop {
                match codec.decode(&mut buf) {
                    Ok(Some(f)) => out.push(f),
                    Ok(None) => break,
                    Err(e) => return (out, Some(e)),
                }
            }
        }
        (out, None)
    }

    #[test]
    fn stream_of_frames_round_trips_in_any_chunking() {
        let frames = samples();
        let bytes = encode_all(&frames);
        for chunk in [1, 2, 3, 7, 64, bytes.len()] {
            let (got, err) = feed(&bytes, chunk, DEFAULT_MAX_FRAME_LEN);
            assert!(err.is_none());
            assert_eq!(got, frames, "chunk size {chunk}");
        }
    }

    #[test]
    fn oversized_length_is_refused_before_buffering() {
        let mut buf = BytesMut::new();
        buf.put_u32(1025);
        buf.put_u8(6);
        let mut codec = FrameCodec::new(1024);
        assert!(matches!(
            codec.decode(&mut buf),
            Err(FrameError::TooLarge {
                len: 1025,
                max: 1024
            })
        ));
    }

    #[test]
    fn encoder_refuses_bodies_over_the_limit() {
        let frame = Frame::Reply {
            id: 1,
            payload: vec![0u8; 2000].into(),
        };
        let mut buf = BytesMut::from(&b"keep"[..]);
        assert!(matches!(
            encode_frame(&frame, &mut buf, 1000),
            Err(FrameError::TooLarge { .. })
        ));
        assert_eq!(&buf[..], b"keep");
    }

    #[test]
    fn truncated_stream_yields_the_complete_prefix_only() {
        let frames = samples();
        let bytes = encode_all(&frames);
        for cut in 0..bytes.len() {
            let (got, err) = feed(&bytes[..cut], 5, DEFAULT_MAX_FRAME_LEN);
            assert!(err.is_none(), "cut at {cut}: {err:?}");
            assert_eq!(&got[..], &frames[..got.len()]);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512), chunk in 1usize..64) {
            let _ = feed(&bytes, chunk, 256);
        }

        #[test]
        fn arbitrary_bodies_never_panic(kind in 0u8..12, rest in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut body = vec![kind];
            body.extend_from_slice(&rest);
            let _ = Frame::decode_body(body.into());
        }

        #[test]
        fn corrupted_valid_streams_never_panic(
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
            cut in any::<usize>(),
        ) {
            let mut bytes = encode_all(&samples()).to_vec();
            for (at, v) in flips {
                let i = at % bytes.len();
                bytes[i] = v;
            }
            let cut = cut % (bytes.len() + 1);
            let _ = feed(&bytes[..cut], 3, 4096);
        }

        #[test]
        fn arbitrary_messages_round_trip(
            recipient in ".{0,40}",
            sender in proptest::option::of(".{0,20}"),
            ids in proptest::collection::vec(any::<u64>(), 0..4),
            payload in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let frame = Frame::Message(crate::frame::Envelope {
                recipient: recipient.as_str().into(),
                sender: sender.map(|s| s.as_str().into()),
                type_tag: "t".into(),
                reply_ids: ids,
                payload: payload.into(),
            });
            let bytes = encode_all(std::slice::from_ref(&frame));
            let (got, err) = feed(&bytes, 13, DEFAULT_MAX_FRAME_LEN);
            prop_assert!(err.is_none());
            prop_assert_eq!(got, vec![frame]);
        }
    }
}
