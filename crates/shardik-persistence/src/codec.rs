//! Self-describing payloads: [`Versioned`] types, [`Payload`] and the upcasting decoder.
//!
//! Every stored event, snapshot and durable state is a [`Payload`]: the type's name, its
//! schema version and its value as MessagePack with named fields (`rmp_serde::to_vec_named`),
//! so a stored record can be read without the code that wrote it and a field can be added
//! later. Reading an older version decodes the record into a generic value tree, passes it
//! through [`Versioned::upcast`] and then into the current type.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::CodecError;

/// A type that can be stored: serde plus a stable name and a schema version.
///
/// Bump [`VERSION`](Versioned::VERSION) when the stored shape changes and teach
/// [`upcast`](Versioned::upcast) to turn an older value into the current shape.
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use shardik_persistence::Versioned;
///
/// #[derive(Serialize, Deserialize)]
/// enum AccountEvent {
///     // Version 1 had no `note`; version 2 added it.
///     Deposited { amount: u64, note: String },
/// }
///
/// impl Versioned for AccountEvent {
///     const TYPE_NAME: &'static str = "bank.AccountEvent";
///     const VERSION: u32 = 2;
///     fn upcast(from: u32, mut value: serde_json::Value) -> Result<serde_json::Value, String> {
///         if from < 2 {
///             if let Some(body) = value.get_mut("Deposited").and_then(|b| b.as_object_mut()) {
///                 body.insert("note".into(), "(before notes)".into());
///             }
///         }
///         Ok(value)
///     }
/// }
/// ```
pub trait Versioned: Serialize + DeserializeOwned + Send + 'static {
    /// A stable name stored with every record (keep it when renaming the Rust type).
    const TYPE_NAME: &'static str;
    /// The current schema version (default 1).
    const VERSION: u32 = 1;

    /// Turns the value tree of a record written as version `from_version` (older than
    /// [`VERSION`](Versioned::VERSION)) into the shape of the current version. The tree is
    /// the stored value as JSON-like data (structs are maps by field name, enums are
    /// externally tagged; binary values, such as a `Uuid` or `serde_bytes` field, are arrays
    /// of byte numbers, and map keys that are numbers are their text, `"7"`). The default
    /// returns it unchanged, which is enough when new fields carry `#[serde(default)]`.
    fn upcast(from_version: u32, value: serde_json::Value) -> Result<serde_json::Value, String> {
        let _ = from_version;
        Ok(value)
    }
}

/// `rmp_serde::to_vec_named` into a buffer sized for a typical small record: starting empty,
/// the buffer was reallocated two or three times per event as it grew.
fn to_vec_named<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, rmp_serde::encode::Error> {
    let mut bytes = Vec::with_capacity(64);
    rmp_serde::encode::write_named(&mut bytes, value)?;
    Ok(bytes)
}

/// A stored value: type name, schema version and named-field MessagePack bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    /// The [`Versioned::TYPE_NAME`] of the value.
    pub type_name: String,
    /// The [`Versioned::VERSION`] it was written with.
    pub version: u32,
    /// The value as MessagePack with named fields.
    pub bytes: Vec<u8>,
}

impl Payload {
    /// Encodes `value` as the current version of its type.
    pub fn encode<T: Versioned>(value: &T) -> Result<Payload, CodecError> {
        let bytes = to_vec_named(value).map_err(|e| CodecError::Encode {
            type_name: T::TYPE_NAME,
            reason: e.to_string(),
        })?;
        Ok(Payload {
            type_name: T::TYPE_NAME.to_string(),
            version: T::VERSION,
            bytes,
        })
    }

    /// Encodes `value` under an explicit type name and version, for tools and tests that
    /// write records of older versions.
    pub fn encode_as<T: Serialize>(
        type_name: &str,
        version: u32,
        value: &T,
    ) -> Result<Payload, CodecError> {
        let bytes = to_vec_named(value).map_err(|e| CodecError::Encode {
            type_name: std::any::type_name::<T>(),
            reason: e.to_string(),
        })?;
        Ok(Payload {
            type_name: type_name.to_string(),
            version,
            bytes,
        })
    }

    /// Decodes the payload as `T`, upcasting an older version first.
    pub fn decode<T: Versioned>(&self) -> Result<T, CodecError> {
        if self.type_name != T::TYPE_NAME {
            return Err(CodecError::WrongType {
                expected: T::TYPE_NAME,
                found: self.type_name.clone(),
            });
        }
        let fail = |reason: String| CodecError::Decode {
            type_name: self.type_name.clone(),
            version: self.version,
            reason,
        };
        if self.version > T::VERSION {
            return Err(CodecError::NewerVersion {
                type_name: T::TYPE_NAME,
                found: self.version,
                supported: T::VERSION,
            });
        }
        if self.version == T::VERSION {
            return rmp_serde::from_slice(&self.bytes).map_err(|e| fail(e.to_string()));
        }
        let tree = crate::value_tree::to_tree(&self.bytes).map_err(fail)?;
        let tree = T::upcast(self.version, tree).map_err(fail)?;
        crate::value_tree::from_tree(tree).map_err(fail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Ev {
        Opened,
        Deposited {
            amount: u64,
            #[serde(default)]
            memo: String,
        },
        Renamed(String),
    }

    impl Versioned for Ev {
        const TYPE_NAME: &'static str = "test.Ev";
        const VERSION: u32 = 3;
        fn upcast(from: u32, mut v: serde_json::Value) -> Result<serde_json::Value, String> {
            if from < 3 {
                if let Some(b) = v.get_mut("Deposited").and_then(|b| b.as_object_mut()) {
                    b.insert("memo".into(), format!("v{from}").into());
                }
            }
            Ok(v)
        }
    }

    #[test]
    fn round_trips_every_variant_shape() {
        for ev in [
            Ev::Opened,
            Ev::Deposited {
                amount: u64::MAX,
                memo: "x".into(),
            },
            Ev::Renamed("bob".into()),
        ] {
            let p = Payload::encode(&ev).unwrap();
            assert_eq!((p.type_name.as_str(), p.version), ("test.Ev", 3));
            assert_eq!(p.decode::<Ev>().unwrap(), ev);
        }
    }

    #[test]
    fn upcasts_every_variant_shape_from_an_older_version() {
        #[derive(Serialize)]
        enum V1 {
            Opened,
            Deposited { amount: u64 },
            Renamed(String),
        }
        let old = |v: &V1| Payload::encode_as("test.Ev", 1, v).unwrap();
        assert_eq!(old(&V1::Opened).decode::<Ev>().unwrap(), Ev::Opened);
        assert_eq!(
            old(&V1::Deposited { amount: 7 }).decode::<Ev>().unwrap(),
            Ev::Deposited {
                amount: 7,
                memo: "v1".into()
            }
        );
        assert_eq!(
            old(&V1::Renamed("a".into())).decode::<Ev>().unwrap(),
            Ev::Renamed("a".into())
        );
    }

    /// Bytes that serialize as a binary value, as `serde_bytes` and `Uuid` do in compact
    /// formats, and read back from a binary value or a sequence of byte numbers.
    #[derive(Debug, PartialEq)]
    struct Blob(Vec<u8>);

    impl Serialize for Blob {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(&self.0)
        }
    }

    impl<'de> Deserialize<'de> for Blob {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Blob, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Blob;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("bytes")
                }
                fn visit_bytes<E>(self, v: &[u8]) -> Result<Blob, E> {
                    Ok(Blob(v.to_vec()))
                }
                fn visit_seq<A: serde::de::SeqAccess<'de>>(
                    self,
                    mut a: A,
                ) -> Result<Blob, A::Error> {
                    let mut v = Vec::new();
                    while let Some(b) = a.next_element()? {
                        v.push(b);
                    }
                    Ok(Blob(v))
                }
            }
            d.deserialize_bytes(V)
        }
    }

    /// An id that serializes as a string in human-readable formats and as bytes in compact
    /// ones, and reads back only the same way, as `Uuid` does.
    #[derive(Debug, PartialEq)]
    struct Id([u8; 4]);

    impl Serialize for Id {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            if s.is_human_readable() {
                s.serialize_str(&format!("{:?}", self.0))
            } else {
                s.serialize_bytes(&self.0)
            }
        }
    }

    impl<'de> Deserialize<'de> for Id {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Id, D::Error> {
            if d.is_human_readable() {
                return Err(serde::de::Error::custom(
                    "a human-readable id: not in this test",
                ));
            }
            let Blob(bytes) = Blob::deserialize(d)?;
            bytes
                .try_into()
                .map(Id)
                .map_err(|_| serde::de::Error::custom("four bytes"))
        }
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Tagged {
        id: Id,
        #[serde(default)]
        label: String,
    }

    impl Versioned for Tagged {
        const TYPE_NAME: &'static str = "test.Tagged";
        const VERSION: u32 = 2;
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Holding {
        id: Blob,
        by_day: std::collections::BTreeMap<u64, String>,
        #[serde(default)]
        label: String,
    }

    impl Versioned for Holding {
        const TYPE_NAME: &'static str = "test.Holding";
        const VERSION: u32 = 2;
    }

    /// A record holding a binary value and a map with integer keys is upcast (here with the
    /// default, unchanged tree): `serde_json`'s visitor refused both, so bumping the version
    /// of such a type made every older record unreadable.
    #[test]
    fn upcasts_records_with_binary_values_and_integer_keys() {
        #[derive(Serialize)]
        struct V1 {
            id: Blob,
            by_day: std::collections::BTreeMap<u64, String>,
        }
        let by_day = std::collections::BTreeMap::from([(1, "a".to_string()), (20, "b".into())]);
        let old = Payload::encode_as(
            "test.Holding",
            1,
            &V1 {
                id: Blob(vec![0, 1, 255]),
                by_day: by_day.clone(),
            },
        )
        .unwrap();
        assert_eq!(
            old.decode::<Holding>().unwrap(),
            Holding {
                id: Blob(vec![0, 1, 255]),
                by_day,
                label: String::new(),
            }
        );
        // A type that reads bytes only from a compact format (as `Uuid` does) takes the
        // MessagePack path.
        #[derive(Serialize)]
        struct TaggedV1 {
            id: Id,
        }
        let old = Payload::encode_as(
            "test.Tagged",
            1,
            &TaggedV1 {
                id: Id([9, 8, 7, 6]),
            },
        )
        .unwrap();
        assert_eq!(
            old.decode::<Tagged>().unwrap(),
            Tagged {
                id: Id([9, 8, 7, 6]),
                label: String::new()
            }
        );
        let old = Payload::encode_as(
            "test.Holding",
            1,
            &V1 {
                id: Blob(vec![0, 1, 255]),
                by_day: std::collections::BTreeMap::from([(1, "a".to_string()), (20, "b".into())]),
            },
        )
        .unwrap();
        // The tree the upcast sees: bytes as numbers, keys as their text.
        let tree = crate::value_tree::to_tree(&old.bytes).unwrap();
        assert_eq!(
            tree,
            serde_json::json!({"id": [0, 1, 255], "by_day": {"1": "a", "20": "b"}})
        );
    }

    #[test]
    fn refuses_wrong_type_and_newer_version() {
        let p = Payload::encode_as("other", 1, &1u8).unwrap();
        assert!(matches!(
            p.decode::<Ev>(),
            Err(CodecError::WrongType { .. })
        ));
        let p = Payload::encode_as("test.Ev", 4, &Ev::Opened).unwrap();
        assert!(matches!(
            p.decode::<Ev>(),
            Err(CodecError::NewerVersion { found: 4, .. })
        ));
    }
}
