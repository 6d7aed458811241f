//! The report, from what a finished run leaves: the live state, the
//! sampler's series and the kernel's verdict.

use std::sync::atomic::Ordering;
use std::time::Instant;

use slotring::bpf::{EpisodeRule, ProbeStatus, SlotringBpf, Verdict, VerifyConfig};
use slotring::throttle::{Tenant, Throttler};

use slotring::slots::AdaptiveCounters;

use super::counters::{FailedReads, budget_report, io_report, slots_report, throttle_report};
use super::lock;
use super::sampler::Sampled;
use super::workers::Live;
use crate::report::{
    DataFile, FailingThread, FairnessReport, KernelReport, KernelVerdict, LatencyReport,
    ProcessReport, QueryKind, QueryReport, Report, RuleReport, SegmentReport, jain,
};

/// Everything the report is made of, once every query thread is done.
pub(super) struct Finished<'a> {
    /// The run's state.
    pub live: &'a Live,
    /// Wall time of the query phase, seconds.
    pub elapsed_s: f64,
    /// Whether Ctrl-C stopped it.
    pub interrupted: bool,
    /// The data file.
    pub data_file: DataFile,
    /// The read throttler.
    pub read: &'a Throttler,
    /// The write throttler (used while creating the data file).
    pub write: &'a Throttler,
    /// The read bucket's debt when the queries were done, bytes.
    pub read_debt_at_end: u64,
    /// The write bucket's debt when the data file was written, bytes.
    pub write_debt_at_end: u64,
    /// What the sampler gathered.
    pub sampled: Sampled,
    /// The kernel's verdict.
    pub kernel: KernelReport,
    /// CPU seconds of the process during the queries.
    pub cpu_s: f64,
    /// Where `/metrics` was served.
    pub metrics_addr: Option<String>,
    /// Run-queue and on-CPU ns of running leases over the run (probes).
    pub runq: Option<(u64, u64)>,
    /// The adaptive budget loop's last state, when one ran.
    pub adaptive: Option<AdaptiveCounters>,
}

/// Assemble the report.
pub(super) fn report(f: Finished<'_>) -> Report {
    let live = f.live;
    let cfg = &live.cfg;
    let queries = query_reports(live);
    let scan_means: Vec<f64> = queries
        .iter()
        .filter(|q| q.kind == QueryKind::Scan)
        .map(|q| q.mean_slots)
        .collect();
    let s = &f.sampled;
    Report {
        config: cfg.clone(),
        elapsed_s: f.elapsed_s,
        interrupted: f.interrupted,
        // `local_read` only when it was the reads' throttler (a tree's
        // waits are its workloads').
        throttlers: live
            .disk
            .is_none()
            .then(|| {
                // The read throttler's waits include the debt the queries
                // paid before a read (see `waits::pay_debt`).
                let mut r = throttle_report(f.read, f.elapsed_s, f.read_debt_at_end);
                r.wait_s += live.debt_wait_ns.load(Ordering::Relaxed) as f64 / 1e9;
                r
            })
            .into_iter()
            .chain([throttle_report(
                f.write,
                f.data_file.create_s,
                f.write_debt_at_end,
            )])
            .collect(),
        workloads: live
            .disk
            .as_ref()
            .map(|d| d.report(f.elapsed_s, &live.cc.workloads())),
        data_file: f.data_file,
        io: io_report(
            &live.engines.total(),
            live.engines.choice(),
            FailedReads {
                errors: live.read_errors.load(Ordering::Relaxed),
                short: live.short_reads.load(Ordering::Relaxed),
                first: lock(&live.first_read_error).clone(),
            },
        ),
        slots: slots_report(&live.cc.counters(), cfg),
        fairness: FairnessReport {
            jain_scans: jain(&scan_means),
            jain_instant_mean: if s.jain_samples == 0 {
                1.0
            } else {
                s.jain_sum / s.jain_samples as f64
            },
            samples: s.jain_samples,
        },
        short_latency_ms: short_latency(&queries),
        queries,
        kernel: f.kernel,
        process: ProcessReport {
            peak_threads: s.peak_threads,
            query_threads: live.query_threads.load(Ordering::Relaxed),
            cpu_s: f.cpu_s,
        },
        metrics_addr: f.metrics_addr,
        adaptive: budget_report(
            cfg,
            &s.timeline.budget,
            f.runq,
            f.adaptive,
            &live.cc.counters(),
        ),
        timeline: f.sampled.timeline,
    }
}

/// Short queries' duration percentiles (nearest rank).
fn short_latency(queries: &[QueryReport]) -> LatencyReport {
    let mut ms: Vec<f64> = queries
        .iter()
        .filter(|q| q.kind == QueryKind::Short)
        .map(|q| (q.end_s - q.start_s) * 1e3)
        .collect();
    ms.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if ms.is_empty() {
            f64::NAN
        } else {
            ms[((ms.len() - 1) as f64 * p).round() as usize]
        }
    };
    LatencyReport {
        count: ms.len() as u64,
        p50: pct(0.50),
        p99: pct(0.99),
    }
}

/// One line per query, times relative to the start of the queries.
fn query_reports(live: &Live) -> Vec<QueryReport> {
    let queries = lock(&live.queries);
    // The scans' shares of the disk throttler, beside their weights' shares.
    let (scan_disk, scan_weights) = queries
        .iter()
        .filter_map(|q| q.tenant.as_ref())
        .fold((0u64, 0u32), |(b, w), t| {
            (b.saturating_add(t.charged()), w + t.weight())
        });
    queries
        .iter()
        .map(|q| {
            let end = lock(&q.end).unwrap_or_else(Instant::now);
            let samples = q.samples.load(Ordering::Relaxed);
            QueryReport {
                id: q.id,
                kind: q.kind,
                start_s: q.start.duration_since(live.start).as_secs_f64(),
                end_s: end.duration_since(live.start).as_secs_f64(),
                reads: q.reads.load(Ordering::Relaxed),
                bytes: q.bytes.load(Ordering::Relaxed),
                mean_slots: q.held_sum.load(Ordering::Relaxed) as f64 / samples.max(1) as f64,
                max_slots: q.max_held.load(Ordering::Relaxed),
                slot_wait_s: q.slot_wait_ns.load(Ordering::Relaxed) as f64 / 1e9,
                threads: (q.kind == QueryKind::Scan).then(|| live.cfg.scan_width(q.id - 1)),
                disk_bytes: q.tenant.as_ref().map(Tenant::charged),
                disk_share_pct: q
                    .tenant
                    .as_ref()
                    .map(|t| 100.0 * t.charged() as f64 / scan_disk.max(1) as f64),
                fair_share_pct: q
                    .tenant
                    .as_ref()
                    .map(|t| 100.0 * f64::from(t.weight()) / f64::from(scan_weights.max(1))),
            }
        })
        .collect()
}

/// The kernel's verdict on the run's parked threads (before the probes
/// are dropped). `probes_wanted` says why there are none when `bpf` is
/// `None`.
pub(super) fn kernel_report(bpf: Option<&SlotringBpf>, probes_wanted: bool) -> KernelReport {
    let cfg = VerifyConfig::default();
    let mut r = KernelReport {
        attached: false,
        attach_mode: None,
        reason: None,
        verdict: KernelVerdict::Unverified,
        rule: RuleReport::new(
            &bpf.map_or_else(EpisodeRule::default_rule, SlotringBpf::episode_rule),
            &cfg,
        ),
        threads: 0,
        failing_tids: vec![],
        failing: vec![],
        parks: 0,
        parked_s: 0.0,
        parked_oncpu_s: 0.0,
        parked_oncpu_pct: 0.0,
        parked_runq_s: 0.0,
        unpark_wake_avg_us: 0.0,
        unpark_wake_max_us: 0.0,
        missed_events: 0,
        parked_oncpu_us_per_park: 0.0,
        segments: SegmentReport::default(),
    };
    let Some(bpf) = bpf else {
        r.reason = Some(if probes_wanted {
            "probes could not be loaded".into()
        } else {
            "probes disabled (probes = false)".into()
        });
        return r;
    };
    match bpf.status() {
        ProbeStatus::Attached(m) => {
            r.attached = true;
            r.attach_mode = Some(m);
        }
        ProbeStatus::Degraded(e) => r.reason = Some(crate::error_chain(e)),
    }
    let tids = bpf.threads();
    r.threads = tids.len() as u64;
    match bpf.verify(&tids, cfg) {
        Ok(v) => {
            let t = &v.total;
            let p = &t.parked;
            r.parks = p.parks;
            r.parked_s = p.parked_ns as f64 / 1e9;
            r.parked_oncpu_s = p.on_cpu_ns as f64 / 1e9;
            r.parked_oncpu_pct = p.parked_cpu_ratio() * 100.0;
            r.parked_runq_s = p.runq_ns as f64 / 1e9;
            r.unpark_wake_avg_us =
                t.unpark_lat_ns.checked_div(t.unpark_wakeups).unwrap_or(0) as f64 / 1e3;
            r.unpark_wake_max_us = t.unpark_lat_max_ns as f64 / 1e3;
            r.missed_events = p.missed_events;
            r.segments = SegmentReport::from(p);
            r.verdict = KernelVerdict::from(&v.verdict);
            match v.verdict {
                Verdict::Pass => {}
                Verdict::Fail { tids } => {
                    r.failing = v
                        .threads
                        .iter()
                        .filter(|t| !t.parked.pass)
                        .take(8)
                        .map(FailingThread::new)
                        .collect();
                    r.failing_tids = tids;
                }
                Verdict::Unverified { reason } => {
                    r.reason.get_or_insert(reason);
                }
            }
        }
        Err(e) => r.reason = Some(format!("verification failed: {}", crate::error_chain(&e))),
    }
    if r.attached && r.parks == 0 {
        // Nothing parked: nothing was verified (e.g. lease parking off).
        r.verdict = KernelVerdict::Unverified;
        r.reason = Some("no CPU lease was parked during the run".into());
    }
    r.parked_oncpu_us_per_park = if r.parks == 0 {
        0.0
    } else {
        r.parked_oncpu_s * 1e6 / r.parks as f64
    };
    r
}
