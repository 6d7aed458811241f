// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * slotring.bpf.c — kernel-side proof that a parked lease costs nothing.
 *
 * sched_switch / sched_wakeup / sched_wakeup_new are attached as tp_btf
 * programs (direct BTF field reads); where tp_btf cannot load, the loader
 * picks the raw_tp twins below (the same code with CO-RE probe reads).
 *
 * Per registered thread (tid -> index, filled once per thread by userspace)
 * we account on-CPU ns, run-queue ns, switch-outs and preemptions, split by
 * lease state. The lease state and a per-state wall clock live in the
 * mmapable `lease` array, written by the thread itself with plain atomic
 * stores (no syscall per park). Time is taken from the kernel's own per-task
 * counters (se.sum_exec_runtime, sched_info.run_delay, sched_info.pcount),
 * snapshotted at every switch-out, so a sched_switch event that never
 * reaches BPF loses no time; the arrivals BPF did not see are counted.
 *
 * Hot path: one tgid compare (rodata), an array lookup by tid (a hash
 * LOOKUP only on a collision; never an update or delete), plain stores into
 * the thread's own entry.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "slotring.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

_Static_assert((SLOTRING_MAX_THREADS & (SLOTRING_MAX_THREADS - 1)) == 0,
	       "SLOTRING_MAX_THREADS is a power of two (direct-mapped lookup)");

/* Only threads of this process are looked at (0 = every process). */
const volatile __u32 targ_tgid = 0;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLOTRING_MAX_THREADS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct lease_slot);
} lease SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLOTRING_MAX_THREADS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct thread_acct);
} thread_acct SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SLOTRING_MAX_THREADS);
	__type(key, __u32);   /* tid */
	__type(value, __u32); /* index into lease / thread_acct */
} thread_index SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct hist);
} hist_park_cpu SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct hist);
} hist_unpark_rq SEC(".maps");

/* Per-episode segment histograms (one sample per episode that has the
 * segment: every episode has a pre-sleep one, an episode that slept a
 * post-wake one, one that slept twice or more a between-sleeps one). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct hist);
} hist_pre_sleep SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct hist);
} hist_between_sleeps SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct hist);
} hist_post_wake SEC(".maps");

/* The last hot episodes of each thread (index as in lease/thread_acct). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLOTRING_MAX_THREADS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct hot_log);
} hot_episodes SEC(".maps");

/* The per-episode rule, written by userspace at load. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct episode_rule);
} episode_rule SEC(".maps");

/* Stats maps written by userspace through mmap; map name = metric name. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLOTRING_MAX_THROTTLERS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct throttle_stats);
} throttle SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct slots_stats);
} slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct uring_stats);
} uring SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct owner);
} owner SEC(".maps");

/* Keep the stats value types in BTF even though no program touches them. */
struct throttle_stats _throttle_stats_btf = {};
struct slots_stats _slots_stats_btf = {};
struct uring_stats _uring_stats_btf = {};
struct owner _owner_btf = {};

#define P SLOTRING_LEASE_PARKED
#define R SLOTRING_LEASE_RUNNING
#define N SLOTRING_LEASE_NOT_HOLDING

/* Direct BTF read in tp_btf programs, CO-RE probe read in raw_tp ones.
 * `btf` is a compile-time constant in every always-inline caller. */
#define TASK_READ(btf, p, ...) ((btf) ? (p)->__VA_ARGS__ : BPF_CORE_READ(p, __VA_ARGS__))

static __always_inline __u64 log2_u32(__u32 v)
{
	__u32 r, shift;

	r = (v > 0xFFFF) << 4; v >>= r;
	shift = (v > 0xFF) << 3; v >>= shift; r |= shift;
	shift = (v > 0xF) << 2; v >>= shift; r |= shift;
	shift = (v > 0x3) << 1; v >>= shift; r |= shift;
	r |= (v >> 1);
	return r;
}

static __always_inline __u64 log2_u64(__u64 v)
{
	__u32 hi = v >> 32;

	return hi ? log2_u32(hi) + 32 : log2_u32(v);
}

/* Add `n` samples of value `v`. */
static __always_inline void hist_add_n(void *map, __u64 v, __u64 n)
{
	__u32 zero = 0;
	struct hist *h = bpf_map_lookup_elem(map, &zero);
	__u64 slot = v ? log2_u64(v) + 1 : 0;

	if (!h)
		return;
	if (slot >= SLOTRING_HIST_SLOTS)
		slot = SLOTRING_HIST_SLOTS - 1;
	__sync_fetch_and_add(&h->slots[slot], n);
}

static __always_inline void hist_add(void *map, __u64 v)
{
	hist_add_n(map, v, 1);
}

static __always_inline __u64 clamp_state(__u64 s)
{
	return s < SLOTRING_LEASE_STATES ? s : N;
}

/* The current (complete) clock of a slot; see struct lease_slot. */
static __always_inline const struct lease_clock *cur_clock(const struct lease_slot *l)
{
	return &l->clk[l->active & 1];
}

/* Time spent in each lease state up to `now` (see struct lease_clock). */
static __always_inline void lease_clock(const struct lease_clock *c, __u64 st, __u64 now,
					__u64 *n, __u64 *r, __u64 *p)
{
	__u64 since = c->since_ns;
	__u64 open = now > since ? now - since : 0;

	*n = c->state_ns[N] + (st == N ? open : 0);
	*r = c->state_ns[R] + (st == R ? open : 0);
	*p = c->state_ns[P] + (st == P ? open : 0);
}

/*
 * tid -> (lease slot, accounting). Userspace places a thread at index
 * tid % SLOTRING_MAX_THREADS when that index is free, and publishes the tid
 * in the slot last: then an inlined array lookup and one compare find it.
 * Otherwise (collision, or a thread not registered) the hash is consulted;
 * it is only ever looked up here, never updated.
 */
static __always_inline struct thread_acct *lookup(__u32 tid, struct lease_slot **l, __u32 *at)
{
	__u32 i = tid & (SLOTRING_MAX_THREADS - 1);
	__u32 *idx;

	*l = bpf_map_lookup_elem(&lease, &i);
	if (!*l)
		return NULL;
	if ((*l)->tid != tid) {
		idx = bpf_map_lookup_elem(&thread_index, &tid);
		if (!idx)
			return NULL;
		i = *idx;
		*l = bpf_map_lookup_elem(&lease, &i);
		if (!*l)
			return NULL;
	}
	*at = i;
	return bpf_map_lookup_elem(&thread_acct, &i);
}

static __always_inline __u64 min_u64(__u64 a, __u64 b)
{
	return a < b ? a : b;
}

static __always_inline __u64 max_u64(__u64 a, __u64 b)
{
	return a > b ? a : b;
}

/* `ppm` parts per million of `v` (v rounded down to whole microseconds:
 * no overflow for any wait shorter than five hours at 100 %). */
static __always_inline __u64 ppm_of(__u64 v, __u64 ppm)
{
	return v / 1000 * ppm / 1000;
}

/*
 * The end of `n` episodes with the same figures (n > 1 only for episodes
 * that began and ended inside one on-CPU interval, which share it evenly):
 * judge them by the rule, add them to the thread's totals and the
 * histograms, and log them when hot.
 */
static __always_inline void episode_end(struct thread_acct *a, __u32 idx, __u64 now, __u64 pre,
				   __u64 between, __u64 post, __u64 sleeps, __u64 last_sleep,
				   __u64 wait, __u64 n)
{
	__u32 zero = 0;
	const struct episode_rule *r = bpf_map_lookup_elem(&episode_rule, &zero);
	struct hot_log *log;
	struct hot_episode *e;
	__u64 hot = 0, excess = 0, bound;

	if (!a || !n)
		return;
	if (r) {
		if (pre > r->pre_sleep_ns) {
			hot |= SLOTRING_HOT_PRE_SLEEP;
			excess += pre - r->pre_sleep_ns;
		}
		bound = ppm_of(wait, r->between_ppm);
		if (sleeps >= 2 && between > bound) {
			hot |= SLOTRING_HOT_BETWEEN_SLEEPS;
			excess += between - bound;
		}
		bound = r->post_wake_ns + ppm_of(last_sleep, r->post_wake_ppm);
		if (sleeps && post > bound) {
			hot |= SLOTRING_HOT_POST_WAKE;
			excess += post - bound;
		}
	}
	a->episodes += n;
	if (n > 1)
		a->episodes_split += n;
	a->pre_sleep_ns += pre * n;
	a->between_sleeps_ns += between * n;
	a->post_wake_ns += post * n;
	a->pre_sleep_max_ns = max_u64(a->pre_sleep_max_ns, pre);
	a->between_sleeps_max_ns = max_u64(a->between_sleeps_max_ns, between);
	a->post_wake_max_ns = max_u64(a->post_wake_max_ns, post);
	hist_add_n(&hist_park_cpu, pre + between + post, n);
	hist_add_n(&hist_pre_sleep, pre, n);
	if (sleeps >= 2)
		hist_add_n(&hist_between_sleeps, between, n);
	if (sleeps)
		hist_add_n(&hist_post_wake, post, n);
	if (!hot)
		return;
	a->hot_episodes += n;
	a->hot_excess_ns += excess * n;
	if (hot & SLOTRING_HOT_PRE_SLEEP)
		a->hot_pre_sleep += n;
	if (hot & SLOTRING_HOT_BETWEEN_SLEEPS)
		a->hot_between_sleeps += n;
	if (hot & SLOTRING_HOT_POST_WAKE)
		a->hot_post_wake += n;
	log = bpf_map_lookup_elem(&hot_episodes, &idx);
	if (!log)
		return;
	e = &log->ep[log->logged & (SLOTRING_HOT_KEEP - 1)];
	e->end_ns = now;
	e->wait_ns = wait;
	e->pre_sleep_ns = pre;
	e->between_sleeps_ns = between;
	e->post_wake_ns = post;
	e->sleeps = sleeps;
	e->last_sleep_ns = last_sleep;
	e->hot = hot;
	e->count = n;
	log->logged++;
}

/* A new episode whose park is the clock's last change. */
static __always_inline void episode_begin(struct thread_acct *a, const struct lease_clock *c,
					  __u64 cpu)
{
	a->ep_phase = SLOTRING_EP_PRE_SLEEP;
	a->ep_parked_base_ns = c->state_ns[P];
	a->ep_seg_ns = cpu;
	a->ep_pre_sleep_ns = 0;
	a->ep_between_ns = 0;
	a->ep_sleeps = 0;
	a->ep_sleep_ts = 0;
	a->ep_last_sleep_ns = 0;
}

/*
 * Episodes over one on-CPU interval that ends at a switch-out at `now`:
 * `cpu_p` of its on-CPU time and `pp` of its wall time were parked; the
 * lease clock is `c` (state `st`) now and was in_state_ns at switch-in.
 * Parks and unparks happen only while the thread runs, so whatever changed
 * since the last switch event happened inside this interval:
 *   open0  an episode was open at switch-in, open1 one is open now;
 *   dp     parks since; ends = open0 + dp - open1 episodes ended.
 * The episode open now began at the clock's last change (its head is
 * now - since_ns of the interval); the rest of the parked time belongs to
 * the episodes that ended, shared evenly when there are several (the open
 * one's tail and those that began and ended inside the interval, which
 * never slept: all pre-sleep).
 */
static __always_inline void episodes(struct thread_acct *a, __u32 idx,
				     const struct lease_clock *c, __u64 st, __u64 now,
				     __u64 cpu_p, __u64 pp, bool sleep)
{
	__u64 open0 = a->ep_phase != SLOTRING_EP_NONE;
	__u64 open1 = st == P;
	__u64 dp = c->parks - a->ep_seen_parks;
	__u64 ends = open0 + dp - open1;
	__u64 head, head_cpu, rem, rem_cpu, share, share_cpu, n_c, pre, post;

	a->ep_seen_parks = c->parks;
	if ((__s64)ends < 0 || dp > (1ULL << 40)) {
		/* Cannot happen with one writer per slot; start over. */
		if (open1)
			episode_begin(a, c, min_u64(now - c->since_ns, cpu_p));
		else
			a->ep_phase = SLOTRING_EP_NONE;
		goto slept;
	}
	if (!ends) {
		if (open0)
			a->ep_seg_ns += cpu_p;
		else if (open1)
			episode_begin(a, c, cpu_p);
		goto slept;
	}
	head = open1 ? min_u64(now > c->since_ns ? now - c->since_ns : 0, pp) : 0;
	head_cpu = min_u64(head, cpu_p);
	rem = pp - head;
	rem_cpu = cpu_p - head_cpu;
	share = rem / ends;
	share_cpu = rem_cpu / ends;
	n_c = ends - open0;
	if (open0) {
		/* The open episode's tail takes the rounding remainder. */
		a->ep_seg_ns += rem_cpu - share_cpu * n_c;
		pre = a->ep_phase == SLOTRING_EP_SLEPT ? a->ep_pre_sleep_ns : a->ep_seg_ns;
		post = a->ep_phase == SLOTRING_EP_SLEPT ? a->ep_seg_ns : 0;
		episode_end(a, idx, now, pre, a->ep_between_ns, post, a->ep_sleeps,
			    a->ep_last_sleep_ns,
			    a->in_state_ns[P] - a->ep_parked_base_ns + rem - share * n_c, 1);
	}
	if (n_c)
		episode_end(a, idx, now, share_cpu, 0, 0, 0, 0, share, n_c);
	if (open1)
		episode_begin(a, c, head_cpu);
	else
		a->ep_phase = SLOTRING_EP_NONE;
slept:
	if (sleep && a->ep_phase != SLOTRING_EP_NONE) {
		/* A real sleep closes the segment: the first one ends the
		 * pre-sleep segment, a later one a between-sleeps one. */
		if (a->ep_phase == SLOTRING_EP_PRE_SLEEP)
			a->ep_pre_sleep_ns = a->ep_seg_ns;
		else
			a->ep_between_ns += a->ep_seg_ns;
		a->ep_phase = SLOTRING_EP_SLEPT;
		a->ep_seg_ns = 0;
		a->ep_sleeps++;
		a->ep_sleep_ts = now;
		a->parked_sleeps++;
	}
}

static __always_inline void switch_out(struct thread_acct *a, __u32 idx,
				       const struct lease_slot *l, __u64 now, __u64 exec, __u64 rd,
				       __u64 pc, bool runnable, bool sleep)
{
	const struct lease_clock *c = cur_clock(l);
	__u64 st = clamp_state(c->state);
	__u64 cn, cr, cp, d, drd, arrivals, pr, pp, cpu_p, cpu_r, in_state;

	lease_clock(c, st, now, &cn, &cr, &cp);
	if (!a->initialized) {
		a->initialized = 1;
		a->ep_seen_parks = c->parks;
		goto snapshot;
	}

	d = exec - a->snap_exec_ns;
	drd = rd - a->snap_run_delay;
	arrivals = pc - a->snap_pcount;
	/* Wall time per lease state over this on-CPU interval. If the
	 * switch-in was missed, in_state_ns still holds the clock at the last
	 * switch-out: an upper bound, so the split stays conservative. */
	pr = cr - a->in_state_ns[R];
	pp = cp - a->in_state_ns[P];
	/* Parked first (never under-report parked CPU), then running; the
	 * rest of the exact on-CPU delta is time not holding a slot. */
	cpu_p = min_u64(pp, d);
	cpu_r = min_u64(pr, d - cpu_p);
	a->on_cpu_ns[P] += cpu_p;
	a->on_cpu_ns[R] += cpu_r;
	a->on_cpu_ns[N] += d - cpu_p - cpu_r;

	/* The thread cannot change its lease state while it waits on a
	 * run-queue, so the whole wait belongs to the state at switch-in. */
	in_state = clamp_state(a->in_state);
	if (in_state == P)
		a->runq_ns[P] += drd;
	else if (in_state == R)
		a->runq_ns[R] += drd;
	else
		a->runq_ns[N] += drd;

	if (st == P)
		a->switches[P]++;
	else if (st == R)
		a->switches[R]++;
	else
		a->switches[N]++;
	if (runnable) {
		if (st == P)
			a->preemptions[P]++;
		else if (st == R)
			a->preemptions[R]++;
		else
			a->preemptions[N]++;
	}

	if (arrivals > a->ins_since_out)
		a->missed_switch_in += arrivals - a->ins_since_out;

	/* Parked episodes: only when one is open or a park happened, so a
	 * thread that never parks pays two compares. */
	if (a->ep_phase != SLOTRING_EP_NONE || c->parks != a->ep_seen_parks)
		episodes(a, idx, c, st, now, cpu_p, pp, sleep);
	a->events++;

snapshot:
	a->snap_exec_ns = exec;
	a->snap_run_delay = rd;
	a->snap_pcount = pc;
	a->ins_since_out = 0;
	a->on_cpu = 0;
	a->in_ts = 0;
	a->in_state = st;
	a->in_state_ns[N] = cn;
	a->in_state_ns[R] = cr;
	a->in_state_ns[P] = cp;
}

static __always_inline void switch_in(struct thread_acct *a, const struct lease_slot *l,
				      __u64 now)
{
	const struct lease_clock *c = cur_clock(l);
	__u64 st = clamp_state(c->state);
	__u64 cn, cr, cp, lat;

	if (a->on_cpu)
		a->missed_switch_out++;
	a->on_cpu = 1;
	a->ins_since_out++;
	a->in_state = st;
	a->in_ts = now;
	lease_clock(c, st, now, &cn, &cr, &cp);
	a->in_state_ns[N] = cn;
	a->in_state_ns[R] = cr;
	a->in_state_ns[P] = cp;
	if (a->ep_sleep_ts) {
		/* The sleep of the open episode ended at its wake-up (at this
		 * switch-in when the wake-up was not seen). */
		a->ep_last_sleep_ns =
			(a->wake_ts > a->ep_sleep_ts ? a->wake_ts : now) - a->ep_sleep_ts;
		a->ep_sleep_ts = 0;
	}
	if (a->wake_ts) {
		if (st == P && now > a->wake_ts) {
			lat = now - a->wake_ts;
			a->unpark_wakeups++;
			a->unpark_lat_ns += lat;
			if (lat > a->unpark_lat_max_ns)
				a->unpark_lat_max_ns = lat;
			hist_add(&hist_unpark_rq, lat);
		}
		a->wake_ts = 0;
	}
	a->events++;
}

static __always_inline int handle_switch(bool preempt, struct task_struct *prev,
					 struct task_struct *next, unsigned int prev_state, bool btf)
{
	struct lease_slot *l;
	struct thread_acct *a;
	__u64 now = 0;
	__u32 tgid, idx = 0;

	tgid = TASK_READ(btf, prev, tgid);
	if (!targ_tgid || tgid == targ_tgid) {
		a = lookup(TASK_READ(btf, prev, pid), &l, &idx);
		if (a) {
			now = bpf_ktime_get_ns();
			/* Runnable: still on a run-queue (preempted, or yielded).
			 * A real sleep is the kernel's own test for blocking. */
			switch_out(a, idx, l, now, TASK_READ(btf, prev, se.sum_exec_runtime),
				   TASK_READ(btf, prev, sched_info.run_delay),
				   TASK_READ(btf, prev, sched_info.pcount), prev_state == 0,
				   !preempt && prev_state != 0);
		}
	}

	tgid = TASK_READ(btf, next, tgid);
	if (!targ_tgid || tgid == targ_tgid) {
		a = lookup(TASK_READ(btf, next, pid), &l, &idx);
		if (a) {
			if (!now)
				now = bpf_ktime_get_ns();
			if (!a->initialized) {
				/* First sight: baseline the kernel counters. The
				 * coming arrival is not yet in pcount/run_delay. */
				a->initialized = 1;
				a->snap_exec_ns = TASK_READ(btf, next, se.sum_exec_runtime);
				a->snap_run_delay = TASK_READ(btf, next, sched_info.run_delay);
				a->snap_pcount = TASK_READ(btf, next, sched_info.pcount);
				a->ep_seen_parks = cur_clock(l)->parks;
				a->ins_since_out = 0;
				a->on_cpu = 0;
			}
			switch_in(a, l, now);
		}
	}
	return 0;
}

static __always_inline int handle_wakeup(struct task_struct *p, bool btf)
{
	struct lease_slot *l;
	struct thread_acct *a;
	__u64 st;
	__u32 idx;

	if (targ_tgid && TASK_READ(btf, p, tgid) != targ_tgid)
		return 0;
	a = lookup(TASK_READ(btf, p, pid), &l, &idx);
	if (!a)
		return 0;
	st = clamp_state(cur_clock(l)->state);
	if (st == P) {
		a->wakeups[P]++;
		a->wake_ts = bpf_ktime_get_ns();
	} else if (st == R) {
		a->wakeups[R]++;
	} else {
		a->wakeups[N]++;
	}
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(switch_btf, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	return handle_switch(preempt, prev, next, prev_state, true);
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(wakeup_btf, struct task_struct *p)
{
	return handle_wakeup(p, true);
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(wakeup_new_btf, struct task_struct *p)
{
	return handle_wakeup(p, true);
}

SEC("raw_tp/sched_switch")
int BPF_PROG(switch_raw, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	return handle_switch(preempt, prev, next, prev_state, false);
}

SEC("raw_tp/sched_wakeup")
int BPF_PROG(wakeup_raw, struct task_struct *p)
{
	return handle_wakeup(p, false);
}

SEC("raw_tp/sched_wakeup_new")
int BPF_PROG(wakeup_new_raw, struct task_struct *p)
{
	return handle_wakeup(p, false);
}
