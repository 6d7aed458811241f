//! The run's IO engines: one per query thread (an engine belongs to the
//! thread that opened it), opened through the library's `open_engine`,
//! their counters kept by engine for the sampler and the report.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use slotring::uring::{IoEngine, PreadEngine, RingConfig, UringCounters, open_engine};

use super::lock;
use crate::config::EngineKind;
use crate::report::Engine;

/// Which engine the queries got, and why not io_uring when it was wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Choice {
    /// The kind of the engine opened last.
    pub engine: Engine,
    /// Why io_uring could not be used, the first time it could not.
    pub fallback_reason: Option<String>,
}

/// Opens engines of the configured kind and collects their counters.
pub(super) struct Engines {
    wanted: EngineKind,
    choice: Mutex<Choice>,
    counters: Mutex<HashMap<u64, UringCounters>>,
    next_id: AtomicU64,
}

impl Engines {
    /// Engines of kind `wanted` (`--engine`).
    pub fn new(wanted: EngineKind) -> Self {
        Self {
            wanted,
            choice: Mutex::new(Choice {
                engine: match wanted {
                    EngineKind::IoUring => Engine::IoUring,
                    EngineKind::Fallback => Engine::Pread,
                },
                fallback_reason: None,
            }),
            counters: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        }
    }

    /// A new engine and the id to [`Engines::record`] its counters under.
    /// When io_uring is wanted but unavailable, the library's fallback
    /// (`pread`) is used and the first such reason is printed and kept.
    pub fn open(&self) -> (u64, Box<dyn IoEngine>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let policy = RingConfig::default().policy;
        let (engine, kind, why_not): (Box<dyn IoEngine>, _, _) = match self.wanted {
            // `open_engine` always tries io_uring first: the pread engine,
            // when asked for, is made here.
            EngineKind::Fallback => (Box::new(PreadEngine::new(policy)), Engine::Pread, None),
            EngineKind::IoUring => match open_engine(&RingConfig::default()) {
                (e, None) => (e, Engine::IoUring, None),
                (e, Some(err)) => (e, Engine::Pread, Some(err)),
            },
        };
        let mut choice = lock(&self.choice);
        choice.engine = kind;
        if let Some(err) = why_not
            && choice.fallback_reason.is_none()
        {
            eprintln!("slotring: io_uring unavailable, using pread: {err}");
            choice.fallback_reason = Some(err.to_string());
        }
        (id, engine)
    }

    /// The latest counters of engine `id`.
    pub fn record(&self, id: u64, c: UringCounters) {
        lock(&self.counters).insert(id, c);
    }

    /// The counters of every engine, summed.
    pub fn total(&self) -> UringCounters {
        lock(&self.counters).values().sum()
    }

    /// Which engine the queries got.
    pub fn choice(&self) -> Choice {
        lock(&self.choice).clone()
    }
}
