//! The `slotring` command's modules: settings, the `/metrics` server, the
//! `run` workload, its report and plot, and what `stats` and `verify`
//! compute and print.
//!
//! This library exists so that the command's integration tests and benchmark
//! can reach its parts; services embed the `slotring` crate instead, which
//! carries none of this (no clap, no workload, no report).
#![forbid(unsafe_code)]

pub mod config;
pub mod http;
pub mod plot;
pub mod report;
pub mod stats;
pub mod verify;
pub mod workload;
