//! Exact behaviour of the throttler, on a `ManualClock` (instant and exact:
//! every wait advances the clock by exactly the waited time).

use std::sync::Arc;
use std::time::Duration;

use slotring_throttle::{
    Clock, ManualClock, NANO_PER_TOKEN, Source, Throttle, ThrottleError, ThrottlePtr, Throttler,
    ThrottlerArray, UNLIMITED_BLOCK, add_throttler,
};

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_000 * SEC;

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(T0))
}

fn throttler(rate: u64, c: &Arc<ManualClock>) -> Throttler {
    Throttler::builder(rate)
        .clock(c.clone())
        .name("t")
        .build()
        .unwrap()
}

fn tokens(t: &Throttler) -> i128 {
    t.tokens_nano()
}

fn tok(n: i128) -> i128 {
    n * NANO_PER_TOKEN
}

#[test]
fn bucket_starts_full() {
    let c = clock();
    let t = throttler(100, &c);
    assert_eq!(tokens(&t), tok(100));
    assert!(
        !t.throttle(100, UNLIMITED_BLOCK).unwrap(),
        "a full burst passes without waiting"
    );
    assert_eq!(tokens(&t), 0);
    assert_eq!(c.now_ns(), T0, "no time passed");
}

#[test]
fn one_second_burst_then_rate() {
    let c = clock();
    let t = throttler(100, &c);
    t.throttle(100, UNLIMITED_BLOCK).unwrap();
    assert!(
        t.throttle(1, UNLIMITED_BLOCK).unwrap(),
        "the 101st token waits"
    );
    assert_eq!(c.now_ns() - T0, SEC / 100, "one token at 100/s is 10 ms");
    assert_eq!(
        tokens(&t),
        0,
        "after the wait the bucket is exactly at zero"
    );
}

#[test]
fn wait_is_deficit_over_rate_exactly() {
    let c = clock();
    let t = throttler(3, &c);
    assert!(t.throttle(4, UNLIMITED_BLOCK).unwrap());
    // One token of debt at 3 tokens/s: ceil(10^9 / 3) ns.
    assert_eq!(c.now_ns() - T0, 333_333_334);
    let c2 = clock();
    let t2 = throttler(1_000_000, &c2);
    t2.throttle(1_000_000 + 1_234_567, UNLIMITED_BLOCK).unwrap();
    assert_eq!(c2.now_ns() - T0, 1_234_567_000, "1,234,567 tokens at 1M/s");
}

#[test]
fn refill_is_capped_at_the_burst_after_a_long_idle() {
    let c = clock();
    let t = throttler(100, &c);
    t.throttle(100, UNLIMITED_BLOCK).unwrap();
    c.advance(60 * SEC);
    assert_eq!(
        tokens(&t),
        tok(100),
        "a minute idle still refills one second"
    );
    let before = c.now_ns();
    assert!(t.throttle(3_000, UNLIMITED_BLOCK).unwrap());
    assert_eq!(
        c.now_ns() - before,
        29 * SEC,
        "30 s worth of tokens minus the 1 s burst"
    );
}

/// ClickHouse applies the `min` after subtracting:
/// `tokens = min(burst, tokens + rate·dt − amount)`. After a 60 s idle a single
/// 30-s-sized request passes free and the bucket stays full. We cap the refill
/// first, so the same request waits 29 s (previous test).
#[test]
fn clickhouse_min_after_subtract_is_an_unbounded_burst() {
    // ClickHouse's formula (`src/Common/Throttler.cpp`), in exact integers
    // (nano-tokens), for comparison.
    let (rate, burst) = (100i128, tok(100));
    let mut ch_tokens = burst - tok(100); // drained, as above
    ch_tokens = (ch_tokens + rate * (60 * SEC) as i128 - tok(3_000)).min(burst);
    assert_eq!(
        ch_tokens, burst,
        "ClickHouse: 3,000 tokens free and the bucket still full"
    );
    let c = clock();
    let t = throttler(100, &c);
    t.throttle(100, Duration::ZERO).unwrap();
    c.advance(60 * SEC);
    t.throttle(3_000, Duration::ZERO).unwrap();
    assert_eq!(
        tokens(&t),
        tok(-2_900),
        "ours: the same request leaves 2,900 tokens of debt"
    );
}

#[test]
fn max_block_caps_the_wait() {
    let c = clock();
    let t = throttler(100, &c);
    assert!(t.throttle(1_100, Duration::from_millis(50)).unwrap());
    assert_eq!(
        c.now_ns() - T0,
        50_000_000,
        "waited max_block, not the 10 s deficit"
    );
    assert_eq!(
        tokens(&t),
        tok(-1_000) + tok(5),
        "the debt stays, minus 50 ms of refill"
    );
}

#[test]
fn zero_max_block_never_waits_but_charges() {
    let c = clock();
    let t = throttler(100, &c);
    assert!(!t.throttle(500, Duration::ZERO).unwrap());
    assert_eq!(c.now_ns(), T0);
    assert_eq!(tokens(&t), tok(-400));
    assert_eq!(t.count(), 500);
    assert_eq!(t.counters().waits, 0);
}

#[test]
fn unlimited_never_waits() {
    let c = clock();
    let t = throttler(0, &c);
    for _ in 0..10 {
        assert!(!t.throttle(u64::MAX / 20, UNLIMITED_BLOCK).unwrap());
    }
    assert_eq!(c.now_ns(), T0);
    assert_eq!(t.count(), u64::MAX / 20 * 10);
    assert!(!t.ignores_page_cache_reads());
}

#[test]
fn lifetime_limit_is_a_typed_error_after_charging() {
    let c = clock();
    let t = Throttler::builder(0)
        .clock(c.clone())
        .name("user_download")
        .limit(1_000, "Too many bytes downloaded today.")
        .build()
        .unwrap();
    t.throttle(600, UNLIMITED_BLOCK).unwrap();
    let err = t.throttle(600, UNLIMITED_BLOCK).unwrap_err();
    assert_eq!(
        err,
        ThrottleError::LimitExceeded {
            name: "user_download".into(),
            limit: 1_000,
            count: 1_200,
            message: "Too many bytes downloaded today.".into(),
        }
    );
    assert_eq!(
        err.to_string(),
        "Too many bytes downloaded today. Maximum: 1000 (throttler `user_download` has counted 1200)"
    );
    assert_eq!(
        t.count(),
        1_200,
        "tokens were charged before the limit check"
    );
}

#[test]
fn parent_is_charged_after_the_childs_wait() {
    let c = clock();
    let parent: ThrottlePtr = Arc::new(throttler(50, &c));
    let child = Throttler::builder(100)
        .clock(c.clone())
        .parent(parent.clone())
        .build()
        .unwrap();
    // Drain the parent to exactly zero at T0.
    parent.throttle(50, Duration::ZERO).unwrap();
    assert!(child.throttle(150, UNLIMITED_BLOCK).unwrap());
    // Child: 50 tokens of debt at 100/s → 0.5 s. Parent, charged at T0+0.5 s:
    // 0 + 25 − 150 = −125 → 2.5 s. Charged at T0 it would be −150 → 3 s.
    assert_eq!(c.now_ns() - T0, 3 * SEC);
    let mut names = vec![];
    child.visit(&mut |t| names.push(t.count()));
    assert_eq!(names, vec![150, 200]);
}

#[test]
fn array_charges_every_member_and_waits_for_each() {
    let c = clock();
    let a: ThrottlePtr = Arc::new(throttler(100, &c));
    let b: ThrottlePtr = Arc::new(throttler(200, &c));
    let arr = ThrottlerArray::new(vec![a.clone(), b.clone()]);
    assert!(!arr.throttle(100, UNLIMITED_BLOCK).unwrap());
    assert!(arr.throttle(200, UNLIMITED_BLOCK).unwrap());
    // a: −200 at 100/s → 2 s. b at T0+2 s: min(200, 100 + 400) − 200 = 0 → no wait.
    assert_eq!(c.now_ns() - T0, 2 * SEC);
    let mut counts = vec![];
    arr.visit(&mut |t| counts.push(t.count()));
    assert_eq!(counts, vec![300, 300]);
}

#[test]
fn add_throttler_combines_like_clickhouse() {
    let c = clock();
    let mut slot: Option<ThrottlePtr> = None;
    add_throttler(&mut slot, None);
    assert!(slot.is_none());
    add_throttler(&mut slot, Some(Arc::new(throttler(10, &c))));
    let mut n = 0;
    slot.as_ref().unwrap().visit(&mut |_| n += 1);
    assert_eq!(n, 1, "an empty slot takes the new throttler as is");
    add_throttler(&mut slot, Some(Arc::new(throttler(20, &c))));
    let mut rates = vec![];
    slot.as_ref()
        .unwrap()
        .visit(&mut |t| rates.push(t.max_speed()));
    assert_eq!(rates, vec![10, 20], "both combined in an array");
    add_throttler(&mut slot, None);
    let mut n = 0;
    slot.as_ref().unwrap().visit(&mut |_| n += 1);
    assert_eq!(n, 2, "adding nothing changes nothing");
}

#[test]
fn page_cache_reads_skip_block_device_throttlers_only() {
    let c = clock();
    let server: ThrottlePtr = Arc::new(throttler(1_000, &c));
    let disk = Throttler::builder(100)
        .clock(c.clone())
        .parent(server.clone())
        .limits_block_device_bandwidth(true)
        .build()
        .unwrap();
    assert!(disk.ignores_page_cache_reads());
    assert!(!disk.throttle_page_cache_read(80, UNLIMITED_BLOCK).unwrap());
    assert_eq!(
        disk.count(),
        0,
        "the block-device throttler does not charge it"
    );
    assert_eq!(disk.counters().page_cache_amount, 80);
    let mut counts = vec![];
    disk.visit(&mut |t| counts.push(t.count()));
    assert_eq!(counts, vec![0, 80], "its parent does");
    // A plain throttler charges page-cache reads as usual.
    let plain = throttler(100, &c);
    plain.throttle_page_cache_read(30, UNLIMITED_BLOCK).unwrap();
    assert_eq!(plain.count(), 30);
    assert!(!plain.ignores_page_cache_reads());
    // An unlimited block-device throttler does not ask for detection...
    let unlimited_disk = Throttler::builder(0)
        .clock(c.clone())
        .limits_block_device_bandwidth(true)
        .build()
        .unwrap();
    assert!(!unlimited_disk.ignores_page_cache_reads());
    // ...but a child of a limited one does.
    let disk: ThrottlePtr = Arc::new(disk);
    let query = Throttler::builder(10)
        .clock(c.clone())
        .parent(disk)
        .build()
        .unwrap();
    assert!(query.ignores_page_cache_reads());
}

#[test]
fn a_clock_stepping_back_is_clamped() {
    let c = clock();
    let t = throttler(100, &c);
    t.throttle(100, Duration::ZERO).unwrap();
    c.advance(SEC / 2);
    assert_eq!(tokens(&t), tok(50));
    c.set_ns(T0 - 10 * SEC); // NTP-style step back by 10.5 s
    assert_eq!(
        tokens(&t),
        tok(50),
        "a step back is no time passing, never a negative refill"
    );
    assert!(!t.throttle(50, UNLIMITED_BLOCK).unwrap());
    assert_eq!(tokens(&t), 0);
    c.set_ns(T0 + SEC / 2 + SEC / 10);
    assert_eq!(tokens(&t), tok(10), "time resumes from the clamped reading");
}

#[test]
fn set_max_speed_mid_stream_keeps_the_bucket() {
    let c = clock();
    let t = throttler(100, &c);
    t.throttle(60, UNLIMITED_BLOCK).unwrap();
    t.set_max_speed(1_000).unwrap();
    assert_eq!(tokens(&t), tok(40), "the tokens survive the change");
    assert!(t.throttle(1_040, UNLIMITED_BLOCK).unwrap());
    assert_eq!(
        c.now_ns() - T0,
        SEC,
        "1,000 tokens of debt at the new 1,000/s"
    );
    t.set_max_speed(0).unwrap();
    assert!(
        !t.throttle(1 << 40, UNLIMITED_BLOCK).unwrap(),
        "unlimited now"
    );
    assert_eq!(t.max_speed(), 0);
}

#[test]
fn counters_record_waits_and_blocking() {
    let c = clock();
    let t = throttler(1_000, &c);
    t.throttle(1_000, UNLIMITED_BLOCK).unwrap();
    t.throttle(500, UNLIMITED_BLOCK).unwrap();
    t.throttle(250, UNLIMITED_BLOCK).unwrap();
    let k = t.counters();
    assert_eq!(k.amount, 1_750);
    assert_eq!(k.waits, 2);
    assert_eq!(k.wait_us, 750_000);
    assert_eq!(k.block_count, 0, "nobody is blocked now");
    assert_eq!(k.max_speed, 1_000);
}

#[test]
fn huge_values_are_typed_errors_never_wraps() {
    let c = clock();
    let err = Throttler::builder(u64::MAX)
        .clock(c.clone())
        .build()
        .unwrap_err();
    assert!(
        matches!(err, ThrottleError::RateTooLarge { rate: u64::MAX, .. }),
        "{err}"
    );
    let err = Throttler::builder(1 << 40)
        .clock(c.clone())
        .burst(Duration::from_secs(1 << 32))
        .build()
        .unwrap_err();
    assert!(matches!(err, ThrottleError::BurstTooLarge { .. }), "{err}");
    // A u64::MAX charge at 1 token/s is exact (2^64 s of debt, no wrap)...
    let t = throttler(1, &c);
    t.throttle(u64::MAX, Duration::ZERO).unwrap();
    assert_eq!(tokens(&t), tok(1) - tok(u64::MAX as i128));
    // ...and so is the next one: the lifetime count saturates, the bucket
    // stays exact (debt 2^65 tokens, far below 2^100 nano-tokens)...
    assert!(!t.throttle(u64::MAX, Duration::ZERO).unwrap());
    assert_eq!(tokens(&t), tok(1) - 2 * tok(u64::MAX as i128));
    assert_eq!(t.count(), u64::MAX);
    // ...until the debt itself leaves the exact range: the 69th such charge
    // (69·(2^64−1)·10^9 > 2^100) is refused, and it charges nothing.
    for _ in 2..68 {
        t.throttle(u64::MAX, Duration::ZERO).unwrap();
    }
    let before = tokens(&t);
    assert_eq!(before, tok(1) - 68 * tok(u64::MAX as i128));
    let e = t.throttle(u64::MAX, Duration::ZERO).unwrap_err();
    assert!(matches!(e, ThrottleError::DebtOverflow { .. }), "{e}");
    assert_eq!(tokens(&t), before);
    assert_eq!(t.count(), u64::MAX);
}

#[test]
fn the_lifetime_count_saturates_and_never_fails_an_unlimited_charge() {
    let c = clock();
    // Unlimited, no lifetime limit (ClickHouse's default throttlers): the
    // count is a statistic, and a statistic never fails an IO.
    let t = throttler(0, &c);
    t.throttle(u64::MAX - 5, UNLIMITED_BLOCK).unwrap();
    assert_eq!(t.throttle(10, UNLIMITED_BLOCK), Ok(false), "past 2^64");
    assert_eq!(t.count(), u64::MAX);
    assert_eq!(t.throttle(u64::MAX, UNLIMITED_BLOCK), Ok(false));
    let r = t
        .reserve(u64::MAX, UNLIMITED_BLOCK, 0, Source::Device)
        .unwrap();
    assert_eq!((r.delay_ns, r.blocked), (0, false));
    assert_eq!(t.count(), u64::MAX);
    assert_eq!(t.counters().amount, u64::MAX);
    assert_eq!(c.now_ns(), T0, "nothing waited");

    // With a lifetime limit a saturated count has passed the limit (no
    // limit lies above u64::MAX), even `limit = u64::MAX`, which
    // `count > limit` alone would miss: the typed error, tokens charged.
    let t = Throttler::builder(0)
        .clock(c.clone())
        .name("all")
        .limit(u64::MAX, "Everything.")
        .build()
        .unwrap();
    t.throttle(u64::MAX - 5, UNLIMITED_BLOCK).unwrap();
    assert_eq!(
        t.throttle(10, UNLIMITED_BLOCK),
        Err(ThrottleError::LimitExceeded {
            name: "all".into(),
            limit: u64::MAX,
            count: u64::MAX,
            message: "Everything.".into(),
        })
    );
    assert_eq!(t.count(), u64::MAX);
}

#[test]
fn reserve_books_the_whole_chain_without_waiting() {
    let c = clock();
    let server: ThrottlePtr = Arc::new(throttler(50, &c));
    let query = Throttler::builder(100)
        .clock(c.clone())
        .parent(server.clone())
        .build()
        .unwrap();
    server.throttle(50, Duration::ZERO).unwrap();
    let r = query
        .reserve(150, UNLIMITED_BLOCK, 0, Source::Device)
        .unwrap();
    assert!(r.blocked);
    assert_eq!(
        r.delay_ns,
        3 * SEC,
        "the same schedule as the blocking chain"
    );
    assert_eq!(c.now_ns(), T0, "nothing waited");
    // Page-cache reservation skips a block-device level but not its parent.
    let disk = Throttler::builder(10)
        .clock(c.clone())
        .parent(server)
        .limits_block_device_bandwidth(true)
        .build()
        .unwrap();
    let r = disk
        .reserve(5, UNLIMITED_BLOCK, 0, Source::PageCache)
        .unwrap();
    assert_eq!(disk.count(), 0);
    assert!(r.delay_ns > 0, "the server is in debt");
}

#[test]
fn real_clock_blocking_wait_lasts_at_least_the_deficit() {
    // Lower bound only: 1,000 tokens of debt at 100,000/s is at least 10 ms.
    let t = Throttler::new(100_000).unwrap();
    t.throttle(100_000, Duration::ZERO).unwrap();
    let start = t.clock().now_ns();
    assert!(t.throttle(1_000, UNLIMITED_BLOCK).unwrap());
    let waited = t.clock().now_ns() - start;
    assert!(waited >= 10_000_000 - 20_000, "waited {waited} ns");
}

#[test]
fn concurrent_accounting_equals_the_sum_of_amounts() {
    let t = Arc::new(Throttler::new(1 << 44).unwrap());
    let threads: u64 = 4;
    let per: u64 = 20_000;
    std::thread::scope(|s| {
        for i in 0..threads {
            let t = t.clone();
            s.spawn(move || {
                for j in 0..per {
                    t.throttle(1 + (i * 7 + j) % 4096, Duration::ZERO).unwrap();
                }
            });
        }
    });
    let expected: u64 = (0..threads)
        .flat_map(|i| (0..per).map(move |j| 1 + (i * 7 + j) % 4096))
        .sum();
    assert_eq!(t.count(), expected);
    // The bucket saw exactly the same charges: its debt is what the refill
    // since creation does not cover (never more tokens than burst).
    assert!(t.tokens_nano() <= (1i128 << 44) * NANO_PER_TOKEN);
}

#[test]
fn the_lifetime_count_never_wraps_under_concurrency() {
    // Near u64::MAX, two racing charges that cannot both fit in a u64: with
    // no lifetime limit both land and the count saturates, never seen
    // wrapped; with `limit = u64::MAX` exactly the one that saturates it is
    // refused with the limit error (its tokens charged, as in ClickHouse).
    for _ in 0..200 {
        let t = Arc::new(Throttler::builder(0).build().unwrap());
        t.throttle(u64::MAX - 100, UNLIMITED_BLOCK).unwrap();
        let results = race_two_charges_of_60(&t);
        assert!(results.iter().all(|r| r == &Ok(false)), "{results:?}");
        assert_eq!(t.count(), u64::MAX);

        let t = Arc::new(
            Throttler::builder(0)
                .name("l")
                .limit(u64::MAX, "Limit.")
                .build()
                .unwrap(),
        );
        t.throttle(u64::MAX - 100, UNLIMITED_BLOCK).unwrap();
        let results = race_two_charges_of_60(&t);
        let refused: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(
            matches!(
                refused[..],
                [ThrottleError::LimitExceeded {
                    count: u64::MAX,
                    ..
                }]
            ),
            "{results:?}"
        );
        assert_eq!(t.count(), u64::MAX);
    }
}

fn race_two_charges_of_60(t: &Arc<Throttler>) -> Vec<Result<bool, ThrottleError>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let t = t.clone();
                s.spawn(move || t.throttle(60, UNLIMITED_BLOCK))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn operations_limit_waits_for_the_later_of_bytes_and_operations() {
    let c = clock();
    let t = Throttler::builder(64 << 20)
        .max_ops(1000)
        .burst(Duration::ZERO)
        .clock(c.clone())
        .build()
        .unwrap();
    assert_eq!(t.max_ops(), 1000);
    // 4 KiB at 64 MiB/s is 61 µs; one operation at 1000/s is 1 ms.
    for _ in 0..100 {
        assert!(t.throttle(4096, UNLIMITED_BLOCK).unwrap());
    }
    assert_eq!(
        c.now_ns() - T0,
        100 * SEC / 1000,
        "the operations limit binds"
    );
    // 1 MiB at 64 MiB/s is 15.625 ms: now the bytes bind.
    let before = c.now_ns();
    t.throttle(1 << 20, UNLIMITED_BLOCK).unwrap();
    assert_eq!(c.now_ns() - before, 15_625_000);
    assert_eq!(
        t.count(),
        100 * 4096 + (1 << 20),
        "bytes are counted, not ops"
    );
    // Without an operations limit, small reads only pay their bytes.
    let c2 = clock();
    let plain = Throttler::builder(64 << 20)
        .burst(Duration::ZERO)
        .clock(c2.clone())
        .build()
        .unwrap();
    plain.throttle(4096, UNLIMITED_BLOCK).unwrap();
    assert_eq!(c2.now_ns() - T0, 61_036, "ceil(4096 / 64 MiB/s)");
}

#[test]
fn operations_limit_has_a_burst_and_changes_at_run_time() {
    let c = clock();
    let t = Throttler::builder(0)
        .max_ops(10)
        .clock(c.clone())
        .build()
        .unwrap();
    for _ in 0..10 {
        assert!(
            !t.throttle(1, UNLIMITED_BLOCK).unwrap(),
            "one second of ops"
        );
    }
    assert!(t.throttle(1, UNLIMITED_BLOCK).unwrap());
    assert_eq!(c.now_ns() - T0, SEC / 10);
    t.set_max_ops(0).unwrap();
    assert!(!t.throttle(1, UNLIMITED_BLOCK).unwrap(), "0 = unlimited");
    let plain = throttler(10, &c);
    assert_eq!(
        plain.set_max_ops(5).unwrap_err(),
        ThrottleError::NoOpsLimit {
            name: "t".into(),
            ops: 5
        }
    );
    plain.set_max_ops(0).unwrap();
}

/// An attachment is one per type and per throttler, created on first use.
#[test]
fn attachments_are_one_per_type_and_throttler() {
    use std::sync::atomic::{AtomicU64, Ordering};
    #[derive(Default)]
    struct Mine(AtomicU64);
    let a = Throttler::new(1 << 20).unwrap();
    let b = Throttler::new(1 << 20).unwrap();
    assert!(
        a.attachment_if_any::<Mine>().is_none(),
        "none before first use"
    );
    a.attachment::<Mine>().0.store(7, Ordering::Relaxed);
    assert_eq!(
        a.attachment::<Mine>().0.load(Ordering::Relaxed),
        7,
        "the same one"
    );
    assert_eq!(
        a.attachment_if_any::<Mine>()
            .unwrap()
            .0
            .load(Ordering::Relaxed),
        7
    );
    assert_eq!(
        b.attachment::<Mine>().0.load(Ordering::Relaxed),
        0,
        "another throttler has its own"
    );
    assert_eq!(
        *a.attachment::<u32>(),
        0,
        "another type is another attachment"
    );
}
