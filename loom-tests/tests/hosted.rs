#![cfg(loom)]
//! Loom models of a hosted scheduler's waker: an arm from another thread against the
//! host registering (or replacing) its waker and then reading `next_deadline()`. The
//! host follows the rule the `Driver` docs give (register, then read), so it never
//! sleeps through an arm: the arm is seen in `next_deadline()` or it wakes a waker that
//! was registered.

use std::sync::Arc;
use std::task::{Wake, Waker};
use std::time::Duration;

use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use loom::thread;
use nicework::{Next, Scheduler};

struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, SeqCst);
    }
}

fn counting() -> (Arc<Count>, Waker) {
    let count = Arc::new(Count(AtomicUsize::new(0)));
    (count.clone(), Waker::from(count))
}

/// `replace`: the host had a waker registered before and replaces it during the arm.
fn set_waker_against_an_arm(replace: bool) {
    loom::model(move || {
        let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
        let (old, old_waker) = counting();
        if replace {
            driver.set_waker(old_waker);
        }
        let work = Arc::new(sched.work(|_| Next::Park));
        let armer = {
            let work = work.clone();
            thread::spawn(move || {
                work.schedule(Duration::from_secs(60));
            })
        };
        let (new, new_waker) = counting();
        driver.set_waker(new_waker);
        let seen = driver.next_deadline().is_some();
        armer.join().unwrap();
        let woken = new.0.load(SeqCst) + old.0.load(SeqCst);
        assert!(seen || woken > 0, "the arm was neither seen nor woken");
        if !seen {
            // Not seen by the read after registering: the arm came after it, so it woke
            // the waker registered then.
            assert_eq!(new.0.load(SeqCst), 1);
        }
        assert!(driver.next_deadline().is_some());
    });
}

#[test]
fn set_waker_against_an_arm_from_another_thread() {
    set_waker_against_an_arm(false);
}

#[test]
fn a_waker_replaced_during_an_arm_from_another_thread() {
    set_waker_against_an_arm(true);
}
