//! Entity id to shard: the first four bytes of the MD5 digest of the UTF-8 id, read as a
//! big-endian `u32`, modulo the shard count (Casty's rule, so both systems agree on homes).

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
    let digest = Md5::digest(entity_id.as_bytes());
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
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
    fn utf8_ids_hash_their_bytes() {
        assert_eq!(hash32("ü"), hash32("\u{fc}"));
        assert_ne!(hash32("user!31"), hash32("user#31"));
    }
}
