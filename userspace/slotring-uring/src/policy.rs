//! The one charging policy of both engines.
//!
//! The ring state machine (`ring_core`) and the threads' own IO (`thread_io.rs`)
//! differ only in *how* they perform a step (SQEs and CQEs, or synchronous
//! syscalls) and in *when* they charge (the ring before the IO, `pread`
//! after it, as ClickHouse does); *what* they charge is decided here:
//!
//! * **The page-cache rule.** Detecting page-cache hits is worth its cost
//!   only for a buffered read charged to a chain in which some throttler
//!   skips page-cache bytes ([`Throttle::ignores_page_cache_reads`]: a
//!   block-device limit). Everything else — writes, `O_DIRECT`, detection
//!   switched off — is charged as device bytes ([`Policy::charge`]).
//! * **What a file taught us.** A filesystem that answered `EOPNOTSUPP` to
//!   `RWF_NOWAIT` is never probed again: a memory filesystem (tmpfs/ramfs)
//!   is all page cache, any other is all device, so a block device is never
//!   under-charged ([`after_nowait_unsupported`], [`Charge::from`]).
//! * **The disk-rate guard.** A NOWAIT miss starts its disk read at once,
//!   uncharged. While a block-device bucket in the chain holds fewer tokens
//!   than the bytes that could go to the disk that way, the engines do not
//!   probe: they ask `cachestat(2)` (no side effect) and charge as page
//!   cache only a fully cached range ([`Policy::guard_engaged`],
//!   [`cachestat_charge`]).
//! * **What a write costs the disk.** Every buffered write on a disk
//!   filesystem is charged as device bytes, before it is issued: with paced
//!   writeback each write reaches the disk (an overwrite of a page whose
//!   writeback is already under way is written again, so it is a device
//!   byte too; without pacing the kernel might merge it with the earlier
//!   write, and it is still charged: a block device is never
//!   under-charged). An `O_DIRECT` write is device IO by nature and needs
//!   no pacing. A write to a memory filesystem (tmpfs/ramfs) never reaches
//!   a disk: it is charged as [`Source::PageCache`], which a block-device
//!   limit skips and every other limit charges, as for reads there
//!   ([`Policy::charge`]).
//! * **Paced writeback.** A throttled buffered write on a disk filesystem
//!   starts the writeback of what it dirtied right after it, in pieces of
//!   at most [`WRITEBACK_PIECE`] bytes each booked on its own, so the disk
//!   receives the bytes at the throttled pace and no writer keeps more than
//!   a piece dirty and unsubmitted ([`Policy::writeback`]). Pacing changes no
//!   durability: `fsync` stays the caller's.
//! * **Writeback in flight per device.** Paced pieces charged to a
//!   rate-limited block-device throttler share one cap on the bytes under
//!   writeback ([`Policy::writeback_cap_bytes`]) and, after the device held
//!   them back, drain the bucket's backlog at most at
//!   [`Policy::catch_up_rate`]
//!   (`writeback_cap.rs` carries both out, for every engine).
//! * **Booking.** Bytes are booked on the chain as [`Source::Device`] or
//!   [`Source::PageCache`], each charge after the delay already booked
//!   ([`book`]).
//!
//! [`Throttle::ignores_page_cache_reads`]: slotring_throttle::Throttle::ignores_page_cache_reads

use std::fmt;
use std::io;
use std::num::NonZeroU32;
use std::time::Duration;

use slotring_throttle::{InFlightHold, NANO_PER_TOKEN, Source, ThrottleError, ThrottlePtr};

use crate::file::{NowaitMode, UringFile};
use crate::sys::CacheStat;

/// The page size `cachestat(2)` counts in.
const PAGE: u64 = 4096;

/// The largest piece a paced write is booked and issued in. A 100 ms window
/// of a 32 MiB/s limit holds 12.8 such pieces, so a window's count is off by
/// at most one piece (8 %); `cargo xtask bench write` measures the windows.
pub(crate) const WRITEBACK_PIECE: u64 = 256 << 10;

/// A read or a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// A positional read.
    Read,
    /// A positional write.
    Write,
}

impl Op {
    /// `"read"` or `"write"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Engine policy switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Detect page-cache hits with `RWF_NOWAIT` when a throttler cares.
    pub detect_page_cache: bool,
    /// Bound the block device's instantaneous rate (cachestat instead of a
    /// NOWAIT probe while the block-device bucket cannot cover the probes).
    pub disk_rate_guard: bool,
    /// Pace the writeback of throttled buffered writes on disk filesystems
    /// (see `Policy::writeback`); off, the kernel flushes them when it
    /// decides (the page-cache behaviour of ClickHouse's write throttler).
    pub pace_writeback: bool,
    /// Paced writes: how many pieces of one request may be written and not
    /// yet completed by the device (their writeback in flight). The next
    /// piece is booked when the throttle allows it *and* fewer than this
    /// many are in flight, so one request has at most `writeback_depth ×
    /// 256 KiB` dirty, and a device slower than the limit holds the writer
    /// back instead of collecting its backlog. 1 serialises device and
    /// writer (at 32 MiB/s a piece is due every 7.8 ms, so any device
    /// latency above that costs throughput); the default 4 covers 31 ms of
    /// device latency at 32 MiB/s with 1 MiB dirty per request.
    pub writeback_depth: NonZeroU32,
    /// Paced writes: how much of a block-device throttler's rate may be
    /// under writeback (its turn in the bucket come, and not yet completed
    /// by the device) at once,
    /// for every request of every engine that charges it together (at least
    /// one piece). It bounds what completes together after the device
    /// stalls; pieces that find no room wait for another's writeback to
    /// complete, and the backlog the bucket collected meanwhile drains at
    /// most a little above the rate (`writeback_catch_up_permille`). `None`: only the
    /// per-request `writeback_depth` applies. Default 16 ms (512 KiB at
    /// 32 MiB/s); `cargo xtask bench write` measures what it holds back.
    pub writeback_cap: Option<Duration>,
    /// Paced writes under a writeback cap: how far above a block-device
    /// throttler's rate its pieces may start while its bucket spends what
    /// it collected when the device held the writers back, in thousandths
    /// of the rate (default 31: 3.1 %). 0 starts pieces at most at the rate
    /// itself: what the bucket collected meanwhile is never caught up
    /// (forfeited).
    pub writeback_catch_up_permille: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            detect_page_cache: true,
            disk_rate_guard: true,
            pace_writeback: true,
            writeback_depth: NonZeroU32::new(4).expect("4 is not 0"),
            writeback_cap: Some(Duration::from_millis(16)),
            writeback_catch_up_permille: 31,
        }
    }
}

/// How a write's dirty pages reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Writeback {
    /// When the kernel flushes them (unthrottled writes, `O_DIRECT`, memory
    /// filesystems, pacing off).
    Kernel,
    /// Booked and issued in pieces of at most [`WRITEBACK_PIECE`] bytes,
    /// each followed at once by the writeback of what it wrote, completed by
    /// the device, at most [`Policy::writeback_depth`] pieces of a request
    /// in flight.
    Paced,
}

/// How a request's bytes are charged, decided before any IO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Charge {
    /// Every byte is a device byte (charged before the IO on the ring,
    /// after it by `pread`).
    Device,
    /// Known to be served from memory: read without a probe, charge every
    /// byte as page cache.
    PageCache,
    /// Find out with a `RWF_NOWAIT` read (or with `cachestat(2)` for a
    /// throttle that takes turns, [`routed_by_cachestat`], and while
    /// [`Policy::guard_engaged`]).
    Probe,
}

impl From<NowaitMode> for Charge {
    /// How the reads of a file in `mode` are charged once detection is on.
    fn from(mode: NowaitMode) -> Self {
        match mode {
            NowaitMode::Probe => Charge::Probe,
            NowaitMode::Unsupported => Charge::Device,
            NowaitMode::Memory => Charge::PageCache,
        }
    }
}

impl Policy {
    /// The page-cache rule: how the bytes of an `op` on `file` charged to
    /// `throttle` are charged.
    pub(crate) fn charge(self, op: Op, file: &UringFile, throttle: Option<&ThrottlePtr>) -> Charge {
        if op == Op::Write {
            // No disk behind a memory filesystem: page-cache bytes, charged
            // after the write as reads there are.
            return if file.in_memory() && throttle.is_some() {
                Charge::PageCache
            } else {
                Charge::Device
            };
        }
        let detect = self.detect_page_cache
            && op == Op::Read
            && !file.is_direct()
            && throttle.is_some_and(|t| t.ignores_page_cache_reads());
        if detect {
            Charge::from(file.nowait_mode())
        } else {
            Charge::Device
        }
    }

    /// Whether the writeback of an `op` on `file` charged to `throttle` is
    /// paced: a throttled buffered write on a disk filesystem, with pacing
    /// on. `O_DIRECT` is paced by nature (its bytes reach the device when
    /// the write is issued, after its charge) and a memory filesystem has
    /// no writeback.
    pub(crate) fn writeback(
        self,
        op: Op,
        file: &UringFile,
        throttle: Option<&ThrottlePtr>,
    ) -> Writeback {
        if self.pace_writeback
            && op == Op::Write
            && throttle.is_some()
            && !file.is_direct()
            && !file.in_memory()
        {
            Writeback::Paced
        } else {
            Writeback::Kernel
        }
    }

    /// The cap on bytes under writeback of a block-device throttler of
    /// `rate` bytes/s: `writeback_cap` of its rate, at least one piece;
    /// `None` when off.
    pub(crate) fn writeback_cap_bytes(self, rate: u64) -> Option<u64> {
        let d = self.writeback_cap?;
        let bytes = u128::from(rate) * d.as_nanos() / 1_000_000_000;
        Some(
            u64::try_from(bytes)
                .unwrap_or(u64::MAX)
                .max(WRITEBACK_PIECE),
        )
    }

    /// The pacer's rate of a block-device throttler of `rate` bytes/s (see
    /// `writeback_cap.rs`): `writeback_catch_up_permille` above it.
    pub(crate) fn catch_up_rate(self, rate: u64) -> u64 {
        let above = u128::from(rate) * u128::from(self.writeback_catch_up_permille) / 1000;
        rate.saturating_add(u64::try_from(above).unwrap_or(u64::MAX))
    }

    /// The disk-rate guard: whether some rate-limited block-device bucket in
    /// `throttle` holds fewer tokens than `need` bytes (the read plus every
    /// probe already in flight), so that probing could burst the disk past
    /// its limit.
    pub(crate) fn guard_engaged(self, throttle: Option<&ThrottlePtr>, need: u64) -> bool {
        let Some(t) = throttle.filter(|_| self.disk_rate_guard) else {
            return false;
        };
        let need = i128::from(need) * NANO_PER_TOKEN;
        let mut engaged = false;
        t.visit(&mut |th| {
            if th.limits_block_device_bandwidth() && th.max_speed() > 0 && th.tokens_nano() < need {
                engaged = true;
            }
        });
        engaged
    }
}

/// Whether a read through `throttle` is routed by `cachestat(2)` and never
/// probed with `RWF_NOWAIT`: true for a throttle that takes turns (a
/// workload). A probe that misses starts reading the range in before it
/// answers `-EAGAIN` (decision 0011), so the device would serve the read
/// at its submission, ahead of its turn, where the tree's priorities and
/// in-flight limits do not see it: sixteen probing readers put sixteen
/// reads in flight at a disk whose `max_io_requests` is 4 (decision 0029).
/// Routed, a miss reaches the device only once its turn comes.
pub(crate) fn routed_by_cachestat(throttle: Option<&ThrottlePtr>) -> bool {
    throttle.is_some_and(|t| t.takes_turns())
}

/// What the guard's `cachestat(2)` answer for `[off, off + len)` means:
/// page cache only when every page of the range is cached; a failed call
/// (`ENOSYS` before Linux 6.5) or a partly cached range is device IO.
pub(crate) fn cachestat_charge(stat: io::Result<CacheStat>, off: u64, len: u64) -> Charge {
    match stat {
        Ok(st) if st.nr_cache >= pages_spanned(off, len) => Charge::PageCache,
        _ => Charge::Device,
    }
}

/// What a file is once a `RWF_NOWAIT` read answered `EOPNOTSUPP`:
/// `in_memory` is the `fstatfs` verdict (tmpfs/ramfs); when it cannot be
/// had, the file counts as disk-backed (never under-charge a block device).
pub(crate) fn after_nowait_unsupported(in_memory: io::Result<bool>) -> NowaitMode {
    if in_memory.unwrap_or(false) {
        NowaitMode::Memory
    } else {
        NowaitMode::Unsupported
    }
}

/// Bytes of a `len`-byte range that `cachestat(2)` counts in the page cache
/// (whole pages, at most `len`): up to date or still being read in by
/// another reader, they are not read from the disk by a read of the range.
pub(crate) fn cached_bytes(stat: &CacheStat, len: u64) -> u64 {
    stat.nr_cache.saturating_mul(PAGE).min(len)
}

/// Pages (of [`PAGE`] bytes) that `[off, off + len)` touches.
pub(crate) fn pages_spanned(off: u64, len: u64) -> u64 {
    if len == 0 {
        return 0;
    }
    (off + len).div_ceil(PAGE) - off / PAGE
}

/// Book `amount` bytes from `source` on `throttle`, `after_ns` from now
/// (the delay already booked for this request); returns the total delay.
/// Nothing to charge (no throttle, no bytes) leaves the delay as it was.
pub(crate) fn book(
    throttle: Option<&ThrottlePtr>,
    amount: u64,
    source: Source,
    max_block: Duration,
    after_ns: u64,
) -> Result<u64, ThrottleError> {
    Ok(book_held(throttle, amount, source, max_block, after_ns)?.0)
}

/// [`book`], with the in-flight places the booking gave (a workload's:
/// [`Throttle::reserve_held`]), to keep until the IO completes.
///
/// [`Throttle::reserve_held`]: slotring_throttle::Throttle::reserve_held
pub(crate) fn book_held(
    throttle: Option<&ThrottlePtr>,
    amount: u64,
    source: Source,
    max_block: Duration,
    after_ns: u64,
) -> Result<(u64, InFlightHold), ThrottleError> {
    match throttle {
        Some(t) if amount > 0 => {
            let (r, hold) = t.reserve_held(amount, max_block, after_ns, source)?;
            Ok((r.delay_ns, hold))
        }
        _ => Ok((after_ns, InFlightHold::none())),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use std::os::unix::fs::OpenOptionsExt;

    use slotring_throttle::{Clock, ManualClock, Throttle, Throttler, UNLIMITED_BLOCK};

    use super::*;

    const T0: u64 = 1_000_000_000;

    fn clock() -> Arc<ManualClock> {
        Arc::new(ManualClock::new(T0))
    }

    /// A block-device limit of `rate` tokens/s with a 1 s burst on `c`.
    fn disk(rate: u64, c: &Arc<ManualClock>) -> Arc<Throttler> {
        let clock: Arc<dyn Clock> = c.clone();
        let t = Throttler::builder(rate)
            .clock(clock)
            .limits_block_device_bandwidth(true);
        Arc::new(t.build().unwrap())
    }

    /// Any other limit of `rate` tokens/s with a 1 s burst on `c`.
    fn user(rate: u64, c: &Arc<ManualClock>) -> Arc<Throttler> {
        let clock: Arc<dyn Clock> = c.clone();
        Arc::new(Throttler::builder(rate).clock(clock).build().unwrap())
    }

    fn file() -> Arc<UringFile> {
        UringFile::new(tempfile::tempfile().unwrap()).unwrap()
    }

    #[test]
    fn only_buffered_reads_charged_to_a_block_device_are_probed() {
        let c = clock();
        let disk: ThrottlePtr = disk(1000, &c);
        let user: ThrottlePtr = user(1000, &c);
        let f = file();
        let on = Policy::default();
        assert_eq!(on.charge(Op::Read, &f, Some(&disk)), Charge::Probe);
        assert_eq!(on.charge(Op::Write, &f, Some(&disk)), Charge::Device);
        assert_eq!(on.charge(Op::Read, &f, Some(&user)), Charge::Device);
        assert_eq!(on.charge(Op::Read, &f, None), Charge::Device);
        let off = Policy {
            detect_page_cache: false,
            ..Policy::default()
        };
        assert_eq!(off.charge(Op::Read, &f, Some(&disk)), Charge::Device);
    }

    #[test]
    fn throttled_buffered_writes_on_a_disk_are_paced_and_charged_to_it() {
        let c = clock();
        let disk: ThrottlePtr = disk(1000, &c);
        let on = Policy::default();
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let f = UringFile::new(std::fs::File::create(dir.path().join("f")).unwrap()).unwrap();
        assert!(!f.in_memory(), "/var/tmp is on a disk filesystem");
        assert_eq!(on.writeback(Op::Write, &f, Some(&disk)), Writeback::Paced);
        assert_eq!(on.charge(Op::Write, &f, Some(&disk)), Charge::Device);
        assert_eq!(on.writeback(Op::Write, &f, None), Writeback::Kernel);
        assert_eq!(on.writeback(Op::Read, &f, Some(&disk)), Writeback::Kernel);
        let off = Policy {
            pace_writeback: false,
            ..Policy::default()
        };
        assert_eq!(off.writeback(Op::Write, &f, Some(&disk)), Writeback::Kernel);
        assert_eq!(off.charge(Op::Write, &f, Some(&disk)), Charge::Device);
    }

    #[test]
    fn writes_to_memory_are_page_cache_and_direct_writes_are_not_paced() {
        let c = clock();
        let disk: ThrottlePtr = disk(1000, &c);
        let on = Policy::default();
        let shm = std::path::Path::new("/dev/shm");
        let memory_dir = nix::sys::statfs::statfs(shm)
            .is_ok_and(|st| st.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
        if memory_dir {
            let m = UringFile::new(tempfile::tempfile_in(shm).unwrap()).unwrap();
            assert!(m.in_memory());
            assert_eq!(on.writeback(Op::Write, &m, Some(&disk)), Writeback::Kernel);
            assert_eq!(on.charge(Op::Write, &m, Some(&disk)), Charge::PageCache);
            assert_eq!(on.charge(Op::Write, &m, None), Charge::Device);
        } else {
            eprintln!("tmpfs part skipped: /dev/shm is not tmpfs on this machine");
        }
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let opened = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(dir.path().join("direct"));
        match opened {
            Ok(d) => {
                let d = UringFile::new(d).unwrap();
                assert!(d.is_direct());
                assert_eq!(on.writeback(Op::Write, &d, Some(&disk)), Writeback::Kernel);
                assert_eq!(on.charge(Op::Write, &d, Some(&disk)), Charge::Device);
            }
            Err(e) => eprintln!("O_DIRECT part skipped: /var/tmp refuses it ({e})"),
        }
    }

    #[test]
    fn what_a_file_taught_us_routes_its_reads() {
        let c = clock();
        let disk: ThrottlePtr = disk(1000, &c);
        let f = file();
        f.set_nowait_mode(after_nowait_unsupported(Ok(true)));
        assert_eq!(
            Policy::default().charge(Op::Read, &f, Some(&disk)),
            Charge::PageCache
        );
        f.set_nowait_mode(after_nowait_unsupported(Ok(false)));
        assert_eq!(
            Policy::default().charge(Op::Read, &f, Some(&disk)),
            Charge::Device
        );
        assert_eq!(
            after_nowait_unsupported(Err(io::Error::from_raw_os_error(libc::ENOSYS))),
            NowaitMode::Unsupported,
            "an unknown filesystem is charged as disk"
        );
    }

    #[test]
    fn the_guard_engages_when_a_block_device_bucket_cannot_cover_the_bytes() {
        let c = clock();
        let disk = disk(1000, &c);
        let tokens = u64::try_from(disk.tokens_nano() / NANO_PER_TOKEN).unwrap();
        assert!(tokens > 0, "a fresh bucket holds its burst");
        let chain: ThrottlePtr = disk.clone();
        let on = Policy::default();
        assert!(!on.guard_engaged(Some(&chain), tokens));
        assert!(on.guard_engaged(Some(&chain), tokens + 1));
        assert!(!on.guard_engaged(None, u64::MAX >> 32));
        let off = Policy {
            disk_rate_guard: false,
            ..Policy::default()
        };
        assert!(!off.guard_engaged(Some(&chain), tokens + 1));
        // A bucket in debt engages the guard for any read.
        disk.reserve(2 * tokens, UNLIMITED_BLOCK, 0, Source::Device)
            .unwrap();
        assert!(on.guard_engaged(Some(&chain), 1));
        // Only block-device limits count.
        let user: ThrottlePtr = user(1000, &c);
        user.reserve(2 * tokens, UNLIMITED_BLOCK, 0, Source::Device)
            .unwrap();
        assert!(!on.guard_engaged(Some(&user), 1));
    }

    #[test]
    fn the_writeback_cap_is_a_share_of_the_rate_and_at_least_a_piece() {
        let on = Policy::default();
        // 16 ms of 32 MiB/s: room for two pieces, not three.
        assert_eq!(on.writeback_cap_bytes(32 << 20), Some(536_870));
        assert_eq!(on.writeback_cap_bytes(1 << 20), Some(WRITEBACK_PIECE));
        let off = Policy {
            writeback_cap: None,
            ..Policy::default()
        };
        assert_eq!(off.writeback_cap_bytes(32 << 20), None);
        assert_eq!(on.catch_up_rate(1000), 1031);
        let forfeit = Policy {
            writeback_catch_up_permille: 0,
            ..Policy::default()
        };
        assert_eq!(forfeit.catch_up_rate(1000), 1000);
    }

    #[test]
    fn pages_spanned_counts_every_touched_page() {
        assert_eq!(pages_spanned(0, 0), 0);
        assert_eq!(pages_spanned(0, 1), 1);
        assert_eq!(pages_spanned(0, PAGE), 1);
        assert_eq!(pages_spanned(0, PAGE + 1), 2);
        assert_eq!(pages_spanned(PAGE - 1, 2), 2);
        assert_eq!(pages_spanned(3 * PAGE, 2 * PAGE), 2);
    }

    #[test]
    fn only_a_fully_cached_range_is_page_cache() {
        let cached = |nr_cache| {
            Ok(CacheStat {
                nr_cache,
                ..CacheStat::default()
            })
        };
        assert_eq!(cachestat_charge(cached(2), 100, PAGE), Charge::PageCache);
        assert_eq!(cachestat_charge(cached(1), 100, PAGE), Charge::Device);
        assert_eq!(
            cachestat_charge(Err(io::Error::from_raw_os_error(libc::ENOSYS)), 0, 1),
            Charge::Device,
            "without cachestat(2) a read is charged to the disk"
        );
    }

    #[test]
    fn booking_skips_the_block_device_for_page_cache_bytes_only() {
        let c = clock();
        let disk = disk(1000, &c);
        let chain: ThrottlePtr = disk.clone();
        assert_eq!(book(None, 10, Source::Device, UNLIMITED_BLOCK, 7), Ok(7));
        assert_eq!(
            book(Some(&chain), 0, Source::Device, UNLIMITED_BLOCK, 7),
            Ok(7)
        );
        book(Some(&chain), 10, Source::PageCache, UNLIMITED_BLOCK, 0).unwrap();
        assert_eq!((disk.count(), disk.counters().page_cache_amount), (0, 10));
        book(Some(&chain), 10, Source::Device, UNLIMITED_BLOCK, 0).unwrap();
        assert_eq!(disk.count(), 10);
        // A charge past the bucket books the wait on top of `after_ns`.
        let tokens = u64::try_from(disk.tokens_nano() / NANO_PER_TOKEN).unwrap();
        let d = book(
            Some(&chain),
            tokens + 1000,
            Source::Device,
            UNLIMITED_BLOCK,
            5,
        )
        .unwrap();
        // Charged 5 ns from now, by when the bucket (below its burst) has
        // refilled for 5 ns: the debt of 1000 tokens at 1000/s is repaid
        // exactly 1 s from now.
        assert_eq!(d, 1_000_000_000);
    }
}
