//! Entity id to shard through the public API: the pinned MD5 vectors (Casty's rule), and
//! `Region::shard_of` / `EntityRef::shard` agree with `shard_of`.

mod common;

use common::{item, snapshot, Probe};
use shardik_actor::ActorSystem;
use shardik_sharding::{hash32, shard_of, ShardingExt};

/// `(id, hash32, shard of 100, shard of 256)`.
const VECTORS: [(&str, u32, u32, u32); 5] = [
    ("user-42", 1_982_970_887, 87, 7),
    ("alice", 1_669_653_170, 70, 178),
    ("bob", 2_677_887_420, 20, 188),
    ("entity-1", 2_920_799_226, 26, 250),
    ("", 3_558_706_393, 93, 217),
];

#[test]
fn pinned_vectors() {
    for (id, hash, of_100, of_256) in VECTORS {
        assert_eq!(hash32(id), hash, "hash32({id:?})");
        assert_eq!(shard_of(id, 100), of_100, "shard_of({id:?}, 100)");
        assert_eq!(shard_of(id, 256), of_256, "shard_of({id:?}, 256)");
        assert_eq!(shard_of(id, 1), 0);
    }
}

#[test]
#[should_panic(expected = "shard count must be at least 1")]
fn zero_shards_is_a_programming_error() {
    shard_of("user-42", 0);
}

#[tokio::test]
async fn regions_and_entity_refs_place_ids_by_the_same_rule() {
    let system = ActorSystem::new("hash");
    let probe = Probe::new();
    let default = system
        .sharding()
        .start(probe.entity_type("default"))
        .unwrap();
    let wide = system
        .sharding()
        .start(probe.entity_type("wide").shards(256))
        .unwrap();
    assert_eq!(default.shard_count(), 100);
    assert_eq!(wide.shard_count(), 256);
    for (id, _, of_100, of_256) in VECTORS {
        assert_eq!(default.shard_of(id), of_100, "{id:?}");
        assert_eq!(wide.shard_of(id), of_256, "{id:?}");
        assert_eq!(default.entity_ref(id).shard(), of_100, "{id:?}");
        assert_eq!(wide.entity_ref(id).shard(), of_256, "{id:?}");
        assert_eq!(wide.entity_ref(id).id(), id);
    }

    // The empty id is an id like any other.
    wide.entity_ref("").tell(item(0, 1));
    assert_eq!(snapshot(&wide, "").await.handled, vec![(0, 1)]);
    // Each entity lives in the shard its id hashes to: one active shard per distinct shard.
    for (id, ..) in VECTORS {
        default.tell(id, item(0, 1));
    }
    for (id, ..) in VECTORS {
        snapshot(&default, id).await;
    }
    let mut shards: Vec<u32> = VECTORS.iter().map(|v| v.2).collect();
    shards.sort();
    shards.dedup();
    assert_eq!(default.stats().active_shards as usize, shards.len());
    system.shutdown().await;
}
