//! `SLOTRING_WRITE_QUICK`'s runs (debugging aids; no report is written):
//!
//! * any value but `fio…`: only the paced runs, or only the unpaced ones
//!   with `pagecache` (e.g. under `perf record -a`), through
//!   `SLOTRING_WRITE_ENGINE`'s writer, for 1 and 8 writers or
//!   `SLOTRING_WRITE_WRITERS`, stalled with `SLOTRING_WRITE_STALL`;
//! * `fio`: one round of fio's buffered runs (`fio:0,1`: only those of
//!   them, indices into `FIO_BUFFERED`; `fio:d`: its direct-IO run
//!   instead), `SLOTRING_WRITE_WRITERS` jobs (default 1), each at its
//!   share of the limit.

use std::path::Path;

use crate::TOTAL;
use crate::device::{LoopDisk, Stall, fresh_disk, stall_on};
use crate::fio::{FIO_BUFFERED, fio};
use crate::ours::{Writer, cap_setting, catch_up_setting, fresh_run_of};

/// Run `which`'s quick runs; `loop_disk`, the first fresh disk, is kept
/// during ours and given up before fio's, as in the full suite.
pub(crate) fn run(which: &str, host: &Path, host_stat: &Path, loop_disk: Option<LoopDisk>) {
    if let Some(which) = which.strip_prefix("fio") {
        drop(loop_disk);
        fio_runs(which, host, host_stat);
        return;
    }
    eprintln!(
        "writeback cap: {:?}, catch-up {} permille",
        cap_setting(),
        catch_up_setting()
    );
    // SLOTRING_WRITE_WRITERS=1: one writer count only.
    let counts: Vec<usize> = std::env::var("SLOTRING_WRITE_WRITERS")
        .ok()
        .and_then(|w| w.parse().ok())
        .map_or(vec![1, 8], |w| vec![w]);
    for writers in counts {
        fresh_run_of(
            host,
            host_stat,
            which != "pagecache",
            writers,
            true,
            Writer::from_env(),
            Stall::from_env(),
        );
    }
    drop(loop_disk);
}

/// `fio…`'s runs: `which` is what follows `fio`.
fn fio_runs(which: &str, host: &Path, host_stat: &Path) {
    let picked: Vec<usize> = which
        .trim_start_matches(':')
        .split(',')
        .filter_map(|i| i.parse().ok())
        .collect();
    let jobs = std::env::var("SLOTRING_WRITE_WRITERS")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(1);
    let direct: [(&str, &[&str]); 1] = [("O_DIRECT", &["--direct=1"])];
    let runs = if which.trim_start_matches(':') == "d" {
        direct.to_vec()
    } else {
        FIO_BUFFERED.to_vec()
    };
    for (i, (name, extra)) in runs.into_iter().enumerate() {
        if !picked.is_empty() && !picked.contains(&i) {
            continue;
        }
        let (disk, dir, dev_stat) = fresh_disk(host, true);
        let stall = stall_on(disk.as_ref(), Stall::from_env());
        if let Err(e) = fio(&dir, &dev_stat, host_stat, name, jobs, TOTAL, extra, stall) {
            eprintln!("  fio {name}: {e}");
        }
        drop(disk);
    }
}
