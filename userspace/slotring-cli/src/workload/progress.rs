//! The progress bars on stderr: the data file, the query phase, and one per
//! scan (hidden when not asked for; indicatif also hides them when stderr
//! is not a terminal).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use slotring::slots::SlotsCounters;

use super::workers::QueryState;

/// The bars, in the order they appear.
pub(super) struct Progress {
    multi: MultiProgress,
    time: Option<ProgressBar>,
    scans: Vec<(ProgressBar, Arc<QueryState>)>,
}

impl Progress {
    /// Bars drawn on stderr if `show`, else hidden.
    pub fn new(show: bool) -> Self {
        Self {
            multi: MultiProgress::with_draw_target(if show {
                ProgressDrawTarget::stderr()
            } else {
                ProgressDrawTarget::hidden()
            }),
            time: None,
            scans: Vec::new(),
        }
    }

    /// The bar of creating a data file of `size` bytes.
    pub fn data_file(&self, size: u64) -> ProgressBar {
        let bar = self.multi.add(ProgressBar::new(size));
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:>12} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar.set_prefix("data file");
        bar
    }

    /// The bar of the query phase, `duration` long.
    pub fn start_queries(&mut self, duration: Duration) {
        let bar = self
            .multi
            .add(ProgressBar::new(duration.as_millis() as u64));
        bar.set_style(
            ProgressStyle::with_template("{prefix:>12} [{bar:30}] {elapsed}/{duration} {msg}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix("queries");
        self.time = Some(bar);
    }

    /// A bar for scan query `q`.
    pub fn add_scan(&mut self, q: Arc<QueryState>) {
        let bar = self.multi.add(ProgressBar::new_spinner());
        bar.set_style(
            ProgressStyle::with_template("{prefix:>12} {bytes:>10} read  {msg}")
                .expect("valid template"),
        );
        bar.set_prefix(format!("scan {}", q.id));
        self.scans.push((bar, q));
    }

    /// Show a sample taken `t_s` into the queries.
    pub fn update(&self, t_s: f64, disk_bytes_per_s: f64, slots: &SlotsCounters) {
        if let Some(bar) = &self.time {
            bar.set_position((t_s * 1e3) as u64);
            bar.set_message(format!(
                "disk {:.1} MiB/s  slots {}/{}  parked {}",
                disk_bytes_per_s / (1 << 20) as f64,
                slots.cur_concurrency,
                slots.max_concurrency,
                slots.parked
            ));
        }
        for (bar, q) in &self.scans {
            bar.set_position(q.bytes.load(Ordering::Relaxed));
            bar.set_message(format!("{} slots", q.held.load(Ordering::Relaxed)));
        }
    }

    /// Finish every bar and clear them from the terminal.
    pub fn finish(self) {
        if let Some(bar) = &self.time {
            bar.finish_with_message("done");
        }
        for (bar, _) in &self.scans {
            bar.finish();
        }
        let _ = self.multi.clear();
    }
}
