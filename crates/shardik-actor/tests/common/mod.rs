//! Helpers shared by the integration tests: a gate that blocked handlers wait on, and a
//! `Worker` actor that records what it handles and can be parked inside a handler.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use shardik_actor::{Actor, ActorError, Context, ReplyTo};
use tokio::sync::{mpsc, watch};

/// A shared, append-only record.
pub type Log<T> = Arc<Mutex<Vec<T>>>;

pub fn log<T>() -> Log<T> {
    Arc::new(Mutex::new(Vec::new()))
}

/// A one-way gate: handlers `wait` until the test calls `open`. Opening before anyone waits
/// is fine (unlike `Notify::notify_waiters`).
#[derive(Clone)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Default for Gate {
    fn default() -> Self {
        Gate(Arc::new(watch::channel(false).0))
    }
}

impl Gate {
    pub fn new() -> Self {
        Gate::default()
    }

    pub fn open(&self) {
        self.0.send_replace(true);
    }

    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        rx.wait_for(|open| *open)
            .await
            .expect("gate sender is kept by the gate");
    }
}

/// Messages of [`Worker`].
pub enum WorkMsg {
    /// Report "entered" with the number, wait for the gate, then record the number.
    Hold(u32),
    /// Record the number.
    Item(u32),
    /// Reply with the number (after recording it).
    Echo(u32, ReplyTo<u32>),
    /// Reply with everything recorded so far.
    Handled(ReplyTo<Vec<u32>>),
}

/// An actor that records the numbers it handles into a shared log, and can be parked in a
/// handler until a gate opens.
#[derive(Clone)]
pub struct Worker {
    handled: Log<u32>,
    entered: mpsc::UnboundedSender<u32>,
    gate: Gate,
    stopped: Arc<AtomicUsize>,
}

/// The test's side of a [`Worker`].
pub struct WorkerProbe {
    pub handled: Log<u32>,
    pub entered: mpsc::UnboundedReceiver<u32>,
    pub gate: Gate,
    pub stopped: Arc<AtomicUsize>,
}

impl WorkerProbe {
    /// Waits until a `Hold` handler has started and returns its number.
    pub async fn wait_entered(&mut self) -> u32 {
        self.entered.recv().await.expect("worker alive")
    }

    pub fn handled(&self) -> Vec<u32> {
        self.handled.lock().clone()
    }

    pub fn stopped_hooks(&self) -> usize {
        self.stopped.load(Ordering::SeqCst)
    }
}

pub fn worker() -> (Worker, WorkerProbe) {
    let (tx, rx) = mpsc::unbounded_channel();
    let w = Worker {
        handled: log(),
        entered: tx,
        gate: Gate::new(),
        stopped: Arc::new(AtomicUsize::new(0)),
    };
    let probe = WorkerProbe {
        handled: w.handled.clone(),
        entered: rx,
        gate: w.gate.clone(),
        stopped: w.stopped.clone(),
    };
    (w, probe)
}

impl Actor for Worker {
    type Msg = WorkMsg;

    async fn handle(&mut self, msg: WorkMsg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            WorkMsg::Hold(n) => {
                let _ = self.entered.send(n);
                self.gate.wait().await;
                self.handled.lock().push(n);
            }
            WorkMsg::Item(n) => self.handled.lock().push(n),
            WorkMsg::Echo(n, reply) => {
                self.handled.lock().push(n);
                reply.reply(n);
            }
            WorkMsg::Handled(reply) => reply.reply(self.handled.lock().clone()),
        }
        Ok(())
    }

    async fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.stopped.fetch_add(1, Ordering::SeqCst);
    }
}
