//! [`UringCounters`]: the engine's statistics, C layout for BPF maps,
//! defined by one field list ([`slotring_counters::counter_set!`]).

slotring_counters::counter_set! {
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
    }
}

/// The paced-writeback statistics of one engine (kept apart from
/// [`UringCounters`], whose layout the eBPF side mirrors).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WritebackCounters {
    /// Bytes written by paced writes (each followed by the start of its
    /// writeback).
    pub paced_bytes: u64,
    /// Writebacks started for paced writes (`SYNC_FILE_RANGE_WRITE` calls
    /// or SQEs that succeeded).
    pub writeback_submissions: u64,
    /// Writebacks the kernel refused (the pages stay with its own flush; a
    /// write error reaches the caller's `fsync`).
    pub writeback_errors: u64,
    /// High-water mark of the bytes paced writes had in the page cache
    /// whose writeback was not started yet.
    pub dirty_high_water_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::UringCounters;

    #[test]
    fn layout_is_fifteen_u64_in_order() {
        assert_eq!(std::mem::size_of::<UringCounters>(), 15 * 8);
        assert_eq!(std::mem::align_of::<UringCounters>(), 8);
        assert_eq!(std::mem::offset_of!(UringCounters, reads), 0);
        assert_eq!(std::mem::offset_of!(UringCounters, page_cache_hits), 4 * 8);
        assert_eq!(std::mem::offset_of!(UringCounters, waits_submitted), 8 * 8);
        assert_eq!(std::mem::offset_of!(UringCounters, cq_overflows), 14 * 8);
    }
}
