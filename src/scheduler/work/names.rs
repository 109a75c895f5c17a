//! The table of custom work names.
//!
//! Few works have a custom name, so it is not worth a word in every work's header: the
//! names live here, keyed by the work's address, and the top bit of the header's listing
//! word says whether to look. A renamed work keeps its older names until it is freed, so a `&str`
//! handed out stays valid for as long as the work lives, even if another thread renames
//! it meanwhile (the strings are boxed, so the table may grow without moving them).
//!
//! The table's lock is a spin lock held for a hash-map operation only, and it is taken
//! around `fork()` (a `pthread_atfork` prepare handler, registered with the fork
//! generation's), so a child never inherits it held by a thread that does not exist there.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

static LOCKED: AtomicBool = AtomicBool::new(false);
static mut TABLE: Option<HashMap<usize, Vec<Box<str>>>> = None;

/// Holds the spin lock; its scope is the only place `TABLE` is touched.
struct Guard;

impl Guard {
    fn acquire() -> Guard {
        let mut spins = 0u32;
        while LOCKED
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        Guard
    }

    fn table(&mut self) -> &mut HashMap<usize, Vec<Box<str>>> {
        // SAFETY: the guard holds the lock, so this is the only reference to `TABLE`
        // (`&mut self` keeps it unique within the guard's scope).
        unsafe { (*std::ptr::addr_of_mut!(TABLE)).get_or_insert_with(HashMap::new) }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        LOCKED.store(false, Ordering::Release);
    }
}

/// Adds a name for the work at `address` (its newest).
pub(crate) fn push(address: usize, name: Box<str>) {
    Guard::acquire()
        .table()
        .entry(address)
        .or_default()
        .push(name);
}

/// The newest name of the work at `address`.
///
/// The returned `&str` points into a box that only [`remove`] frees, which happens when
/// the work is freed; the caller holds the work, so its lifetime is bound to that.
pub(crate) fn get<'a>(address: usize) -> Option<&'a str> {
    let mut guard = Guard::acquire();
    let name: *const str = &**guard.table().get(&address)?.last()?;
    // SAFETY: the box's contents stay where they are until `remove(address)`, which runs
    // when the work at `address` is freed, after every borrow of it ended (see above).
    Some(unsafe { &*name })
}

/// Forgets the names of the work at `address`; called when it is freed.
pub(crate) fn remove(address: usize) {
    let names = Guard::acquire().table().remove(&address);
    drop(names);
}

/// `pthread_atfork` prepare handler: holds the lock across `fork()`.
#[cfg_attr(not(unix), allow(dead_code))]
pub(crate) extern "C" fn before_fork() {
    std::mem::forget(Guard::acquire());
}

/// `pthread_atfork` parent and child handler: releases the lock taken before the fork.
#[cfg_attr(not(unix), allow(dead_code))]
pub(crate) extern "C" fn after_fork() {
    LOCKED.store(false, Ordering::Release);
}
