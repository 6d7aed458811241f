//! The suite's JSON keys, from its runs ([`Runs`]): every key beside its
//! goal or its baseline, in the order the table prints them.

use slotring_benchkit::{Report, median};

use crate::fio::FioRun;
use crate::ours::Run;
use crate::suite::Runs;
use crate::{GIB, PIECE, ROUNDS};

/// Every key of `m`, and the neighbours' share `noise`.
pub(crate) fn put(report: &mut Report, m: &Runs, noise: f64) {
    ceilings_and_rates(report, m);
    cpu(report, m);
    fio_direct(report, m);
    pacing_vs_fio(report, m);
    shared(report, m);
    context(report, m, noise);
    stall(report, m);
}

/// Over every run of every writer count.
fn worst(rs: &[Vec<Run>], f: fn(&Run) -> f64) -> f64 {
    rs.iter().flatten().map(f).fold(f64::MIN, f64::max)
}

/// The median over the rounds of each writer count (`f` gets the run's
/// index over every writer count's rounds), the worst of those: the
/// highest with `hi`, else the lowest.
fn median_worst(rs: &[Vec<Run>], f: &dyn Fn(usize, &Run) -> f64, hi: bool) -> f64 {
    let meds = rs.iter().enumerate().map(|(w, runs)| {
        let mut v: Vec<f64> = runs
            .iter()
            .enumerate()
            .map(|(i, r)| f(w * ROUNDS + i, r))
            .collect();
        median(&mut v)
    });
    if hi {
        meds.fold(f64::MIN, f64::max)
    } else {
        meds.fold(f64::MAX, f64::min)
    }
}

/// The worst of fio's runs by `f` (NaN if there is none).
fn fio_worst(rs: &[FioRun], f: fn(&FioRun) -> f64) -> f64 {
    rs.iter().map(f).fold(f64::NAN, f64::max)
}

/// What pacing adds per piece: paced minus unpaced CPU s per GiB, over the
/// pieces in a GiB, in microseconds.
fn per_piece_us(paced: f64, unpaced: f64) -> f64 {
    (paced - unpaced) / (GIB / PIECE) as f64 * 1e6
}

/// The median of `v`, NaN if it is empty.
fn or_nan(v: &mut [f64]) -> f64 {
    if v.is_empty() { f64::NAN } else { median(v) }
}

impl Runs {
    /// `f` of the paced run `r` over `f` of the unpaced run of the same
    /// round (`i` over every writer count's rounds).
    fn paired(&self, i: usize, r: &Run, f: fn(&Run) -> f64) -> f64 {
        f(r) / f(self.unpaced(i))
    }

    /// The unpaced run of round `i` over every writer count's rounds.
    fn unpaced(&self, i: usize) -> &Run {
        self.pagecache
            .iter()
            .flatten()
            .nth(i)
            .expect("a pair per round")
    }

    /// The median of `f` over fio's buffered rounds (NaN if none ran).
    fn fio_med(&self, f: &dyn Fn(&[FioRun; 3]) -> f64) -> f64 {
        let mut v: Vec<f64> = self.fio_rounds.iter().flatten().map(f).collect();
        or_nan(&mut v)
    }

    /// `f` of each round of the async front end's runs.
    fn by_task(&self, f: &dyn Fn(&[Run; 4]) -> f64) -> Vec<f64> {
        self.tasks.iter().map(f).collect()
    }
}

/// Ours: the ceilings (peak, dirty) on every run, the rate and the
/// throughput on the median round.
fn ceilings_and_rates(report: &mut Report, m: &Runs) {
    let Runs {
        ours, pagecache, ..
    } = m;
    report.put(
        "write_disk_peak_ratio",
        worst(ours, |r| r.peak_ratio),
        "peak 100 ms device write rate / 32 MiB/s, paced, worst of every run (1 and 8 writers); goal <= 1.2",
    );
    report.put(
        "write_disk_peak_ratio_pagecache",
        worst(pagecache, |r| r.peak_ratio),
        "same, charged at the page cache (pacing off)",
    );
    report.put(
        "write_disk_rate_error_pct",
        median_worst(ours, &|_, r| r.rate_error_pct, true),
        "|device bytes - limit x time| / (limit x time), run start to last byte on the device, %, median round, worse of 1 and 8 writers; goal <= 1",
    );
    report.put(
        "write_disk_rate_error_pct_worst_run",
        worst(ours, |r| r.rate_error_pct),
        "same, the worst single run (a stall of the shared disk leaves the writers behind)",
    );
    let worst_run = ours
        .iter()
        .flatten()
        .max_by(|a, b| a.rate_error_pct.total_cmp(&b.rate_error_pct));
    report.put(
        "write_device_held_s_worst_run",
        worst_run.map_or(f64::NAN, |r| r.held_s),
        "that run's seconds in 100 ms windows where the device's own mean write latency exceeded what the cap keeps under writeback / limit (Little's law: the device, not the limit, set the pace), or it completed no write",
    );
    report.put(
        "write_throughput_ratio",
        median_worst(ours, &|_, r| r.throughput_ratio, false),
        "writers' achieved rate / limit, median round, worse of 1 and 8; goal >= 0.98",
    );
    // The same two over the time the device allowed: a limit is a ceiling,
    // and the seconds in which the device itself held the writers below it
    // (`device_held_s`) are not the throttler's to make up (making them up
    // is a burst above the limit: write_disk_peak_ratio).
    report.put(
        "write_throughput_ratio_unheld",
        median_worst(ours, &|_, r| r.throughput_ratio_unheld, false),
        "writers' bytes / (their time less the seconds the device held them) / limit, median round, worse of 1 and 8",
    );
    report.put(
        "write_disk_rate_error_pct_unheld",
        median_worst(ours, &|_, r| r.rate_error_pct_unheld, true),
        "as write_disk_rate_error_pct over the run's time less the seconds the device held the writers, median round, worse of 1 and 8",
    );
    report.put(
        "write_dirty_mb_max",
        worst(ours, |r| r.dirty_mb_max),
        "MiB dirty + writeback of the run's files (cachestat, 100 ms), every run; goal <= 48 (1.5 s of the limit)",
    );
    report.put(
        "write_dirty_mb_max_pagecache",
        worst(pagecache, |r| r.dirty_mb_max),
        "same, pacing off",
    );
}

/// Ours: the CPU per GiB, paced and not, on the loop device and on the
/// disk itself.
fn cpu(report: &mut Report, m: &Runs) {
    let Runs {
        ours,
        pagecache,
        on_disk,
        ..
    } = m;
    report.put(
        "write_cpu_s_per_gb",
        median_worst(ours, &|_, r| r.cpu_s_per_gb, true),
        "CPU s per GiB written of the process (io-wq included) and the kernel's worker threads (kworker: the flusher, the loop device), run start until every byte is on the device, paced, median round, worse of 1 and 8",
    );
    report.put(
        "write_cpu_s_per_gb_pagecache",
        median_worst(pagecache, &|_, r| r.cpu_s_per_gb, true),
        "same, pacing off (its writeback is the flusher's, in a kworker)",
    );
    report.put(
        "write_cpu_ratio",
        median_worst(ours, &|i, r| m.paired(i, r, |r| r.cpu_s_per_gb), true),
        "that CPU paced / unpaced of the same round, median round, worse of 1 and 8; goal <= 1.2",
    );
    let disk_worst =
        |f: &dyn Fn(&(Run, Run)) -> f64| on_disk.iter().map(f).fold(f64::MIN, f64::max);
    report.put(
        "write_cpu_s_per_gb_disk",
        disk_worst(&|(o, _)| o.cpu_s_per_gb),
        "CPU s per GiB as write_cpu_s_per_gb, on the disk itself (no loop device), paced, one run per writer count, worse of 1 and 8",
    );
    report.put(
        "write_cpu_s_per_gb_pagecache_disk",
        disk_worst(&|(_, p)| p.cpu_s_per_gb),
        "same, pacing off",
    );
    report.put(
        "write_cpu_ratio_disk",
        disk_worst(&|(o, p)| o.cpu_s_per_gb / p.cpu_s_per_gb),
        "paced / unpaced on the disk itself, worse of 1 and 8 (no loop device doing one direct IO per request on its backing file)",
    );
    report.put(
        "write_process_cpu_s_per_gb",
        median_worst(ours, &|_, r| r.process_cpu_s_per_gb, true),
        "the process's CPU alone (io-wq included: the paced writeback's submission is here), paced, median round, worse of 1 and 8",
    );
    report.put(
        "write_process_cpu_s_per_gb_pagecache",
        median_worst(pagecache, &|_, r| r.process_cpu_s_per_gb, true),
        "same, pacing off (without its writeback, which the flusher does)",
    );
    report.put(
        "write_process_cpu_ratio",
        median_worst(ours, &|i, r| m.paired(i, r, |r| r.process_cpu_s_per_gb), true),
        "process CPU paced / unpaced of the same round, median round, worse of 1 and 8 (the paced side carries its writeback, the unpaced side does not)",
    );
    report.put(
        "write_machine_cpu_s_per_gb",
        median_worst(ours, &|_, r| r.machine_cpu_s_per_gb, true),
        "the machine's busy CPU s per GiB (/proc/stat, neighbours included), run start until every byte is on the device, paced, median round, worse of 1 and 8",
    );
    report.put(
        "write_machine_cpu_s_per_gb_pagecache",
        median_worst(pagecache, &|_, r| r.machine_cpu_s_per_gb, true),
        "same, pacing off (here the kernel flusher's writeback CPU is counted)",
    );
    report.put(
        "write_machine_cpu_ratio",
        median_worst(
            ours,
            &|i, r| m.paired(i, r, |r| r.machine_cpu_s_per_gb),
            true,
        ),
        "machine CPU paced / unpaced of the same round, median round, worse of 1 and 8",
    );
}

/// The baseline: fio `O_DIRECT` at the limit.
fn fio_direct(report: &mut Report, m: &Runs) {
    let Runs {
        fio_direct,
        fio_rounds,
        ..
    } = m;
    report.put(
        "fio_write_disk_peak_ratio",
        fio_worst(fio_direct, |r| r.peak_ratio),
        "baseline: fio --direct=1 --bs=256k --rate=32m (1 job and 8 at 4m each), peak 100 ms device write rate / limit, worst",
    );
    report.put(
        "fio_write_disk_peak_ratio_sfr",
        fio_worst(
            &fio_rounds
                .iter()
                .flatten()
                .map(|r| r[0])
                .collect::<Vec<_>>(),
            |r| r.peak_ratio,
        ),
        "baseline: fio buffered, --sync_file_range=wait_before,write,wait_after:1, 1 job, same",
    );
    report.put(
        "fio_write_disk_rate_error_pct",
        fio_worst(fio_direct, |r| r.rate_error_pct),
        "baseline: fio --direct=1, |device bytes - limit x time| / (limit x time), from its first write on the device (fio's 0.3 s start-up is not its time), %, worst",
    );
    report.put(
        "fio_write_device_held_s",
        fio_worst(fio_direct, |r| r.held_s),
        "baseline: fio --direct=1, seconds the device held it (as write_device_held_s_worst_run, with its jobs' blocks in flight), worst",
    );
    report.put(
        "fio_write_throughput_ratio",
        fio_direct
            .iter()
            .map(|r| r.throughput_ratio)
            .fold(f64::NAN, f64::min),
        "baseline: fio --direct=1, bytes / fio's wall time / limit, worst",
    );
    report.put(
        "fio_write_cpu_s_per_gb",
        fio_worst(fio_direct, |r| r.cpu_s_per_gb),
        "baseline: fio --direct=1, CPU s per GiB of fio and the kernel workers (as ours), worst",
    );
}

/// What pacing costs per piece, ours against fio's own (each paced minus
/// unpaced of the same round; fio's own overhead, its rate loop, is in
/// both of its runs and cancels).
fn pacing_vs_fio(report: &mut Report, m: &Runs) {
    let Runs {
        fio_rounds,
        ours,
        pagecache,
        ..
    } = m;
    report.put(
        "fio_write_cpu_s_per_gb_sfr",
        m.fio_med(&|[s, _, _]| s.cpu_s_per_gb),
        "baseline: fio buffered, sync_file_range (our flags) after each 256 KiB write in fio's thread, CPU s per GiB of fio and the kernel workers, median of the rounds",
    );
    report.put(
        "fio_write_cpu_s_per_gb_buffered",
        m.fio_med(&|[_, b, _]| b.cpu_s_per_gb),
        "baseline: fio buffered without it (the flusher's writeback), same",
    );
    report.put(
        "fio_write_cpu_ratio_sfr",
        m.fio_med(&|[s, b, _]| s.cpu_s_per_gb / b.cpu_s_per_gb),
        "fio's paced / unpaced of the same round, median (its rate loop's own CPU is in both)",
    );
    let fio_piece = m.fio_med(&|[s, b, _]| per_piece_us(s.cpu_s_per_gb, b.cpu_s_per_gb));
    report.put(
        "fio_write_pacing_cpu_us_per_piece",
        fio_piece,
        "what pacing costs the kernel: fio's CPU with sync_file_range minus without, per 256 KiB piece, us, median of the rounds",
    );
    let ours_piece = median_worst(
        ours,
        &|i, r| per_piece_us(r.cpu_s_per_gb, m.unpaced(i).cpu_s_per_gb),
        true,
    );
    report.put(
        "write_pacing_cpu_us_per_piece",
        ours_piece,
        "what pacing costs us: paced minus unpaced CPU of the same round, per 256 KiB piece, us, median round, worse of 1 and 8",
    );
    // Ours (one writer) against fio (one job) round by round; each round's
    // pair is printed: in the machine's expensive memory state (every run
    // 3-5 CPU s per GiB, paced or not) the differences are noise, even
    // negative, and the median says nothing.
    let by_round: Vec<(f64, f64)> = fio_rounds
        .iter()
        .zip(&ours[0])
        .zip(&pagecache[0])
        .filter_map(|((f, o), p)| {
            let [s, b, _] = f.as_ref()?;
            Some((
                per_piece_us(o.cpu_s_per_gb, p.cpu_s_per_gb),
                per_piece_us(s.cpu_s_per_gb, b.cpu_s_per_gb),
            ))
        })
        .collect();
    eprintln!(
        "pacing's CPU per piece by round, us (ours, fio): {:?}",
        by_round
            .iter()
            .map(|&(o, f)| (o.round(), f.round()))
            .collect::<Vec<_>>()
    );
    let mut vs_fio: Vec<f64> = by_round.iter().map(|&(o, f)| o / f).collect();
    report.put(
        "write_pacing_cpu_vs_fio",
        if vs_fio.is_empty() {
            f64::NAN
        } else {
            median(&mut vs_fio)
        },
        "what pacing costs one writer of ours / what it costs fio (one job), per piece, round by round (fio runs beside each round), median; goal <= 1.2; judge it only in the machine's quiet state (write_cpu_s_per_gb_pagecache about 1 or less: in the expensive one the differences are noise) (in place of write_cpu_ratio's: with 256 KiB pieces the kernel's own share alone puts any pacer above 1.2x the unpaced path)",
    );
}

/// The async front end, round by round.
fn shared(report: &mut Report, m: &Runs) {
    let Runs {
        fio_rounds,
        ours,
        pagecache,
        tasks,
        ..
    } = m;
    // The async front end, round by round: against the blocking front end
    // (the whole paced path), its pacing (paced minus its own unpaced run)
    // against fio's as above, and against what a tokio service writes
    // without slotring (`Writer::TokioFs`).
    let mut shared_vs_blocking: Vec<f64> = tasks
        .iter()
        .zip(&ours[0])
        .map(|([s, ..], o)| s.cpu_s_per_gb / o.cpu_s_per_gb)
        .collect();
    let mut shared_unpaced_vs_blocking: Vec<f64> = tasks
        .iter()
        .zip(&pagecache[0])
        .map(|([_, su, ..], p)| su.cpu_s_per_gb / p.cpu_s_per_gb)
        .collect();
    let mut shared_vs_fio: Vec<f64> = fio_rounds
        .iter()
        .zip(tasks.iter())
        .filter_map(|(f, [s, su, ..])| {
            let [sfr, b, _] = f.as_ref()?;
            Some(
                per_piece_us(s.cpu_s_per_gb, su.cpu_s_per_gb)
                    / per_piece_us(sfr.cpu_s_per_gb, b.cpu_s_per_gb),
            )
        })
        .collect();
    let mut shared_pacing_vs_tokio_fs = m.by_task(&|[s, su, t, tu]| {
        per_piece_us(s.cpu_s_per_gb, su.cpu_s_per_gb)
            / per_piece_us(t.cpu_s_per_gb, tu.cpu_s_per_gb)
    });
    eprintln!(
        "the async front end by round, CPU s/GiB (shared paced, unpaced, tokio::fs paced, unpaced): {:?}; \
         shared paced / the blocking front end's {:?}; its pacing / fio's {:?}; / tokio::fs's {:?}",
        tasks
            .iter()
            .map(|r| r
                .each_ref()
                .map(|r| (r.cpu_s_per_gb * 1000.0).round() / 1000.0))
            .collect::<Vec<_>>(),
        shared_vs_blocking,
        shared_vs_fio,
        shared_pacing_vs_tokio_fs
    );
    report.put(
        "write_cpu_s_per_gb_shared",
        or_nan(&mut m.by_task(&|[s, ..]| s.cpu_s_per_gb)),
        "one writer through SharedEngine (a tokio task; paced writes on tokio's blocking pool), paced, CPU s per GiB as write_cpu_s_per_gb, median of the rounds",
    );
    report.put(
        "write_cpu_s_per_gb_shared_pagecache",
        or_nan(&mut m.by_task(&|[_, su, ..]| su.cpu_s_per_gb)),
        "same, pacing off (its writes on the ring, io-wq's)",
    );
    report.put(
        "write_cpu_ratio_shared",
        or_nan(&mut m.by_task(&|[s, su, ..]| s.cpu_s_per_gb / su.cpu_s_per_gb)),
        "SharedEngine paced / unpaced of the same round, median",
    );
    report.put(
        "write_shared_cpu_vs_blocking",
        or_nan(&mut shared_vs_blocking),
        "SharedEngine's paced path / the blocking front end's, CPU per GiB, one writer, round by round, median",
    );
    report.put(
        "write_shared_unpaced_cpu_vs_blocking",
        or_nan(&mut shared_unpaced_vs_blocking),
        "same, pacing off both (SharedEngine's unpaced writes are the ring's: io-wq and a wake-up per request)",
    );
    report.put(
        "write_pacing_cpu_vs_fio_shared",
        or_nan(&mut shared_vs_fio),
        "as write_pacing_cpu_vs_fio for SharedEngine: its paced run minus its own unpaced run of the same round, per piece, / fio's, median; goal <= 1.2, judged in the quiet state only (its own unpaced run, not the blocking front end's, so that the async front end's per-request cost is not put on pacing)",
    );
    report.put(
        "write_disk_peak_ratio_shared",
        m.by_task(&|[s, ..]| s.peak_ratio)
            .into_iter()
            .fold(f64::NAN, f64::max),
        "peak 100 ms device write rate / 32 MiB/s, SharedEngine, worst run; goal <= 1.2",
    );
    report.put(
        "write_throughput_ratio_shared",
        or_nan(&mut m.by_task(&|[s, ..]| s.throughput_ratio)),
        "SharedEngine writer's achieved / limit, median of the rounds; goal >= 0.98",
    );
    report.put(
        "tokio_fs_write_cpu_s_per_gb",
        or_nan(&mut m.by_task(&|[.., t, _]| t.cpu_s_per_gb)),
        "baseline for SharedEngine: one tokio task, tokio::fs + governor per 256 KiB piece + sync_file_range (our flags) on the blocking pool after each piece, CPU s per GiB as ours, median of the rounds",
    );
    report.put(
        "tokio_fs_write_cpu_s_per_gb_pagecache",
        or_nan(&mut m.by_task(&|[.., tu]| tu.cpu_s_per_gb)),
        "same without sync_file_range (the flusher's writeback)",
    );
    report.put(
        "tokio_fs_write_pacing_cpu_us_per_piece",
        or_nan(&mut m.by_task(&|[.., t, tu]| per_piece_us(t.cpu_s_per_gb, tu.cpu_s_per_gb))),
        "what pacing costs that baseline: paced minus unpaced of the same round, per 256 KiB piece, us, median",
    );
    report.put(
        "tokio_fs_write_disk_peak_ratio",
        m.by_task(&|[.., t, _]| t.peak_ratio)
            .into_iter()
            .fold(f64::NAN, f64::max),
        "that baseline paced, peak 100 ms device write rate / limit, worst run",
    );
    report.put(
        "tokio_fs_write_throughput_ratio",
        or_nan(&mut m.by_task(&|[.., t, _]| t.throughput_ratio)),
        "that baseline paced, achieved / limit, median of the rounds",
    );
    report.put(
        "write_shared_cpu_vs_tokio_fs",
        or_nan(&mut m.by_task(&|[s, _, t, _]| s.cpu_s_per_gb / t.cpu_s_per_gb)),
        "SharedEngine's paced path / that baseline's, CPU per GiB, round by round, median",
    );
    report.put(
        "write_pacing_cpu_vs_tokio_fs_shared",
        or_nan(&mut shared_pacing_vs_tokio_fs),
        "SharedEngine's pacing per piece / that baseline's (each paced minus its own unpaced run), round by round, median",
    );
}

/// Context: a ring's handoff per write, the host disk, the neighbours.
fn context(report: &mut Report, m: &Runs, noise: f64) {
    let Runs {
        fio_direct, ours, ..
    } = m;
    // Whether a ring's handoff explains ours: each write an SQE that io-wq
    // runs, where fio's pwrite copies in its own thread.
    report.put(
        "fio_write_ring_cpu_us_per_sqe",
        m.fio_med(&|[_, b, r]| per_piece_us(r.cpu_s_per_gb, b.cpu_s_per_gb)),
        "what a 256 KiB buffered write costs through io_uring over pwrite: fio io_uring minus psync, unpaced both, us per write, median of the rounds",
    );
    report.put(
        "write_host_disk_peak_ratio",
        worst(ours, |r| r.host_peak_ratio),
        "the host disk under the loop device (neighbours included), peak window / limit, paced, worst",
    );
    report.put(
        "fio_write_host_disk_peak_ratio",
        fio_worst(fio_direct, |r| r.host_peak_ratio),
        "same for fio --direct=1",
    );
    report.put(
        "write_noise_peak_ratio",
        noise,
        "host disk peak 100 ms write rate / limit while we write nothing: the neighbours' share",
    );
}

/// Under a stall of the device.
fn stall(report: &mut Report, m: &Runs) {
    let Runs {
        stall_ours,
        stall_fio,
        ..
    } = m;
    let stall_worst = |f: fn(&Run) -> f64, hi: bool| {
        let v = stall_ours.iter().map(f);
        if hi {
            v.fold(f64::NAN, f64::max)
        } else {
            v.fold(f64::NAN, f64::min)
        }
    };
    report.put(
        "write_stall_peak_ratio",
        stall_worst(|r| r.peak_ratio, true),
        "under a stall (the filesystem frozen 3 s, 8 s into the run), paced, peak 100 ms device write rate / limit, worse of 1 and 8 writers; goal <= 1.2 (the limit stays a ceiling)",
    );
    report.put(
        "write_stall_throughput_ratio",
        stall_worst(|r| r.throughput_ratio, false),
        "same run, writers' achieved / limit, worse of 1 and 8 (3 s of 32 lost: about 0.91)",
    );
    report.put(
        "write_stall_throughput_ratio_unheld",
        stall_worst(|r| r.throughput_ratio_unheld, false),
        "same, over the writers' time less the seconds the device held them (device_held_s)",
    );
    report.put(
        "write_stall_held_s",
        stall_worst(|r| r.held_s, false),
        "same runs, the seconds the device held the writers (device_held_s; the freeze is 3 s), fewer of 1 and 8",
    );
    for (i, what) in ["sfr", "direct"].into_iter().enumerate() {
        let r = stall_fio.get(i).and_then(Option::as_ref);
        report.put(
            &format!("fio_write_stall_peak_ratio_{what}"),
            r.map_or(f64::NAN, |r| r.peak_ratio),
            "baseline: fio (buffered + sync_file_range, or O_DIRECT), 1 job, under the same stall, peak 100 ms device write rate / limit",
        );
        report.put(
            &format!("fio_write_stall_throughput_ratio_{what}"),
            r.map_or(f64::NAN, |r| r.throughput_ratio),
            "same run, bytes / fio's wall time / limit",
        );
    }
}
