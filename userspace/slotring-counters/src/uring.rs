//! [`UringCounters`]: the IO engine's statistics (re-exported as
//! `slotring_uring::UringCounters`).

crate::counter_set! {
    /// A snapshot of one engine's counters. Plain `u64`s in this exact order
    /// (the eBPF side mirrors the layout); engines sum with `+` or `sum()`.
    pub struct UringCounters, prefix = "slotring_io" {
        counter reads: "Reads completed.",
        counter writes: "Writes completed.",
        counter read_bytes: "Bytes read.",
        counter write_bytes: "Bytes written.",
        /// Reads or read pieces.
        counter page_cache_hits: "Reads detected as served from the page cache.",
        counter page_cache_bytes: "Bytes detected as served from the page cache.",
        /// `-EAGAIN` or a partial hit.
        counter nowait_misses: "RWF_NOWAIT probes that missed the page cache.",
        counter cachestat_checks: "cachestat(2) calls made by the disk-rate guard.",
        counter waits_submitted => "waits": "Throttle waits booked by the engine (timeout SQEs or sleeps).",
        /// In microseconds.
        counter(us) wait_us => "wait_seconds": "Total booked throttle wait of the engine.",
        counter cancellations: "Requests that ended cancelled.",
        /// Also counts `EBUSY`/`EAGAIN` enters.
        counter resubmits: "IOs resubmitted after EINTR/EAGAIN or busy enters.",
        /// Or partial page-cache hits.
        counter short_reads: "Short transfers continued.",
        /// It had to be submitted before pushing.
        counter sq_full: "Times the submission queue was full.",
        /// Completions are kept by `IORING_FEAT_NODROP`.
        counter cq_overflows: "Enters that found the completion queue overflowed (nothing lost).",
        /// Each followed at once by its writeback, completed by the device.
        counter paced_bytes: "Bytes written by paced writes.",
        /// Writeback `sync_file_range` SQEs or calls that succeeded (one per
        /// piece; the device has completed it by the request's end).
        counter writeback_submissions: "Writebacks of paced writes the kernel accepted.",
        /// The pages stay with the kernel's flush; a write error reaches `fsync`.
        counter writeback_errors: "Writebacks of paced writes the kernel refused.",
        /// Per engine (a sum over engines bounds the total from above); of
        /// a `SharedEngine`'s blocking-pool calls, the highest of any one.
        gauge dirty_high_water_bytes: "High-water mark of paced bytes written and not yet completed by the device.",
        /// Also counted in `page_cache_bytes`.
        counter page_cache_refund_bytes: "Bytes charged as a miss but found in the page cache when their throttle wait ended, given back to the disk throttler.",
        /// Each waits, booking nothing, until a writeback of the same
        /// block-device throttler completes.
        counter writeback_cap_waits: "Paced write pieces that found no room under their block-device throttler's writeback cap.",
        /// Per piece: on the ring, from the reap of its write's CQE to the
        /// reap of its writeback's; in a thread of ours (the `pread`
        /// engine, a blocking `UringEngine::write_at`, a `SharedEngine`'s
        /// paced write on tokio's blocking pool), from the
        /// `sync_file_range(WRITE)` that starts it to the return of the one
        /// that waits for it, which comes only at the depth or the cap, so
        /// it is an upper bound there (the writer's next turns may be in
        /// it). Divided by `writeback_submissions`, the
        /// device's mean writeback latency; by Little's law, once it exceeds
        /// what the writeback cap holds divided by the rate, the device, not
        /// the limit, paces the writers.
        counter(us) writeback_us => "writeback_seconds": "Time paced write pieces took from the start of their writeback to the device completing it, summed over the writebacks that succeeded.",
    }
}

#[cfg(test)]
mod tests {
    use super::UringCounters;

    #[test]
    fn layout_is_u64s_in_order() {
        // One `u64` per field of the list, no padding (adding a counter
        // touches no test).
        assert_eq!(std::mem::size_of::<UringCounters>(), UringCounters::LEN * 8);
        assert_eq!(std::mem::align_of::<UringCounters>(), 8);
        assert_eq!(std::mem::offset_of!(UringCounters, reads), 0);
        assert_eq!(std::mem::offset_of!(UringCounters, page_cache_hits), 4 * 8);
        assert_eq!(std::mem::offset_of!(UringCounters, waits_submitted), 8 * 8);
        assert_eq!(std::mem::offset_of!(UringCounters, cq_overflows), 14 * 8);
        assert_eq!(
            std::mem::offset_of!(UringCounters, dirty_high_water_bytes),
            18 * 8
        );
    }
}
