//! Spaces dropped and re-created (often at the same address) while long-lived threads
//! keep the previous space's record cached in `LAST`: ids stay fresh, dense and unique
//! (CI also runs this under ASan).

use std::collections::HashSet;
use std::sync::mpsc;
use std::sync::{Arc, Barrier};

use nicework::{IdSpace, PerCid, Scheduler};

#[test]
fn recreated_spaces_at_reused_addresses_hand_out_fresh_dense_ids() {
    let sched = Scheduler::manual();
    const HELPERS: usize = 3;
    let mut senders = Vec::new();
    let mut joins = Vec::new();
    let (ids_tx, ids_rx) = mpsc::channel::<(usize, usize, usize)>();
    for h in 0..HELPERS {
        let (tx, rx) = mpsc::channel::<Option<(Arc<IdSpace>, Arc<PerCid<u64>>, Arc<Barrier>)>>();
        senders.push(tx);
        let ids_tx = ids_tx.clone();
        joins.push(std::thread::spawn(move || {
            let mut round = 0;
            while let Some((space, p, barrier)) = rx.recv().unwrap() {
                {
                    let g = space.enter();
                    let n = space.enter();
                    assert_eq!(g.get(), n.get());
                    p.with(|v| *v += 1);
                    ids_tx.send((round, h, g.get())).unwrap();
                    barrier.wait(); // every helper holds its guard here
                    barrier.wait();
                }
                drop((space, p));
                barrier.wait();
                round += 1;
            }
        }));
    }
    let mut addresses = HashSet::new();
    for round in 0..2000 {
        let space = Arc::new(IdSpace::new(&sched));
        addresses.insert(&*space as *const IdSpace as usize);
        let p = Arc::new(PerCid::new(&space, || 0u64));
        let barrier = Arc::new(Barrier::new(HELPERS + 1));
        for tx in &senders {
            tx.send(Some((space.clone(), p.clone(), barrier.clone())))
                .unwrap();
        }
        barrier.wait();
        let mut seen = HashSet::new();
        for _ in 0..HELPERS {
            let (r, _, id) = ids_rx.recv().unwrap();
            assert_eq!(r, round);
            assert!(id < HELPERS, "round {round}: id {id} not dense");
            assert!(seen.insert(id), "round {round}: id {id} handed out twice");
        }
        assert_eq!(space.held(), HELPERS);
        barrier.wait();
        drop((space, p));
        barrier.wait();
    }
    for tx in &senders {
        tx.send(None).unwrap();
    }
    for j in joins {
        j.join().unwrap();
    }
    println!(
        "{} distinct space addresses over 2000 rounds",
        addresses.len()
    );
}
