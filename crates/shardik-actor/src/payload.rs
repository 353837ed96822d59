//! Payload formats: the serde data format that messages and replies travel in between nodes.
//!
//! [`PayloadFormat::message_pack`] (MessagePack with named fields, `rmp_serde::to_vec_named`)
//! is the default: a field added with `#[serde(default)]` can be read by older and newer nodes
//! alike. Any other serde format plugs in through a [`PayloadCodec`], a trait object that
//! works on type-erased values ([`erased_serde`]), so one codec serves every message type.
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use shardik_actor::wire::{PayloadCodec, PayloadFormat, Visit};
//!
//! /// MessagePack with structs as arrays: smaller, but a field cannot be added later.
//! struct CompactMessagePack;
//!
//! impl PayloadCodec for CompactMessagePack {
//!     fn name(&self) -> &str {
//!         "msgpack-compact"
//!     }
//!     fn encode(&self, value: &dyn erased_serde::Serialize) -> Result<Vec<u8>, String> {
//!         rmp_serde::to_vec(value).map_err(|e| e.to_string())
//!     }
//!     fn decode<'de>(
//!         &self,
//!         bytes: &'de [u8],
//!         visit: &mut Visit<'_, 'de>,
//!     ) -> Result<(), String> {
//!         let mut de = rmp_serde::Deserializer::from_read_ref(bytes);
//!         visit(&mut <dyn erased_serde::Deserializer>::erase(&mut de)).map_err(|e| e.to_string())
//!     }
//! }
//!
//! #[derive(Debug, PartialEq, Serialize, Deserialize)]
//! struct Point { x: i32, y: i32 }
//!
//! let format = PayloadFormat::custom(CompactMessagePack);
//! let bytes = format.encode(&Point { x: 1, y: 2 }).unwrap();
//! assert_eq!(bytes, [0x92, 1, 2]);
//! assert_eq!(format.decode::<Point>(&bytes).unwrap(), Point { x: 1, y: 2 });
//! assert_eq!(format.name(), "msgpack-compact");
//! assert_eq!(PayloadFormat::default().name(), "msgpack-named");
//! ```

use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// What [`PayloadCodec::decode`] runs with the deserializer it makes: it deserializes the
/// value the caller wants and keeps it.
pub type Visit<'v, 'de> =
    dyn FnMut(&mut dyn erased_serde::Deserializer<'de>) -> Result<(), erased_serde::Error> + 'v;

/// A serde data format for message and reply payloads, as a trait object.
///
/// Implement it for a format and install it with [`PayloadFormat::custom`]. Both ends of a
/// connection must use the same format: transports compare [`name`](PayloadCodec::name)s.
pub trait PayloadCodec: Send + Sync + 'static {
    /// The format's name, such as `"json"`: nodes whose names differ refuse each other.
    fn name(&self) -> &str;

    /// Encodes `value`; `Err` says why it cannot be.
    fn encode(&self, value: &dyn erased_serde::Serialize) -> Result<Vec<u8>, String>;

    /// Makes a deserializer over all of `bytes` and runs `visit` with it (once); `Err` says
    /// why the bytes do not decode (including bytes left over after the value).
    fn decode<'de>(&self, bytes: &'de [u8], visit: &mut Visit<'_, 'de>) -> Result<(), String>;
}

/// The payload format of a node: MessagePack with named fields (the default, encoded without
/// any dynamic dispatch) or a [`PayloadCodec`]. Cloning is cheap.
#[derive(Clone, Default)]
pub struct PayloadFormat(Repr);

#[derive(Clone, Default)]
enum Repr {
    #[default]
    MessagePackNamed,
    Codec(Arc<dyn PayloadCodec>),
}

impl PayloadFormat {
    /// The name of [`PayloadFormat::message_pack`].
    pub const MESSAGE_PACK_NAMED: &'static str = "msgpack-named";

    /// MessagePack with named fields (`rmp_serde::to_vec_named`), the default.
    pub fn message_pack() -> Self {
        PayloadFormat(Repr::MessagePackNamed)
    }

    /// A format given by a [`PayloadCodec`].
    pub fn custom(codec: impl PayloadCodec) -> Self {
        PayloadFormat(Repr::Codec(Arc::new(codec)))
    }

    /// The format's name, compared between nodes.
    pub fn name(&self) -> &str {
        match &self.0 {
            Repr::MessagePackNamed => Self::MESSAGE_PACK_NAMED,
            Repr::Codec(c) => c.name(),
        }
    }

    /// Encodes `value` in this format.
    #[inline]
    pub fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>, String> {
        match &self.0 {
            Repr::MessagePackNamed => rmp_serde::to_vec_named(value).map_err(|e| e.to_string()),
            Repr::Codec(c) => encode_with(&**c, &value),
        }
    }

    /// Appends `value`, encoded in this format, to `buf`.
    #[inline]
    pub fn encode_into<T: Serialize + ?Sized>(
        &self,
        value: &T,
        buf: &mut Vec<u8>,
    ) -> Result<(), String> {
        match &self.0 {
            Repr::MessagePackNamed => {
                rmp_serde::encode::write_named(buf, value).map_err(|e| e.to_string())
            }
            Repr::Codec(c) => encode_with(&**c, &value).map(|bytes| buf.extend_from_slice(&bytes)),
        }
    }

    /// Decodes a `T` from `bytes` in this format.
    #[inline]
    pub fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, String> {
        match &self.0 {
            Repr::MessagePackNamed => rmp_serde::from_slice(bytes).map_err(|e| e.to_string()),
            Repr::Codec(c) => decode_with(&**c, bytes),
        }
    }
}

// The codec paths stay out of line so that the default path inlines as plain rmp_serde.
#[inline(never)]
fn encode_with(
    codec: &dyn PayloadCodec,
    value: &dyn erased_serde::Serialize,
) -> Result<Vec<u8>, String> {
    codec.encode(value)
}

#[inline(never)]
fn decode_with<T: DeserializeOwned>(codec: &dyn PayloadCodec, bytes: &[u8]) -> Result<T, String> {
    let mut out = None;
    codec.decode(bytes, &mut |de| {
        out = Some(erased_serde::deserialize::<T>(de)?);
        Ok(())
    })?;
    out.ok_or_else(|| format!("payload codec {:?} did not decode a value", codec.name()))
}

impl fmt::Debug for PayloadFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PayloadFormat").field(&self.name()).finish()
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Msg {
        name: String,
        n: u64,
    }

    /// A codec that uses MessagePack through the erased path and counts nothing else.
    struct ErasedMessagePack;

    impl PayloadCodec for ErasedMessagePack {
        fn name(&self) -> &str {
            "erased-msgpack"
        }
        fn encode(&self, value: &dyn erased_serde::Serialize) -> Result<Vec<u8>, String> {
            rmp_serde::to_vec_named(value).map_err(|e| e.to_string())
        }
        fn decode<'de>(&self, bytes: &'de [u8], visit: &mut Visit<'_, 'de>) -> Result<(), String> {
            let mut de = rmp_serde::Deserializer::from_read_ref(bytes);
            visit(&mut <dyn erased_serde::Deserializer>::erase(&mut de)).map_err(|e| e.to_string())
        }
    }

    #[test]
    fn the_erased_path_matches_the_direct_one() {
        let msg = Msg {
            name: "a".into(),
            n: 7,
        };
        let direct = PayloadFormat::message_pack().encode(&msg).unwrap();
        let erased = PayloadFormat::custom(ErasedMessagePack);
        assert_eq!(erased.encode(&msg).unwrap(), direct);
        assert_eq!(erased.decode::<Msg>(&direct).unwrap(), msg);
        let err = erased.decode::<Msg>(&[0xc1]).unwrap_err();
        assert!(!err.is_empty());
        assert_eq!(format!("{erased:?}"), "PayloadFormat(\"erased-msgpack\")");
    }

    #[test]
    fn a_codec_that_never_visits_is_an_error() {
        struct Lazy;
        impl PayloadCodec for Lazy {
            fn name(&self) -> &str {
                "lazy"
            }
            fn encode(&self, _: &dyn erased_serde::Serialize) -> Result<Vec<u8>, String> {
                Ok(Vec::new())
            }
            fn decode<'de>(&self, _: &'de [u8], _: &mut Visit<'_, 'de>) -> Result<(), String> {
                Ok(())
            }
        }
        let err = PayloadFormat::custom(Lazy).decode::<Msg>(b"").unwrap_err();
        assert_eq!(err, "payload codec \"lazy\" did not decode a value");
    }
}
