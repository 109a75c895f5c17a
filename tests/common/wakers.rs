//! Polling futures by hand and watching a host's descriptor: a waker that counts its
//! wakes, one poll with a given waker, and whether a `Driver`'s descriptor is readable.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};

/// Counts the wakes of the wakers made from it.
pub struct Wakes(pub AtomicUsize);

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A waker and the count of its wakes.
pub fn counting_waker() -> (Arc<Wakes>, Waker) {
    let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
    (wakes.clone(), Waker::from(wakes))
}

/// Polls `future` once with `waker`.
pub fn poll<F: Future + ?Sized>(future: Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(waker))
}

/// Whether the driver's descriptor is readable now (poll with a zero timeout).
#[cfg(unix)]
pub fn readable(driver: &nicework::Driver) -> bool {
    use std::os::fd::{AsFd, AsRawFd};

    let mut pfd = libc::pollfd {
        fd: driver.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout.
    let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
    assert!(rc >= 0, "poll failed");
    rc == 1 && pfd.revents & libc::POLLIN != 0
}
