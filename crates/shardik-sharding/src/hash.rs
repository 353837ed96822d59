//! Entity id to shard: the first four bytes of the MD5 digest of the UTF-8 id, read as a
//! big-endian `u32`, modulo the shard count (Casty's rule, so both systems agree on homes).

use std::fmt;
use std::sync::Arc;

use md5::{Digest, Md5};

/// A shard number in `0..shard_count`.
pub type ShardId = u32;

/// The shard an entity id belongs to.
///
/// ```
/// assert_eq!(shardik_sharding::shard_of("user-42", 100), 87);
/// ```
///
/// # Panics
/// If `shard_count` is zero.
#[inline]
pub fn shard_of(entity_id: &str, shard_count: u32) -> ShardId {
    assert!(shard_count > 0, "shard count must be at least 1");
    hash32(entity_id) % shard_count
}

/// The 32-bit hash behind [`shard_of`].
#[inline]
pub fn hash32(entity_id: &str) -> u32 {
    let bytes = entity_id.as_bytes();
    if bytes.len() <= ONE_BLOCK_MAX {
        return one_block_hash32(bytes);
    }
    let digest = Md5::digest(bytes);
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
}

/// The longest input whose MD5 padding fits in one 64-byte block (the usual entity id).
const ONE_BLOCK_MAX: usize = 55;

/// MD5 of an input of at most [`ONE_BLOCK_MAX`] bytes, first four digest bytes as a
/// big-endian `u32`: the padded block is built on the stack and compressed once, skipping the
/// streaming hasher's buffering (which cost as much as the compression on every message).
#[inline]
fn one_block_hash32(bytes: &[u8]) -> u32 {
    debug_assert!(bytes.len() <= ONE_BLOCK_MAX);
    let mut block = [0u8; 64];
    block[..bytes.len()].copy_from_slice(bytes);
    block[bytes.len()] = 0x80;
    block[56..].copy_from_slice(&(bytes.len() as u64 * 8).to_le_bytes());
    let mut state = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];
    md5::block_api::compress(&mut state, &[block]);
    // The digest starts with the first state word in little-endian order.
    u32::from_be_bytes(state[0].to_le_bytes())
}

type CustomShardFn = Arc<dyn Fn(&str, u32) -> ShardId + Send + Sync>;

/// How one entity type maps entity ids to shards: [`shard_of`] (MD5) by default, or a function
/// of your own ([`EntityType::shard_fn`](crate::EntityType::shard_fn)).
///
/// A custom function gets the entity id and the shard count; its result is taken modulo the
/// shard count, so it never names a shard that does not exist. It must be **deterministic and
/// the same on every node** (same code, no per-process seed or state): nodes route by it
/// without asking anyone, so two nodes that disagree would home one entity id in two shards,
/// that is on two nodes. The coordinator refuses a region whose function answers differently
/// on a fixed set of probe ids ([`fingerprint`](Self::fingerprint)), like a shard count
/// mismatch.
///
/// ```
/// use shardik_sharding::ShardFn;
/// // Numeric account ids, shard = id mod shard count; other ids by the MD5 rule.
/// let by_number = ShardFn::new(|id: &str, shards: u32| match id.parse::<u64>() {
///     Ok(n) => (n % u64::from(shards)) as u32,
///     Err(_) => shardik_sharding::shard_of(id, shards),
/// });
/// assert_eq!(by_number.shard("1042", 100), 42);
/// assert_eq!(ShardFn::md5().shard("user-42", 100), 87);
/// ```
#[derive(Clone, Default)]
pub struct ShardFn(Option<CustomShardFn>);

impl ShardFn {
    /// The default rule, [`shard_of`].
    pub fn md5() -> Self {
        ShardFn(None)
    }

    /// A custom rule: `f(entity_id, shard_count)`, taken modulo `shard_count`.
    pub fn new(f: impl Fn(&str, u32) -> ShardId + Send + Sync + 'static) -> Self {
        ShardFn(Some(Arc::new(f)))
    }

    /// Whether this is a custom rule.
    pub fn is_custom(&self) -> bool {
        self.0.is_some()
    }

    /// The shard of `entity_id` among `shard_count` shards.
    ///
    /// # Panics
    /// If `shard_count` is zero.
    #[inline]
    pub fn shard(&self, entity_id: &str, shard_count: u32) -> ShardId {
        match &self.0 {
            None => shard_of(entity_id, shard_count),
            Some(f) => {
                assert!(shard_count > 0, "shard count must be at least 1");
                f(entity_id, shard_count) % shard_count
            }
        }
    }

    /// A digest of the rule's answers for 128 fixed probe ids (`"0"` to `"63"`, `"probe-0"` to
    /// `"probe-63"`): two nodes whose rules differ on any of them have different fingerprints.
    /// Regions send it when they register; the coordinator refuses one that differs from its
    /// own.
    pub fn fingerprint(&self, shard_count: u32) -> u64 {
        // FNV-1a: the same on every node and platform.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut feed = |v: u32| {
            for b in v.to_be_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        feed(shard_count);
        for i in 0..64 {
            feed(self.shard(&i.to_string(), shard_count));
            feed(self.shard(&format!("probe-{i}"), shard_count));
        }
        h
    }
}

impl fmt::Debug for ShardFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_custom() {
            "ShardFn(custom)"
        } else {
            "ShardFn(md5)"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors from `shared/reference/numbers.md` (Casty v1).
    #[test]
    fn pinned_vectors() {
        let cases = [
            ("user-42", 1_982_970_887u32, 87, 7),
            ("alice", 1_669_653_170, 70, 178),
            ("bob", 2_677_887_420, 20, 188),
            ("entity-1", 2_920_799_226, 26, 250),
            ("", 3_558_706_393, 93, 217),
        ];
        for (id, hash, mod100, mod256) in cases {
            assert_eq!(hash32(id), hash, "hash of {id:?}");
            assert_eq!(shard_of(id, 100), mod100, "{id:?} mod 100");
            assert_eq!(shard_of(id, 256), mod256, "{id:?} mod 256");
        }
    }

    #[test]
    fn custom_shard_fn_stays_in_range_and_fingerprints_differ() {
        let wild = ShardFn::new(|id: &str, _| id.len() as u32 * 1000 + 7);
        for id in ["", "a", "abcdef", "user-42"] {
            assert!(wild.shard(id, 10) < 10);
        }
        let md5 = ShardFn::md5();
        assert_eq!(md5.shard("alice", 100), shard_of("alice", 100));
        assert_eq!(md5.fingerprint(100), ShardFn::md5().fingerprint(100));
        assert_ne!(md5.fingerprint(100), md5.fingerprint(101));
        assert_ne!(md5.fingerprint(100), wild.fingerprint(100));
        let same_as_md5 = ShardFn::new(shard_of);
        assert_eq!(same_as_md5.fingerprint(100), md5.fingerprint(100));
    }

    /// The one-block shortcut agrees with the streaming hasher at every length around the
    /// block boundary.
    #[test]
    fn one_block_shortcut_matches_the_full_digest() {
        let full = |b: &[u8]| {
            let d = Md5::digest(b);
            u32::from_be_bytes([d[0], d[1], d[2], d[3]])
        };
        for len in 0..=130usize {
            let id: String = (0..len)
                .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
                .collect();
            assert_eq!(hash32(&id), full(id.as_bytes()), "length {len}");
        }
    }

    #[test]
    fn utf8_ids_hash_their_bytes() {
        assert_eq!(hash32("ü"), hash32("\u{fc}"));
        assert_ne!(hash32("user!31"), hash32("user#31"));
    }
}
