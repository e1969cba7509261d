//! glibc allocator settings for tensor workloads.

/// Makes glibc keep freed memory for reuse. Candle allocates a fresh buffer for every tensor
/// op; with glibc's defaults, buffers over 128 KiB are mmapped and unmapped each time, and the
/// heap above 128 KiB of free space is returned to the kernel, so every reuse pays page faults
/// and page clearing. A SmolLM2 LoRA train step (8 × 128 tokens, 7.5 GB of activations and
/// gradients) then spent about 40% of its time in `clear_page` even in steady state.
///
/// Serves every buffer from the heap (no mmap: a threshold alone stops at glibc's 32 MiB
/// ceiling, and a small model's attention weights are larger; the quickstart's update took
/// 2.6 million page faults for three steps with the threshold and 0.15 million without mmap),
/// never trims it (-1: the process keeps its peak, as PyTorch's caching allocators do) and
/// grows it in 256 MiB steps. A thread's own arena still maps a buffer too large for one of
/// its 64 MiB heaps, and the main heap falls back to mmap where it cannot grow. Call it first
/// thing in `main`, before any other thread exists. Does nothing when the user set any
/// `MALLOC_*` variable (theirs win) or off glibc.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if !user_set_malloc() {
            // SAFETY: mallopt only changes allocator thresholds; the caller runs it before
            // any other thread exists. A trim threshold of -1 disables trimming (mallopt(3));
            // i32::MAX would still trim once 2 GiB lie free at the top.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
                libc::mallopt(libc::M_MMAP_MAX, 0);
                libc::mallopt(libc::M_TRIM_THRESHOLD, -1);
                libc::mallopt(libc::M_TOP_PAD, 256 << 20);
            }
        }
    }
}

/// Whether the user set any `MALLOC_*` variable, which [`keep_freed_memory`] leaves alone.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn user_set_malloc() -> bool {
    std::env::vars_os().any(|(k, _)| k.to_string_lossy().starts_with("MALLOC_"))
}

/// This process's resident memory now (VmRSS) and its peak so far (VmHWM), in MiB, from
/// `/proc/self/status`; `None` where there is no such file (not Linux). Every training loop
/// reports it after its optimizer steps, so a run's memory trend is in its metrics.
pub fn resident_mib() -> Option<Resident> {
    Resident::parse(&std::fs::read_to_string("/proc/self/status").ok()?)
}

/// Resident memory in MiB: now and the process's peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Resident {
    pub now: u64,
    pub peak: u64,
}

impl Resident {
    /// From the text of a `/proc/PID/status` file.
    pub fn parse(status: &str) -> Option<Resident> {
        let field = |key: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(key))?;
            let kb: u64 = line[key.len()..]
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()?;
            Some(kb / 1024)
        };
        Some(Resident {
            now: field("VmRSS:")?,
            peak: field("VmHWM:")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's minor page faults so far (field 10 of /proc/thread-self/stat).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn minor_faults() -> u64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        // The command name (field 2) is in parentheses and may hold spaces.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        rest.split(' ').nth(7).unwrap().parse().unwrap()
    }

    /// A freed 40 MiB buffer (over glibc's 32 MiB mmap ceiling) is used again for the next
    /// one: the second costs no page faults, where an mmapped one would fault every page.
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn freed_buffers_are_used_again_without_page_faults() {
        if user_set_malloc() {
            return; // the user's settings win; nothing of ours to test
        }
        keep_freed_memory();
        const BYTES: usize = 40 << 20;
        let pages = (BYTES / 4096) as u64;
        let fill = |v: u8| std::hint::black_box(vec![v; BYTES]);
        let before = minor_faults();
        drop(fill(1));
        let first = minor_faults() - before;
        let before = minor_faults();
        drop(fill(2));
        let second = minor_faults() - before;
        assert!(first <= pages + 64, "the first buffer: {first} faults");
        assert!(
            second < pages / 20,
            "the second buffer: {second} faults of {pages} pages"
        );
    }

    #[test]
    fn status_files_are_read_in_mib() {
        let text = "Name:\tmaporl\nVmPeak:\t 9000000 kB\nVmHWM:\t  2097152 kB\n\
                    VmRSS:\t  1049600 kB\nThreads:\t2\n";
        assert_eq!(
            Resident::parse(text),
            Some(Resident {
                now: 1025,
                peak: 2048
            })
        );
        assert_eq!(Resident::parse("VmRSS:\t12 kB\n"), None, "no peak");
        assert_eq!(Resident::parse("VmRSS:\tmany kB\nVmHWM:\t1 kB\n"), None);
        #[cfg(target_os = "linux")]
        {
            let r = resident_mib().expect("Linux has /proc/self/status");
            assert!(r.now > 0 && r.peak >= r.now, "{r:?}");
        }
    }
}
