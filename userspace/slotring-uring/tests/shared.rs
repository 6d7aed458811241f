//! The `Send + Sync + Clone` front end on tokio's multi-thread runtime, real
//! kernel: many spawned tasks, cancellation by drop and by abort, the pread
//! fallback (seam and the real `io_uring_disabled` sysctl).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use slotring_throttle::{ThrottlePtr, Throttler};
use slotring_uring::{Reaper, RingConfig, SharedConfig, SharedEngine, UringError};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

/// Fails (instead of hanging) if the engine never wakes.
const HANG: Duration = Duration::from_secs(20);

fn cfg(reaper: Reaper, rings: usize) -> SharedConfig {
    SharedConfig {
        ring: RingConfig {
            entries: 64,
            ..RingConfig::default()
        },
        rings,
        reaper,
        ..SharedConfig::default()
    }
}

fn assert_send_sync_clone<T: Send + Sync + Clone + 'static>() {}

#[test]
fn the_handle_is_send_sync_clone() {
    assert_send_sync_clone::<SharedEngine>();
}

/// 256 spawned tasks × 8 reads each (cold, hot, throttled through a
/// block-device chain), on both reapers and on one and several rings: every
/// byte checked, nothing left in flight, the disk charged only for misses.
#[test]
fn many_spawned_tasks_read_the_right_bytes() {
    for (reaper, rings) in [
        (Reaper::Reactor, 1),
        (Reaper::Reactor, 3),
        (Reaper::Thread, 2),
    ] {
        let tf = disk_file(4 << 20, 50);
        let data = Arc::new(tf.data.clone());
        rt().block_on(async {
            let e = SharedEngine::new(&cfg(reaper, rings)).unwrap();
            assert_eq!(e.rings(), rings);
            let (disk, _parent, chain) = disk_chain(1 << 30, 1 << 30);
            tf.file.make_cold().unwrap();
            let mut hs = Vec::new();
            for t in 0..256usize {
                let (e, f, data, chain) = (e.clone(), tf.file.clone(), data.clone(), chain.clone());
                hs.push(tokio::spawn(async move {
                    let mut rng = Rng(t as u64 + 1);
                    for _ in 0..8 {
                        let off = rng.below(4 << 20) as usize;
                        let len = 1 + rng.below(64 << 10) as usize;
                        let th = (rng.below(2) == 0).then(|| chain.clone());
                        let (r, buf) = e
                            .read_at(&f, vec![0xEE; len], off as u64, th.as_ref(), NO_CAP)
                            .await;
                        let end = (off + len).min(data.len());
                        assert_eq!(r.unwrap(), end - off, "{off}+{len}");
                        assert_eq!(buf[..end - off], data[off..end], "bytes at {off}+{len}");
                        tokio::task::yield_now().await;
                    }
                }));
            }
            for h in hs {
                tokio::time::timeout(HANG, h)
                    .await
                    .unwrap_or_else(|_| panic!("{reaper:?}/{rings}: hang, {:?}", e.counters()))
                    .unwrap();
            }
            assert_eq!(e.in_flight(), 0);
            let c = e.counters();
            assert_eq!(c.reads, 256 * 8, "{c:?}");
            // What the disk throttler was charged came from the disk: never
            // more than the bytes read minus the page-cache hits.
            assert!(
                disk.counters().amount <= c.read_bytes - c.page_cache_bytes,
                "{c:?} {:?}",
                disk.counters()
            );
            assert!(c.page_cache_hits > 0 && c.nowait_misses > 0, "{c:?}");
        });
    }
}

/// Reads on many tasks, a quarter of them dropped mid-flight (by a short
/// `timeout` on a throttled read, or by aborting the task from another
/// worker). A buffer freed before its last CQE would be reused by the
/// allocator and the kernel's late write would show up as wrong bytes in a
/// later read; every completed read is checked, and every dropped request
/// is retired once its CQEs are in.
#[test]
fn drops_mid_flight_keep_buffer_integrity() {
    for reaper in [Reaper::Reactor, Reaper::Thread] {
        let tf = disk_file(8 << 20, 51);
        let data = Arc::new(tf.data.clone());
        rt().block_on(async {
            let e = SharedEngine::new(&cfg(reaper, 2)).unwrap();
            let slow: ThrottlePtr = Arc::new(
                Throttler::builder(256 << 20)
                    .burst(Duration::from_millis(2))
                    .build()
                    .unwrap(),
            );
            let mut rng = Rng(9);
            let (mut completed, mut dropped) = (0usize, 0usize);
            for round in 0..40 {
                if round % 4 == 0 {
                    tf.file.evict().unwrap();
                }
                let mut hs = Vec::new();
                for _ in 0..128 {
                    let off = rng.below(9 << 20) as usize;
                    let len = 1 + rng.below(64 << 10) as usize;
                    let th = (rng.below(2) == 0).then(|| slow.clone());
                    let how = rng.below(8);
                    let (e, f, data) = (e.clone(), tf.file.clone(), data.clone());
                    let h = tokio::spawn(async move {
                        let fut = e.read_at(&f, vec![0xEE; len], off as u64, th.as_ref(), NO_CAP);
                        let out = if how == 0 {
                            match tokio::time::timeout(Duration::from_micros(50), fut).await {
                                Ok(v) => v,
                                Err(_) => return false,
                            }
                        } else {
                            fut.await
                        };
                        let (r, buf) = out;
                        let end = (off + len).min(data.len());
                        let n = r.unwrap();
                        assert_eq!(n, end.saturating_sub(off));
                        assert_eq!(buf[..n], data[off.min(end)..end], "bytes at {off}+{len}");
                        true
                    });
                    hs.push((how == 1, h));
                }
                for (abort, h) in &hs {
                    if *abort {
                        h.abort();
                    }
                }
                for (_, h) in hs {
                    match tokio::time::timeout(HANG, h).await.expect("no hang") {
                        Ok(true) => completed += 1,
                        Ok(false) => dropped += 1,
                        Err(j) if j.is_cancelled() => dropped += 1,
                        Err(j) => std::panic::resume_unwind(j.into_panic()),
                    }
                }
            }
            assert_eq!(completed + dropped, 40 * 128);
            assert!(dropped > 200, "{reaper:?}: drops happened: {dropped}");
            let deadline = Instant::now() + HANG;
            while e.in_flight() > 0 {
                assert!(Instant::now() < deadline, "{} never retired", e.in_flight());
                e.poll_progress().unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            assert!(e.counters().cancellations > 0, "{:?}", e.counters());
        });
    }
}

/// Without io_uring (setup refused, as seccomp or the sysctl would), the
/// handle serves the same reads from tokio's blocking pool with the same
/// charging policy, and the reason is handed back once.
#[test]
fn setup_refused_falls_back_to_pread_on_the_blocking_pool() {
    let tf = disk_file(1 << 20, 52);
    let plan = fault_plan();
    plan.lock().unwrap().setup_errno = Some(libc::EPERM);
    let p = plan.clone();
    rt().block_on(async {
        let (e, why) = SharedEngine::open_with(
            &cfg(Reaper::Reactor, 2),
            Arc::new(move || -> Box<dyn slotring_uring::Syscalls> {
                Box::new(FaultSys(p.clone()))
            }),
        )
        .unwrap();
        assert_eq!(e.kind(), "pread");
        let why = why.expect("the reason is handed back");
        assert!(matches!(why, UringError::Unavailable { .. }), "{why}");
        let (disk, _parent, chain) = disk_chain(1 << 30, 1 << 30);
        tf.file.make_cold().unwrap();
        let mut hs = Vec::new();
        for i in 0..16usize {
            let (e, f, chain) = (e.clone(), tf.file.clone(), chain.clone());
            hs.push(tokio::spawn(async move {
                let off = i * (64 << 10);
                e.read_at(&f, vec![0; 64 << 10], off as u64, Some(&chain), NO_CAP)
                    .await
            }));
        }
        for (i, h) in hs.into_iter().enumerate() {
            let (r, buf) = h.await.unwrap();
            assert_eq!(r.unwrap(), 64 << 10);
            assert_eq!(buf, tf.data[i * (64 << 10)..(i + 1) * (64 << 10)]);
        }
        // Cold: each byte is charged to the disk unless readahead of a
        // neighbour brought it in first. Then hot: the page cache is free.
        let before = e.counters();
        let cold = disk.counters().amount;
        assert_eq!(cold + before.page_cache_bytes, 1 << 20, "{before:?}");
        let (r, _) = e
            .read_at(&tf.file, vec![0; 64 << 10], 0, Some(&chain), NO_CAP)
            .await;
        assert_eq!(r.unwrap(), 64 << 10);
        assert_eq!(disk.counters().amount, cold, "a page-cache hit is free");
        let c = e.counters();
        assert_eq!(c.reads, 17, "{c:?}");
        assert_eq!(c.page_cache_hits, before.page_cache_hits + 1, "{c:?}");
        // Every read went through preadv2 (one NOWAIT probe each, then a
        // plain pread for what was not cached), none through a ring.
        let log = plan.lock().unwrap().log.clone();
        assert!(!log.contains(&"io_uring_enter"), "{log:?}");
        let probes = log.iter().filter(|&&c| c == "preadv2_nowait").count();
        assert_eq!(probes, 17, "{log:?}");
    });
}

#[test]
fn setup_flags_the_shared_front_end_cannot_use_are_refused() {
    rt().block_on(async {
        for ring in [
            RingConfig {
                single_issuer: true,
                defer_taskrun: true,
                ..RingConfig::default()
            },
            RingConfig {
                single_issuer: true,
                ..RingConfig::default()
            },
        ] {
            let c = SharedConfig {
                ring,
                ..SharedConfig::default()
            };
            let err = SharedEngine::open(&c).unwrap_err();
            assert!(
                matches!(err, UringError::InvalidFlags { .. }),
                "not a fallback: {err}"
            );
            assert!(err.to_string().contains("single_issuer=true"), "{err}");
        }
    });
}

/// Code written against `AsyncIo` runs on both front ends.
async fn read_whole<E: slotring_uring::AsyncIo>(e: &E, tf: &TestFile) -> Vec<u8> {
    let (r, buf) = e
        .read_at(&tf.file, vec![0; tf.data.len()], 0, None, NO_CAP)
        .await;
    assert_eq!(r.unwrap(), tf.data.len());
    buf
}

#[test]
fn both_front_ends_serve_the_async_io_trait() {
    let tf = disk_file(128 << 10, 54);
    let shared = rt().block_on(async {
        let e = SharedEngine::new(&SharedConfig::default()).unwrap();
        read_whole(&e, &tf).await
    });
    let local = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let e = slotring_uring::LocalEngine::new(&RingConfig::default()).unwrap();
            read_whole(&e, &tf).await
        });
    assert_eq!(shared, tf.data);
    assert_eq!(local, tf.data);
}

/// On the async front end a read the guard routed by `cachestat` waits on a
/// standalone timeout; at its expiry, before any read of its own, pages of
/// its range in the page cache (here: 4 of 16, injected through the seam, as
/// another reader's read-in still in flight would show) are refunded to the
/// disk throttler, and the read goes on plainly.
#[test]
fn pages_another_reader_brought_in_during_the_wait_are_refunded() {
    const LEN: u64 = 64 << 10;
    let tf = disk_file(LEN as usize, 53);
    tf.file.make_cold().unwrap();
    let plan = fault_plan();
    let p = plan.clone();
    rt().block_on(async {
        let (e, why) = SharedEngine::open_with(
            &cfg(Reaper::Reactor, 1),
            Arc::new(move || -> Box<dyn slotring_uring::Syscalls> {
                Box::new(FaultSys(p.clone()))
            }),
        )
        .unwrap();
        assert!(why.is_none());
        // 1 MiB/s, 1 ms of burst: the guard routes the read, which waits.
        let disk = Arc::new(
            Throttler::builder(1 << 20)
                .burst(Duration::from_millis(1))
                .limits_block_device_bandwidth(true)
                .build()
                .unwrap(),
        );
        let chain: ThrottlePtr = disk.clone();
        // The guard's own cachestat sees the real (empty) cache; the one at
        // the wait's expiry sees 4 pages.
        let (r, buf) = {
            let fut = e.read_at(&tf.file, vec![0; LEN as usize], 0, Some(&chain), NO_CAP);
            let p = plan.clone();
            let arm = async move {
                while !p.lock().unwrap().log.contains(&"cachestat") {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                p.lock().unwrap().cachestat_pages = Some(4);
            };
            let (out, ()) = tokio::join!(fut, arm);
            out
        };
        assert_eq!(r.unwrap(), LEN as usize);
        assert_eq!(buf, tf.data);
        let c = e.counters();
        assert_eq!(c.cachestat_checks, 2, "{c:?}");
        assert_eq!(c.page_cache_refund_bytes, 4 * 4096, "{c:?}");
        let d = disk.counters();
        assert_eq!(d.amount, LEN, "the count keeps the charge: {d:?}");
        assert_eq!(d.page_cache_amount, 4 * 4096, "{d:?}");
    });
}
