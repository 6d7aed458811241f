//! `slotring stats`: two snapshots of the pinned maps as a table with units
//! and rates.

use std::fmt;
use std::path::Path;

use slotring::snapshot::Snapshot;

/// The change from `before` to `after` over `dt` seconds, read from the
/// pins in `dir`; its `Display` is what `slotring stats` prints.
#[derive(Debug, Clone, Copy)]
pub struct StatsView<'a> {
    /// Pin directory (for the heading).
    pub dir: &'a Path,
    /// The earlier snapshot.
    pub before: &'a Snapshot,
    /// The later snapshot.
    pub after: &'a Snapshot,
    /// Seconds between them.
    pub dt: f64,
}

fn mib(b: f64) -> f64 {
    b / (1 << 20) as f64
}

impl fmt::Display for StatsView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b, dt) = (self.before, self.after, self.dt);
        let rate = |x: u64, y: u64| y.saturating_sub(x) as f64 / dt;
        writeln!(
            f,
            "slotring stats from {} (rates over {dt:.1} s)",
            self.dir.display()
        )?;
        writeln!(
            f,
            "{:<14} {:>14} {:>12} {:>12} {:>16} {:>10}",
            "throttler", "configured", "charged", "rate", "page cache/s", "waited/s"
        )?;
        for t in &b.throttlers {
            let prev = a
                .throttlers
                .iter()
                .find(|p| p.name == t.name)
                .map(|p| p.counters)
                .unwrap_or_default();
            let c = &t.counters;
            writeln!(
                f,
                "{:<14} {:>14} {:>8.1} MiB {:>6.1} MiB/s {:>10.1} MiB/s {:>9.3}s",
                t.name,
                if c.max_speed == 0 {
                    "unlimited".to_owned()
                } else {
                    format!("{:.1} MiB/s", mib(c.max_speed as f64))
                },
                mib(c.amount as f64),
                mib(rate(prev.amount, c.amount)),
                mib(rate(prev.page_cache_amount, c.page_cache_amount)),
                rate(prev.wait_us, c.wait_us) / 1e6
            )?;
        }
        let (s0, s) = (&a.slots, &b.slots);
        let max = if s.max_concurrency == u64::MAX {
            "unlimited".to_owned()
        } else {
            s.max_concurrency.to_string()
        };
        writeln!(
            f,
            "slots: budget {max}, in use {}, allocations {}, waiters {}, parked {}, borrowed {}",
            s.cur_concurrency, s.allocations, s.waiters, s.parked, s.borrowed
        )?;
        writeln!(
            f,
            "       acquired {:.1}/s, delayed {:.1}/s (total {}), queries delayed {}, parks {:.1}/s, borrows {}",
            rate(s0.slots_acquired, s.slots_acquired),
            rate(s0.slots_delayed, s.slots_delayed),
            s.slots_delayed,
            s.queries_delayed,
            rate(s0.parks, s.parks),
            s.unpark_borrows
        )?;
        let (u0, u) = (&a.uring, &b.uring);
        writeln!(
            f,
            "io:    {:.0} reads/s, {:.1} MiB/s read, page cache {:.1} MiB/s ({} hits total), NOWAIT misses {:.1}/s, waits {:.1}/s",
            rate(u0.reads, u.reads),
            mib(rate(u0.read_bytes, u.read_bytes)),
            mib(rate(u0.page_cache_bytes, u.page_cache_bytes)),
            u.page_cache_hits,
            rate(u0.nowait_misses, u.nowait_misses),
            rate(u0.waits_submitted, u.waits_submitted)
        )?;
        if let (Some(k0), Some(k)) = (&a.kernel, &b.kernel) {
            let parked = k.parked_ns.saturating_sub(k0.parked_ns);
            let oncpu = k.parked_oncpu_ns.saturating_sub(k0.parked_oncpu_ns);
            writeln!(
                f,
                "kernel: {} threads, {} parked now, parked {:.2} thread-s/s, on-CPU while parked {:.3} ms/s ({:.4}% of parked), run-queue while parked {:.3} ms/s, missed events {}",
                k.threads,
                k.leases_parked,
                parked as f64 / 1e9 / dt,
                oncpu as f64 / 1e6 / dt,
                if parked == 0 {
                    0.0
                } else {
                    oncpu as f64 / parked as f64 * 100.0
                },
                k.parked_runq_ns.saturating_sub(k0.parked_runq_ns) as f64 / 1e6 / dt,
                k.missed_events
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slotring::snapshot::NamedThrottler;

    #[test]
    fn rates_are_the_change_over_the_interval() {
        let mut before = Snapshot::default();
        before.throttlers.push(NamedThrottler {
            name: "local_read".into(),
            counters: Default::default(),
        });
        let mut after = before.clone();
        after.throttlers[0].counters.max_speed = 4 << 20;
        after.throttlers[0].counters.amount = 8 << 20;
        after.uring.reads = 20;
        after.slots.max_concurrency = u64::MAX;
        let text = StatsView {
            dir: Path::new("/pins"),
            before: &before,
            after: &after,
            dt: 2.0,
        }
        .to_string();
        assert!(
            text.starts_with("slotring stats from /pins (rates over 2.0 s)\n"),
            "{text}"
        );
        assert!(
            text.contains("local_read          4.0 MiB/s      8.0 MiB    4.0 MiB/s"),
            "{text}"
        );
        assert!(text.contains("slots: budget unlimited,"), "{text}");
        assert!(text.contains("io:    10 reads/s,"), "{text}");
        assert!(
            !text.contains("kernel:"),
            "no kernel line without probes: {text}"
        );
    }
}
