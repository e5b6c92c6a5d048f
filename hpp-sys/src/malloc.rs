//! Allocator tuning. glibc gives every thread that allocates concurrently its own arena (up to
//! 8 per core), and memory freed into an arena stays resident there. hpp's processes are small
//! servers whose threads (tokio workers, blocking-pool threads doing file system calls) all
//! allocate briefly: measured on the CSI driver, one arena per thread more than doubled the
//! resident memory after listing 10,000 volumes (25 MB against 10.5 MB with one arena) for no
//! measurable gain in speed. So each binary caps the arenas first thing in `main`.
//!
//! The operator runs on jemalloc instead (feature `jemalloc`, [`Jemalloc`], [`tune_jemalloc`]):
//! it keeps thousands of small long-lived texts (its watch caches) among the short-lived trees of
//! every pass, and glibc's heap could not give back the pages between them (16–18 MiB of 45 at
//! 1,000 nodes); jemalloc's size classes keep them apart (see docs/performance.md).

/// Caps glibc's malloc arenas at `max` (what `MALLOC_ARENA_MAX` does, but without relying on
/// the environment). Returns false when the allocator refused or is not glibc's (musl has no
/// arenas; there is nothing to cap). Call before starting threads.
#[allow(unsafe_code)]
pub fn limit_arenas(max: u16) -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets a tunable of the process's allocator; it takes two integers,
        // touches no caller memory, and is safe to call at any time (glibc locks internally).
        let ok = unsafe { libc::mallopt(libc::M_ARENA_MAX, libc::c_int::from(max)) };
        ok == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = max;
        false
    }
}

/// Hands memory that `free` kept in the arenas back to the kernel (glibc's `malloc_trim(0)`,
/// which releases free pages anywhere in every arena, not only at the top). After a burst of
/// work, such as listing 10,000 volumes or serving sixteen concurrent creates, the freed
/// buffers otherwise stay resident until the next burst reuses them. Returns whether anything
/// was released; always false on other allocators. Takes the arenas' locks briefly: call it
/// when idle or every few seconds, not per request.
#[allow(unsafe_code)]
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes a size and only walks the allocator's own free lists under
        // its locks; it touches no caller memory and is safe to call from any thread.
        let released = unsafe { libc::malloc_trim(0) };
        released == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(feature = "jemalloc")]
pub use tikv_jemallocator::Jemalloc;

/// Whether [`tune_jemalloc`] asked for every thread to share the first arena.
#[cfg(feature = "jemalloc")]
static SHARE_FIRST_ARENA: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Tunes jemalloc for a long-running controller: freed pages go back to the kernel `decay`
/// after they were last used (one background thread purges them, so an idle process shrinks
/// too; jemalloc's default is 10 s, and only when the process allocates), straight away rather
/// than through `MADV_FREE` (whose pages still count as resident until the kernel needs them),
/// and every thread that calls [`on_thread_start`] shares the first arena (a few threads that
/// allocate briefly gain nothing from arenas of their own; measured at 1,000 nodes: 38.4 MiB
/// against 39.6 MiB with one arena per thread, 26.8 against 40.6 after a pass). Call first
/// thing in `main`, before any thread starts. Only meaningful when [`Jemalloc`] is the global
/// allocator.
#[cfg(feature = "jemalloc")]
pub fn tune_jemalloc(decay: std::time::Duration) -> std::io::Result<()> {
    let decay_ms = isize::try_from(decay.as_millis()).unwrap_or(isize::MAX);
    mallctl_write(c"arenas.dirty_decay_ms", decay_ms)?;
    mallctl_write(c"arenas.muzzy_decay_ms", 0isize)?;
    // The defaults above are for arenas created from now on; the first one already exists.
    mallctl_write(c"arena.0.dirty_decay_ms", decay_ms)?;
    mallctl_write(c"arena.0.muzzy_decay_ms", 0isize)?;
    mallctl_write(c"max_background_threads", 1usize)?;
    mallctl_write(c"background_thread", true)?;
    SHARE_FIRST_ARENA.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// Binds the calling thread to jemalloc's first arena when [`tune_jemalloc`] ran (a runtime's
/// thread-start hook); does nothing otherwise, so it is safe to install in every executable.
pub fn on_thread_start() {
    #[cfg(feature = "jemalloc")]
    if SHARE_FIRST_ARENA.load(std::sync::atomic::Ordering::Relaxed) {
        // A thread left on an arena of its own only costs memory: nothing to report.
        let _ = mallctl_write(c"thread.arena", 0u32);
    }
}

/// What jemalloc holds, in bytes (its `stats.*` counters): how much of a process's resident
/// memory is its own data and how much the allocator keeps around it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JemallocStats {
    /// Allocated by the program and not freed yet.
    pub allocated: usize,
    /// In pages holding allocations: `allocated` and the free room in those pages.
    pub active: usize,
    /// jemalloc's own bookkeeping.
    pub metadata: usize,
    /// In resident pages jemalloc maps (an upper bound): `active`, `metadata`, and freed pages
    /// not handed back to the kernel yet.
    pub resident: usize,
}

/// jemalloc's counters as of now; `None` without the `jemalloc` feature (or if jemalloc
/// refuses). Only meaningful where [`Jemalloc`] is the global allocator.
pub fn jemalloc_stats() -> Option<JemallocStats> {
    #[cfg(feature = "jemalloc")]
    {
        // The counters are a snapshot, taken again each time the epoch moves on.
        mallctl_write(c"epoch", 1u64).ok()?;
        Some(JemallocStats {
            allocated: mallctl_read(c"stats.allocated").ok()?,
            active: mallctl_read(c"stats.active").ok()?,
            metadata: mallctl_read(c"stats.metadata").ok()?,
            resident: mallctl_read(c"stats.resident").ok()?,
        })
    }
    #[cfg(not(feature = "jemalloc"))]
    {
        None
    }
}

/// A value jemalloc's control interface accepts; sealed to the C types its settings use, so
/// `mallctl` is never handed a value of another size.
#[cfg(feature = "jemalloc")]
trait MallctlValue: Copy + Default {}
#[cfg(feature = "jemalloc")]
impl MallctlValue for bool {}
#[cfg(feature = "jemalloc")]
impl MallctlValue for u32 {}
#[cfg(feature = "jemalloc")]
impl MallctlValue for usize {}
#[cfg(feature = "jemalloc")]
impl MallctlValue for u64 {}
#[cfg(feature = "jemalloc")]
impl MallctlValue for isize {}

/// Sets jemalloc setting `name` (whose C type must be `T`'s: every caller names a setting
/// documented with that type) to `value`.
#[cfg(feature = "jemalloc")]
#[allow(unsafe_code)]
fn mallctl_write<T: MallctlValue>(name: &std::ffi::CStr, mut value: T) -> std::io::Result<()> {
    // SAFETY: `name` is NUL-terminated; no old value is asked for (null pointers, as the API
    // allows); `newp` points at a live `T` of `newlen` bytes that jemalloc only reads during the
    // call, and `T` is the setting's C type (bool, unsigned, size_t or ssize_t), so it reads
    // exactly that many bytes.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            (&raw mut value).cast(),
            std::mem::size_of::<T>(),
        )
    };
    match rc {
        0 => Ok(()),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

/// Reads jemalloc setting `name`, whose C type must be `T`'s.
#[cfg(feature = "jemalloc")]
#[allow(unsafe_code)]
fn mallctl_read<T: MallctlValue>(name: &std::ffi::CStr) -> std::io::Result<T> {
    let mut value = T::default();
    let mut len = std::mem::size_of::<T>();
    // SAFETY: `name` is NUL-terminated; `oldp` points at a live `T` and `oldlenp` holds its
    // size, so jemalloc writes at most that many bytes (it fails with EINVAL on a size
    // mismatch); no new value is given.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            (&raw mut value).cast(),
            &raw mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    match rc {
        0 => Ok(value),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_memory_goes_back_to_the_kernel() {
        if !cfg!(all(target_os = "linux", target_env = "gnu")) {
            return;
        }
        // Many mid-sized blocks (below the mmap threshold, so they live in the arena), every
        // other one kept so the freed ones cannot simply shrink the heap from the top.
        let mut blocks: Vec<Vec<u8>> = (0..4096).map(|i| vec![i as u8; 16 * 1024]).collect();
        let mut kept = Vec::new();
        for (i, b) in blocks.drain(..).enumerate() {
            if i % 64 == 0 {
                kept.push(b);
            }
        }
        assert!(
            release_free_memory(),
            "64 MiB freed in the middle of the heap must be released"
        );
        drop(kept);
    }

    #[test]
    fn glibc_accepts_an_arena_cap() {
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            assert!(limit_arenas(2));
        }
    }

    #[cfg(feature = "jemalloc")]
    #[test]
    fn jemalloc_takes_the_operators_settings() {
        tune_jemalloc(std::time::Duration::from_secs(1)).unwrap();
        assert_eq!(mallctl_read::<isize>(c"arenas.dirty_decay_ms").unwrap(), 1000);
        assert_eq!(mallctl_read::<isize>(c"arena.0.dirty_decay_ms").unwrap(), 1000);
        assert_eq!(mallctl_read::<isize>(c"arena.0.muzzy_decay_ms").unwrap(), 0);
        assert!(mallctl_read::<bool>(c"background_thread").unwrap());
        let arena = std::thread::spawn(|| {
            on_thread_start();
            mallctl_read::<u32>(c"thread.arena").unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(arena, 0, "threads share the first arena");
        // A setting of another type is refused, not misread.
        assert!(mallctl_read::<bool>(c"arenas.dirty_decay_ms").is_err());
        assert!(mallctl_write(c"no.such.setting", 1usize).is_err());
    }

    #[cfg(feature = "jemalloc")]
    #[test]
    #[allow(unsafe_code)]
    fn jemalloc_counts_what_the_program_holds() {
        const SIZE: usize = 8 << 20;
        let before = jemalloc_stats().unwrap();
        // The tests run on the system allocator: ask jemalloc itself.
        // SAFETY: a plain allocation of SIZE bytes, freed below by jemalloc's own `free`.
        let block = unsafe { tikv_jemalloc_sys::malloc(SIZE) };
        assert!(!block.is_null());
        let holding = jemalloc_stats().unwrap();
        // SAFETY: `block` came from jemalloc's `malloc` above and is freed once.
        unsafe { tikv_jemalloc_sys::free(block) };
        let after = jemalloc_stats().unwrap();
        assert!(holding.allocated >= before.allocated + SIZE, "{before:?} {holding:?}");
        assert!(holding.active >= holding.allocated, "{holding:?}");
        assert!(after.allocated + SIZE <= holding.allocated, "{holding:?} {after:?}");
        assert!(holding.metadata > 0);
    }
}
