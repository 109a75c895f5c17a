//! `IdSpace::enter()` + drop on a held id against `thread_local::ThreadLocal::get`, alone
//! in a binary built differently from `benches/cid.rs` (see `Cargo.toml`): code layout
//! moves such nanosecond figures, so a result must hold in both. Prints the median of 9
//! passes, each timing both back to back, and the median of the passes' ratios.

use std::hint::black_box;
use std::time::Instant;

use nicework::{IdSpace, Scheduler};
use thread_local::ThreadLocal;

fn per_op(iters: u64, mut f: impl FnMut()) -> f64 {
    let mut rounds: Vec<f64> = (0..5)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iters {
                f();
            }
            start.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[rounds.len() / 2]
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let held = ids.enter(); // the thread holds its id: every enter below is nested-free
    drop(held);
    let tls: ThreadLocal<u64> = ThreadLocal::new();
    let iters = 20_000_000;
    let (mut enters, mut gets, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..9 {
        let enter = per_op(iters, || {
            let cid = black_box(&ids).enter();
            black_box(cid.get());
        });
        let get = per_op(iters, || {
            black_box(black_box(&tls).get_or(|| 0));
        });
        enters.push(enter);
        gets.push(get);
        ratios.push(enter / get);
    }
    println!(
        "standalone: enter()+drop on a held id {:5.2} ns   ThreadLocal::get {:5.2} ns   ratio {:.2}x (median of 9 passes)   fence-free fast path: {}",
        median(enters),
        median(gets),
        median(ratios),
        nicework::hooks::uses_membarrier(),
    );
}
