//! Allocator tuning. glibc gives every thread that allocates concurrently its own arena (up to
//! 8 per core), and memory freed into an arena stays resident there. hpp's processes are small
//! servers whose threads (tokio workers, blocking-pool threads doing file system calls) all
//! allocate briefly: measured on the CSI driver, one arena per thread more than doubled the
//! resident memory after listing 10,000 volumes (25 MB against 10.5 MB with one arena) for no
//! measurable gain in speed. So each binary caps the arenas first thing in `main`.

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
}
