//! The keys: each one's values over the rounds ([`Keys`]), every key the
//! bench writes ([`KEYS`]) and how each is put in the report, with its note.

use slotring_benchkit::{Report, median};

use crate::{INFLIGHT_LIMIT, PIECE, RATE};

/// Each key's values over the rounds, or why it has none.
#[derive(Default)]
pub(crate) struct Keys(pub(crate) Vec<(&'static str, Result<Vec<f64>, String>)>);

impl Keys {
    /// One round's value of `key`; an error sticks (the key is `null`,
    /// its reason printed).
    pub(crate) fn add(&mut self, key: &'static str, v: Result<f64, String>) {
        let i = match self.0.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                self.0.push((key, Ok(vec![])));
                self.0.len() - 1
            }
        };
        match (&mut self.0[i].1, v) {
            (Ok(xs), Ok(x)) => xs.push(x),
            (slot @ Ok(_), Err(e)) => *slot = Err(e),
            (Err(_), _) => {}
        }
    }

    /// The median over rounds (`max`: the largest), or NaN with the reason printed.
    pub(crate) fn value(&mut self, key: &str, max: bool) -> f64 {
        match self.0.iter_mut().find(|(k, _)| *k == key).map(|(_, v)| v) {
            Some(Ok(xs)) if !xs.is_empty() => {
                if max {
                    xs.iter().copied().fold(f64::MIN, f64::max)
                } else {
                    median(xs)
                }
            }
            Some(Err(e)) => {
                eprintln!("  {key}: not measured: {e}");
                f64::NAN
            }
            _ => {
                eprintln!("  {key}: not measured: no round ran");
                f64::NAN
            }
        }
    }
}

/// Every key the rounds measure.
pub(crate) const KEYS: [&str; 18] = [
    "wl_user_wait_p99_ms",
    "wl_user_wait_p99_ms_fifo",
    "wl_user_wait_p99_ms_rocksdb",
    "wl_background_share_idle_pct",
    "wl_cap_error_pct",
    "wl_share_w31_pct",
    "wl_share_w31_pct_fifo",
    "wl_share_nested_pct",
    "wl_share_nested_pct_flat",
    "wl_inflight_max",
    "wl_inflight_max_sysfs",
    "wl_inflight_max_sysfs_unlimited",
    "wl_inflight_max_sysfs_idle",
    "wl_inflight_sysfs_over_pct",
    "wl_inflight_sysfs_over_pct_unlimited",
    "wl_inflight_sysfs_over_pct_idle",
    "wl_write_share_pct",
    "wl_write_share_pct_fifo",
];

/// Put every key in `r`: the rounds' medians (peaks: their largest).
pub(crate) fn put_keys(r: &mut Report, k: &mut Keys) {
    let piece_ms = PIECE as f64 / RATE as f64 * 1e3;
    r.put(
        "wl_user_wait_p99_ms",
        k.value("wl_user_wait_p99_ms", false),
        "user reads (prio 0, 256 KiB / 20 ms) beside 8 background readers (prio 1) at 64 MiB/s: submit to turn, p99 ms; goal <= piece + 2 ms and <= 0.1 x _rocksdb",
    );
    r.put(
        "wl_user_wait_p99_ms_fifo",
        k.value("wl_user_wait_p99_ms_fifo", false),
        "the same, one plain throttler for everybody (first-come)",
    );
    r.put(
        "wl_user_wait_p99_ms_rocksdb",
        k.value("wl_user_wait_p99_ms_rocksdb", false),
        "the same through the RocksDB limiter port (user IO_HIGH, background IO_LOW, 100 ms refills)",
    );
    r.put("wl_piece_ms", piece_ms, "one 256 KiB piece at 64 MiB/s, ms");
    r.put(
        "wl_background_share_idle_pct",
        k.value("wl_background_share_idle_pct", false),
        "background's rate with users idle, % of the 64 MiB/s limit; goal >= 99",
    );
    r.put(
        "wl_cap_error_pct",
        k.value("wl_cap_error_pct", false),
        "a 32 MiB/s workload under the 64 MiB/s root, 8 readers: |achieved - cap| / cap, %; goal <= 0.5",
    );
    r.put(
        "wl_share_w31_pct",
        k.value("wl_share_w31_pct", false),
        "weights 3 and 1, 4 readers each: weight 3's % of bytes; goal 75 +- 2",
    );
    r.put(
        "wl_share_w31_pct_fifo",
        k.value("wl_share_w31_pct_fifo", false),
        "the same through one plain throttler (first-come)",
    );
    r.put(
        "wl_share_nested_pct",
        k.value("wl_share_nested_pct", false),
        "A (1 reader in A/q1) vs B (8 readers in B/q1..q8), equal weights: A's %; goal 50 +- 2",
    );
    r.put(
        "wl_share_nested_pct_flat",
        k.value("wl_share_nested_pct_flat", false),
        "the same as 9 equal flat tenants of one throttler: A/q1's %",
    );
    r.put(
        "wl_inflight_max",
        k.value("wl_inflight_max", true),
        "16 readers, max_io_requests 4 on the root: peak in flight (our counters); goal <= wl_inflight_limit",
    );
    r.put(
        "wl_inflight_limit",
        INFLIGHT_LIMIT as f64,
        "the root's max_io_requests in that case",
    );
    r.put(
        "wl_inflight_max_sysfs",
        k.value("wl_inflight_max_sysfs", true),
        "the same case's peak of the device's reads in flight (sysfs, 0.5 ms samples; counts every process's reads, and a read the kernel splits in two counts twice)",
    );
    r.put(
        "wl_inflight_sysfs_over_pct",
        k.value("wl_inflight_sysfs_over_pct", true),
        "of those samples, % with more reads in flight at the device than wl_inflight_limit; goal <= 1",
    );
    r.put(
        "wl_inflight_sysfs_over_pct_unlimited",
        k.value("wl_inflight_sysfs_over_pct_unlimited", false),
        "the same for the 16 readers unthrottled",
    );
    r.put(
        "wl_inflight_sysfs_over_pct_idle",
        k.value("wl_inflight_sysfs_over_pct_idle", true),
        "the same with none of our readers",
    );
    r.put(
        "wl_inflight_max_sysfs_unlimited",
        k.value("wl_inflight_max_sysfs_unlimited", true),
        "the same 16 readers unthrottled: the device's peak of reads in flight",
    );
    r.put(
        "wl_inflight_max_sysfs_idle",
        k.value("wl_inflight_max_sysfs_idle", true),
        "the device's peak of reads in flight with none of our readers (other processes' reads)",
    );
    r.put(
        "wl_write_share_pct",
        k.value("wl_write_share_pct", false),
        "paced buffered writes, weights 3 and 1 under 64 MiB/s: weight 3's % of bytes; goal 75 +- 2",
    );
    r.put(
        "wl_write_share_pct_fifo",
        k.value("wl_write_share_pct_fifo", false),
        "the same through one plain throttler (first-come)",
    );
}
