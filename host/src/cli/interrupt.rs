//! Ctrl-C for the training loops (`maporl train`, `maporl verifier train`): the first one
//! asks the loop to checkpoint after the step in progress and exit; a second one exits at
//! once (the last checkpoint stays good).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// The process's interrupt flag, set by Ctrl-C (SIGINT). The handler is installed on the
/// first call (ctrlc allows one per process); later calls return the same flag.
pub(crate) fn interrupt_flag() -> Arc<AtomicBool> {
    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    FLAG.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        let installed = ctrlc::set_handler(move || {
            if f.swap(true, Ordering::SeqCst) {
                eprintln!("\ninterrupted again: exiting without a checkpoint");
                std::process::exit(130);
            }
            eprintln!("\ninterrupted: checkpointing after this step (Ctrl-C again to exit now)");
        });
        if let Err(e) = installed {
            tracing::warn!("cannot catch Ctrl-C ({e}); an interrupt will lose the current step");
        }
        flag
    })
    .clone()
}

/// Set by SIGUSR1 (async-signal-safe: the handler only stores).
static USR1: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_usr1(_: libc::c_int) {
    USR1.store(true, Ordering::SeqCst);
}

/// Under mpirun, Ctrl-C ends the whole job at once (mpirun kills its ranks on SIGINT), so
/// the request to checkpoint and stop is SIGUSR1, which `mpirun` (and Slurm's `scancel
/// --signal=USR1`) passes on to every rank: it sets `flag` as a first Ctrl-C would, and the
/// ranks agree to stop after the same step.
pub(crate) fn stop_on_sigusr1(flag: Arc<AtomicBool>) {
    // SAFETY: the handler is async-signal-safe (one atomic store).
    let previous =
        unsafe { libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t) };
    if previous == libc::SIG_ERR {
        tracing::warn!("cannot catch SIGUSR1; `kill -USR1` will not checkpoint the run");
        return;
    }
    std::thread::spawn(move || loop {
        if USR1.load(Ordering::SeqCst) {
            if !flag.swap(true, Ordering::SeqCst) {
                eprintln!("SIGUSR1: checkpointing after this step");
            }
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handler_is_installed_once_and_every_caller_shares_its_flag() {
        let a = interrupt_flag();
        let b = interrupt_flag();
        assert!(Arc::ptr_eq(&a, &b));
    }
}
