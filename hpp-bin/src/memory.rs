//! Returning burst memory to the kernel. A request burst (sixteen concurrent creates, a
//! ListVolumes walk over 10,000 volumes, a large watch list) leaves freed buffers in the
//! allocator's arenas, resident until the next burst reuses them. Every few seconds each
//! executable asks glibc to release them ([`hpp_sys::malloc::release_free_memory`]); on an
//! idle process that walk costs microseconds.

use std::time::Duration;

/// How often freed memory is handed back.
pub const RELEASE_INTERVAL: Duration = Duration::from_secs(5);

/// Releases freed allocator memory every `every`, forever. Runs on the runtime's own
/// threads: the call is short and must not start a blocking-pool thread of its own (which
/// would cost more memory than it saves).
pub async fn release_periodically(every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate; start-up has nothing to release yet.
    tick.tick().await;
    loop {
        tick.tick().await;
        hpp_sys::malloc::release_free_memory();
    }
}
