//! [`ThrottleCounters`]: a throttler's statistics (re-exported as
//! `slotring_throttle::ThrottleCounters`, which keeps the live atomics).

crate::counter_set! {
    /// A snapshot of one throttler's counters. Plain `u64`s, C layout (the
    /// BPF `struct throttle_stats` is a name followed by these fields); one
    /// Prometheus series per throttler, labelled with its name.
    pub struct ThrottleCounters, prefix = "slotring_throttler" {
        /// In tokens over the throttler's life (ClickHouse's `count`).
        counter amount => "bytes": "Bytes charged to the throttler.",
        counter page_cache_amount => "page_cache_bytes": "Page-cache bytes this block-device throttler did not charge.",
        /// In microseconds.
        counter(us) wait_us => "wait_seconds": "Time waited (or booked to wait) on the throttler.",
        counter waits: "Waits (or booked waits) on the throttler.",
        gauge block_count => "blocked": "Threads blocked in the throttler now.",
        /// Tokens/s at snapshot time.
        gauge max_speed => "max_bytes_per_second": "Configured rate of the throttler (0 = unlimited).",
    }
}
