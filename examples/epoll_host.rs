//! A plain epoll loop runs a hosted scheduler's works: no nicework thread. The loop
//! registers the `Driver`'s raw descriptor (`AsRawFd`, as mio's `SourceFd`, calloop's
//! `Generic` and async-io's `Async` take it), readable once the next deadline passes,
//! and a pipe of its own; it calls `run_due()` when either is ready, and otherwise sleeps
//! with no timeout at all. Other threads touch a session reaper and arm a one-off cleanup, which
//! moves the next deadline earlier; the descriptor follows.
//!
//! It prints how many runs each wakeup made and exits non-zero if a reaper ran while its
//! session was being touched.
//!
//! ```text
//! cargo run --release --example epoll_host
//! ```
//!
//! Linux only: the `Driver`'s descriptor is a timerfd, which other OSes (and Linux built
//! with `--cfg nicework_portable`) do not have. There a host sleeps until
//! `Driver::next_deadline` and is woken through `Driver::set_waker`, as the `tokio_host`
//! example does.

#[cfg(all(target_os = "linux", not(nicework_portable)))]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    epoll::main()
}

#[cfg(not(all(target_os = "linux", not(nicework_portable))))]
fn main() {
    eprintln!("epoll_host needs Linux's timerfd: see the tokio_host example");
}

#[cfg(all(target_os = "linux", not(nicework_portable)))]
mod epoll {
    use std::os::fd::AsRawFd;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use nicework::{Next, Scheduler};

    pub(super) fn main() -> Result<(), Box<dyn std::error::Error>> {
        let (sched, driver) = Scheduler::builder().name("epoll-host").build_hosted()?;

        // SAFETY: plain system calls on descriptors this function owns.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(epoll >= 0, "epoll_create1");
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 1,
        };
        // SAFETY: a valid epoll descriptor and the driver's descriptor, which outlives it.
        let rc =
            unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, driver.as_raw_fd(), &mut event) };
        assert_eq!(rc, 0, "epoll_ctl");

        // A session touched every 20 ms for 400 ms, reaped 150 ms after its last touch.
        let touching = Arc::new(AtomicBool::new(true));
        let early_reaps = Arc::new(AtomicUsize::new(0));
        let reaped = Arc::new(AtomicBool::new(false));
        let reaper = {
            let (touching, early_reaps, reaped) =
                (touching.clone(), early_reaps.clone(), reaped.clone());
            Arc::new(sched.timeout(Duration::from_millis(150), move |_| {
                if touching.load(Ordering::SeqCst) {
                    early_reaps.fetch_add(1, Ordering::SeqCst);
                }
                reaped.store(true, Ordering::SeqCst);
                Next::Stop
            }))
        };
        let cleanups = Arc::new(AtomicUsize::new(0));
        let session = {
            let (reaper, touching, sched, cleanups) = (
                reaper.clone(),
                touching.clone(),
                sched.clone(),
                cleanups.clone(),
            );
            std::thread::spawn(move || {
                for i in 0..20 {
                    reaper.touch();
                    if i == 10 {
                        // A cleanup due soon, armed from this thread: the host's descriptor
                        // must turn readable for it although the loop sleeps without timeout.
                        let cleanups = cleanups.clone();
                        let cleanup = sched.work(move |_| {
                            cleanups.fetch_add(1, Ordering::SeqCst);
                            Next::Stop
                        });
                        cleanup.schedule(Duration::from_millis(5));
                        cleanup.detach();
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                touching.store(false, Ordering::SeqCst);
            })
        };

        let start = Instant::now();
        let mut wakeups = 0;
        let mut runs = 0;
        while !reaped.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(10) {
            let mut ready = [libc::epoll_event { events: 0, u64: 0 }; 4];
            // No timeout: the descriptor alone says when something is due. (A loop with other
            // timers of its own would pass `driver.next_deadline()` as its timeout.)
            // SAFETY: a valid epoll descriptor and a buffer of 4 events.
            let n = unsafe { libc::epoll_wait(epoll, ready.as_mut_ptr(), 4, 1_000) };
            if n < 0 {
                continue; // EINTR
            }
            wakeups += 1;
            runs += driver.run_due();
        }
        session.join().expect("the session thread");
        // SAFETY: the descriptor is ours and no longer used.
        unsafe { libc::close(epoll) };

        let early = early_reaps.load(Ordering::SeqCst);
        println!(
            "epoll host: {wakeups} wakeups, {runs} runs in {:?}; cleanups run: {}; \
         reaped: {}; early reaps: {early}",
            start.elapsed(),
            cleanups.load(Ordering::SeqCst),
            reaped.load(Ordering::SeqCst),
        );
        if early != 0 || !reaped.load(Ordering::SeqCst) || cleanups.load(Ordering::SeqCst) != 1 {
            std::process::exit(1);
        }
        Ok(())
    }
}
