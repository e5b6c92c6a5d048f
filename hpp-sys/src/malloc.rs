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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_accepts_an_arena_cap() {
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            assert!(limit_arenas(2));
        }
    }
}
