//! The value tree an older record is upcast in ([`Versioned::upcast`](crate::Versioned)):
//! a stored MessagePack record as JSON-like data, and back into the current type.
//!
//! MessagePack holds more than JSON: binary values (`serde_bytes`, and types such as `Uuid`
//! that serialize as bytes in a compact format, which the record's encoder is) and map keys
//! that are not strings (a `HashMap<u64, _>`). `serde_json`'s own visitor refuses both, so
//! such a record could not be upcast at all. Here binary values become arrays of byte
//! numbers and keys their JSON text (`7` → `"7"`); the tree is then decoded as JSON, as
//! before (which parses `"7"` back into an integer key, and fills a `serde_bytes` field from
//! an array), or, where that fails, the way records are written: as MessagePack, not
//! human-readable, where a compact `Uuid` takes the array of its 16 bytes. So a record that
//! decoded before decodes to the same value; only those that failed take the second path.
//! That path is rmp-serde's, which is lenient where JSON is strict: it reads a number as an
//! enum variant by its index, for one, so a field whose type changed from a number to an enum
//! needs an upcaster that says how. Not covered: one record that holds both a compact `Uuid`
//! and integer map keys (neither path reads both), byte-string map keys that are not UTF-8,
//! map keys that are neither a string, a number nor a boolean (a tuple, a `Vec`, a struct, an
//! enum variant with data, `None` or `()`; `Some(x)` is stored as `x` and read), which a JSON
//! object has no key for, and `i128`/`u128` values (stored as 16 bytes); NaN and infinities
//! become `null`.

use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// The stored MessagePack `bytes` as a JSON value tree.
pub(crate) fn to_tree(bytes: &[u8]) -> Result<Value, String> {
    let mut de = rmp_serde::Deserializer::from_read_ref(bytes);
    Tree.deserialize(&mut de).map_err(|e| e.to_string())
}

/// Decodes `T` from an (upcast) value tree: as JSON, then as MessagePack (see the module
/// docs).
pub(crate) fn from_tree<T: DeserializeOwned>(tree: Value) -> Result<T, String> {
    match T::deserialize(&tree) {
        Ok(value) => Ok(value),
        Err(json_error) => {
            let packed = rmp_serde::to_vec_named(&tree).map_err(|e| e.to_string())?;
            rmp_serde::from_slice::<T>(&packed).map_err(|packed_error| {
                format!("{json_error} (read as MessagePack: {packed_error})")
            })
        }
    }
}

/// Deserializes any MessagePack value into a JSON value.
struct Tree;

impl<'de> DeserializeSeed<'de> for Tree {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a MessagePack value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // As `serde_json` does: a NaN or an infinity has no JSON number.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_bytes<E>(self, v: &[u8]) -> Result<Value, E> {
        Ok(Value::Array(v.iter().map(|b| Value::from(*b)).collect()))
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Tree.deserialize(d)
    }

    fn visit_newtype_struct<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Tree.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element_seed(Tree)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key_seed(Key)? {
            let value = map.next_value_seed(Tree)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// A map key as JSON object keys are: its text.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = String;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map key (a string, a number or a boolean)")
    }

    fn visit_bool<E>(self, v: bool) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_i64<E>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_u64<E>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_f64<E>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_str<E>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_string<E>(self, v: String) -> Result<String, E> {
        Ok(v)
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<String, E> {
        String::from_utf8(v.to_vec()).map_err(|_| E::invalid_value(de::Unexpected::Bytes(v), &self))
    }
}
