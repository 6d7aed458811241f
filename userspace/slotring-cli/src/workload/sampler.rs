//! The sampler: every [`SAMPLE_PERIOD`](super::SAMPLE_PERIOD) it reads the
//! live state once and feeds the report's timeline and fairness, the
//! `/metrics` snapshot, the BPF maps and the progress bars.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use prometheus::IntCounter;
use slotring::bpf::{AdaptiveBudget, SlotringBpf, ThrottleStats};
use slotring::metrics::SlotringCollector;
use slotring::pinned::{self, ThreadState};
use slotring::slots::{ConcurrencyControl, SlotsCounters};
use slotring::snapshot::{KernelSnapshot, NamedThrottler, Snapshot, TenantStat};
use slotring::throttle::{Tenant, ThrottleCounters, Throttler, WorkloadCounters};
use slotring::uring::UringCounters;

use super::disk_workloads::DiskWorkloads;
use super::engines::Engines;
use super::progress::Progress;
use super::workers::Live;
use super::{SAMPLE_PERIOD, lock};
use crate::http::{MetricsServer, render_registry};
use crate::report::{QueryKind, Timeline, jain};

/// The latest snapshot, which `/metrics` renders, and the run's own read
/// failure counters (the library's counter sets have no such field: they
/// are the workload's, `slotring_run_*`).
#[derive(Clone)]
pub(super) struct Published(Arc<Mutex<Snapshot>>, RunReads);

/// `slotring_run_read_errors_total`, `slotring_run_short_reads_total`.
#[derive(Clone)]
struct RunReads {
    errors: IntCounter,
    short: IntCounter,
}

impl Default for Published {
    fn default() -> Self {
        let counter = |name: &str, help: &str| {
            IntCounter::new(name, help).expect("a valid metric name and help")
        };
        Self(
            Arc::default(),
            RunReads {
                errors: counter(
                    "slotring_run_read_errors_total",
                    "Reads of slotring run's data file that failed",
                ),
                short: counter(
                    "slotring_run_short_reads_total",
                    "Reads of slotring run's data file that ended before its expected end (the file got shorter)",
                ),
            },
        )
    }
}

impl Published {
    /// Serve `/metrics` from this snapshot at `addr`; says where, or why
    /// not (the run goes on without it).
    pub fn serve(&self, addr: SocketAddr, allow_remote: bool) -> Option<MetricsServer> {
        let s = self.0.clone();
        let registry = prometheus::Registry::new();
        registry
            .register(Box::new(SlotringCollector::new(move || lock(&s).clone())))
            .expect("a fresh registry has no clashing names");
        for c in [&self.1.errors, &self.1.short] {
            registry
                .register(Box::new(c.clone()))
                .expect("slotring_run_* names are not the collector's");
        }
        match MetricsServer::start(addr, allow_remote, render_registry(registry)) {
            Ok(srv) => {
                // The bound address (`--listen 127.0.0.1:0` picks a port).
                eprintln!(
                    "slotring: serving metrics at http://{}/metrics while running",
                    srv.addr()
                );
                Some(srv)
            }
            Err(e) => {
                eprintln!("slotring: not serving /metrics: {}", crate::error_chain(&e));
                None
            }
        }
    }
}

/// Where a published sample comes from, besides the counters the caller
/// read.
pub(super) struct Source<'a> {
    /// `local_read`.
    pub read: &'a Throttler,
    /// `local_write`.
    pub write: &'a Throttler,
    /// The probes, whose maps get the counters too.
    pub bpf: Option<&'a SlotringBpf>,
    /// The adaptive budget.
    pub adaptive: Option<&'a AdaptiveBudget>,
    /// The disk's workload tree, when there is one.
    pub disk: Option<&'a DiskWorkloads>,
    /// The CPU slot budget (its workloads too, when a tree schedules it).
    pub cc: &'a ConcurrencyControl,
}

impl Published {
    /// Publish one sample: to the BPF maps and as the snapshot `/metrics`
    /// renders (`read` is `source.read`'s counters and `workloads` the
    /// disk tree's, read by the caller with the rest of its sample; the CPU
    /// workloads are `source.cc`'s now).
    fn publish(
        &self,
        source: &Source<'_>,
        read: ThrottleCounters,
        slots: SlotsCounters,
        uring: UringCounters,
        tenants: Vec<TenantStat>,
        workloads: Vec<WorkloadCounters>,
    ) {
        let throttlers = vec![
            NamedThrottler {
                name: "local_read".into(),
                counters: read,
            },
            NamedThrottler {
                name: "local_write".into(),
                counters: source.write.counters(),
            },
        ];
        if let Some(b) = source.bpf {
            for (i, th) in throttlers.iter().enumerate() {
                let _ = b.publish_throttle(i as u32, &ThrottleStats::new(&th.name, &th.counters));
            }
            b.publish_slots(&slots);
            b.publish_uring(&uring);
        }
        *lock(&self.0) = Snapshot {
            throttlers,
            slots,
            uring,
            kernel: source.bpf.and_then(kernel_snapshot),
            tenants,
            adaptive: source.adaptive.map(AdaptiveBudget::status),
            workloads,
            cpu_workloads: source.cc.workloads(),
        };
    }

    /// Publish a sample every [`SAMPLE_PERIOD`] until `done()`: while the
    /// data file is created, before the queries and their sampler exist.
    pub fn until(&self, source: &Source<'_>, engines: &Engines, done: &dyn Fn() -> bool) {
        loop {
            let read = source.read.counters();
            let workloads = source.disk.map(DiskWorkloads::counters).unwrap_or_default();
            self.publish(
                source,
                read,
                source.cc.counters(),
                engines.total(),
                Vec::new(),
                workloads,
            );
            let next = std::time::Instant::now() + SAMPLE_PERIOD;
            if !super::waits::sleep_until(next, done) {
                return;
            }
        }
    }
}

/// What the sampler leaves for the report.
pub(super) struct Sampled {
    /// The sampled series.
    pub timeline: Timeline,
    /// Sum of Jain's index of the live scans' slots, over `jain_samples`
    /// samples (taken while at least two scans ran).
    pub jain_sum: f64,
    /// Samples in `jain_sum`.
    pub jain_samples: u64,
    /// Most threads of this process at a sample.
    pub peak_threads: u64,
}

/// Reads the run's live state; the only reader while the queries run.
pub(super) struct Sampler<'a> {
    live: &'a Live,
    write: &'a Throttler,
    bpf: Option<&'a SlotringBpf>,
    adaptive: Option<&'a AdaptiveBudget>,
    progress: &'a Progress,
    published: Published,
    out: Sampled,
    last_t: f64,
    last_amount: u64,
    last_cache: u64,
    /// Each scan's tenant bytes at the previous sample.
    last_scan_disk: Vec<u64>,
    /// Each workload's bytes (net of refunds) at the previous sample.
    last_workload: Vec<u64>,
}

impl<'a> Sampler<'a> {
    /// A sampler of `live` (and of the `write` throttler), publishing to
    /// `bpf`'s maps and `published`, showing on `progress`. Rates of the
    /// first sample are from now.
    pub fn new(
        live: &'a Live,
        write: &'a Throttler,
        bpf: Option<&'a SlotringBpf>,
        adaptive: Option<&'a AdaptiveBudget>,
        progress: &'a Progress,
        published: Published,
    ) -> Self {
        Self {
            live,
            write,
            bpf,
            adaptive,
            progress,
            published,
            out: Sampled {
                timeline: Timeline {
                    scan_slots: vec![Vec::new(); live.cfg.scans as usize],
                    scan_disk_bytes_per_s: vec![Vec::new(); live.cfg.scans as usize],
                    ..Timeline::default()
                },
                jain_sum: 0.0,
                jain_samples: 0,
                peak_threads: 0,
            },
            last_t: 0.0,
            last_amount: disk_amount(live, &live.read.counters()),
            last_cache: live.engines.total().page_cache_bytes,
            last_scan_disk: vec![0; live.cfg.scans as usize],
            last_workload: Vec::new(),
        }
    }

    /// Sample every period until the run stops (the sample that sees it
    /// stopping included).
    pub fn run_until_stopping(&mut self) {
        loop {
            std::thread::sleep(SAMPLE_PERIOD);
            self.sample();
            if self.live.stopping() {
                // Reads queued for their fair turn go at once: stopping
                // must not wait out the tenants' order.
                self.live.read.release_fair_queue();
                break;
            }
        }
    }

    /// Take one sample and publish it.
    pub fn sample(&mut self) {
        let live = self.live;
        let timeline = &mut self.out.timeline;
        let t = live.start.elapsed().as_secs_f64();
        let slots = live.cc.counters();
        let uring = live.engines.total();
        let rc = live.read.counters();
        let dt = (t - self.last_t).max(1e-6);
        let amount = disk_amount(live, &rc);
        let disk_rate = amount.saturating_sub(self.last_amount) as f64 / dt;
        timeline.t_s.push(t);
        timeline.disk_bytes_per_s.push(disk_rate);
        timeline
            .page_cache_bytes_per_s
            .push(uring.page_cache_bytes.saturating_sub(self.last_cache) as f64 / dt);
        self.last_t = t;
        self.last_amount = amount;
        self.last_cache = uring.page_cache_bytes;
        let queries = lock(&live.queries).clone();
        let mut short = 0;
        let mut scan_live = Vec::new();
        let mut si = 0;
        for q in &queries {
            let held = q.held.load(Ordering::Relaxed);
            if q.live() {
                q.held_sum.fetch_add(held, Ordering::Relaxed);
                q.samples.fetch_add(1, Ordering::Relaxed);
                q.max_held.fetch_max(held, Ordering::Relaxed);
            }
            match q.kind {
                QueryKind::Scan => {
                    timeline.scan_slots[si].push(held);
                    // The scan's disk rate: bytes charged as its tenant.
                    let disk = q.tenant.as_ref().map_or(0, Tenant::charged);
                    timeline.scan_disk_bytes_per_s[si]
                        .push(disk.saturating_sub(self.last_scan_disk[si]) as f64 / dt);
                    self.last_scan_disk[si] = disk;
                    si += 1;
                    if q.live() {
                        scan_live.push(held as f64);
                    }
                }
                QueryKind::Short => {
                    if q.live() {
                        short += held;
                    }
                }
            }
        }
        if scan_live.len() >= 2 && !live.stopping() {
            self.out.jain_sum += jain(&scan_live);
            self.out.jain_samples += 1;
        }
        timeline.short_slots.push(short);
        timeline.slots_in_use.push(slots.cur_concurrency);
        timeline.leases_parked.push(slots.parked);
        timeline.budget.push(slots.budget_effective);
        let workloads = live
            .disk
            .as_ref()
            .map(DiskWorkloads::counters)
            .unwrap_or_default();
        self.workload_rates(&workloads, dt);
        self.workload_slots();
        self.out.peak_threads = self.out.peak_threads.max(process_threads());
        // Counters only go up; the sampler is their only writer.
        let reads = &self.published.1;
        for (c, v) in [
            (&reads.errors, &live.read_errors),
            (&reads.short, &live.short_reads),
        ] {
            c.inc_by(v.load(Ordering::Relaxed).saturating_sub(c.get()));
        }
        let tenants = queries
            .iter()
            .filter_map(|q| q.tenant.as_ref().map(TenantStat::of))
            .collect();
        let source = Source {
            read: &live.read,
            write: self.write,
            bpf: self.bpf,
            adaptive: self.adaptive,
            disk: live.disk.as_ref(),
            cc: &live.cc,
        };
        self.published
            .publish(&source, rc, slots, uring, tenants, workloads);
        self.progress.update(t, disk_rate, &slots);
    }

    /// Each workload's read rate (bytes net of refunds) since the previous
    /// sample, onto the timeline; the names at the first.
    fn workload_rates(&mut self, workloads: &[WorkloadCounters], dt: f64) {
        let timeline = &mut self.out.timeline;
        if timeline.workloads.is_empty() {
            timeline.workloads = workloads.iter().map(|w| w.name.clone()).collect();
            timeline.workload_bytes_per_s = vec![Vec::new(); workloads.len()];
            self.last_workload = vec![0; workloads.len()];
        }
        for (i, w) in workloads.iter().enumerate().take(self.last_workload.len()) {
            let net = w.bytes.saturating_sub(w.refunded_bytes);
            timeline.workload_bytes_per_s[i]
                .push(net.saturating_sub(self.last_workload[i]) as f64 / dt);
            self.last_workload[i] = net;
        }
    }

    /// The slots each CPU workload holds now, onto the timeline; the names
    /// at the first.
    fn workload_slots(&mut self) {
        let timeline = &mut self.out.timeline;
        let cpu = self.live.cc.workloads();
        if timeline.slot_workloads.is_empty() {
            timeline.slot_workloads = cpu.iter().map(|w| w.name.clone()).collect();
            timeline.workload_slots = vec![Vec::new(); cpu.len()];
        }
        for (series, w) in timeline.workload_slots.iter_mut().zip(&cpu) {
            series.push(w.held);
        }
    }

    /// What the samples add up to.
    pub fn finish(self) -> Sampled {
        self.out
    }
}

/// The bytes the disk was charged so far: the tree's root (net of refunds)
/// with `--workloads`, else `local_read`'s (`read`, its counters).
fn disk_amount(live: &Live, read: &ThrottleCounters) -> u64 {
    live.disk
        .as_ref()
        .map_or(read.amount, DiskWorkloads::disk_bytes)
}

/// Threads of this process now.
fn process_threads() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The kernel's view of this process's registered threads, when the probes
/// are attached.
fn kernel_snapshot(bpf: &SlotringBpf) -> Option<KernelSnapshot> {
    if !bpf.is_attached() {
        return None;
    }
    let now = pinned::monotonic_ns();
    let threads: Vec<ThreadState> = bpf
        .threads()
        .into_iter()
        .filter_map(|tid| {
            Some(ThreadState {
                tid,
                lease: bpf.lease_slot(tid).ok()?,
                acct: bpf.thread_acct(tid).ok()?,
                hot: Vec::new(),
            })
        })
        .collect();
    Some(pinned::kernel_from_threads(&threads, now, |k| {
        bpf.hist(k).slots
    }))
}
