//! Readers and writers: threads with their own `UringEngine`, each
//! class's completions in a [`Log`], run beside the thread that times the
//! case ([`run_groups`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use slotring_throttle::{Tenant, ThrottlePtr, UNLIMITED_BLOCK};
use slotring_uring::{IoEngine, RingConfig, UringEngine, UringFile};

use crate::{EVICT_EVERY, FILE_SIZE, PIECE, Plan, WRITE_REGION, lock};

/// Completions of one class: when, and how many device bytes.
#[derive(Debug, Default)]
pub(crate) struct Log(Mutex<Vec<(Instant, u64)>>);

impl Log {
    fn push(&self, bytes: u64) {
        lock(&self.0).push((Instant::now(), bytes));
    }

    /// The completions in `[from, to]`, in time order.
    fn window(&self, (from, to): (Instant, Instant)) -> Vec<(Instant, u64)> {
        let mut xs: Vec<_> = lock(&self.0)
            .iter()
            .copied()
            .filter(|&(t, _)| t >= from && t <= to)
            .collect();
        xs.sort_by_key(|&(t, _)| t);
        xs
    }

    pub(crate) fn bytes_in(&self, w: (Instant, Instant)) -> u64 {
        self.window(w).iter().map(|&(_, b)| b).sum()
    }

    /// Bytes per second over `w`: the bytes completed after the window's
    /// first completion, over the time from it to the last.
    pub(crate) fn rate_in(&self, w: (Instant, Instant)) -> Result<f64, String> {
        let xs = self.window(w);
        let (Some(first), Some(last)) = (xs.first(), xs.last()) else {
            return Err("no completion in the window".into());
        };
        let dt = last.0.duration_since(first.0).as_secs_f64();
        if xs.len() < 3 || dt <= 0.0 {
            return Err(format!("{} completions in the window", xs.len()));
        }
        Ok(xs[1..].iter().map(|&(_, b)| b).sum::<u64>() as f64 / dt)
    }
}

/// Readers (or writers) of one class, through one throttle.
pub(crate) struct Group {
    pub(crate) throttle: Option<ThrottlePtr>,
    pub(crate) tenant: Option<Tenant>,
    pub(crate) threads: usize,
}

impl Group {
    pub(crate) fn new(throttle: ThrottlePtr, threads: usize) -> Self {
        Self {
            throttle: Some(throttle),
            tenant: None,
            threads,
        }
    }
}

pub(crate) fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

pub(crate) fn engine() -> Result<UringEngine, String> {
    UringEngine::new(&RingConfig::default()).map_err(|e| format!("io_uring: {e}"))
}

/// One 256 KiB read at a random piece of the file; its miss bytes.
pub(crate) fn read_piece(
    e: &mut UringEngine,
    file: &Arc<UringFile>,
    throttle: Option<&ThrottlePtr>,
    buf: &mut Vec<u8>,
    x: &mut u64,
) -> Result<u64, String> {
    let off = xorshift(x) % (FILE_SIZE / PIECE) * PIECE;
    let hits = e.counters().page_cache_bytes;
    let (r, back) = e.read_at(file, std::mem::take(buf), off, throttle, UNLIMITED_BLOCK);
    *buf = back;
    let n = r.map_err(|err| format!("read at {off}: {err}"))? as u64;
    Ok(n.saturating_sub(e.counters().page_cache_bytes - hits))
}

/// What one thread of a group does until `stop`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Job {
    Read,
    /// Paced 256 KiB writes, each thread over its own file.
    Write,
}

pub(crate) fn work(
    job: Job,
    file: &Arc<UringFile>,
    g: &Group,
    seed: u64,
    log: &Log,
    stop: &AtomicBool,
) -> Result<(u64, u64), String> {
    let _scope = g.tenant.as_ref().map(Tenant::enter);
    let mut e = engine()?;
    let mut buf = vec![0u8; PIECE as usize];
    let mut x = seed | 1;
    let mut off = 0;
    while !stop.load(Ordering::Relaxed) {
        match job {
            Job::Read => log.push(read_piece(
                &mut e,
                file,
                g.throttle.as_ref(),
                &mut buf,
                &mut x,
            )?),
            Job::Write => {
                let (r, back) = e.write_at(file, buf, off, g.throttle.as_ref(), UNLIMITED_BLOCK);
                buf = back;
                let n = r.map_err(|err| format!("write at {off}: {err}"))?;
                log.push(n as u64);
                off = (off + PIECE) % WRITE_REGION;
            }
        }
    }
    let c = e.counters();
    Ok((c.write_bytes, c.paced_bytes))
}

/// What [`run_groups`] gives back.
pub(crate) struct Ran<R> {
    /// Each group's completions.
    pub(crate) logs: Vec<Log>,
    /// Bytes written, and of them paced, by every engine.
    pub(crate) written: (u64, u64),
    /// What the side returned.
    pub(crate) side: R,
}

/// Run `groups` (each thread reading `data`, or writing its own file of
/// `files`) while `side` runs in this thread (it times the case and
/// samples what it needs), evicting `data` every [`EVICT_EVERY`].
pub(crate) fn run_groups<R>(
    job: Job,
    data: &Arc<UringFile>,
    files: &[Arc<UringFile>],
    groups: &[Group],
    side: impl FnOnce() -> Result<R, String>,
) -> Result<Ran<R>, String> {
    let logs: Vec<Log> = groups.iter().map(|_| Log::default()).collect();
    let stop = AtomicBool::new(false);
    data.evict().map_err(|e| format!("evict: {e}"))?;
    let (out, written) = std::thread::scope(|s| {
        let mut hs = vec![];
        let mut k = 0usize;
        for (g, log) in groups.iter().zip(&logs) {
            for _ in 0..g.threads {
                let file = match job {
                    Job::Read => data,
                    Job::Write => &files[k % files.len()],
                };
                let seed = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(k as u64 + 1);
                let stop = &stop;
                hs.push(s.spawn(move || work(job, file, g, seed, log, stop)));
                k += 1;
            }
        }
        let evictor = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let _ = data.evict();
                std::thread::sleep(EVICT_EVERY);
            }
        });
        let out = side();
        stop.store(true, Ordering::Relaxed);
        let mut written = (0, 0);
        let mut failed = None;
        for h in hs {
            match h.join().expect("a worker panicked") {
                Ok((w, p)) => written = (written.0 + w, written.1 + p),
                Err(e) => failed = Some(e),
            }
        }
        evictor.join().expect("the evictor panicked");
        (failed.map_or(out, Err), written)
    });
    Ok(Ran {
        logs,
        written,
        side: out?,
    })
}

/// Sleep `warm`, then `window`: the window's bounds.
pub(crate) fn window(plan: &Plan, len: Duration) -> (Instant, Instant) {
    std::thread::sleep(plan.warm);
    let t1 = Instant::now();
    std::thread::sleep(len);
    (t1, Instant::now())
}

pub(crate) fn share_pct(logs: &[Log], of: usize, w: (Instant, Instant)) -> Result<f64, String> {
    let bytes: Vec<u64> = logs.iter().map(|l| l.bytes_in(w)).collect();
    let total: u64 = bytes.iter().sum();
    if total == 0 {
        return Err("nothing completed in the window".into());
    }
    Ok(100.0 * bytes[of] as f64 / total as f64)
}
