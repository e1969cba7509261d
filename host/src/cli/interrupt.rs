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
