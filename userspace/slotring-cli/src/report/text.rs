//! The report as text: one section per part of the run.

use std::fmt;

use super::*;

fn mib(b: f64) -> f64 {
    b / (1 << 20) as f64
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_data_file(f)?;
        self.write_throttlers(f)?;
        if let Some(w) = &self.workloads {
            write!(f, "{w}")?;
        }
        self.write_slots(f)?;
        self.write_kernel(f)?;
        writeln!(
            f,
            "\nprocess: {:.2} CPU s, peak {} threads ({} query threads created)",
            self.process.cpu_s, self.process.peak_threads, self.process.query_threads
        )?;
        if let Some(a) = &self.metrics_addr {
            writeln!(f, "metrics were served at http://{a}/metrics")?;
        }
        Ok(())
    }
}

impl Report {
    /// The run's heading and its data file.
    fn write_data_file(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        writeln!(
            f,
            "slotring run: {:.1} s{}, {} scans x {} threads + short queries every {:?}, engine {}",
            self.elapsed_s,
            if self.interrupted {
                " (interrupted)"
            } else {
                ""
            },
            c.scans,
            c.scan_threads,
            c.short_query_interval,
            self.io.engine
        )?;
        if let Some(r) = &self.io.fallback_reason {
            writeln!(f, "  io_uring not used: {r}")?;
        }
        writeln!(
            f,
            "data file: {} ({:.0} MiB on {}{})",
            self.data_file.path,
            mib(self.data_file.size_bytes as f64),
            self.data_file.filesystem,
            if self.data_file.kept {
                ", kept"
            } else {
                ", removed"
            }
        )?;
        if let Some(end) = self.data_file.size_at_end_bytes
            && end != self.data_file.size_bytes
        {
            writeln!(
                f,
                "  the data file was {end} bytes at the end, not {}",
                self.data_file.size_bytes
            )?;
        }
        if let Some(d) = &self.data_file.disk_writes {
            let write_limit = self.config.max_local_write_bandwidth;
            writeln!(
                f,
                "  disk writes while creating it, 100 ms windows: peak {:.1} MiB/s, median {:.1} MiB/s \
                 (limit {}; neighbours' peak before: {:.1} MiB/s; {})",
                mib(d.peak_bytes_per_s),
                mib(d.median_bytes_per_s),
                if write_limit == 0 {
                    "unlimited".to_owned()
                } else {
                    format!("{:.1} MiB/s", mib(write_limit as f64))
                },
                mib(d.neighbours_peak_bytes_per_s),
                d.stat
            )?;
        }
        Ok(())
    }

    /// The throttlers and the engine's reads.
    fn write_throttlers(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "\nthrottlers (achieved vs configured):")?;
        writeln!(
            f,
            "  {:<12} {:>12} {:>12} {:>12} {:>9} {:>14} {:>9}",
            "name", "configured", "achieved", "sustained", "error", "page cache", "waited"
        )?;
        for t in &self.throttlers {
            let conf = if t.configured_bytes_per_s == 0 {
                "unlimited".to_owned()
            } else {
                format!("{:.1} MiB/s", mib(t.configured_bytes_per_s as f64))
            };
            let err = t
                .rate_error_pct
                .map_or("-".to_owned(), |e| format!("{e:.2}%"));
            writeln!(
                f,
                "  {:<12} {:>12} {:>7.1} MiB/s {:>6.1} MiB/s {:>9} {:>10.1} MiB {:>8.2}s",
                t.name,
                conf,
                mib(t.achieved_bytes_per_s),
                mib(t.sustained_bytes_per_s),
                err,
                mib(t.page_cache_bytes_not_charged as f64),
                t.wait_s
            )?;
        }
        writeln!(
            f,
            "  page-cache bytes not charged to the disk: {:.1} MiB ({} hits, {} NOWAIT misses, {} cachestat checks)",
            mib(self.io.page_cache_bytes as f64),
            self.io.page_cache_hits,
            self.io.nowait_misses,
            self.io.cachestat_checks
        )?;
        writeln!(
            f,
            "  reads: {} ({:.1} MiB), throttle waits booked: {} ({:.2} s)",
            self.io.reads,
            mib(self.io.read_bytes as f64),
            self.io.waits,
            self.io.wait_s
        )?;
        if self.io.reads_failed() {
            writeln!(
                f,
                "  FAILED READS: {} errors, {} short reads (end of file before {:.0} MiB){}",
                self.io.read_errors,
                self.io.short_reads,
                mib(self.data_file.size_bytes as f64),
                self.io
                    .first_read_error
                    .as_ref()
                    .map_or(String::new(), |e| format!("; first error: {e}"))
            )?;
        }
        Ok(())
    }

    /// The slot budget, the queries' slots and the adaptive budget.
    fn write_slots(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.slots;
        writeln!(
            f,
            "\nCPU slots: budget {} ({}), lease parking {}",
            s.max_concurrency,
            s.scheduler,
            if s.lease_parking { "on" } else { "off" }
        )?;
        writeln!(
            f,
            "  granted {}  delayed {}  acquired {} (+{} non-competing)  queries delayed {}  slot waits {:.2} s",
            s.slots_granted,
            s.slots_delayed,
            s.slots_acquired,
            s.slots_acquired_non_competing,
            s.queries_delayed,
            s.slot_wait_s
        )?;
        writeln!(
            f,
            "  parks {}  unparks {}  borrows {}  (at end: in use {}, borrowed {})",
            s.parks, s.unparks, s.unpark_borrows, s.in_use_at_end, s.borrowed_at_end
        )?;
        writeln!(
            f,
            "\nslots held per query over time (Jain's index of the scans: {:.4}; per-sample mean {:.4}; {} samples):",
            self.fairness.jain_scans, self.fairness.jain_instant_mean, self.fairness.samples
        )?;
        writeln!(
            f,
            "  {:<6} {:>4} {:>7} {:>8} {:>8} {:>10} {:>6} {:>9} {:>9} {:>10} {:>6}",
            "query",
            "id",
            "threads",
            "start",
            "end",
            "mean slots",
            "max",
            "MiB read",
            "slot wait",
            "disk share",
            "fair"
        )?;
        let pct = |v: Option<f64>| v.map_or("-".to_owned(), |p| format!("{p:.1}%"));
        let shorts: Vec<&QueryReport> = self
            .queries
            .iter()
            .filter(|q| q.kind == QueryKind::Short)
            .collect();
        for q in self.queries.iter().filter(|q| q.kind == QueryKind::Scan) {
            writeln!(
                f,
                "  {:<6} {:>4} {:>7} {:>7.2}s {:>7.2}s {:>10.2} {:>6} {:>9.1} {:>8.2}s {:>10} {:>6}",
                q.kind,
                q.id,
                q.threads.map_or("-".to_owned(), |t| t.to_string()),
                q.start_s,
                q.end_s,
                q.mean_slots,
                q.max_slots,
                mib(q.bytes as f64),
                q.slot_wait_s,
                pct(q.disk_share_pct),
                pct(q.fair_share_pct)
            )?;
        }
        if !shorts.is_empty() {
            let n = shorts.len() as f64;
            let lat: f64 = shorts.iter().map(|q| q.end_s - q.start_s).sum::<f64>() / n;
            let wait: f64 = shorts.iter().map(|q| q.slot_wait_s).sum::<f64>() / n;
            writeln!(
                f,
                "  {} short queries: mean duration {:.1} ms (p50 {:.1} ms, p99 {:.1} ms), mean slot wait {:.2} ms",
                shorts.len(),
                lat * 1e3,
                self.short_latency_ms.p50,
                self.short_latency_ms.p99,
                wait * 1e3
            )?;
        }
        let b = &self.adaptive;
        writeln!(
            f,
            "\nCPU slot budget: {} (ceiling {}): mean {:.2}, min {}, max {}; run-queue share of running leases {:.1}%; {} yields, {} controller windows{}",
            b.mode,
            b.ceiling,
            b.budget_mean,
            b.budget_min,
            b.budget_max,
            b.runq_share_pct,
            b.yields,
            b.windows,
            if b.probe_losses > 0 {
                format!(", probes lost {} times", b.probe_losses)
            } else {
                String::new()
            }
        )?;
        Ok(())
    }

    /// The kernel's verdict on parked threads.
    fn write_kernel(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = &self.kernel;
        writeln!(f, "\nkernel verdict on parked threads:")?;
        if k.attached {
            writeln!(
                f,
                "  probes attached ({}); {} threads, {} parks, parked {:.2} s, on-CPU while parked {:.3} ms (raw ratio {:.4}%, a diagnostic), run-queue while parked {:.3} ms",
                k.attach_mode.map_or("?", attach_mode_name),
                k.threads,
                k.parks,
                k.parked_s,
                k.parked_oncpu_s * 1e3,
                k.parked_oncpu_pct,
                k.parked_runq_s * 1e3
            )?;
            writeln!(f, "  segments: {}", k.segments)?;
            writeln!(
                f,
                "  on-CPU per park {:.1} us; wake-up at unpark: mean {:.1} us, max {:.1} us; missed switch events {}",
                k.parked_oncpu_us_per_park,
                k.unpark_wake_avg_us,
                k.unpark_wake_max_us,
                k.missed_events
            )?;
        } else {
            writeln!(
                f,
                "  no probes: {}",
                k.reason.as_deref().unwrap_or("disabled")
            )?;
        }
        writeln!(f, "  rule: {}", k.rule)?;
        for t in &k.failing {
            writeln!(
                f,
                "  thread {} over the rule: {} of {} episodes hot (allowed {}), {:.1} us on CPU above the bounds (allowed {:.1} us); parked {:.3} ms in {} parks, {:.1} us of it on CPU, {:.1} us in the run queue",
                t.tid,
                t.segments.hot_episodes,
                t.segments.episodes,
                t.tolerated_hot_episodes,
                t.above_bounds_us,
                t.tolerated_above_bounds_us,
                t.parked_ms,
                t.parks,
                t.parked_oncpu_us,
                t.parked_runq_us
            )?;
            writeln!(f, "    segments: {}", t.segments)?;
            for e in &t.hot {
                writeln!(f, "    {e}")?;
            }
        }
        let verdict = match k.verdict {
            KernelVerdict::Pass => {
                "PASS: no parked thread had more hot episodes, or more CPU above the bounds, than it is allowed".to_owned()
            }
            KernelVerdict::Fail => format!(
                "FAIL: {} of {} threads used more CPU while parked than they are allowed (tids {:?}{})",
                k.failing_tids.len(),
                k.threads,
                &k.failing_tids[..k.failing_tids.len().min(6)],
                if k.failing_tids.len() > 6 {
                    ", …"
                } else {
                    ""
                }
            ),
            KernelVerdict::Unverified => format!(
                "UNVERIFIED ({})",
                k.reason.as_deref().unwrap_or("no probes")
            ),
        };
        writeln!(f, "  verdict: {verdict}")
    }
}
