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
 * A lease clock: the current state, when it began, and the total wall time
 * (CLOCK_MONOTONIC ns, the clock of bpf_ktime_get_ns) spent in each state
 * before `since_ns`. The time in state s at instant t is
 * state_ns[s] + (state == s ? t - since_ns : 0).
 */
struct lease_clock {
	__u64 state;     /* current SLOTRING_LEASE_* */
	__u64 since_ns;  /* CLOCK_MONOTONIC of the last state change */
	__u64 state_ns[SLOTRING_LEASE_STATES];
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
	__u64 parks;     /* transitions into PARKED */
	__u64 unparks;   /* transitions out of PARKED */
	struct lease_clock clk[2];
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
	__u64 park_cpu_ns;       /* on-CPU in the current parked episode */
	__u64 initialized;
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
