//! Workloads (a) and (b) and their keys: the rounds of each mode, the hog
//! in the workload's cgroup and in one of its own.

use super::*;

/// (a): the CPU-bound scans and short queries, every mode in each of
/// [`A_ROUNDS`] rounds, and their keys.
pub(crate) fn workload_a(bpf: &SlotringBpf, cores: usize, report: &mut Report) {
    // (a) CPU-bound scans + short queries: 3 rounds of 3 s per mode,
    // interleaved, so that other work on the machine meets all modes alike.
    // The static sweep: budgets 1 … 2 × cores − 1 (2 × cores is Static).
    let ceiling = 2 * cores as u64;
    let (mut sa, mut aa, mut hist) = (vec![], vec![], vec![]);
    let mut fixed: Vec<Vec<Phase>> = (1..ceiling).map(|_| Vec::new()).collect();
    let mut yields_a = 0;
    let modes: Vec<Mode> = [Mode::Static, Mode::Adaptive]
        .into_iter()
        .chain((1..ceiling).map(Mode::Fixed))
        .collect();
    for round in 0..A_ROUNDS {
        for &mode in &modes {
            let mut r = cpu_run(bpf, mode, &[A_SECS], |_| {});
            let p = r.phases.pop().expect("one phase");
            match mode {
                Mode::Static => sa.push(p),
                Mode::Fixed(b) => fixed[b as usize - 1].push(p),
                Mode::Adaptive => {
                    eprintln!(
                        "(a) adaptive round {round}, budget/run-queue % per window: {}",
                        trace(&r.history)
                    );
                    // The windows of the measured phase (not the wind-down).
                    let end = r.marks[0];
                    hist.extend(r.history.into_iter().filter(|p| p.t_s <= end));
                    yields_a += r.yields;
                    aa.push(p);
                }
            }
        }
    }
    let (mut sp, mut ap) = (merge(sa), merge(aa));
    let mut sweep: Vec<(u64, Phase)> = (1..).zip(fixed.into_iter().map(merge)).collect();
    let cp_work = sweep[cores - 1].1.work_per_s();
    let cp_cpus = sweep[cores - 1].1.cpus();
    let mut points: Vec<StaticPoint> = sweep
        .iter_mut()
        .map(|(b, p)| StaticPoint::of(*b, p))
        .collect();
    points.push(StaticPoint::of(ceiling, &mut sp));
    put_best_static(report, "cpu", &points, "(a)");
    let (floor_share, floor_p99) = physical_floor(None);
    report.put(
        "floor_runq_share_pct_cpu",
        floor_share,
        "(a) context: one plain CPU-bound thread alone beside the machine's other work, 2 s, /proc schedstat (the least run-queue share any budget >= 1 reaches)",
    );
    report.put(
        "floor_short_p99_ms_cpu",
        floor_p99,
        "(a) context: the short queries alone, no scan, no slotring, 4 s",
    );
    let (sp, ap) = (&mut sp, &mut ap);
    let a_hist = budget_hist(&hist, f64::NEG_INFINITY, f64::INFINITY);
    eprintln!("(a) adaptive, windows at each budget: {a_hist}");
    let note = |w: &str| format!("{w}; {} cores, ceiling {}", cores, 2 * cores);
    let p50s = format!(
        "(a) static, {A_ROUNDS} × {A_SECS} s; p50 {:.2} ms",
        sp.p50()
    );
    let p50a = format!("(a) adaptive; p50 {:.2} ms", ap.p50());
    report.put("static_short_p99_ms_cpu", sp.p99(), &note(&p50s));
    report.put("adapt_short_p99_ms_cpu", ap.p99(), &note(&p50a));
    report.put(
        "static_runq_share_pct_cpu",
        sp.share_pct(),
        "(a) static: run-queue / (run-queue + on-CPU) of running leases",
    );
    report.put("adapt_runq_share_pct_cpu", ap.share_pct(), "(a) adaptive");
    report.put(
        "static_work_per_s_cpu",
        sp.work_per_s(),
        &format!(
            "(a) static: units of CPU work ({UNIT_ITERS} iterations) per s; {}",
            sp.cpus()
        ),
    );
    report.put(
        "adapt_work_per_s_cpu",
        ap.work_per_s(),
        &format!("(a) adaptive; {}", ap.cpus()),
    );
    report.put(
        "cores_work_per_s_cpu",
        cp_work,
        &format!("(a) context: a static budget of {cores} (the cores), no loop; {cp_cpus}"),
    );
    report.put(
        "adapt_budget_mean_cpu",
        budget_mean(&hist, f64::NEG_INFINITY, f64::INFINITY),
        &format!("(a) mean effective budget; windows at each budget: {a_hist}"),
    );
    report.put(
        "adapt_yields_cpu",
        yields_a as f64,
        "(a) slots released by should_yield",
    );
}

/// Where (b)'s hog runs: in a sibling cgroup of its own (`own`), else in
/// the workload's.
pub(crate) fn hog_dir(cg: Option<&Cgroups>, own: bool) -> PathBuf {
    match (cg, own) {
        (Some(c), true) => c.hog.dir.clone(),
        (Some(c), false) => c.work.dir.clone(),
        (None, _) => PathBuf::from("/sys/fs/cgroup/cpu"),
    }
}

/// One run of (b) in `mode`: 3 s without the hog, 6 s with, 3 s without.
pub(crate) fn hog_run(bpf: &SlotringBpf, cores: usize, mode: Mode, dir: &Path) -> CpuRun {
    let events = [3.0, 9.0, 12.0];
    let mut h: Option<Hog> = None;
    cpu_run(bpf, mode, &events, |i| match i {
        0 => h = Some(hog(2 * cores, dir)),
        1 => h = None,
        _ => {}
    })
}

/// (b) with the hog in the workload's cgroup, and its keys.
pub(crate) fn workload_b(
    bpf: &SlotringBpf,
    cores: usize,
    cg: Option<&Cgroups>,
    report: &mut Report,
) {
    // (b) the hog: 3 s without, 6 s with, 3 s without.
    let same = hog_dir(cg, false);
    let mut hs = hog_run(bpf, cores, Mode::Static, &same);
    let mut ha = hog_run(bpf, cores, Mode::Adaptive, &same);
    eprintln!(
        "(b) adaptive, budget/run-queue % per window: {}",
        trace(&ha.history)
    );
    let (sp, ap) = (&mut hs.phases[1], &mut ha.phases[1]);
    let hog_note = format!(
        "(b) during the 6 s of stress-ng --cpu {} in the workload's cgroup",
        2 * cores
    );
    let p50a = format!("(b) adaptive, same cgroup; p50 {:.2} ms", ap.p50());
    let hog_note = format!("{hog_note}; p50 {:.2} ms", sp.p50());
    report.put("static_short_p99_ms_hog", sp.p99(), &hog_note);
    report.put("adapt_short_p99_ms_hog", ap.p99(), &p50a);
    report.put("static_runq_share_pct_hog", sp.share_pct(), "(b) static");
    report.put("adapt_runq_share_pct_hog", ap.share_pct(), "(b) adaptive");
    report.put(
        "static_work_per_s_hog",
        sp.work_per_s(),
        "(b) static, hog in the same cgroup",
    );
    report.put(
        "adapt_work_per_s_hog",
        ap.work_per_s(),
        "(b) adaptive, hog in the same cgroup",
    );
    let (m0, m1, m2) = (ha.marks[0], ha.marks[1], ha.marks[2]);
    let (s_on, s_off) = (settle(&ha.history, m0, m1), settle(&ha.history, m1, m2));
    report.put(
        "adapt_settle_s",
        s_on.max(s_off),
        &format!("(b) after the hog starts {s_on:.2} s, after it stops {s_off:.2} s (to the phase's final level, then within one slot of it; 100 ms windows)"),
    );
    // The physical floor of (b) in the same cgroup, without slotring.
    let (floor_share, floor_p99) = physical_floor(Some((2 * cores, &same)));
    report.put(
        "floor_runq_share_pct_hog",
        floor_share,
        &format!(
            "(b) context: one plain CPU-bound thread beside stress-ng --cpu {} in its cgroup, 2 s, /proc schedstat (the least any budget >= 1 can reach; per-thread CFS: {:.0}% expected)",
            2 * cores,
            100.0 * (1.0 - cores as f64 / (2 * cores + 1) as f64)
        ),
    );
    report.put(
        "floor_short_p99_ms_hog",
        floor_p99,
        "(b) context: the short queries alone beside the same hog, no scan, no slotring, 4 s (the best p99 of a budget of 0)",
    );
    report.put(
        "adapt_budget_mean_hog",
        budget_mean(&ha.history, m0, m1),
        "(b) mean budget during the hog",
    );
    report.put(
        "adapt_yields_hog",
        ha.yields as f64,
        "(b) over the whole 12 s",
    );
}

/// (b) with the hog in a sibling cgroup of its own, and its keys.
pub(crate) fn workload_b_own_cgroup(
    bpf: &SlotringBpf,
    cores: usize,
    cg: &Cgroups,
    report: &mut Report,
) {
    let own = hog_dir(Some(cg), true);
    let mut os = hog_run(bpf, cores, Mode::Static, &own);
    let mut oa = hog_run(bpf, cores, Mode::Adaptive, &own);
    let (sp, ap) = (&mut os.phases[1], &mut oa.phases[1]);
    report.put(
        "static_work_per_s_hog_own_cgroup",
        sp.work_per_s(),
        "(b) static, hog in a sibling cgroup of equal weight",
    );
    report.put(
        "adapt_work_per_s_hog_own_cgroup",
        ap.work_per_s(),
        "(b) adaptive, hog in a sibling cgroup",
    );
    report.put(
        "static_short_p99_ms_hog_own_cgroup",
        sp.p99(),
        "(b) static, own cgroup",
    );
    report.put(
        "adapt_short_p99_ms_hog_own_cgroup",
        ap.p99(),
        "(b) adaptive, own cgroup",
    );
    report.put(
        "static_runq_share_pct_hog_own_cgroup",
        sp.share_pct(),
        "(b) static, own cgroup",
    );
    report.put(
        "adapt_runq_share_pct_hog_own_cgroup",
        ap.share_pct(),
        "(b) adaptive, own cgroup",
    );
}
