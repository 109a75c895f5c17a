//! Per-object works: `work_for`, `every_for` and `timeout_for`, and [`ObjectRef`], which
//! lets them take the object as `&Arc<T>` or `&Weak<T>`.
//!
//! An object usually owns its work (its reaper, its flusher), so the work's closure must
//! not own the object: that would be a cycle that never drops. These constructors keep a
//! `Weak<T>` in the closure, upgrade it for each run, and stop the work (`Next::Stop`)
//! once the object is gone. Given a `Weak`, they work inside `Arc::new_cyclic`, so the
//! object can hold its `Work` directly, with no `Mutex<Option<Work>>` or `OnceLock` to
//! fill in after construction.
//!
//! An object under construction is not an object that is gone. A run that comes while
//! `Arc::new_cyclic`'s constructor still runs (the work was armed inside it, and the
//! constructor is slow) cannot upgrade the `Weak` yet: it calls nothing and re-arms for
//! the work's period, at least [`UNBUILT_RETRY`], so the work lives on once the object
//! exists. Only a `Weak` that has been seen alive (at creation, or by an earlier run)
//! and no longer upgrades stops the work. A `Weak` to an object that died before the work
//! was made has never been seen alive either: that work retries at its period until its
//! handle is dropped.
//!
//! If the last `Arc` drops during a run, the object, and with it the work, is dropped on
//! the running thread after the callback returns (see [`Work`]'s drop from inside its
//! own callback).

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::scheduler::{Ctx, Next};

/// How a per-object constructor takes its object: `&Arc<T>` or `&Weak<T>`.
///
/// Implemented for [`Arc<T>`] and [`Weak<T>`] only (the trait is sealed).
pub trait ObjectRef<T>: sealed::Sealed {
    /// The weak reference the work keeps.
    fn to_weak(&self) -> Weak<T>;
}

impl<T> ObjectRef<T> for Arc<T> {
    fn to_weak(&self) -> Weak<T> {
        Arc::downgrade(self)
    }
}

impl<T> ObjectRef<T> for Weak<T> {
    fn to_weak(&self) -> Weak<T> {
        self.clone()
    }
}

mod sealed {
    pub trait Sealed {}
    impl<T> Sealed for std::sync::Arc<T> {}
    impl<T> Sealed for std::sync::Weak<T> {}
}

/// How soon a run that finds its object not yet built tries again, at the least (its
/// period, if longer): a constructor inside `Arc::new_cyclic` that takes a while costs a
/// few runs, never a spin.
pub(crate) const UNBUILT_RETRY: Duration = Duration::from_millis(10);

/// The closure of a per-object work: the object if it is still alive; `Stop` once it is
/// gone.
///
/// A `Weak` that has never upgraded may belong to an object still under construction in
/// `Arc::new_cyclic`, which is not an object that is gone: such a run re-arms for its
/// period (at least [`UNBUILT_RETRY`]) and calls nothing. Once the object has been seen
/// alive (at creation, or by a run), a failed upgrade means it is gone.
pub(crate) fn for_object<T, F>(object: Weak<T>, mut f: F) -> impl FnMut(&mut Ctx<'_>) -> Next + Send
where
    T: Send + Sync + 'static,
    F: FnMut(&T, &mut Ctx<'_>) -> Next + Send + 'static,
{
    let mut seen_alive = object.strong_count() > 0;
    move |cx| match object.upgrade() {
        Some(object) => {
            seen_alive = true;
            f(&object, cx)
        }
        None if seen_alive => Next::Stop,
        None => Next::After(cx.period().max(UNBUILT_RETRY)),
    }
}
