//! The shared suite, run on the real kernel against both engines behind
//! [`IoEngine`]: io_uring and the pread fallback.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use slotring_throttle::{Throttle, ThrottlePtr, Throttler, ThrottlerArray};
use slotring_uring::{
    IoEngine, NowaitMode, PreadEngine, RingConfig, SIZE_UNBOUNDED, UringEngine, UringFile,
};

fn uring() -> Box<dyn IoEngine> {
    Box::new(UringEngine::new(&RingConfig::default()).expect("io_uring is enabled on this machine"))
}

fn pread() -> Box<dyn IoEngine> {
    Box::new(PreadEngine::new(Default::default()))
}

fn hit_and_miss(make: fn() -> Box<dyn IoEngine>) {
    let tf = disk_file(1 << 20, 1);
    let off = 256 << 10;
    let len = 128 << 10;
    // A cold probe can be answered with the data it read in
    // (`COLD_PROBE_ATTEMPTS`); then it looks like a hit. Try again on a fresh
    // engine in that case (bounded).
    let mut attempt = 0;
    let (mut e, disk, parent, chain) = loop {
        attempt += 1;
        let mut e = make();
        let (disk, parent, chain) = disk_chain(1 << 30, 1 << 30);
        tf.file.make_cold().unwrap();
        // Cold: a disk read, charged to the block-device throttler and its parent.
        let (r, buf) = e.read_at(&tf.file, vec![0; len], off, Some(&chain), NO_CAP);
        assert_eq!(r.unwrap(), len);
        assert_eq!(buf, tf.data[off as usize..off as usize + len]);
        if e.counters().nowait_misses == 1 || attempt == COLD_PROBE_ATTEMPTS {
            break (e, disk, parent, chain);
        }
        eprintln!("the kernel served a cold NOWAIT read with data; retrying");
    };
    let c = e.counters();
    assert_eq!(
        c.nowait_misses, 1,
        "the cold read was detected as a miss: {c:?}"
    );
    assert_eq!(c.page_cache_bytes, 0);
    assert_eq!(disk.counters().amount, len as u64);
    assert_eq!(parent.counters().amount, len as u64);
    // Hot: page cache; the block device does not count it, the parent does.
    let (r, buf) = e.read_at(&tf.file, vec![0; len], off, Some(&chain), NO_CAP);
    assert_eq!(r.unwrap(), len);
    assert_eq!(buf, tf.data[off as usize..off as usize + len]);
    let c = e.counters();
    assert_eq!(c.page_cache_hits, 1);
    assert_eq!(c.page_cache_bytes, len as u64);
    assert_eq!(
        disk.counters().amount,
        len as u64,
        "page-cache bytes skip the disk throttler"
    );
    assert_eq!(disk.counters().page_cache_amount, len as u64);
    assert_eq!(
        parent.counters().amount,
        2 * len as u64,
        "the parent charges page-cache bytes"
    );
    assert_eq!(c.reads, 2);
    assert_eq!(c.read_bytes, 2 * len as u64);
}

fn partial_hit(mut e: Box<dyn IoEngine>) {
    let tf = disk_file(1 << 20, 2);
    let (disk, parent, chain) = disk_chain(1 << 30, 1 << 30);
    tf.file.make_cold().unwrap();
    // Warm the first 64 KiB only.
    let (r, _) = e.read_at(&tf.file, vec![0; 64 << 10], 0, None, NO_CAP);
    assert_eq!(r.unwrap(), 64 << 10);
    let before = e.counters();
    let (r, buf) = e.read_at(&tf.file, vec![0; 256 << 10], 0, Some(&chain), NO_CAP);
    assert_eq!(r.unwrap(), 256 << 10);
    assert_eq!(buf, tf.data[..256 << 10]);
    let c = e.counters();
    let pc = c.page_cache_bytes - before.page_cache_bytes;
    assert!(
        pc >= 64 << 10,
        "the cached prefix is a page-cache read ({pc})"
    );
    assert_eq!(
        disk.counters().amount + pc,
        256 << 10,
        "the rest is charged to the disk"
    );
    assert_eq!(parent.counters().amount, 256 << 10);
}

fn no_detection_without_a_caring_throttler(mut e: Box<dyn IoEngine>) {
    let tf = disk_file(256 << 10, 3);
    let plain: ThrottlePtr = Arc::new(Throttler::new(1 << 30).unwrap());
    tf.file.make_cold().unwrap();
    let (r, buf) = e.read_at(&tf.file, vec![0; 256 << 10], 0, Some(&plain), NO_CAP);
    assert_eq!(r.unwrap(), 256 << 10);
    assert_eq!(buf, tf.data);
    let c = e.counters();
    assert_eq!(
        (c.nowait_misses, c.page_cache_hits, c.cachestat_checks),
        (0, 0, 0)
    );
}

fn eof_and_empty(mut e: Box<dyn IoEngine>) {
    let tf = disk_file(10_000, 4);
    let (disk, _parent, chain) = disk_chain(1 << 30, 1 << 30);
    let (r, buf) = e.read_at(&tf.file, vec![0; 8192], 4096, Some(&chain), NO_CAP);
    assert_eq!(
        r.unwrap(),
        10_000 - 4096,
        "a read across EOF returns what exists"
    );
    assert_eq!(buf[..10_000 - 4096], tf.data[4096..]);
    let (r, _) = e.read_at(&tf.file, vec![0; 4096], 20_000, Some(&chain), NO_CAP);
    assert_eq!(r.unwrap(), 0, "a read past EOF returns 0");
    let empty = disk_file(0, 5);
    let d0 = disk.counters().amount;
    let (r, _) = e.read_at(&empty.file, vec![0; 4096], 0, Some(&chain), NO_CAP);
    assert_eq!(r.unwrap(), 0);
    assert_eq!(
        disk.counters().amount,
        d0,
        "nothing beyond EOF is charged to the disk"
    );
}

fn write_then_read(mut e: Box<dyn IoEngine>) {
    let tf = disk_file(0, 6);
    let t = Arc::new(Throttler::new(1 << 30).unwrap());
    let tp: ThrottlePtr = t.clone();
    let data = pattern(300_000, 7);
    let (r, back) = e.write_at(&tf.file, data.clone(), 1000, Some(&tp), NO_CAP);
    assert_eq!(r.unwrap(), data.len());
    assert_eq!(back, data, "the buffer is handed back");
    assert_eq!(t.counters().amount, data.len() as u64);
    let (r, buf) = e.read_at(&tf.file, vec![0; data.len()], 1000, None, NO_CAP);
    assert_eq!(r.unwrap(), data.len());
    assert_eq!(buf, data);
    let c = e.counters();
    assert_eq!((c.writes, c.write_bytes), (1, data.len() as u64));
}

/// A throttled read of N bytes at rate R with burst B takes at least (N-B)/R.
fn throttled_lower_bound(mut e: Box<dyn IoEngine>) {
    let tf = disk_file(4 << 20, 8);
    let rate = 8 << 20;
    let t = Arc::new(
        Throttler::builder(rate)
            .burst(Duration::from_millis(100))
            .build()
            .unwrap(),
    );
    let tp: ThrottlePtr = t.clone();
    let n: u64 = 3 << 20;
    let burst = rate / 10;
    // Measured on the throttler's own clock (CLOCK_MONOTONIC_RAW), the one
    // its rate is defined against.
    let clock = t.clock().clone();
    let start = clock.now_ns();
    let mut off = 0;
    while off < n {
        let (r, buf) = e.read_at(&tf.file, vec![0; 256 << 10], off, Some(&tp), NO_CAP);
        assert_eq!(r.unwrap(), 256 << 10);
        assert_eq!(buf, tf.data[off as usize..off as usize + (256 << 10)]);
        off += 256 << 10;
    }
    let min = Duration::from_nanos((n - burst) * 1_000_000_000 / rate);
    let elapsed = Duration::from_nanos(clock.now_ns() - start);
    assert!(elapsed >= min, "{elapsed:?} < lower bound {min:?}");
    assert!(e.counters().waits_submitted > 0);
    assert_eq!(t.counters().amount, n);
}

/// Parent and array members are all charged; each keeps its own rate.
fn chain_and_array_rates(mut e: Box<dyn IoEngine>) {
    let tf = disk_file(2 << 20, 9);
    let burst = Duration::from_millis(50);
    let fast = 16u64 << 20;
    let slow = 4u64 << 20;
    let parent = Arc::new(Throttler::builder(slow).burst(burst).build().unwrap());
    let child = Arc::new(
        Throttler::builder(fast)
            .burst(burst)
            .parent(parent.clone())
            .build()
            .unwrap(),
    );
    let a = Arc::new(Throttler::builder(fast).burst(burst).build().unwrap());
    let b = Arc::new(Throttler::builder(slow).burst(burst).build().unwrap());
    let array: ThrottlePtr = Arc::new(ThrottlerArray::new(vec![a.clone(), b.clone()]));
    let chain: ThrottlePtr = child.clone();
    let n = 1u64 << 20;
    let clock = parent.clock().clone();
    for tp in [&chain, &array] {
        let start = clock.now_ns();
        let mut off = 0;
        while off < n {
            let (r, _) = e.read_at(&tf.file, vec![0; 128 << 10], off, Some(tp), NO_CAP);
            assert_eq!(r.unwrap(), 128 << 10);
            off += 128 << 10;
        }
        // The slowest level bounds the whole: (N - burst) / slow.
        let min = Duration::from_nanos((n - slow / 20) * 1_000_000_000 / slow);
        let elapsed = Duration::from_nanos(clock.now_ns() - start);
        assert!(elapsed >= min, "{elapsed:?} < {min:?}");
    }
    for t in [&parent, &child, &a, &b] {
        assert_eq!(
            t.counters().amount,
            n,
            "every level is charged: {}",
            t.name()
        );
    }
}

fn max_block_caps_each_wait(mut e: Box<dyn IoEngine>) {
    let tf = disk_file(2 << 20, 10);
    let t: ThrottlePtr = Arc::new(
        Throttler::builder(1 << 20)
            .burst(Duration::from_millis(10))
            .build()
            .unwrap(),
    );
    let cap = Duration::from_millis(20);
    for i in 0..4u64 {
        let (r, _) = e.read_at(&tf.file, vec![0; 512 << 10], i * (512 << 10), Some(&t), cap);
        assert_eq!(r.unwrap(), 512 << 10);
    }
    let c = e.counters();
    assert!(c.waits_submitted >= 3, "{c:?}");
    assert!(
        c.wait_us <= c.waits_submitted * 20_000,
        "each booked wait is capped: {c:?}"
    );
}

fn random_integrity(mut e: Box<dyn IoEngine>, reads: usize) {
    let tf = disk_file(8 << 20, 11);
    let (_disk, _parent, chain) = disk_chain(1 << 30, 1 << 30);
    tf.file.make_cold().unwrap();
    let mut rng = Rng(0x1234_5678);
    for _ in 0..reads {
        let off = rng.below(9 << 20);
        let len = 1 + rng.below(128 << 10) as usize;
        let throttle = if rng.below(2) == 0 {
            Some(&chain)
        } else {
            None
        };
        let (r, buf) = e.read_at(&tf.file, vec![0xAA; len], off, throttle, NO_CAP);
        let n = r.unwrap();
        let end = (off as usize + len).min(tf.data.len());
        let want = end.saturating_sub(off as usize);
        assert_eq!(n, want, "read {len} at {off}");
        if n > 0 {
            assert_eq!(buf[..n], tf.data[off as usize..end], "bytes at {off}+{len}");
        }
        if rng.below(64) == 0 {
            tf.file.evict().unwrap();
        }
    }
}

fn tmpfs_is_memory(mut e: Box<dyn IoEngine>) {
    let shm = std::path::Path::new("/dev/shm");
    let is_tmpfs = nix::sys::statfs::statfs(shm)
        .map(|s| s.filesystem_type().0 == 0x0102_1994)
        .unwrap_or(false);
    if !is_tmpfs {
        eprintln!("skipped: /dev/shm is not tmpfs here");
        return;
    }
    let tf = file_in(shm, 64 << 10, 12);
    let (disk, parent, chain) = disk_chain(1 << 30, 1 << 30);
    for _ in 0..2 {
        let (r, buf) = e.read_at(&tf.file, vec![0; 64 << 10], 0, Some(&chain), NO_CAP);
        assert_eq!(r.unwrap(), 64 << 10);
        assert_eq!(buf, tf.data);
    }
    assert_eq!(
        tf.file.nowait_mode(),
        NowaitMode::Memory,
        "EOPNOTSUPP remembered per file"
    );
    assert_eq!(disk.counters().amount, 0, "tmpfs is memory, not disk");
    assert_eq!(parent.counters().amount, 128 << 10);
}

fn direct_is_not_probed(mut e: Box<dyn IoEngine>) {
    use std::os::unix::fs::OpenOptionsExt;
    let tf = disk_file(64 << 10, 13);
    let path = std::fs::read_link(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(tf.file.file())
    ))
    .unwrap();
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
    {
        Ok(f) => f,
        Err(err) => {
            eprintln!("skipped: O_DIRECT unsupported here: {err}");
            return;
        }
    };
    let f = UringFile::new(f).unwrap();
    assert!(f.is_direct());
    let (_disk, _parent, chain) = disk_chain(1 << 30, 1 << 30);
    // A Vec<u8> is not 512-aligned, so the kernel may refuse the transfer;
    // what matters is that no NOWAIT probe or cachestat preceded it.
    let (_r, _) = e.read_at(&f, vec![0; 4096], 0, Some(&chain), NO_CAP);
    let c = e.counters();
    assert_eq!(
        (c.nowait_misses, c.page_cache_hits, c.cachestat_checks),
        (0, 0, 0),
        "{c:?}"
    );
}

/// A character device has `st_size` 0 but no EOF: every byte read is
/// charged, and the throttle's wait happens (`(N - burst) / rate` at least).
fn char_device_is_charged(mut e: Box<dyn IoEngine>) {
    let f = UringFile::new(std::fs::File::open("/dev/zero").unwrap()).unwrap();
    assert_eq!(f.size_hint(), SIZE_UNBOUNDED, "no size bounds /dev/zero");
    let rate = 4u64 << 20;
    let t = Arc::new(
        Throttler::builder(rate)
            .burst(Duration::from_millis(10))
            .build()
            .unwrap(),
    );
    let tp: ThrottlePtr = t.clone();
    let clock = t.clock().clone();
    let start = clock.now_ns();
    let n = 1u64 << 20;
    let mut off = 0;
    while off < n {
        let (r, buf) = e.read_at(&f, vec![1; 256 << 10], off, Some(&tp), NO_CAP);
        assert_eq!(r.unwrap(), 256 << 10);
        assert!(buf.iter().all(|&b| b == 0), "read /dev/zero");
        off += 256 << 10;
    }
    assert_eq!(t.counters().amount, n, "every byte read is charged");
    let burst = rate / 100;
    let min = Duration::from_nanos((n - burst) * 1_000_000_000 / rate);
    let elapsed = Duration::from_nanos(clock.now_ns() - start);
    assert!(elapsed >= min, "{elapsed:?} < lower bound {min:?}");
    assert!(e.counters().waits_submitted > 0);
    // Through a chain that ignores page-cache reads (NOWAIT detection on):
    // nothing is trimmed either; the parent is charged for every byte.
    let (disk, parent, chain) = disk_chain(1 << 30, 1 << 30);
    let (r, _) = e.read_at(&f, vec![1; 64 << 10], 0, Some(&chain), NO_CAP);
    assert_eq!(r.unwrap(), 64 << 10);
    assert_eq!(parent.counters().amount, 64 << 10);
    let _ = disk;
}

/// A loop device over a temporary file, detached on drop.
struct LoopDev {
    dev: std::path::PathBuf,
    _backing: TestFile,
}

impl LoopDev {
    fn new(len: usize) -> Self {
        let backing = disk_file(len, 70);
        let path = std::fs::read_link(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(backing.file.file())
        ))
        .unwrap();
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&path)
            .output()
            .expect("losetup (util-linux) runs");
        assert!(out.status.success(), "losetup: {out:?}");
        let dev = String::from_utf8(out.stdout).unwrap().trim().into();
        Self {
            dev,
            _backing: backing,
        }
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .arg("-d")
            .arg(&self.dev)
            .status();
    }
}

/// A block device has `st_size` 0; its size is its capacity
/// (`BLKGETSIZE64`), and a read crossing it is charged only up to it.
fn block_device_is_trimmed_at_capacity(mut e: Box<dyn IoEngine>) {
    let len = (1 << 20) + 3 * 4096;
    let lo = LoopDev::new(len);
    let f = UringFile::new(std::fs::File::open(&lo.dev).unwrap()).unwrap();
    assert_eq!(f.size_hint(), len as u64, "{:?}", lo.dev);
    let t = Arc::new(Throttler::builder(1 << 30).build().unwrap());
    let tp: ThrottlePtr = t.clone();
    let (r, buf) = e.read_at(&f, vec![0; 16 << 10], len as u64 - 4096, Some(&tp), NO_CAP);
    assert_eq!(r.unwrap(), 4096, "the read stops at the device's end");
    assert_eq!(buf[..4096], lo._backing.data[len - 4096..]);
    assert_eq!(t.counters().amount, 4096, "charged up to the capacity only");
}

macro_rules! suite {
    ($m:ident, $make:ident) => {
        mod $m {
            use super::*;
            #[test]
            fn hit_and_miss_charges_disk_and_parent() {
                hit_and_miss($make);
            }
            #[test]
            fn partial_hit_charges_prefix_as_page_cache() {
                partial_hit($make());
            }
            #[test]
            fn no_detection_without_caring_throttler() {
                no_detection_without_a_caring_throttler($make());
            }
            #[test]
            fn eof_short_and_empty_file() {
                eof_and_empty($make());
            }
            #[test]
            fn write_then_read_back() {
                write_then_read($make());
            }
            #[test]
            fn throttled_read_takes_at_least_n_minus_burst_over_rate() {
                throttled_lower_bound($make());
            }
            #[test]
            fn parent_and_array_each_keep_their_rate() {
                chain_and_array_rates($make());
            }
            #[test]
            fn max_block_caps_waits() {
                max_block_caps_each_wait($make());
            }
            #[test]
            fn random_reads_integrity() {
                random_integrity($make(), 3000);
            }
            #[test]
            fn tmpfs_eopnotsupp_remembered_as_memory() {
                tmpfs_is_memory($make());
            }
            #[test]
            fn char_device_reads_are_charged_and_waited() {
                char_device_is_charged($make());
            }
            #[test]
            fn block_device_reads_are_trimmed_at_capacity() {
                block_device_is_trimmed_at_capacity($make());
            }
            #[test]
            fn o_direct_is_not_probed() {
                direct_is_not_probed($make());
            }
        }
    };
}

suite!(uring_engine, uring);
suite!(pread_engine, pread);

#[test]
fn throttle_trait_is_object_safe_for_chains() {
    // A compile-time check that a chain is usable as the engines' ThrottlePtr.
    let t: Arc<dyn Throttle> = Arc::new(Throttler::new(1).unwrap());
    assert!(!t.ignores_page_cache_reads());
}

/// A read charged as a miss waits its turn; if another reader brings its
/// range into the page cache meanwhile, the re-probe at the end of the wait
/// finds it there and gives the charge back to the disk throttler (not to
/// its parent, which charges page-cache reads too); a range nobody warmed
/// stays charged and is read from the disk.
#[test]
fn a_miss_found_cached_after_its_wait_is_refunded_to_the_disk() {
    use std::os::unix::fs::FileExt;
    const LEN: usize = 64 << 10;
    let tf = disk_file(2 << 20, 51);
    // No readahead: warming one range must not warm the other.
    nix::fcntl::posix_fadvise(
        tf.file.file(),
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_RANDOM,
    )
    .unwrap();
    tf.file.make_cold().unwrap();
    // 128 KiB/s, 1 ms of burst: the first miss waits ~0.5 s, the second ~1 s.
    let disk = Arc::new(
        Throttler::builder(128 << 10)
            .burst(Duration::from_millis(1))
            .limits_block_device_bandwidth(true)
            .name("disk")
            .build()
            .unwrap(),
    );
    let chain: ThrottlePtr = disk.clone();
    let mut e = UringEngine::new(&RingConfig::default()).unwrap();
    let (warmed, cold) = (0u64, 1u64 << 20);
    let a = e.submit_read(&tf.file, vec![0; LEN], warmed, Some(&chain), NO_CAP);
    let b = e.submit_read(&tf.file, vec![0; LEN], cold, Some(&chain), NO_CAP);
    // Both probes miss and both reads are charged before either waits out.
    while disk.counters().amount < 2 * LEN as u64 {
        e.submit_pending().unwrap();
        std::thread::yield_now();
    }
    // Found missing by a probe or, the disk bucket being this small, by the
    // guard's cachestat.
    let c = e.counters();
    assert_eq!(c.nowait_misses + c.cachestat_checks, 2, "{c:?}");
    // Another reader brings the first range in while it waits.
    let mut other = vec![0; LEN];
    tf.file.file().read_at(&mut other, warmed).unwrap();
    let ca = e.wait(a).unwrap();
    let cb = e.wait(b).unwrap();
    assert_eq!(ca.result.unwrap(), LEN);
    assert_eq!(ca.buf, tf.data[..LEN]);
    assert_eq!(cb.result.unwrap(), LEN);
    assert_eq!(cb.buf, tf.data[1 << 20..(1 << 20) + LEN]);
    let c = e.counters();
    assert_eq!(c.page_cache_refund_bytes, LEN as u64, "{c:?}");
    assert_eq!(c.page_cache_bytes, LEN as u64, "{c:?}");
    let d = disk.counters();
    // The count keeps both charges (a monotonic counter); the warmed read's
    // went back to the bucket and is counted as page-cache bytes.
    assert_eq!(d.amount, 2 * LEN as u64, "{d:?}");
    assert_eq!(d.page_cache_amount, LEN as u64, "{d:?}");
}

/// A miss found by a `RWF_NOWAIT` probe is not re-probed after its wait: the
/// probe itself may start reading the range in, so by the end
/// of the wait the pages may be there because of this very request, and a
/// re-probe would refund the disk read it caused.
#[test]
fn a_probed_miss_is_not_refunded_for_its_own_read_in() {
    const LEN: usize = 64 << 10;
    let tf = disk_file(1 << 20, 52);
    nix::fcntl::posix_fadvise(
        tf.file.file(),
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_RANDOM,
    )
    .unwrap();
    // The disk bucket covers the read (no guard: the read is probed); the
    // parent makes it wait ~0.5 s, long enough for the probe's read-in. A
    // cold probe can be answered with the data it read in
    // (`COLD_PROBE_ATTEMPTS`): try again on a fresh engine then.
    let mut attempt = 0;
    let (e, disk) = loop {
        attempt += 1;
        tf.file.make_cold().unwrap();
        let parent: ThrottlePtr = Arc::new(
            Throttler::builder(128 << 10)
                .burst(Duration::from_millis(1))
                .name("user")
                .build()
                .unwrap(),
        );
        let disk = Arc::new(
            Throttler::builder(1 << 30)
                .limits_block_device_bandwidth(true)
                .parent(parent)
                .name("disk")
                .build()
                .unwrap(),
        );
        let chain: ThrottlePtr = disk.clone();
        let mut e = UringEngine::new(&RingConfig::default()).unwrap();
        let (r, buf) = e.read_at(&tf.file, vec![0; LEN], 0, Some(&chain), NO_CAP);
        assert_eq!(r.unwrap(), LEN);
        assert_eq!(buf, tf.data[..LEN]);
        if e.counters().nowait_misses == 1 || attempt == COLD_PROBE_ATTEMPTS {
            break (e, disk);
        }
        eprintln!("the kernel served a cold NOWAIT read with data; retrying");
    };
    let c = e.counters();
    assert_eq!(c.nowait_misses, 1, "{c:?}");
    assert!(c.wait_us >= 400_000, "the parent made it wait: {c:?}");
    assert_eq!(c.page_cache_refund_bytes, 0, "{c:?}");
    assert_eq!(disk.counters().amount, LEN as u64);
}

#[test]
fn make_cold_names_the_pages_a_mapping_keeps_cached() {
    use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};
    const LEN: usize = 64 << 10;
    let tf = disk_file(LEN, 90);
    // SAFETY: a read-only shared mapping of the whole of a file this test
    // owns; it is read only through `bytes` below and unmapped before the
    // file is dropped.
    let map = unsafe {
        mmap(
            None,
            std::num::NonZeroUsize::new(LEN).unwrap(),
            ProtFlags::PROT_READ,
            MapFlags::MAP_SHARED,
            tf.file.file(),
            0,
        )
    }
    .unwrap();
    // SAFETY: `map` is LEN readable bytes until the `munmap` below.
    let bytes = unsafe { std::slice::from_raw_parts(map.as_ptr().cast::<u8>(), LEN) };
    // Reading every byte maps every page; the kernel evicts no mapped page.
    assert_eq!(bytes, &tf.data[..]);
    let err = tf.file.make_cold().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ResourceBusy, "{err}");
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let pages = LEN as u64 / page;
    assert!(
        err.to_string()
            .starts_with(&format!("{pages} pages of fd ")),
        "{err}"
    );
    // SAFETY: `bytes` is not used again.
    unsafe { munmap(map, LEN) }.unwrap();
    tf.file.make_cold().unwrap();
    assert_eq!(cached_pages(&tf.file, 0, LEN as u64), 0);
}
