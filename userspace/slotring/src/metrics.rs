//! Prometheus metric families built from plain counter snapshots, and a
//! [`SlotringCollector`] that a service registers into its own
//! [`prometheus::Registry`].
//!
//! [`families`] turns a [`Snapshot`] into Prometheus metric families (built
//! with the `prometheus` crate's data model) and [`encode`] renders the text
//! exposition format that `/metrics` serves. [`SlotringCollector`] is the
//! same families behind the `prometheus::core::Collector` trait, fed by any
//! snapshot source: a closure over the service's own counter snapshots, or
//! the pinned maps of a process ([`SlotringCollector::pinned`]). Names follow the Prometheus
//! conventions: `_total` counters, base units (bytes, seconds), gauges
//! without suffix, one prefix per area (`slotring_throttler_*`,
//! `slotring_slots_*`, `slotring_io_*`). The families of the three counter
//! sets come from their field lists (`slotring_counters::counter_set!`):
//! name, HELP, type and unit conversion are declared once, with the field.
//!
//! The kernel's exp2 histograms (bucket 0 counts zeros, bucket `i >= 1`
//! counts values in `[2^(i-1), 2^i)` ns, the last bucket takes the rest)
//! become Prometheus histograms with **every** bucket present: bucket `i`
//! has the upper bound `le = 2^i ns` (a value below `2^i` is `<= 2^i`), the
//! last one is `+Inf`. The kernel keeps no sum, so `_sum` is estimated from
//! the bucket midpoints (said so in the HELP text).

use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};
use slotring_counters::{CounterSet, Kind};
use slotring_slots::WorkloadSlots;
use slotring_throttle::WorkloadCounters;

use crate::snapshot::{
    HIST_BUCKETS, SEGMENTS, Snapshot, WORKLOAD_SERIES, WorkloadSeries, bounded_workloads,
};

fn family(name: &str, help: &str, t: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_owned());
    f.set_help(help.to_owned());
    f.set_field_type(t);
    f.set_metric(metrics);
    f
}

fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    pairs
        .iter()
        .map(|(n, v)| {
            let mut l = LabelPair::default();
            l.set_name((*n).to_owned());
            l.set_value((*v).to_owned());
            l
        })
        .collect()
}

fn counter_metric(v: f64, l: &[(&str, &str)]) -> Metric {
    let mut c = Counter::default();
    c.set_value(v);
    let mut m = Metric::from_label(labels(l));
    m.set_counter(c);
    m
}

fn gauge_metric(v: f64, l: &[(&str, &str)]) -> Metric {
    let mut g = Gauge::default();
    g.set_value(v);
    let mut m = Metric::from_label(labels(l));
    m.set_gauge(g);
    m
}

fn counter(name: &str, help: &str, v: f64) -> MetricFamily {
    family(
        name,
        help,
        MetricType::COUNTER,
        vec![counter_metric(v, &[])],
    )
}

fn gauge(name: &str, help: &str, v: f64) -> MetricFamily {
    family(name, help, MetricType::GAUGE, vec![gauge_metric(v, &[])])
}

/// Upper bound (ns) of exp2 bucket `i` that is not the last one.
fn bucket_upper_ns(i: usize) -> u64 {
    1u64 << i
}

/// Convert an exp2 histogram (ns) into a Prometheus histogram in seconds,
/// with every bucket present. Returns the histogram and its estimated sum.
pub fn exp2_histogram(slots: &[u64; HIST_BUCKETS]) -> Histogram {
    let mut buckets = Vec::with_capacity(HIST_BUCKETS);
    let mut cumulative = 0u64;
    let mut sum_ns = 0f64;
    for (i, &c) in slots.iter().enumerate() {
        cumulative = cumulative.saturating_add(c);
        let (lo, hi) = match i {
            0 => (0.0, 0.0),
            _ => ((1u64 << (i - 1)) as f64, (1u64 << i) as f64),
        };
        sum_ns += c as f64 * (lo + hi) / 2.0;
        // The last exp2 bucket is the `+Inf` bucket, which the encoder
        // writes (spelled `+Inf`) from the sample count.
        if i + 1 < HIST_BUCKETS {
            let mut b = Bucket::default();
            b.set_cumulative_count(cumulative);
            b.set_upper_bound(bucket_upper_ns(i) as f64 / 1e9);
            buckets.push(b);
        }
    }
    let mut h = Histogram::default();
    h.set_bucket(buckets);
    h.set_sample_count(cumulative);
    h.set_sample_sum(sum_ns / 1e9);
    h
}

fn histogram(name: &str, help: &str, slots: &[u64; HIST_BUCKETS]) -> MetricFamily {
    labelled_histograms(name, help, &[(&[], slots)])
}

/// One series of a histogram family: its labels and exp2 buckets.
type HistSeries<'a> = (&'a [(&'a str, &'a str)], &'a [u64; HIST_BUCKETS]);

/// One histogram family with a series per `(labels, buckets)`.
fn labelled_histograms(name: &str, help: &str, series: &[HistSeries<'_>]) -> MetricFamily {
    let metrics = series
        .iter()
        .map(|(l, slots)| {
            let mut m = Metric::from_label(labels(l));
            m.set_histogram(exp2_histogram(slots));
            m
        })
        .collect();
    family(name, help, MetricType::HISTOGRAM, metrics)
}

/// One counter family with a series per segment of a parked episode.
fn per_segment(name: &str, help: &str, values: [f64; 3]) -> MetricFamily {
    let metrics = SEGMENTS
        .iter()
        .zip(values)
        .map(|(seg, v)| counter_metric(v, &[("segment", seg)]))
        .collect();
    family(name, help, MetricType::COUNTER, metrics)
}

fn secs_ns(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// One family per field of a counter set (name, help, type and unit from
/// its field list), with one series per `(labels, counters)` entry.
fn counter_set_families<T: CounterSet>(
    series: &[(Vec<(&str, &str)>, T)],
    out: &mut Vec<MetricFamily>,
) {
    for (i, f) in T::FIELDS.iter().enumerate() {
        let metric = match f.kind {
            Kind::Counter => counter_metric,
            Kind::Gauge => gauge_metric,
        };
        let t = match f.kind {
            Kind::Counter => MetricType::COUNTER,
            Kind::Gauge => MetricType::GAUGE,
        };
        let metrics = series
            .iter()
            .map(|(l, c)| metric(f.export(c.get(i)), l))
            .collect();
        out.push(family(f.metric, f.help, t, metrics));
    }
}

/// The metric families of a snapshot, in a stable order.
pub fn families(s: &Snapshot) -> Vec<MetricFamily> {
    let mut out = Vec::new();
    // Throttlers (one series per throttler), CPU slots, IO engine: every
    // field of their counter sets, described by its `counter_set!` line.
    if !s.throttlers.is_empty() {
        let series: Vec<_> = s
            .throttlers
            .iter()
            .map(|th| (vec![("throttler", th.name.as_str())], th.counters))
            .collect();
        counter_set_families(&series, &mut out);
    }
    counter_set_families(&[(vec![], s.slots)], &mut out);
    if let Some(a) = s.adaptive {
        counter_set_families(&[(vec![], a)], &mut out);
    }
    counter_set_families(&[(vec![], s.uring)], &mut out);
    // Tenants: the top ones by bytes and `other` (bounded cardinality).
    if !s.tenants.is_empty() {
        let top = crate::snapshot::top_tenants(&s.tenants, crate::snapshot::TENANT_SERIES);
        let series = |f: &dyn Fn(&crate::snapshot::TenantStat) -> f64| {
            top.iter()
                .map(|t| counter_metric(f(t), &[("tenant", t.name.as_str())]))
                .collect()
        };
        out.push(family(
            "slotring_tenant_bytes_total",
            "Bytes charged to throttlers as this tenant (the top tenants by bytes; `other` sums the rest, so it may step down when a tenant enters the top).",
            MetricType::COUNTER,
            series(&|t| t.charged as f64),
        ));
        out.push(family(
            "slotring_tenant_wait_seconds_total",
            "Time this tenant's requests waited on throttlers (same series as slotring_tenant_bytes_total).",
            MetricType::COUNTER,
            series(&|t| secs_ns(t.wait_ns)),
        ));
    }
    workload_families(&s.workloads, &mut out);
    cpu_workload_families(&s.cpu_workloads, &mut out);
    // Kernel probes.
    out.push(gauge(
        "slotring_probes_attached",
        "1 when the eBPF probes are attached, 0 when running without them.",
        if s.kernel.is_some() { 1.0 } else { 0.0 },
    ));
    if let Some(k) = &s.kernel {
        out.push(gauge(
            "slotring_bpf_threads",
            "Threads registered with the eBPF probes.",
            k.threads as f64,
        ));
        out.push(counter(
            "slotring_parked_seconds_total",
            "Wall time with a CPU lease parked, summed over threads.",
            secs_ns(k.parked_ns),
        ));
        out.push(counter(
            "slotring_parked_oncpu_seconds_total",
            "On-CPU time while the lease was parked (kernel-measured).",
            secs_ns(k.parked_oncpu_ns),
        ));
        out.push(counter(
            "slotring_parked_runqueue_seconds_total",
            "Run-queue time while the lease was parked (kernel-measured).",
            secs_ns(k.parked_runq_ns),
        ));
        out.push(counter(
            "slotring_running_oncpu_seconds_total",
            "On-CPU time while holding a running lease (kernel-measured).",
            secs_ns(k.running_oncpu_ns),
        ));
        out.push(counter(
            "slotring_bpf_missed_events_total",
            "Context switches BPF never saw (time stays exact).",
            k.missed_events as f64,
        ));
        out.push(counter(
            "slotring_parked_episodes_total",
            "Parked episodes (one park up to its unpark) that ended, as the kernel saw them.",
            k.episodes as f64,
        ));
        out.push(counter(
            "slotring_parked_hot_episodes_total",
            "Parked episodes with a segment over the kernel's per-episode bound (the verdict fails a thread with more than a few).",
            k.hot_episodes as f64,
        ));
        out.push(per_segment(
            "slotring_parked_segment_oncpu_seconds_total",
            "On-CPU time of parked episodes by segment: pre_sleep (park to first sleep), between_sleeps, post_wake (last wake-up to unpark).",
            k.segment_oncpu_ns.map(secs_ns),
        ));
        out.push(per_segment(
            "slotring_parked_segment_hot_episodes_total",
            "Parked episodes over the bound of this segment.",
            k.segment_hot.map(|n| n as f64),
        ));
        out.push(histogram(
            "slotring_parked_oncpu_episode_seconds",
            "On-CPU time per parked episode, one sample per episode, from the kernel's exp2 buckets (sum estimated from bucket midpoints).",
            &k.hist_park_cpu,
        ));
        let seg: Vec<[(&str, &str); 1]> = SEGMENTS.iter().map(|s| [("segment", *s)]).collect();
        let series: Vec<HistSeries<'_>> = seg
            .iter()
            .zip(&k.hist_segments)
            .map(|(l, h)| (&l[..], h))
            .collect();
        out.push(labelled_histograms(
            "slotring_parked_segment_oncpu_episode_seconds",
            "On-CPU time of one segment of a parked episode, one sample per episode that has it (post_wake: it slept; between_sleeps: it slept twice or more), from the kernel's exp2 buckets (sum estimated from bucket midpoints).",
            &series,
        ));
        out.push(histogram(
            "slotring_unpark_runqueue_latency_seconds",
            "Run-queue latency at unpark, from the kernel's exp2 buckets (sum estimated from bucket midpoints).",
            &k.hist_unpark_rq,
        ));
    }
    out
}

/// A workload's wait histogram (bucket `k` counts waits below `2^k` µs,
/// the last the rest: [`slotring_throttle::workload_wait_bucket_bound`]) as
/// a Prometheus histogram in seconds, every bucket present. The scheduler
/// keeps no sum: `_sum` is estimated from the bucket midpoints (bucket 0,
/// mostly no wait at all, as 0; the last at its lower bound).
pub fn wait_histogram(buckets: &[u64; slotring_throttle::WORKLOAD_WAIT_BUCKETS]) -> Histogram {
    let mut out = Vec::with_capacity(buckets.len());
    let (mut cumulative, mut sum_us) = (0u64, 0f64);
    for (k, &c) in buckets.iter().enumerate() {
        cumulative = cumulative.saturating_add(c);
        let estimate_us = match k {
            0 => 0.0,
            _ if k + 1 == buckets.len() => (1u64 << (k - 1)) as f64,
            _ => 0.75 * (1u64 << k) as f64,
        };
        sum_us += c as f64 * estimate_us;
        if let Some(bound) = slotring_throttle::workload_wait_bucket_bound(k) {
            let mut b = Bucket::default();
            b.set_cumulative_count(cumulative);
            b.set_upper_bound(bound.as_secs_f64());
            out.push(b);
        }
    }
    let mut h = Histogram::default();
    h.set_bucket(out);
    h.set_sample_count(cumulative);
    h.set_sample_sum(sum_us / 1e6);
    h
}

/// One family with a series per workload: its name, help and type, and a
/// workload's value.
type PerWorkload<W> = (&'static str, &'static str, MetricType, fn(&W) -> f64);

/// The families of `table`, one series per workload of `shown` (label
/// `workload`).
fn per_workload<W: WorkloadSeries>(
    shown: &[W],
    table: &[PerWorkload<W>],
    out: &mut Vec<MetricFamily>,
) {
    for &(name, help, t, value) in table {
        let metric = if t == MetricType::COUNTER {
            counter_metric
        } else {
            gauge_metric
        };
        let series = shown
            .iter()
            .map(|w| metric(value(w), &[("workload", w.name())]))
            .collect();
        out.push(family(name, help, t, series));
    }
}

/// The disk's workload families: one series per workload of
/// [`bounded_workloads`] (label `workload`), none without a tree.
fn workload_families(all: &[WorkloadCounters], out: &mut Vec<MetricFamily>) {
    if all.is_empty() {
        return;
    }
    let shown = bounded_workloads(all, WORKLOAD_SERIES);
    per_workload(
        &shown,
        &[
            (
                "slotring_workload_bytes_total",
                "Bytes granted to this workload's subtree by the disk's workload scheduler (refunds counted apart); `other` sums the leaf workloads beyond the first 64.",
                MetricType::COUNTER,
                |w| w.bytes as f64,
            ),
            (
                "slotring_workload_refunded_bytes_total",
                "Bytes given back to this workload's caps after their grant (page-cache reads found after their charge).",
                MetricType::COUNTER,
                |w| w.refunded_bytes as f64,
            ),
            (
                "slotring_workload_requests_total",
                "Requests granted to this workload's subtree.",
                MetricType::COUNTER,
                |w| w.requests as f64,
            ),
            (
                "slotring_workload_queued",
                "Requests queued in this workload's subtree now.",
                MetricType::GAUGE,
                |w| w.queued as f64,
            ),
            (
                "slotring_workload_in_flight",
                "Requests in flight through this workload now, where it limits them (max_io_requests; 0 elsewhere).",
                MetricType::GAUGE,
                |w| w.in_flight_requests as f64,
            ),
        ],
        out,
    );
    let metrics = shown
        .iter()
        .map(|w| {
            let mut m = Metric::from_label(labels(&[("workload", w.name.as_str())]));
            m.set_histogram(wait_histogram(&w.wait_histogram));
            m
        })
        .collect();
    out.push(family(
        "slotring_workload_wait_seconds",
        "How long this workload's requests queued for their turn, power-of-two microsecond buckets (sum estimated from the bucket midpoints).",
        MetricType::HISTOGRAM,
        metrics,
    ));
}

/// The CPU slots' workload families: one series per workload of
/// [`bounded_workloads`] (label `workload`), none without a tree.
fn cpu_workload_families(all: &[WorkloadSlots], out: &mut Vec<MetricFamily>) {
    if all.is_empty() {
        return;
    }
    per_workload(
        &bounded_workloads(all, WORKLOAD_SERIES),
        &[
            (
                "slotring_workload_cpu_slot_seconds_total",
                "Slot time of this workload's subtree: seconds its competing CPU slots counted, unparked (a slot's time is added when it parks or is released); `other` sums the leaf workloads beyond the first 64.",
                MetricType::COUNTER,
                |w| secs_ns(w.slot_ns),
            ),
            (
                "slotring_workload_cpu_slots_held",
                "Competing CPU slots counted against this workload now (granted or acquired, not parked).",
                MetricType::GAUGE,
                |w| w.held as f64,
            ),
            (
                "slotring_workload_cpu_grants_total",
                "CPU slots granted through this workload.",
                MetricType::COUNTER,
                |w| w.grants as f64,
            ),
            (
                "slotring_workload_cpu_preemptions_total",
                "Yields this workload's slot holders promised because a waiting workload of higher priority outranked it.",
                MetricType::COUNTER,
                |w| w.preemptions as f64,
            ),
        ],
        out,
    );
}

/// The text exposition format of [`families`].
pub fn encode(s: &Snapshot) -> String {
    prometheus::TextEncoder::new()
        .encode_to_string(&families(s))
        .expect("every family has a name and at least one metric")
}

/// A `prometheus` [`Collector`](prometheus::core::Collector) of slotring's
/// metrics, for a service's own [`prometheus::Registry`] (the way a Rust
/// service exports a library's metrics, like the process collector).
///
/// Each scrape takes one [`Snapshot`] from the source and returns
/// [`families`] of it. The `slotring` command's `run` and `exporter` serve
/// exactly this collector.
///
/// ```
/// use slotring::metrics::SlotringCollector;
/// use slotring::snapshot::Snapshot;
///
/// let registry = prometheus::Registry::new();
/// registry.register(Box::new(SlotringCollector::new(Snapshot::default)))?;
/// let text = prometheus::TextEncoder::new().encode_to_string(&registry.gather())?;
/// assert!(text.contains("slotring_probes_attached 0"));
/// # Ok::<(), prometheus::Error>(())
/// ```
pub struct SlotringCollector {
    source: Source,
    descs: Vec<prometheus::core::Desc>,
}

enum Source {
    /// The service's own snapshots.
    Live(Box<dyn Fn() -> Snapshot + Send + Sync>),
    /// Another process's pinned maps.
    #[cfg(feature = "bpf")]
    Pinned(crate::pinned::PinnedMaps),
    /// Every instance under a pin root.
    #[cfg(feature = "bpf")]
    Instances(std::path::PathBuf),
}

/// The label naming the instance (its pin directory name) on every series
/// of [`SlotringCollector::pinned_instances`]. Not `instance`: Prometheus
/// sets that one to the scrape target (and would rename ours to
/// `exported_instance`).
pub const INSTANCE_LABEL: &str = "slotring_instance";

/// The families of a stale instance (its process is gone): only
/// `slotring_probes_attached 0`, no frozen counters.
#[cfg(feature = "bpf")]
fn stale_families() -> Vec<MetricFamily> {
    families(&Snapshot::default())
        .into_iter()
        .filter(|f| f.name() == "slotring_probes_attached")
        .collect()
}

/// The families of one pinned instance: its snapshot, or (stale, or
/// unreadable) `slotring_probes_attached 0` alone.
#[cfg(feature = "bpf")]
fn pinned_families(maps: &crate::pinned::PinnedMaps) -> Result<Vec<MetricFamily>, ()> {
    if maps.liveness().map_err(drop)?.is_stale() {
        return Ok(stale_families());
    }
    maps.snapshot().map(|s| families(&s)).map_err(drop)
}

/// Merge `fams` into `into` (one family per name), with `label = value`
/// first on every series.
#[cfg(feature = "bpf")]
fn merge_labelled(into: &mut Vec<MetricFamily>, fams: Vec<MetricFamily>, label: &str, value: &str) {
    for mut f in fams {
        let mut metrics = f.take_metric();
        for m in metrics.iter_mut() {
            let mut l = labels(&[(label, value)]);
            l.extend(m.take_label());
            m.set_label(l);
        }
        match into.iter_mut().find(|g| g.name() == f.name()) {
            Some(g) => g.mut_metric().extend(metrics),
            None => {
                f.set_metric(metrics);
                into.push(f);
            }
        }
    }
}

const PINNED_UP_NAME: &str = "slotring_exporter_up";

/// The gauge a pinned-map collector adds: whether the maps could be read.
#[cfg(feature = "bpf")]
const PINNED_UP: (&str, &str) = (
    PINNED_UP_NAME,
    "1 when the pinned maps (or the pin root) could be read.",
);

impl std::fmt::Debug for SlotringCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotringCollector")
            .field("families", &self.descs.len())
            .finish_non_exhaustive()
    }
}

impl SlotringCollector {
    /// Collect from `snapshot`, called once per scrape.
    pub fn new(snapshot: impl Fn() -> Snapshot + Send + Sync + 'static) -> Self {
        Self {
            source: Source::Live(Box::new(snapshot)),
            descs: every_desc(&[], None),
        }
    }

    /// Collect from the maps pinned under `maps`' directory by any process
    /// that embeds slotring with probes. Every scrape also reports
    /// `slotring_exporter_up` (0, and no other family, when the maps cannot
    /// be read).
    #[cfg(feature = "bpf")]
    pub fn pinned(maps: crate::pinned::PinnedMaps) -> Self {
        Self {
            source: Source::Pinned(maps),
            descs: every_desc(&[PINNED_UP], None),
        }
    }

    /// Collect every instance pinned under `root` (see
    /// [`crate::pinned::instances`]), each series labelled
    /// [`INSTANCE_LABEL`]`="<directory name>"`. A stale instance (its
    /// process is gone) reports only `slotring_probes_attached 0`, as does
    /// one whose maps cannot be read. `slotring_exporter_up` is 1 when at
    /// least one instance could be read (0: no root, no instance, or no
    /// permission).
    #[cfg(feature = "bpf")]
    pub fn pinned_instances(root: impl Into<std::path::PathBuf>) -> Self {
        Self {
            source: Source::Instances(root.into()),
            descs: every_desc(&[PINNED_UP], Some(INSTANCE_LABEL)),
        }
    }
}

/// The descriptor of every family any snapshot can produce (a snapshot with
/// one throttler and the kernel part has them all), so that the registry can
/// reject a name clash with the service's own metrics at registration.
fn every_desc(gauges: &[(&str, &str)], label: Option<&str>) -> Vec<prometheus::core::Desc> {
    let full = Snapshot {
        throttlers: vec![crate::snapshot::NamedThrottler::default()],
        kernel: Some(crate::snapshot::KernelSnapshot::default()),
        tenants: vec![crate::snapshot::TenantStat::default()],
        adaptive: Some(slotring_slots::AdaptiveCounters::default()),
        workloads: vec![WorkloadCounters::default()],
        cpu_workloads: vec![WorkloadSlots::other()],
        ..Snapshot::default()
    };
    let mut all = families(&full);
    all.extend(gauges.iter().map(|(name, help)| gauge(name, help, 0.0)));
    all.iter()
        .map(|f| {
            let mut labels: Vec<String> = f
                .get_metric()
                .first()
                .map(|m| m.get_label().iter().map(|l| l.name().to_owned()).collect())
                .unwrap_or_default();
            if let Some(l) = label
                && f.name() != PINNED_UP_NAME
            {
                labels.insert(0, l.to_owned());
            }
            prometheus::core::Desc::new(
                f.name().to_owned(),
                f.help().to_owned(),
                labels,
                std::collections::HashMap::new(),
            )
            .expect("every family name and help is valid")
        })
        .collect()
}

impl prometheus::core::Collector for SlotringCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        match &self.source {
            Source::Live(snapshot) => families(&snapshot()),
            #[cfg(feature = "bpf")]
            Source::Pinned(maps) => {
                let (name, help) = PINNED_UP;
                match pinned_families(maps) {
                    Ok(mut f) => {
                        f.push(gauge(name, help, 1.0));
                        f
                    }
                    Err(()) => vec![gauge(name, help, 0.0)],
                }
            }
            #[cfg(feature = "bpf")]
            Source::Instances(root) => {
                let (name, help) = PINNED_UP;
                let Ok(list) = crate::pinned::instances(root) else {
                    return vec![gauge(name, help, 0.0)];
                };
                let mut out = Vec::new();
                let mut read = false;
                for inst in &list {
                    let fams = match pinned_families(&inst.maps) {
                        Ok(f) => {
                            read = true;
                            f
                        }
                        Err(()) => stale_families(),
                    };
                    merge_labelled(&mut out, fams, INSTANCE_LABEL, &inst.name);
                }
                out.push(gauge(name, help, if read { 1.0 } else { 0.0 }));
                out
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{KernelSnapshot, NamedThrottler};
    use slotring_slots::{SlotsCounters, UNLIMITED};
    use slotring_throttle::ThrottleCounters;

    #[test]
    fn exp2_buckets_are_cumulative_and_complete() {
        let mut slots = [0u64; HIST_BUCKETS];
        slots[0] = 2; // zeros
        slots[3] = 1; // [4, 8) ns
        slots[HIST_BUCKETS - 1] = 5; // the rest
        let h = exp2_histogram(&slots);
        let b = h.get_bucket();
        // 39 finite buckets; the encoder adds `+Inf` from the count.
        assert_eq!(b.len(), HIST_BUCKETS - 1);
        assert_eq!(b[0].cumulative_count(), 2);
        assert_eq!(b[0].upper_bound(), 1e-9);
        assert_eq!(b[2].cumulative_count(), 2);
        assert_eq!(b[3].cumulative_count(), 3);
        assert_eq!(b[3].upper_bound(), 8e-9);
        assert_eq!(b[HIST_BUCKETS - 2].cumulative_count(), 3);
        assert_eq!(h.get_sample_count(), 8);
        // 0 for the zeros, 6 ns for the [4, 8) value, midpoint of the last.
        let last = ((1u64 << 38) as f64 + (1u64 << 39) as f64) / 2.0;
        assert!((h.get_sample_sum() - (6.0 + 5.0 * last) / 1e9).abs() < 1e-12);
    }

    #[test]
    fn text_has_issue_names_and_labels() {
        let s = Snapshot {
            throttlers: vec![NamedThrottler {
                name: "local_read".into(),
                counters: ThrottleCounters {
                    amount: 1 << 20,
                    page_cache_amount: 4096,
                    wait_us: 1_500_000,
                    ..Default::default()
                },
            }],
            slots: SlotsCounters {
                max_concurrency: UNLIMITED,
                slots_delayed: 3,
                ..Default::default()
            },
            kernel: Some(KernelSnapshot {
                parked_oncpu_ns: 2_000_000,
                ..Default::default()
            }),
            ..Default::default()
        };
        let text = encode(&s);
        assert!(
            text.contains("slotring_throttler_bytes_total{throttler=\"local_read\"} 1048576\n")
        );
        assert!(
            text.contains("slotring_throttler_wait_seconds_total{throttler=\"local_read\"} 1.5\n")
        );
        assert!(text.contains("slotring_slots_delayed_total 3\n"));
        assert!(text.contains("slotring_slots_max 0\n"));
        assert!(text.contains("slotring_parked_oncpu_seconds_total 0.002\n"));
        assert!(text.contains("slotring_probes_attached 1\n"));
        let buckets = text
            .lines()
            .filter(|l| l.starts_with("slotring_unpark_runqueue_latency_seconds_bucket"))
            .count();
        assert_eq!(buckets, HIST_BUCKETS);
        assert!(text.contains("slotring_unpark_runqueue_latency_seconds_bucket{le=\"+Inf\"} 0\n"));
    }

    #[test]
    fn parked_segments_are_labelled_series() {
        let mut post = [0; HIST_BUCKETS];
        post[20] = 7;
        let s = Snapshot {
            kernel: Some(KernelSnapshot {
                episodes: 50,
                hot_episodes: 7,
                segment_oncpu_ns: [1_000, 0, 3_000_000],
                segment_hot: [0, 0, 7],
                hist_segments: [[0; HIST_BUCKETS], [0; HIST_BUCKETS], post],
                ..Default::default()
            }),
            ..Default::default()
        };
        let text = encode(&s);
        for line in [
            "slotring_parked_episodes_total 50\n",
            "slotring_parked_hot_episodes_total 7\n",
            "slotring_parked_segment_oncpu_seconds_total{segment=\"pre_sleep\"} 0.000001\n",
            "slotring_parked_segment_oncpu_seconds_total{segment=\"post_wake\"} 0.003\n",
            "slotring_parked_segment_hot_episodes_total{segment=\"between_sleeps\"} 0\n",
            "slotring_parked_segment_hot_episodes_total{segment=\"post_wake\"} 7\n",
            "slotring_parked_segment_oncpu_episode_seconds_count{segment=\"post_wake\"} 7\n",
            "slotring_parked_segment_oncpu_episode_seconds_count{segment=\"pre_sleep\"} 0\n",
        ] {
            assert!(text.contains(line), "{line}{text}");
        }
        let buckets = text
            .lines()
            .filter(|l| l.starts_with("slotring_parked_segment_oncpu_episode_seconds_bucket"))
            .count();
        assert_eq!(buckets, 3 * HIST_BUCKETS, "every bucket of every segment");
    }

    #[test]
    fn adaptive_budget_families_only_with_a_loop() {
        let s = Snapshot {
            slots: SlotsCounters {
                max_concurrency: 4,
                budget_effective: 2,
                ..Default::default()
            },
            adaptive: Some(slotring_slots::AdaptiveCounters {
                adaptive: 1,
                budget: 2,
                runq_share_bp: 1250,
                runq_us: 500_000,
                ..Default::default()
            }),
            ..Default::default()
        };
        let text = encode(&s);
        assert!(
            text.contains("slotring_slots_budget_effective 2\n"),
            "{text}"
        );
        assert!(text.contains("slotring_slots_adaptive_enabled 1\n"));
        assert!(text.contains("slotring_slots_adaptive_runq_share_basis_points 1250\n"));
        assert!(text.contains("slotring_slots_adaptive_runq_seconds_total 0.5\n"));
        let none = encode(&Snapshot::default());
        assert!(none.contains("slotring_slots_budget_effective"));
        assert!(!none.contains("slotring_slots_adaptive_"));
    }

    #[test]
    fn no_kernel_means_no_kernel_families() {
        let text = encode(&Snapshot::default());
        assert!(text.contains("slotring_probes_attached 0\n"));
        assert!(!text.contains("slotring_parked_oncpu_seconds_total"));
        assert!(!text.contains("slotring_throttler_bytes_total"));
    }

    #[test]
    fn tenants_export_the_top_ones_and_other() {
        let s = Snapshot {
            tenants: (0..50u64)
                .map(|i| crate::snapshot::TenantStat {
                    name: format!("q{i}"),
                    charged: i << 20,
                    wait_ns: 500_000_000,
                })
                .collect(),
            ..Snapshot::default()
        };
        let text = encode(&s);
        assert!(
            text.contains("slotring_tenant_bytes_total{tenant=\"q49\"} 51380224\n"),
            "{text}"
        );
        assert!(text.contains("slotring_tenant_wait_seconds_total{tenant=\"q40\"} 0.5\n"));
        assert!(!text.contains("tenant=\"q39\""), "outside the top 10");
        let other: u64 = (0..40u64).map(|i| i << 20).sum();
        assert!(text.contains(&format!(
            "slotring_tenant_bytes_total{{tenant=\"other\"}} {other}\n"
        )));
        assert_eq!(text.matches("slotring_tenant_bytes_total{").count(), 11);
        assert!(!encode(&Snapshot::default()).contains("slotring_tenant_"));
    }

    #[test]
    fn workloads_export_bounded_series_and_their_wait_histograms() {
        use slotring_throttle::{WORKLOAD_WAIT_BUCKETS, WorkloadCounters};
        let w = |i: u64| {
            let mut wait_histogram = [0; WORKLOAD_WAIT_BUCKETS];
            // One request without a wait, one of [2, 4) µs, one over a second.
            wait_histogram[0] = 1;
            wait_histogram[2] = 1;
            wait_histogram[WORKLOAD_WAIT_BUCKETS - 1] = 1;
            WorkloadCounters {
                name: if i == 0 {
                    "all".into()
                } else {
                    format!("w{i}")
                },
                parent: (i > 0).then(|| "all".into()),
                bytes: i << 20,
                requests: 3,
                refunded_bytes: i,
                queued: i % 3,
                in_flight_requests: 1,
                in_flight_bytes: 0,
                peak_in_flight_requests: 1,
                wait_histogram,
            }
        };
        // The root and 69 leaves: 64 series, the last 6 leaves in `other`.
        let s = Snapshot {
            workloads: (0..70).map(w).collect(),
            ..Default::default()
        };
        let text = encode(&s);
        assert_eq!(text.matches("slotring_workload_bytes_total{").count(), 65);
        assert!(text.contains("slotring_workload_bytes_total{workload=\"w63\"} 66060288\n"));
        assert!(!text.contains("workload=\"w64\""), "beyond the first 64");
        let other: u64 = (64..70u64).map(|i| i << 20).sum();
        for line in [
            format!("slotring_workload_bytes_total{{workload=\"other\"}} {other}\n"),
            "slotring_workload_requests_total{workload=\"other\"} 18\n".into(),
            "slotring_workload_refunded_bytes_total{workload=\"w5\"} 5\n".into(),
            "slotring_workload_queued{workload=\"w5\"} 2\n".into(),
            "slotring_workload_in_flight{workload=\"other\"} 6\n".into(),
            "slotring_workload_wait_seconds_bucket{workload=\"w1\",le=\"0.000001\"} 1\n".into(),
            "slotring_workload_wait_seconds_bucket{workload=\"w1\",le=\"0.000004\"} 2\n".into(),
            "slotring_workload_wait_seconds_bucket{workload=\"w1\",le=\"1.048576\"} 2\n".into(),
            "slotring_workload_wait_seconds_bucket{workload=\"w1\",le=\"+Inf\"} 3\n".into(),
            "slotring_workload_wait_seconds_count{workload=\"w1\"} 3\n".into(),
        ] {
            assert!(text.contains(&line), "{line}");
        }
        let w1_buckets = text
            .lines()
            .filter(|l| l.starts_with("slotring_workload_wait_seconds_bucket{workload=\"w1\""))
            .count();
        assert_eq!(
            w1_buckets, WORKLOAD_WAIT_BUCKETS,
            "every bucket, +Inf included"
        );
        // 0 for no wait, 3 µs for [2, 4), the last bucket's lower bound 2^20 µs.
        let h = wait_histogram(&w(1).wait_histogram);
        assert!((h.get_sample_sum() - (3.0 + (1u64 << 20) as f64) / 1e6).abs() < 1e-12);
        assert!(!encode(&Snapshot::default()).contains("slotring_workload_"));
    }

    #[test]
    fn cpu_workloads_export_bounded_series_of_slot_time_holdings_grants_and_preemptions() {
        let w = |i: u64| WorkloadSlots {
            held: i % 4,
            grants: 10 + i,
            preemptions: i / 2,
            // i.5 s of slot time.
            slot_ns: i * 1_000_000_000 + 500_000_000,
            ..WorkloadSlots {
                name: if i == 0 {
                    "all".into()
                } else {
                    format!("w{i}")
                },
                parent: (i > 0).then(|| "all".into()),
                ..WorkloadSlots::other()
            }
        };
        // The root and 69 leaves: 64 series, the last 6 leaves in `other`.
        let s = Snapshot {
            cpu_workloads: (0..70).map(w).collect(),
            ..Default::default()
        };
        let text = encode(&s);
        for family in [
            "slotring_workload_cpu_slot_seconds_total{",
            "slotring_workload_cpu_slots_held{",
            "slotring_workload_cpu_grants_total{",
            "slotring_workload_cpu_preemptions_total{",
        ] {
            assert_eq!(text.matches(family).count(), 65, "{family}");
        }
        assert!(!text.contains("workload=\"w64\""), "beyond the first 64");
        let other = |f: fn(u64) -> u64| (64..70u64).map(f).sum::<u64>();
        for line in [
            "# TYPE slotring_workload_cpu_slot_seconds_total counter\n".to_owned(),
            "# TYPE slotring_workload_cpu_slots_held gauge\n".into(),
            "# TYPE slotring_workload_cpu_grants_total counter\n".into(),
            "# TYPE slotring_workload_cpu_preemptions_total counter\n".into(),
            "slotring_workload_cpu_slot_seconds_total{workload=\"w3\"} 3.5\n".into(),
            "slotring_workload_cpu_slots_held{workload=\"w63\"} 3\n".into(),
            "slotring_workload_cpu_grants_total{workload=\"w5\"} 15\n".into(),
            "slotring_workload_cpu_preemptions_total{workload=\"w5\"} 2\n".into(),
            format!(
                "slotring_workload_cpu_slot_seconds_total{{workload=\"other\"}} {}\n",
                other(|i| i) as f64 + 3.0
            ),
            format!(
                "slotring_workload_cpu_slots_held{{workload=\"other\"}} {}\n",
                other(|i| i % 4)
            ),
            format!(
                "slotring_workload_cpu_grants_total{{workload=\"other\"}} {}\n",
                other(|i| 10 + i)
            ),
            format!(
                "slotring_workload_cpu_preemptions_total{{workload=\"other\"}} {}\n",
                other(|i| i / 2)
            ),
        ] {
            assert!(text.contains(&line), "{line}");
        }
        assert!(
            !text.contains("slotring_workload_bytes_total"),
            "no disk tree, no disk families"
        );
        assert!(!encode(&Snapshot::default()).contains("slotring_workload_cpu_"));
    }
}
