//! The benchmark harness shared by the bench binaries: medians over rounds.
#![allow(dead_code)] // each bench binary uses a different part of it

use std::time::Instant;

/// Rounds per figure: 7, or 3 with the `quick` argument.
pub fn rounds() -> usize {
    if std::env::args().any(|a| a == "quick") {
        3
    } else {
        7
    }
}

pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
}

/// ns per iteration of `f` (given the iteration index): the median over `rounds()`
/// rounds of `iters` iterations.
pub fn per_op(iters: u64, mut f: impl FnMut(u64)) -> f64 {
    median(
        (0..rounds())
            .map(|_| {
                let start = Instant::now();
                for i in 0..iters {
                    f(i);
                }
                start.elapsed().as_nanos() as f64 / iters as f64
            })
            .collect(),
    )
}
