fn main() {
    keep_freed_memory();
    std::process::exit(maporl::cli::main());
}

/// Candle allocates a fresh buffer for every tensor op. With glibc's defaults, buffers over
/// 128 KiB are mmapped and unmapped each time, and every reuse pays page faults: a training
/// step then spends about half its time in the kernel. Serving buffers up to 32 MiB from the
/// heap and keeping freed memory halves the warm start's step time (BENCHMARKS.md). A user's
/// own `MALLOC_*` settings win.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let user_set = std::env::vars_os().any(|(k, _)| k.to_string_lossy().starts_with("MALLOC_"));
        if !user_set {
            // SAFETY: mallopt only changes allocator thresholds; it is called before any
            // other thread exists.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
                libc::mallopt(libc::M_TOP_PAD, 256 << 20);
            }
        }
    }
}
