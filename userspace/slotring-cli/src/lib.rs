//! The `slotring` command's modules: settings, the `/metrics` server, the
//! `run` workload, its report and plot, and what `stats` and `verify`
//! compute and print.
//!
//! This library exists so that the command's integration tests and benchmark
//! can reach its parts; services embed the `slotring` crate instead, which
//! carries none of this (no clap, no workload, no report).
#![forbid(unsafe_code)]

pub mod abort;
pub mod config;
pub mod http;
pub mod plot;
pub mod report;
pub mod stats;
pub mod verify;
pub mod watch;
pub mod workload;

/// `e` and its causes (`source()` chain), joined by `: `: for warnings that
/// print an error without `anyhow` (each cause once, since no message
/// formats its source).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}
