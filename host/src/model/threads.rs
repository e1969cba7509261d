//! Which threads run candle's large elementwise ops.
//!
//! candle 0.11 splits an elementwise op of 64k elements or more across a pool of its own:
//! `CANDLE_NUM_THREADS` (by default `RAYON_NUM_THREADS`) minus one workers, which spin up to
//! 25,000 times for the next op before they sleep, and which serve one caller at a time.
//! maporl's parallelism is rayon's: agents updating side by side, attention's head groups,
//! gemm's blocks. On 2 cores the two agents' updates then queued for that pool, and shared
//! the cores with its spinning worker. With the ops on the caller's thread (no worker) the
//! quickstart's update took 2.6 s a step instead of 3.5 s, and SmolLM2-135M's 77 s instead
//! of 99 s, with the same bits (BENCHMARKS.md, "candle's elementwise pool"). One model
//! training alone, one caller, gains from the pool instead (the warm start 1.1x): the
//! `maporl` command keeps it for `warm-start` and `verifier train`.

/// Runs candle's elementwise ops on the thread that calls them (`CANDLE_NUM_THREADS=1`),
/// unless the user set `CANDLE_NUM_THREADS` (theirs wins), and starts candle's pool now so
/// that the choice is made once. Returns the pool's worker threads (0 unless the user asked
/// for more). Call it first thing in `main`, before any other thread exists, as the `maporl`
/// command does for every command but `warm-start` and `verifier train`: it sets an
/// environment variable.
pub fn elementwise_ops_inline() -> usize {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // SAFETY: the caller runs this before any other thread exists, so nothing reads the
        // environment while it changes.
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    }
    candle_core::utils::barrier_pool().n_workers()
}
