//! The probe entity of the remember-entities restart tests: it reports its incarnations to a
//! shared [`Registry`] (which ids run, where each ever started, the single-writer check).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, Context, ReplyTo};
use shardik_sharding::cluster::ClusterShardingSettings;
use shardik_sharding::{EntityType, Region};

use crate::cluster_util::Member;

pub const TYPE: &str = "remembered";
pub const SHARDS: u32 = 12;
pub const ENTITIES: usize = 30;

#[derive(Serialize, Deserialize)]
pub enum Msg {
    /// The node the entity runs on.
    Where(ReplyTo<String>),
}

/// Live incarnations per entity id (and the most ever at once), across every node.
#[derive(Default)]
pub struct Registry {
    live: Mutex<HashMap<String, usize>>,
    max_live: AtomicUsize,
    pub started: Mutex<BTreeMap<String, Vec<String>>>,
}

impl Registry {
    pub fn running(&self) -> BTreeSet<String> {
        let live = self.live.lock();
        live.iter()
            .filter(|(_, n)| **n > 0)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

struct Probe {
    id: String,
    node: String,
    reg: Arc<Registry>,
}

impl Actor for Probe {
    type Msg = Msg;
    async fn started(&mut self, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        let mut live = self.reg.live.lock();
        let n = live.entry(self.id.clone()).or_default();
        *n += 1;
        self.reg.max_live.fetch_max(*n, Ordering::SeqCst);
        self.reg
            .started
            .lock()
            .entry(self.id.clone())
            .or_default()
            .push(self.node.clone());
        Ok(())
    }
    async fn stopped(&mut self, _ctx: &mut Context<Self>) {
        if let Some(n) = self.reg.live.lock().get_mut(&self.id) {
            *n -= 1;
        }
    }
    async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Msg::Where(r) => r.reply(self.node.clone()),
        }
        Ok(())
    }
}

pub fn settings() -> ClusterShardingSettings {
    ClusterShardingSettings::default()
        .remember_entities(true)
        .down_margin(Duration::from_secs(2))
}

pub fn start_type(m: &Member, reg: &Arc<Registry>) -> Region<Msg> {
    start_type_with(m, reg, settings())
}

pub fn start_type_with(
    m: &Member,
    reg: &Arc<Registry>,
    settings: ClusterShardingSettings,
) -> Region<Msg> {
    let node = m.id().node_id.clone();
    let reg = reg.clone();
    m.sharding
        .start_with(
            EntityType::new(TYPE, move |id: &str| Probe {
                id: id.to_string(),
                node: node.clone(),
                reg: reg.clone(),
            })
            .shards(SHARDS),
            settings,
        )
        .expect("type starts")
}

pub fn ids() -> Vec<String> {
    (0..ENTITIES).map(|i| format!("e{i}")).collect()
}

impl Registry {
    pub fn assert_single_writer(&self) {
        assert!(
            self.max_live.load(Ordering::SeqCst) <= 1,
            "two live incarnations of one entity id at once"
        );
    }
}
