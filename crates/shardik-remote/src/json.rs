//! [`JsonCodec`]: JSON payloads, the second built-in payload format.

use shardik_actor::wire::{erased_serde, PayloadCodec, PayloadFormat, Visit};

/// Message and reply payloads as JSON (`serde_json`), through the pluggable
/// [`PayloadCodec`] seam. Larger and slower than the default MessagePack, but readable in a
/// packet capture and by tools of other languages; like the default it keeps field names, so
/// a field added with `#[serde(default)]` is read by older and newer nodes alike.
///
/// Every node of a cluster must use the same format (the handshake refuses a mismatch):
///
/// ```
/// use shardik_remote::{JsonCodec, RemoteConfig};
/// let cfg = RemoteConfig::new("prod", "node-1").payload_format(JsonCodec::format());
/// assert_eq!(cfg.payload_format.name(), "json");
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonCodec;

impl JsonCodec {
    /// The name compared in the handshake.
    pub const NAME: &'static str = "json";

    /// This codec as a [`PayloadFormat`].
    pub fn format() -> PayloadFormat {
        PayloadFormat::custom(JsonCodec)
    }
}

impl PayloadCodec for JsonCodec {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn encode(&self, value: &dyn erased_serde::Serialize) -> Result<Vec<u8>, String> {
        serde_json::to_vec(value).map_err(|e| e.to_string())
    }

    fn decode<'de>(&self, bytes: &'de [u8], visit: &mut Visit<'_, 'de>) -> Result<(), String> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        visit(&mut <dyn erased_serde::Deserializer>::erase(&mut de)).map_err(|e| e.to_string())?;
        de.end().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Msg {
        Greet { name: String, times: u32 },
    }

    #[test]
    fn round_trips_as_json_with_field_names() {
        let f = JsonCodec::format();
        let msg = Msg::Greet {
            name: "x".into(),
            times: 2,
        };
        let bytes = f.encode(&msg).unwrap();
        assert_eq!(bytes, br#"{"Greet":{"name":"x","times":2}}"#);
        assert_eq!(f.decode::<Msg>(&bytes).unwrap(), msg);
    }

    #[test]
    fn trailing_bytes_and_bad_json_are_errors() {
        let f = JsonCodec::format();
        let err = f.decode::<u32>(b"1 2").unwrap_err();
        assert!(err.contains("trailing characters"), "{err}");
        assert!(f.decode::<u32>(b"\"x\"").is_err());
    }
}
