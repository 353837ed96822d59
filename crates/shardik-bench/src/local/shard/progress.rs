//! A process-wide count of handled tells, striped per thread so that counting costs one
//! uncontended atomic add; the driver of a tell benchmark polls it to see when every message
//! has been handled. shardik entities and baseline owners count alike.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

const STRIPES: usize = 16;

#[repr(align(128))]
struct Stripe(AtomicU64);

static HANDLED: [Stripe; STRIPES] = [const { Stripe(AtomicU64::new(0)) }; STRIPES];
static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MY_STRIPE: usize = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed) % STRIPES;
}

/// Counts one handled message.
#[inline]
pub fn handled() {
    let i = MY_STRIPE.with(|i| *i);
    HANDLED[i].0.fetch_add(1, Ordering::Release);
}

/// Messages counted since the last [`reset`].
pub fn total() -> u64 {
    HANDLED.iter().map(|s| s.0.load(Ordering::Acquire)).sum()
}

/// Starts counting from zero (call only while nothing is being counted).
pub fn reset() {
    for s in &HANDLED {
        s.0.store(0, Ordering::Release);
    }
}

/// Waits, checking every millisecond, until `target` messages have been counted.
pub async fn wait_for(target: u64) {
    while total() < target {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
