//! The sharded benchmarks' workload: entity keys, a deterministic key sequence (uniform or
//! skewed) and the totals a correct run must end with.

use std::sync::{Arc, OnceLock};

/// How message keys are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dist {
    /// Every key equally likely.
    Uniform,
    /// 80% of the messages go to 1% of the keys (the hot set, uniform within it); the other
    /// 20% are uniform over all keys.
    Skewed,
}

/// What every variant must end with, over all keys: the sum of the counters and a checksum
/// that also catches a message counted under the wrong key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Sum of all counters.
    pub sum: u64,
    /// Sum over keys of `counter * weight(key)`, wrapping.
    pub checksum: u64,
}

impl Totals {
    /// Adds one key's final counter.
    pub fn add(&mut self, key: &str, count: u64) {
        self.sum += count;
        self.checksum = self.checksum.wrapping_add(count.wrapping_mul(weight(key)));
    }
}

/// A key's checksum weight (odd, so no key's count vanishes from the checksum).
fn weight(key: &str) -> u64 {
    fnv1a(key.as_bytes()) | 1
}

/// FNV-1a, 64 bit: the baselines' cheap key hash (routing and maps).
#[inline]
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// splitmix64: a tiny seeded generator, enough for a reproducible key sequence.
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (n small next to 2^64, so the modulo bias is negligible).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// The keys `entity-0 .. entity-{n-1}`, made once per process and kept for its lifetime so
/// that every variant can pass them around as `&'static str` without allocating.
pub fn keys(n: usize) -> &'static [&'static str] {
    static KEYS: OnceLock<Vec<&'static str>> = OnceLock::new();
    let keys = KEYS.get_or_init(|| {
        (0..n)
            .map(|i| &*Box::leak(format!("entity-{i}").into_boxed_str()))
            .collect()
    });
    assert_eq!(keys.len(), n, "one key count per process");
    keys
}

/// One benchmark's messages: which key each one goes to, and what the run must end with.
pub struct Workload {
    /// The entity keys.
    pub keys: &'static [&'static str],
    /// Key index of each message, in sending order.
    pub seq: Arc<[u32]>,
    /// Expected totals after the warm-up (one increment per key) and every message of `seq`
    /// (one increment each).
    pub expected: Totals,
}

impl Workload {
    /// `messages` messages over `entities` keys drawn from `dist`, reproducibly.
    pub fn new(entities: usize, messages: usize, dist: Dist) -> Arc<Self> {
        let keys = keys(entities);
        let mut rng = SplitMix64::new(match dist {
            Dist::Uniform => 0x5EED_0001,
            Dist::Skewed => 0x5EED_0002,
        });
        let hot = (entities / 100).max(1);
        let seq: Arc<[u32]> = (0..messages)
            .map(|_| {
                let k = match dist {
                    Dist::Uniform => rng.below(entities),
                    Dist::Skewed if rng.below(100) < 80 => rng.below(hot),
                    Dist::Skewed => rng.below(entities),
                };
                k as u32
            })
            .collect();
        let mut counts = vec![1u64; entities];
        for &k in seq.iter() {
            counts[k as usize] += 1;
        }
        let mut expected = Totals::default();
        for (key, count) in keys.iter().zip(counts) {
            expected.add(key, count);
        }
        Arc::new(Workload {
            keys,
            seq,
            expected,
        })
    }

    /// The key with index `k` (an entry of `seq`).
    #[inline]
    pub fn key(&self, k: u32) -> &'static str {
        self.keys[k as usize]
    }

    /// The part of `seq` that worker `w` of `workers` sends.
    pub fn slice(&self, w: usize, workers: usize) -> &[u32] {
        let len = self.seq.len();
        &self.seq[w * len / workers..(w + 1) * len / workers]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skewed_sends_most_messages_to_the_hot_keys() {
        let w = Workload::new(1_000, 100_000, Dist::Skewed);
        let hot = w.seq.iter().filter(|&&k| k < 10).count();
        // 80% to the hot set plus its 1% share of the uniform 20%.
        assert!((79_000..82_000).contains(&hot), "{hot}");
        assert_eq!(w.expected.sum, 1_000 + 100_000);
        let again = Workload::new(1_000, 100_000, Dist::Skewed);
        assert_eq!(w.seq, again.seq, "deterministic");
    }

    #[test]
    fn slices_cover_the_sequence() {
        let w = Workload::new(1_000, 1_003, Dist::Uniform);
        let total: usize = (0..4).map(|i| w.slice(i, 4).len()).sum();
        assert_eq!(total, 1_003);
    }
}
