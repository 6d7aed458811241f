//! Workloads (a) and (b) and their keys: the rounds of each mode, the hog
//! in the workload's cgroup and in one of its own.

use super::*;

/// (a): the CPU-bound scans and short queries, every mode in each of
/// [`A_ROUNDS`] rounds, and their keys.
pub(crate) fn workload_a(bpf: &SlotringBpf, cores: usize, report: &mut Report) {
    // Every mode once per round, interleaved, so that other work on the
    // machine meets all modes alike. The static sweep: budgets 1 … 2 ×
    // cores − 1 (2 × cores is Static); the floor: no scan.
    let ceiling = 2 * cores as u64;
    let (mut sa, mut aa, mut fa, mut plain, mut hist) = (vec![], vec![], vec![], vec![], vec![]);
    let mut fixed: Vec<Vec<Phase>> = (1..ceiling).map(|_| Vec::new()).collect();
    let mut yields_a = 0;
    let modes: Vec<Mode> = [Mode::Static, Mode::Adaptive, Mode::Floor]
        .into_iter()
        .chain((1..ceiling).map(Mode::Fixed))
        .collect();
    for round in 0..A_ROUNDS {
        for &mode in &modes {
            if mode == Mode::Floor {
                let (p, rq) = floor_run(bpf, None);
                fa.push(p);
                plain.push(rq);
                continue;
            }
            let mut r = cpu_run(bpf, mode, &[A_SECS], |_| {});
            let p = r.phases.pop().expect("one phase");
            match mode {
                Mode::Static => sa.push(p),
                Mode::Fixed(b) => fixed[b as usize - 1].push(p),
                Mode::Floor => unreachable!("handled above"),
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
    let (rs, ra, rf) = (
        round_p99s(&mut sa),
        round_p99s(&mut aa),
        round_p99s(&mut fa),
    );
    let (mut sp, mut ap, mut fp) = (merge(sa), merge(aa), merge(fa));
    let mut sweep: Vec<(u64, Phase)> = (1..).zip(fixed.into_iter().map(merge)).collect();
    let cp_work = sweep[cores - 1].1.work_per_s();
    let cp_cpus = sweep[cores - 1].1.cpus();
    let mut points: Vec<StaticPoint> = sweep
        .iter_mut()
        .map(|(b, p)| StaticPoint::of(*b, p))
        .collect();
    points.push(StaticPoint::of(ceiling, &mut sp));
    put_best_static(report, "cpu", &points, "(a)");
    report.put(
        "floor_runq_share_pct_cpu",
        share_of(&plain),
        &format!("(a) floor: one plain CPU-bound thread (no slotring) beside the same load (the short queries, no scan), {A_ROUNDS} × {FLOOR_PLAIN_S} s, /proc schedstat: the least run-queue share one running lease can see"),
    );
    report.put(
        "floor_short_p99_ms_cpu",
        fp.p99(),
        &format!(
            "(a) floor: the short queries alone on their slots, no scan, {A_ROUNDS} × {FLOOR_SHORT_S} s after a {FLOOR_LEAD_S} s warm-up, pooled; p50 {:.2} ms; p99 of each round {rf}",
            fp.p50()
        ),
    );
    let (sp, ap) = (&mut sp, &mut ap);
    let a_hist = budget_hist(&hist, f64::NEG_INFINITY, f64::INFINITY);
    eprintln!("(a) adaptive, windows at each budget: {a_hist}");
    let note = |w: &str| format!("{w}; {} cores, ceiling {}", cores, 2 * cores);
    let p50s = format!(
        "(a) static, {A_ROUNDS} × {A_SECS} s pooled; p50 {:.2} ms; p99 of each round {rs}",
        sp.p50()
    );
    let p50a = format!(
        "(a) adaptive; p50 {:.2} ms; p99 of each round {ra}",
        ap.p50()
    );
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

/// An adaptive run's settling times: `(round, after the hog starts, after
/// it stops)`, s.
pub(crate) type Settle = (usize, f64, f64);

/// Where (b)'s hog runs: in a sibling cgroup of its own (`own`), else in
/// the workload's.
pub(crate) fn hog_dir(cg: Option<&Cgroups>, own: bool) -> PathBuf {
    match (cg, own) {
        (Some(c), true) => c.hog.dir.clone(),
        (Some(c), false) => c.work.dir.clone(),
        (None, _) => PathBuf::from("/sys/fs/cgroup/cpu"),
    }
}

/// One run of (b) in `mode`: [`B_EVENTS`] (without the hog, with it for
/// 6 s, without it again). A budget of the sweep (`Fixed`) needs no settle
/// time: its run is 0.5 s, then the hog's 6 s.
pub(crate) fn hog_run(bpf: &SlotringBpf, cores: usize, mode: Mode, dir: &Path) -> CpuRun {
    let events: &[f64] = match mode {
        Mode::Fixed(_) => &[0.5, 6.5],
        _ => &B_EVENTS,
    };
    let mut h: Option<Hog> = None;
    cpu_run(bpf, mode, events, |i| match i {
        0 => h = Some(hog(2 * cores, dir)),
        1 => h = None,
        _ => {}
    })
}

/// (b) with the hog in `dir` (the workload's own cgroup: `same_cgroup`), keys suffixed `_<w>`: static, adaptive and
/// the floor in each of [`B_ROUNDS`] interleaved rounds, the sweep of
/// static budgets in the first. The adaptive runs' settling times after
/// the hog starts and after it stops: `(round, on, off)`.
pub(crate) fn workload_b(
    bpf: &SlotringBpf,
    cores: usize,
    dir: &Path,
    same_cgroup: bool,
    w: &str,
    what: &str,
    report: &mut Report,
) -> Vec<Settle> {
    let ceiling = 2 * cores as u64;
    let (mut sa, mut aa, mut fa, mut plain) = (vec![], vec![], vec![], vec![]);
    let (mut settles, mut means, mut yields) = (vec![], vec![], 0);
    let mut points = vec![];
    for round in 0..B_ROUNDS {
        let mut s = hog_run(bpf, cores, Mode::Static, dir);
        sa.push(s.phases.swap_remove(1));
        let mut a = hog_run(bpf, cores, Mode::Adaptive, dir);
        eprintln!(
            "(b) {what} adaptive round {round}, budget/run-queue % per window: {}",
            trace(&a.history)
        );
        let (m0, m1, m2) = (a.marks[0], a.marks[1], a.marks[2]);
        settles.push((
            round,
            settle(&a.history, m0, m1),
            settle(&a.history, m1, m2),
        ));
        means.push(budget_mean(&a.history, m0, m1));
        yields += a.yields;
        aa.push(a.phases.swap_remove(1));
        let (f, rq) = floor_run(bpf, Some((2 * cores, dir)));
        fa.push(f);
        plain.push(rq);
        if round == 0 {
            for b in 1..ceiling {
                let mut r = hog_run(bpf, cores, Mode::Fixed(b), dir);
                points.push(StaticPoint::of(b, &mut r.phases[1]));
            }
        }
    }
    let (rs, ra, rf) = (
        round_p99s(&mut sa),
        round_p99s(&mut aa),
        round_p99s(&mut fa),
    );
    let (mut sp, mut ap, mut fp) = (merge(sa), merge(aa), merge(fa));
    points.push(StaticPoint::of(ceiling, &mut sp));
    put_best_static(
        report,
        w,
        &points,
        &format!("(b) {what} (the sweep: one round; {ceiling} is static's rounds)"),
    );
    let hog_note = format!(
        "(b) {what}: during the 6 s of stress-ng --cpu {} of each of {B_ROUNDS} rounds, pooled",
        2 * cores
    );
    report.put(
        &format!("static_short_p99_ms_{w}"),
        sp.p99(),
        &format!("{hog_note}; p50 {:.2} ms; p99 of each round {rs}", sp.p50()),
    );
    report.put(
        &format!("adapt_short_p99_ms_{w}"),
        ap.p99(),
        &format!(
            "(b) {what} adaptive; p50 {:.2} ms; p99 of each round {ra}",
            ap.p50()
        ),
    );
    report.put(
        &format!("static_runq_share_pct_{w}"),
        sp.share_pct(),
        &format!("(b) {what} static: run-queue share of running leases"),
    );
    report.put(
        &format!("adapt_runq_share_pct_{w}"),
        ap.share_pct(),
        &format!("(b) {what} adaptive"),
    );
    report.put(
        &format!("static_work_per_s_{w}"),
        sp.work_per_s(),
        &format!("(b) {what} static: units of work per s"),
    );
    report.put(
        &format!("adapt_work_per_s_{w}"),
        ap.work_per_s(),
        &format!("(b) {what} adaptive"),
    );
    // Per-thread CFS in one cgroup: the plain thread is one of 2 × cores + 1
    // on `cores` CPUs; in a cgroup of its own it has its cgroup's share.
    let expected = if same_cgroup {
        format!(
            "; per-thread CFS in one cgroup: {:.0}% expected",
            100.0 * (1.0 - cores as f64 / (2 * cores + 1) as f64)
        )
    } else {
        String::new()
    };
    report.put(
        &format!("floor_runq_share_pct_{w}"),
        share_of(&plain),
        &format!(
            "(b) {what} floor: one plain CPU-bound thread (no slotring) beside the same hog and the short queries, {B_ROUNDS} × {FLOOR_PLAIN_S} s, /proc schedstat{expected}"
        ),
    );
    report.put(
        &format!("floor_short_p99_ms_{w}"),
        fp.p99(),
        &format!(
            "(b) {what} floor: the short queries alone on their slots beside the same hog, no scan, {B_ROUNDS} × {FLOOR_SHORT_S} s, pooled; p50 {:.2} ms; p99 of each round {rf}",
            fp.p50()
        ),
    );
    report.put(
        &format!("adapt_budget_mean_{w}"),
        means.iter().sum::<f64>() / means.len() as f64,
        &format!("(b) {what}: mean budget during the hog, the mean of the rounds"),
    );
    report.put(
        &format!("adapt_yields_{w}"),
        yields as f64,
        &format!("(b) {what}: slots released by should_yield, every round's whole run"),
    );
    settles
}

/// `adapt_settle_s`: the longest settling time of every adaptive run of
/// (b), after the hog starts or stops; `runs` are `(which, settles)`.
pub(crate) fn put_settle(report: &mut Report, runs: &[(&str, Vec<Settle>)]) {
    let mut worst = 0.0_f64;
    let mut each = vec![];
    for (w, s) in runs {
        for &(round, on, off) in s {
            worst = worst.max(on).max(off);
            each.push(format!("{w} round {round}: {on:.2} s / {off:.2} s"));
        }
    }
    report.put(
        "adapt_settle_s",
        worst,
        &format!(
            "(b) the longest of every adaptive run's settling times after the hog starts / after it stops (to the phase's final level, then within one slot of it; 100 ms windows): {}",
            each.join("; ")
        ),
    );
}

/// Each round's short-query p99, for the log.
fn round_p99s(v: &mut [Phase]) -> String {
    v.iter_mut()
        .map(|p| format!("{:.2}", p.p99()))
        .collect::<Vec<_>>()
        .join(", ")
}
