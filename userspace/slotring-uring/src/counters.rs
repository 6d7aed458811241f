//! [`UringCounters`]: the engine's statistics, C layout for BPF maps.

/// A snapshot of one engine's counters. Plain `u64`s in this exact order
/// (the eBPF side mirrors the layout).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UringCounters {
    /// Reads completed successfully.
    pub reads: u64,
    /// Writes completed successfully.
    pub writes: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Reads (or read pieces) served from the page cache, as detected.
    pub page_cache_hits: u64,
    /// Bytes served from the page cache, as detected.
    pub page_cache_bytes: u64,
    /// `RWF_NOWAIT` probes that missed (`-EAGAIN` or a partial hit).
    pub nowait_misses: u64,
    /// `cachestat(2)` calls made by the disk-rate guard.
    pub cachestat_checks: u64,
    /// Throttle waits booked (timeout SQEs, or sleeps in the pread engine).
    pub waits_submitted: u64,
    /// Total booked wait time, µs.
    pub wait_us: u64,
    /// Requests that ended cancelled.
    pub cancellations: u64,
    /// IOs resubmitted after `-EINTR`/`-EAGAIN`, and `EBUSY`/`EAGAIN` enters.
    pub resubmits: u64,
    /// Short transfers continued (or partial page-cache hits).
    pub short_reads: u64,
    /// Times the SQ was full and had to be submitted before pushing.
    pub sq_full: u64,
    /// Enters that found the CQ overflow flag set (completions kept by NODROP).
    pub cq_overflows: u64,
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
