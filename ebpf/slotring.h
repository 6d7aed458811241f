/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * slotring.h — the ONLY definition of every struct that crosses the
 * kernel/user boundary. The Rust mirrors in userspace/slotring-bpf/src/abi.rs
 * are checked against the BTF of the compiled slotring.bpf.o by a test
 * (sizes and field offsets), so a change here fails the build until the
 * mirrors follow.
 *
 * Every field is a naturally aligned 64-bit (or char array) value so the
 * layout has no padding and both sides agree without packing pragmas.
 */
#ifndef __SLOTRING_H
#define __SLOTRING_H

/* Registered threads per loaded instance (index space of lease/acct maps);
 * a power of two: a thread sits at tid % SLOTRING_MAX_THREADS when free. */
#define SLOTRING_MAX_THREADS 1024
/* exp2 histogram buckets: bucket i counts values v with 2^(i-1) <= v < 2^i ns
 * (bucket 0 counts v == 0); the last bucket also takes everything larger. */
#define SLOTRING_HIST_SLOTS 40
/* Named throttler entries in the `throttle` stats map. */
#define SLOTRING_MAX_THROTTLERS 64
#define SLOTRING_NAME_LEN 32

/* Lease states: the numeric values of slotring_throttle::LeaseState. */
#define SLOTRING_LEASE_NOT_HOLDING 0
#define SLOTRING_LEASE_RUNNING 1
#define SLOTRING_LEASE_PARKED 2
#define SLOTRING_LEASE_STATES 3

/*
 * A lease clock: the current state, when it began, the total wall time
 * (CLOCK_MONOTONIC ns, the clock of bpf_ktime_get_ns) spent in each state
 * before `since_ns`, and how many parks there were. The time in state s at
 * instant t is state_ns[s] + (state == s ? t - since_ns : 0). The park count
 * lives in the clock so that BPF reads it with the state it belongs to (the
 * clock is double-buffered, see struct lease_slot).
 */
struct lease_clock {
	__u64 state;     /* current SLOTRING_LEASE_* */
	__u64 since_ns;  /* CLOCK_MONOTONIC of the last state change */
	__u64 state_ns[SLOTRING_LEASE_STATES];
	__u64 parks;     /* transitions into PARKED up to since_ns; the
	                  * transitions out of it are parks - (state == PARKED) */
};

/*
 * One registered thread's lease state, written ONLY by that thread (plain
 * atomic stores into the mmapped `lease` map), read by BPF at the thread's
 * own context switches and wake-ups.
 *
 * The clock is double-buffered: a state change fills clk[!active] from
 * clk[active] and then flips `active` with one store, so BPF always reads a
 * complete clock even when the thread was preempted in the middle of an
 * update. BPF evaluates the clock at switch-in and switch-out: the
 * difference is exactly how much of the on-CPU interval was spent in each
 * state, however many transitions happened inside it.
 */
struct lease_slot {
	__u64 tid;       /* owner thread id, stored last at registration;
	                  * 0 = free or exited */
	__u64 active;    /* which clk[] is current (0 or 1) */
	struct lease_clock clk[2];
};

/*
 * Parked episodes. An episode is one park (lease into PARKED) up to its
 * unpark. BPF splits its on-CPU time into three segments:
 *   pre-sleep      from the park to the first real sleep (a switch-out with
 *                  !preempt && prev_state != 0, the kernel's own test for
 *                  blocking); an episode that never slept is all pre-sleep;
 *   between-sleeps on CPU after one wake-up and before the next sleep
 *                  (a poller), summed over the episode;
 *   post-wake      after the last wake-up, until the unpark.
 * A preempted switch-out is not a sleep: the segment goes on across it.
 * At the episode's end BPF judges it with struct episode_rule and, when a
 * segment is over its bound, counts it hot and logs it in `hot_episodes`.
 */
#define SLOTRING_HOT_PRE_SLEEP 1      /* hot bits of struct hot_episode */
#define SLOTRING_HOT_BETWEEN_SLEEPS 2
#define SLOTRING_HOT_POST_WAKE 4
/* Hot episodes kept per thread (newest last); a power of two. */
#define SLOTRING_HOT_KEEP 4
/* Episode phases (thread_acct.ep_phase). */
#define SLOTRING_EP_NONE 0            /* not parked */
#define SLOTRING_EP_PRE_SLEEP 1       /* parked, no real sleep yet */
#define SLOTRING_EP_SLEPT 2           /* parked, after a real sleep */

/*
 * The per-episode rule (the single entry of the `episode_rule` map),
 * written by userspace before any thread registers. Fractions are parts per
 * million. An episode is hot when
 *   pre-sleep      > pre_sleep_ns, or
 *   between-sleeps > between_ppm of the episode's wait, or
 *   post-wake      > post_wake_ns + post_wake_ppm of the sleep before it.
 */
struct episode_rule {
	__u64 pre_sleep_ns;
	__u64 between_ppm;
	__u64 post_wake_ns;
	__u64 post_wake_ppm;
};

/*
 * Per registered thread accounting, written only by BPF (the thread's own
 * switch events are serialized by the scheduler). Totals are split by the
 * lease state in force at the time.
 */
struct thread_acct {
	__u64 tid;
	__u64 on_cpu_ns[SLOTRING_LEASE_STATES];   /* from se.sum_exec_runtime */
	__u64 runq_ns[SLOTRING_LEASE_STATES];     /* from sched_info.run_delay */
	__u64 switches[SLOTRING_LEASE_STATES];    /* switch-outs */
	__u64 preemptions[SLOTRING_LEASE_STATES]; /* switch-outs while runnable */
	__u64 wakeups[SLOTRING_LEASE_STATES];     /* sched_wakeup(_new) */
	__u64 unpark_wakeups;   /* switch-ins after a wake-up while PARKED */
	__u64 unpark_lat_ns;    /* sum of wake-up -> switch-in latency for those */
	__u64 unpark_lat_max_ns;
	__u64 missed_switch_in;  /* arrivals (sched_info.pcount) BPF never saw */
	__u64 missed_switch_out; /* switch-ins while BPF thought it on CPU */
	__u64 events;            /* switch events handled for this thread */
	/* Parked episodes that ended (see above), and their segments. */
	__u64 episodes;
	__u64 episodes_split;    /* ended in one on-CPU interval with another:
	                          * their segments are that interval's even share */
	__u64 parked_sleeps;     /* real sleeps while PARKED */
	__u64 pre_sleep_ns;      /* sums over the episodes */
	__u64 between_sleeps_ns;
	__u64 post_wake_ns;
	__u64 pre_sleep_max_ns;  /* largest of one episode */
	__u64 between_sleeps_max_ns;
	__u64 post_wake_max_ns;
	__u64 hot_episodes;      /* episodes with any segment over its bound */
	__u64 hot_pre_sleep;     /* episodes hot in each segment */
	__u64 hot_between_sleeps;
	__u64 hot_post_wake;
	__u64 hot_excess_ns;     /* on-CPU of hot episodes above their bounds,
	                          * summed: what a thread that spins in some of
	                          * its waits burns beyond the rule */
	/* Snapshots (private to BPF; exported for debugging). */
	__u64 snap_exec_ns;      /* se.sum_exec_runtime at last switch-out */
	__u64 snap_run_delay;    /* sched_info.run_delay at last switch-out */
	__u64 snap_pcount;       /* sched_info.pcount at last switch-out */
	__u64 ins_since_out;     /* switch-ins seen since last switch-out */
	__u64 on_cpu;            /* 1 between a seen switch-in and switch-out */
	__u64 in_state;          /* lease state at switch-in */
	__u64 in_ts;             /* bpf_ktime at switch-in (0 = unknown) */
	__u64 in_state_ns[SLOTRING_LEASE_STATES]; /* lease clock at switch-in */
	__u64 wake_ts;           /* bpf_ktime of the last wake-up while PARKED */
	/* The open episode (private to BPF). */
	__u64 ep_seen_parks;     /* lease_clock.parks accounted so far */
	__u64 ep_phase;          /* SLOTRING_EP_* */
	__u64 ep_parked_base_ns; /* lease clock's parked total at its park */
	__u64 ep_seg_ns;         /* on-CPU in the current segment */
	__u64 ep_pre_sleep_ns;   /* its pre-sleep segment, once it slept */
	__u64 ep_between_ns;     /* its between-sleeps total so far */
	__u64 ep_sleeps;         /* its real sleeps so far */
	__u64 ep_sleep_ts;       /* bpf_ktime of the switch-out of a sleep in
	                          * progress (0 = none) */
	__u64 ep_last_sleep_ns;  /* its last sleep: switch-out to wake-up */
	__u64 initialized;
};

/* One hot episode as logged (values in ns). */
struct hot_episode {
	__u64 end_ns;            /* bpf_ktime of the switch event that ended it */
	__u64 wait_ns;           /* wall time parked */
	__u64 pre_sleep_ns;
	__u64 between_sleeps_ns;
	__u64 post_wake_ns;
	__u64 sleeps;
	__u64 last_sleep_ns;     /* the sleep before the post-wake segment */
	__u64 hot;               /* SLOTRING_HOT_* bits */
	__u64 count;             /* episodes this entry stands for (> 1: several
	                          * ended in one on-CPU interval, an even split) */
};

/* `hot_episodes` map: per thread (the index of lease/thread_acct), the last
 * SLOTRING_HOT_KEEP hot episodes; entry (logged - 1) % KEEP is the newest. */
struct hot_log {
	__u64 logged;
	struct hot_episode ep[SLOTRING_HOT_KEEP];
};

/* A global exp2 histogram (one map entry). */
struct hist {
	__u64 slots[SLOTRING_HIST_SLOTS];
};

/* Global counters of the probes themselves. */
struct probe_totals {
	__u64 switch_events;   /* sched_switch hits past the tgid filter */
	__u64 wakeup_events;   /* sched_wakeup(_new) hits past the tgid filter */
	__u64 unregistered;    /* in the target tgid but not registered */
	__u64 missed_switch_in;
	__u64 missed_switch_out;
};

/* `throttle` map: one entry per named throttler
 * (= slotring_throttle::ThrottleCounters plus a name). */
struct throttle_stats {
	char name[SLOTRING_NAME_LEN];
	__u64 amount;
	__u64 page_cache_amount;
	__u64 wait_us;
	__u64 waits;
	__u64 block_count;
	__u64 max_speed;
};

/* `slots` map (= slotring_slots::SlotsCounters). */
struct slots_stats {
	__u64 slots_granted;
	__u64 slots_delayed;
	__u64 slots_acquired;
	__u64 slots_acquired_non_competing;
	__u64 queries_delayed;
	__u64 wait_us;
	__u64 parks;
	__u64 unparks;
	__u64 unpark_borrows;
	__u64 max_concurrency;
	__u64 cur_concurrency;
	__u64 allocations;
	__u64 waiters;
	__u64 parked;
	__u64 borrowed;
	__u64 budget_effective;
	__u64 yields;
	__u64 waiting_us;
};

/* `uring` map (= slotring_uring::UringCounters). */
struct uring_stats {
	__u64 reads;
	__u64 writes;
	__u64 read_bytes;
	__u64 write_bytes;
	__u64 page_cache_hits;
	__u64 page_cache_bytes;
	__u64 nowait_misses;
	__u64 cachestat_checks;
	__u64 waits_submitted;
	__u64 wait_us;
	__u64 cancellations;
	__u64 resubmits;
	__u64 short_reads;
	__u64 sq_full;
	__u64 cq_overflows;
	__u64 paced_bytes;
	__u64 writeback_submissions;
	__u64 writeback_errors;
	__u64 dirty_high_water_bytes;
	__u64 page_cache_refund_bytes;
	__u64 writeback_cap_waits;
	__u64 writeback_us;
};

/*
 * `owner` map (one entry): the process that loaded and pinned this
 * instance, written once by userspace right after loading. A reader tells
 * a live instance from a stale one (left by kill -9) by comparing
 * start_time with field 22 of /proc/<pid>/stat: a missing process or a
 * different start time (pid reused) means the pins are stale. No program
 * reads it.
 */
struct owner {
	__u64 pid;        /* tgid of the loading process */
	__u64 start_time; /* its start time, clock ticks after boot */
};

#endif /* __SLOTRING_H */
