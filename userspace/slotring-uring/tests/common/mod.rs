//! Shared helpers for the real-kernel tests.
#![allow(dead_code, reason = "each test binary uses a subset")]

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slotring_throttle::{
    Resource, ThrottlePtr, Throttler, WorkloadScheduler, WorkloadSpec, WorkloadTree,
};
use slotring_uring::{IoUring, RealSyscalls, Syscalls, UringFile};

/// A directory on a real disk (not tmpfs), for page-cache tests.
pub fn disk_dir() -> PathBuf {
    for cand in [
        std::env::temp_dir(),
        PathBuf::from("/var/tmp"),
        std::env::current_dir().unwrap(),
    ] {
        if let Ok(st) = nix::sys::statfs::statfs(&cand) {
            let magic = st.filesystem_type().0;
            if magic != 0x0102_1994 && magic != 0x8584_58f6 {
                return cand;
            }
        }
    }
    panic!("no disk-backed directory found for page-cache tests");
}

/// Deterministic pseudo-random bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A small xorshift RNG.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A file on disk with `len` pattern bytes, synced (so it can be evicted).
pub struct TestFile {
    pub file: Arc<UringFile>,
    pub data: Vec<u8>,
    _tmp: tempfile::TempPath,
}

pub fn disk_file(len: usize, seed: u64) -> TestFile {
    file_in(&disk_dir(), len, seed)
}

pub fn file_in(dir: &std::path::Path, len: usize, seed: u64) -> TestFile {
    let data = pattern(len, seed);
    let tmp = tempfile::Builder::new()
        .prefix("slotring-uring-")
        .tempfile_in(dir)
        .unwrap();
    let (mut f, path) = tmp.into_parts();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    TestFile {
        file: UringFile::new(f).unwrap(),
        data,
        _tmp: path,
    }
}

pub fn open_rw(path: &std::path::Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

/// The whole cachestat(2) answer for `[off, off+len)`.
pub fn cache_stat(f: &UringFile, off: u64, len: u64) -> slotring_uring::CacheStat {
    use std::os::fd::AsRawFd;
    RealSyscalls
        .cachestat(f.file().as_raw_fd(), off, len)
        .unwrap()
}

/// How many times a test that needs a cold `RWF_NOWAIT` probe to miss
/// tries it, each on a cold file. The probe that misses starts the read-in
/// before it answers; when that IO completes before the probe looks again
/// (a thread preempted there on a loaded machine, a device that answers at
/// once), the probe returns the data and counts as a hit: rare on an idle
/// machine, and most of the time in a bad minute (decision 0029). At 93 %
/// hits, 200 tries all hit once in two million runs.
pub const COLD_PROBE_ATTEMPTS: usize = 200;

/// Pages of `[off, off+len)` in the page cache, per cachestat(2).
pub fn cached_pages(f: &UringFile, off: u64, len: u64) -> u64 {
    use std::os::fd::AsRawFd;
    RealSyscalls
        .cachestat(f.file().as_raw_fd(), off, len)
        .unwrap()
        .nr_cache
}

/// A disk with one in-flight place (`max_io_requests` 1) over two leaves,
/// `user` and `other`: a request of one queues while the other holds the
/// place.
pub fn one_place_disk() -> WorkloadScheduler {
    let tree = WorkloadTree::new(vec![
        WorkloadSpec::new("disk").max_io_requests(1),
        WorkloadSpec::new("user").parent("disk"),
        WorkloadSpec::new("other").parent("disk"),
    ])
    .unwrap();
    WorkloadScheduler::new(&tree, Resource::Io).unwrap()
}

/// A block-device throttler under a non-block-device parent.
pub fn disk_chain(
    disk_rate: u64,
    parent_rate: u64,
) -> (Arc<Throttler>, Arc<Throttler>, ThrottlePtr) {
    let parent = Arc::new(
        Throttler::builder(parent_rate)
            .name("user")
            .build()
            .unwrap(),
    );
    let disk = Arc::new(
        Throttler::builder(disk_rate)
            .limits_block_device_bandwidth(true)
            .parent(parent.clone())
            .name("disk")
            .build()
            .unwrap(),
    );
    let chain: ThrottlePtr = disk.clone();
    (disk, parent, chain)
}

pub const NO_CAP: Duration = slotring_throttle::UNLIMITED_BLOCK;

/// What to inject, consumed in order.
#[derive(Debug, Default)]
pub struct Plan {
    /// Results to substitute for the next IO completions (tag 0), in order.
    pub io_results: Vec<Rewrite>,
    /// Errnos to substitute for the next throttle-wait completions (tag 1), in order.
    pub wait_results: Vec<i32>,
    /// Errors to return from the next `io_uring_enter` calls, in order.
    pub enter_errors: Vec<i32>,
    /// Errors to return from the next timed waits (`io_uring_wait_until`).
    pub wait_until_errors: Vec<i32>,
    /// Report this many pages cached from every `cachestat(2)` (e.g.
    /// another reader's pages still being read in).
    pub cachestat_pages: Option<u64>,

    /// Report a full SQ this many times.
    pub sq_full: u32,
    /// Fail io_uring_setup with this errno.
    pub setup_errno: Option<i32>,
    /// Errors to return from the next preadv2 calls (before the real call).
    pub pread_errors: Vec<i32>,
    /// Halve the next preadv2 results this many times.
    pub pread_short: u32,
    /// Faults for the next pwrite calls, in order: `Errno` fails the call
    /// (nothing written), `Half` writes only the first half of the buffer.
    pub pwrite_faults: Vec<Rewrite>,
    /// Errors to return from the next sync_file_range calls.
    pub sync_errors: Vec<i32>,
    /// Log of every call made, by name.
    pub log: Vec<&'static str>,
    /// `(to_submit, min_complete)` of every `io_uring_enter` that reached
    /// the kernel.
    pub enters: Vec<(u32, u32)>,
    /// `(user_data, res)` of every completion reaped, as the kernel gave it.
    pub completions: Vec<(u64, i32)>,
}

#[derive(Debug, Clone, Copy)]
pub enum Rewrite {
    Errno(i32),
    Half,
}

/// The real kernel, with faults injected per the shared plan.
pub struct FaultSys(pub Arc<Mutex<Plan>>);

impl Syscalls for FaultSys {
    fn io_uring_setup(&mut self, p: &slotring_uring::SetupParams) -> std::io::Result<IoUring> {
        let mut plan = self.0.lock().unwrap();
        plan.log.push("io_uring_setup");
        if let Some(e) = plan.setup_errno {
            return Err(std::io::Error::from_raw_os_error(e));
        }
        RealSyscalls.io_uring_setup(p)
    }
    fn io_uring_enter(&mut self, ring: &IoUring, s: u32, m: u32, f: u32) -> std::io::Result<usize> {
        {
            let mut plan = self.0.lock().unwrap();
            plan.log.push("io_uring_enter");
            if !plan.enter_errors.is_empty() {
                let e = plan.enter_errors.remove(0);
                return Err(std::io::Error::from_raw_os_error(e));
            }
            plan.enters.push((s, m));
        }
        RealSyscalls.io_uring_enter(ring, s, m, f)
    }
    fn io_uring_wait_until(&mut self, ring: &IoUring, deadline_ns: u64) -> std::io::Result<usize> {
        {
            let mut plan = self.0.lock().unwrap();
            plan.log.push("io_uring_wait_until");
            if !plan.wait_until_errors.is_empty() {
                let e = plan.wait_until_errors.remove(0);
                return Err(std::io::Error::from_raw_os_error(e));
            }
        }
        RealSyscalls.io_uring_wait_until(ring, deadline_ns)
    }
    fn cachestat(
        &mut self,
        fd: i32,
        off: u64,
        len: u64,
    ) -> std::io::Result<slotring_uring::CacheStat> {
        let pages = {
            let mut plan = self.0.lock().unwrap();
            plan.log.push("cachestat");
            plan.cachestat_pages
        };
        let mut st = RealSyscalls.cachestat(fd, off, len)?;
        if let Some(p) = pages {
            st.nr_cache = p;
        }
        Ok(st)
    }
    fn completion(&mut self, user_data: u64, res: &mut i32) {
        let mut plan = self.0.lock().unwrap();
        plan.completions.push((user_data, *res));
        if user_data & 7 == 1 && !plan.wait_results.is_empty() {
            *res = -plan.wait_results.remove(0);
        }
        if user_data & 7 == 0 && !plan.io_results.is_empty() {
            match plan.io_results.remove(0) {
                Rewrite::Errno(e) => *res = -e,
                Rewrite::Half => {
                    if *res > 1 {
                        *res /= 2;
                    }
                }
            }
        }
    }
    fn sq_room(&mut self, real: usize) -> usize {
        let mut plan = self.0.lock().unwrap();
        if plan.sq_full > 0 {
            plan.sq_full -= 1;
            0
        } else {
            real
        }
    }
    fn preadv2(&mut self, fd: i32, buf: &mut [u8], off: u64, flags: i32) -> std::io::Result<usize> {
        {
            let mut plan = self.0.lock().unwrap();
            plan.log.push(if flags != 0 {
                "preadv2_nowait"
            } else {
                "pread"
            });
            if !plan.pread_errors.is_empty() {
                let e = plan.pread_errors.remove(0);
                return Err(std::io::Error::from_raw_os_error(e));
            }
            if plan.pread_short > 0 && buf.len() > 1 {
                plan.pread_short -= 1;
                let half = buf.len() / 2;
                return RealSyscalls.preadv2(fd, &mut buf[..half], off, flags);
            }
        }
        RealSyscalls.preadv2(fd, buf, off, flags)
    }
    fn pwrite(&mut self, fd: i32, buf: &[u8], off: u64) -> std::io::Result<usize> {
        {
            let mut plan = self.0.lock().unwrap();
            plan.log.push("pwrite");
            if !plan.pwrite_faults.is_empty() {
                match plan.pwrite_faults.remove(0) {
                    Rewrite::Errno(e) => return Err(std::io::Error::from_raw_os_error(e)),
                    Rewrite::Half if buf.len() > 1 => {
                        return RealSyscalls.pwrite(fd, &buf[..buf.len() / 2], off);
                    }
                    Rewrite::Half => {}
                }
            }
        }
        RealSyscalls.pwrite(fd, buf, off)
    }
    fn sync_file_range(
        &mut self,
        fd: i32,
        off: u64,
        len: u64,
        complete: bool,
    ) -> std::io::Result<()> {
        {
            let mut plan = self.0.lock().unwrap();
            plan.log.push("sync_file_range");
            if !plan.sync_errors.is_empty() {
                let e = plan.sync_errors.remove(0);
                return Err(std::io::Error::from_raw_os_error(e));
            }
        }
        RealSyscalls.sync_file_range(fd, off, len, complete)
    }
}

pub fn fault_plan() -> Arc<Mutex<Plan>> {
    Arc::new(Mutex::new(Plan::default()))
}
