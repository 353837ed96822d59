//! Encode and decode cost per message, in this process (no network).
//!
//! The message is the throughput benchmarks' `BenchMsg::Data` with its 100-byte payload.
//! shardik's encode is what a tell does to it before queueing and what the writer does to
//! the frame: the default `PayloadFormat` (named-field MessagePack) of the message, an
//! `Envelope` (recipient path, type tag) in a `Frame::Message`, and `encode_frame` with its
//! length prefix into the write buffer. (Not included: the thread-local wire context a tell sets around serialization so
//! that `ReplyTo`s inside can be exported, and the queue.) Decode is what the reader does:
//! `Frame::decode_body` of the frame body (payload sliced, not copied) and the default
//! `PayloadFormat` into the recipient's message type. The baseline is `rmp_serde::to_vec_named` /
//! `rmp_serde::from_slice` of the bare message, so the ratio is the envelope's overhead.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use shardik::remote::codec::{encode_frame, DEFAULT_MAX_FRAME_LEN, LEN_PREFIX};
use shardik::remote::frame::{Envelope, Frame};
use shardik::remote::PayloadFormat;

use super::{payload, sink_path, BenchMsg, Ctx, SUITE};
use crate::harness::Contender;
use crate::report::{Better, Record};

/// Encoding one message into a frame.
pub const ENCODE: &str = "remote_encode_ns";
/// Decoding one frame into a message.
pub const DECODE: &str = "remote_decode_ns";

fn message() -> BenchMsg {
    BenchMsg::Data { payload: payload() }
}

fn frame_for(
    format: &PayloadFormat,
    msg: &BenchMsg,
    recipient: &Arc<str>,
    type_tag: &Arc<str>,
) -> Frame {
    Frame::Message(Envelope {
        recipient: recipient.clone(),
        sender: None,
        type_tag: type_tag.clone(),
        reply_ids: Vec::new(),
        payload: Bytes::from(format.encode(msg).expect("the message encodes")),
    })
}

/// `remote_encode_ns`.
pub fn encode(ctx: &Ctx) -> Vec<Record> {
    let n = ctx.sizes.codec;
    let recipient: Arc<str> = sink_path(0).into();
    let type_tag: Arc<str> = std::any::type_name::<BenchMsg>().into();
    let format = PayloadFormat::default();
    let mut contenders = [
        Contender::new("shardik", || {
            let mut buf = BytesMut::with_capacity(64 * 1024);
            let start = Instant::now();
            for _ in 0..n {
                let msg = message();
                let frame = frame_for(&format, black_box(&msg), &recipient, &type_tag);
                encode_frame(&frame, &mut buf, DEFAULT_MAX_FRAME_LEN).expect("frame encodes");
                black_box(&buf);
                buf.clear();
            }
            vec![start.elapsed().as_nanos() as f64 / n as f64]
        }),
        Contender::new("rmp_serde", || {
            let start = Instant::now();
            for _ in 0..n {
                let msg = message();
                black_box(rmp_serde::to_vec_named(black_box(&msg)).expect("encodes"));
            }
            vec![start.elapsed().as_nanos() as f64 / n as f64]
        }),
    ];
    let m = ctx.alternate(&mut contenders);
    vec![Record::new(
        SUITE,
        ENCODE,
        m[0][0],
        m[1][0],
        "ns",
        Better::Lower,
    )]
}

/// `remote_decode_ns`.
pub fn decode(ctx: &Ctx) -> Vec<Record> {
    let n = ctx.sizes.codec;
    let recipient: Arc<str> = sink_path(0).into();
    let type_tag: Arc<str> = std::any::type_name::<BenchMsg>().into();
    let format = PayloadFormat::default();
    let mut wire = BytesMut::new();
    encode_frame(
        &frame_for(&format, &message(), &recipient, &type_tag),
        &mut wire,
        DEFAULT_MAX_FRAME_LEN,
    )
    .expect("frame encodes");
    let body = wire.freeze().slice(LEN_PREFIX..);
    let bare = rmp_serde::to_vec_named(&message()).expect("encodes");
    let check = |msg: &BenchMsg| {
        assert!(matches!(msg, BenchMsg::Data { payload } if payload.len() == super::PAYLOAD));
    };
    let mut contenders = [
        Contender::new("shardik", || {
            let start = Instant::now();
            for _ in 0..n {
                let Frame::Message(env) =
                    Frame::decode_body(black_box(body.clone())).expect("frame decodes")
                else {
                    panic!("a message frame");
                };
                let msg: BenchMsg = format.decode(&env.payload).expect("payload decodes");
                black_box(&msg);
            }
            let ns = start.elapsed().as_nanos() as f64 / n as f64;
            let Frame::Message(env) = Frame::decode_body(body.clone()).expect("decodes") else {
                panic!("a message frame");
            };
            check(&format.decode(&env.payload).expect("payload decodes"));
            vec![ns]
        }),
        Contender::new("rmp_serde", || {
            let start = Instant::now();
            for _ in 0..n {
                let msg: BenchMsg = rmp_serde::from_slice(black_box(&bare)).expect("decodes");
                black_box(&msg);
            }
            let ns = start.elapsed().as_nanos() as f64 / n as f64;
            check(&rmp_serde::from_slice(&bare).expect("decodes"));
            vec![ns]
        }),
    ];
    let m = ctx.alternate(&mut contenders);
    vec![Record::new(
        SUITE,
        DECODE,
        m[0][0],
        m[1][0],
        "ns",
        Better::Lower,
    )]
}
