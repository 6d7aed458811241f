//! The full suite's runs, in their order: fio's direct-IO baseline, the
//! rounds of ours beside the charge-at-page-cache behaviour (with fio's
//! buffered runs and the async front end's in the single writer's rounds),
//! the stall runs, and the CPU once more on the disk itself.

use std::path::Path;

use crate::device::{STALL, fresh_disk, stall_on};
use crate::fio::{FIO_BUFFERED, FioRun, fio};
use crate::ours::{Run, Writer, fresh_run, fresh_run_of};
use crate::{ROUNDS, TOTAL};
use slotring_uring::PacedWrites;

/// Every run of the suite.
pub(crate) struct Runs {
    /// fio `O_DIRECT`, 1 job and 8.
    pub(crate) fio_direct: Vec<FioRun>,
    /// fio's buffered runs (`FIO_BUFFERED`) per round of our single writer
    /// (`None` where fio failed).
    pub(crate) fio_rounds: Vec<Option<[FioRun; 3]>>,
    /// Ours paced, per writer count (1, 8), per round.
    pub(crate) ours: Vec<Vec<Run>>,
    /// Ours with pacing off, likewise.
    pub(crate) pagecache: Vec<Vec<Run>>,
    /// Per round of the single writer: [shared paced, shared unpaced,
    /// tokio::fs paced, tokio::fs unpaced].
    pub(crate) tasks: Vec<[Run; 4]>,
    /// Ours paced under [`STALL`], 1 writer and 8 (none without a loop
    /// device).
    pub(crate) stall_ours: Vec<Run>,
    /// fio buffered + `sync_file_range`, then `O_DIRECT`, under [`STALL`]
    /// (`None` where one failed or could not be stalled).
    pub(crate) stall_fio: Vec<Option<FioRun>>,
    /// (paced, unpaced) on the disk itself, per writer count.
    pub(crate) on_disk: Vec<(Run, Run)>,
}

/// The runs of [`rounds`] (their fields of [`Runs`]).
struct Rounds {
    ours: Vec<Vec<Run>>,
    pagecache: Vec<Vec<Run>>,
    tasks: Vec<[Run; 4]>,
    fio_rounds: Vec<Option<[FioRun; 3]>>,
}

/// Run the suite on fresh filesystems under `host` (`host_stat` its disk's
/// stat file); `can_stall`: the runs have a loop device of their own.
pub(crate) fn measure(host: &Path, host_stat: &Path, can_stall: bool) -> Runs {
    let fio_direct = fio_direct(host, host_stat);
    let Rounds {
        ours,
        pagecache,
        tasks,
        fio_rounds,
    } = rounds(host, host_stat);
    let (stall_ours, stall_fio) = stalled(host, host_stat, can_stall);
    let on_disk = on_disk(host, host_stat);
    Runs {
        fio_direct,
        fio_rounds,
        ours,
        pagecache,
        tasks,
        stall_ours,
        stall_fio,
        on_disk,
    }
}

/// The baseline: fio at the same rate with the best pacing it has, each
/// on a fresh filesystem, 1 GiB like ours: direct IO (the device sees
/// each 256 KiB write when fio issues it) by one job and by eight.
fn fio_direct(host: &Path, host_stat: &Path) -> Vec<FioRun> {
    eprintln!("fio at 32 MiB/s (1 GiB each, each on a fresh filesystem):");
    let mut fio_direct = Vec::new();
    for (name, jobs) in [("O_DIRECT, 1 job", 1), ("O_DIRECT, 8 jobs", 8)] {
        let (disk, dir, dev_stat) = fresh_disk(host, true);
        match fio(
            &dir,
            &dev_stat,
            host_stat,
            name,
            jobs,
            TOTAL,
            &["--direct=1"],
            None,
        ) {
            Ok(r) => fio_direct.push(r),
            Err(e) => eprintln!("  fio {name}: {e}"),
        }
        drop(disk);
    }
    fio_direct
}

/// What pacing costs the kernel itself: a round of fio's buffered writes
/// (`FIO_BUFFERED`), run in each round of our single writer, before or
/// after our pair in turn (the machine's state drifts within the hour, and
/// the two are compared round by round): each 256 KiB write followed by
/// `sync_file_range` with our flags in fio's own thread (the cheapest
/// pacing there is: no ring, no io-wq, no wake-up but fio's own), without
/// it (the flusher's writeback), and without it through io_uring (what a
/// write SQE costs over a `pwrite`), the order rotating.
fn fio_round(host: &Path, host_stat: &Path, round: usize) -> Option<[FioRun; 3]> {
    let mut runs = [None, None, None];
    for k in 0..3 {
        let i = (k + round) % 3;
        let (name, extra) = FIO_BUFFERED[i];
        let (disk, dir, dev_stat) = fresh_disk(host, true);
        match fio(&dir, &dev_stat, host_stat, name, 1, TOTAL, extra, None) {
            Ok(r) => runs[i] = Some(r),
            Err(e) => eprintln!("  fio {name}: {e}"),
        }
        drop(disk);
    }
    let [Some(sfr), Some(buffered), Some(ring)] = runs else {
        return None;
    };
    Some([sfr, buffered, ring])
}

/// One writer through the async front end (`SharedEngine`, its paced
/// writes on tokio's blocking pool), paced and not, and its baseline
/// (`Writer::TokioFs`) paced and not, the order rotating: [shared paced,
/// shared unpaced, tokio::fs paced, tokio::fs unpaced].
fn tasks_round(host: &Path, host_stat: &Path, round: usize) -> [Run; 4] {
    let kinds = [
        (Writer::Shared(PacedWrites::default()), true),
        (Writer::Shared(PacedWrites::default()), false),
        (Writer::TokioFs, true),
        (Writer::TokioFs, false),
    ];
    let mut runs = [None; 4];
    for k in 0..4 {
        let i = (k + round) % 4;
        let (writer, paced) = kinds[i];
        runs[i] = Some(fresh_run_of(host, host_stat, paced, 1, true, writer, None));
    }
    runs.map(|r| r.expect("every kind ran"))
}

/// The rounds of ours (`ours`, `pagecache`, `tasks`, `fio_rounds` of
/// [`Runs`]).
///
/// [`ROUNDS`] rounds per writer count, each a paced and an unpaced run on
/// fresh filesystems, the order alternating between rounds (the machine's
/// memory state drifts: a run's CPU depends on which pages it gets).
/// Ceilings (peak, dirty) are judged on every run; the rate error, the
/// throughput and the CPU on the median round of each writer count (the
/// shared disk stalls now and then; the worst run is printed too). The
/// single writer's rounds also run the async front end's
/// ([`tasks_round`]) and fio's buffered runs ([`fio_round`]).
fn rounds(host: &Path, host_stat: &Path) -> Rounds {
    eprintln!(
        "ours and the charge-at-page-cache behaviour (1 GiB each, each on a fresh filesystem):"
    );
    let mut fio_rounds = Vec::new();
    let mut ours: Vec<Vec<Run>> = Vec::new();
    let mut pagecache: Vec<Vec<Run>> = Vec::new();
    let mut tasks: Vec<[Run; 4]> = Vec::new();
    for writers in [1, 8] {
        let (mut o, mut p) = (Vec::new(), Vec::new());
        let single = writers == 1;
        for round in 0..ROUNDS {
            let even = round % 2 == 0;
            if single && even {
                fio_rounds.push(fio_round(host, host_stat, round));
            }
            if even {
                o.push(fresh_run(host, host_stat, true, writers, true));
                p.push(fresh_run(host, host_stat, false, writers, true));
            }
            if single {
                tasks.push(tasks_round(host, host_stat, round));
            }
            if !even {
                p.push(fresh_run(host, host_stat, false, writers, true));
                o.push(fresh_run(host, host_stat, true, writers, true));
            }
            if single && !even {
                fio_rounds.push(fio_round(host, host_stat, round));
            }
        }
        ours.push(o);
        pagecache.push(p);
    }
    Rounds {
        ours,
        pagecache,
        tasks,
        fio_rounds,
    }
}

/// Under a hold the kernel makes ([`STALL`]: the filesystem frozen 3 s),
/// the same for ours and for fio: what each does with the time the device
/// lost, ours keeping the limit a ceiling, fio making the time up (its
/// rate is a schedule: behind it, it issues at once).
fn stalled(host: &Path, host_stat: &Path, can_stall: bool) -> (Vec<Run>, Vec<Option<FioRun>>) {
    eprintln!(
        "under a stall: the filesystem frozen {:?} at {:?} (1 GiB each, each on a fresh filesystem):",
        STALL.hold, STALL.at
    );
    if !can_stall {
        eprintln!("  no stall runs: no loop device of our own (not root)");
    }
    let stall_ours: Vec<Run> = [1, 8]
        .into_iter()
        .filter(|_| can_stall)
        .map(|writers| {
            fresh_run_of(
                host,
                host_stat,
                true,
                writers,
                true,
                Writer::Blocking,
                Some(STALL),
            )
        })
        .collect();
    // fio's buffered + sync_file_range run, then its O_DIRECT run.
    let mut stall_fio: Vec<Option<FioRun>> = Vec::new();
    for (name, extra) in [FIO_BUFFERED[0], ("O_DIRECT, 1 job", &["--direct=1"][..])] {
        if !can_stall {
            stall_fio.push(None);
            continue;
        }
        let (disk, dir, dev_stat) = fresh_disk(host, true);
        let stall = stall_on(disk.as_ref(), Some(STALL));
        stall_fio.push(
            fio(&dir, &dev_stat, host_stat, name, 1, TOTAL, extra, stall)
                .map_err(|e| eprintln!("  fio {name}: {e}"))
                .ok(),
        );
        drop(disk);
    }
    (stall_ours, stall_fio)
}

/// The CPU once more on the disk itself, to tell the loop device's share
/// from pacing's own: its worker does one direct IO on its backing file
/// per request it gets, and a paced GiB is 4,096 requests where the
/// flusher's is a few hundred. One pair per writer count, the order
/// alternating; CPU only (the disk's windows mix in the neighbours'
/// writes).
fn on_disk(host: &Path, host_stat: &Path) -> Vec<(Run, Run)> {
    eprintln!("the CPU on the disk itself (no loop device; 1 GiB each):");
    let mut on_disk: Vec<(Run, Run)> = Vec::new();
    for (k, writers) in [1, 8].into_iter().enumerate() {
        if k % 2 == 0 {
            let o = fresh_run(host, host_stat, true, writers, false);
            on_disk.push((o, fresh_run(host, host_stat, false, writers, false)));
        } else {
            let p = fresh_run(host, host_stat, false, writers, false);
            on_disk.push((fresh_run(host, host_stat, true, writers, false), p));
        }
    }
    on_disk
}
