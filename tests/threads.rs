//! The `maporl` process's set-up of candle's elementwise pool
//! ([`maporl::model::elementwise_ops_inline`]): no worker threads unless the user asked for
//! some with `CANDLE_NUM_THREADS`. Its own `main` (no test harness): the pool is one per
//! process and the call must come before any other thread exists, so each case runs in a
//! child process of this binary.

use std::process::Command;

const CHILD: &str = "MAPORL_TEST_THREADS_CHILD";

fn main() {
    if std::env::var_os(CHILD).is_some() {
        println!("workers {}", maporl::model::elementwise_ops_inline());
        return;
    }
    let me = std::env::current_exe().unwrap();
    let workers = |candle: Option<&str>| {
        let mut c = Command::new(&me);
        c.env(CHILD, "1").env("RAYON_NUM_THREADS", "4");
        match candle {
            Some(n) => c.env("CANDLE_NUM_THREADS", n),
            None => c.env_remove("CANDLE_NUM_THREADS"),
        };
        let out = c.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    // Without the call, candle would give RAYON_NUM_THREADS − 1 = 3 workers.
    assert_eq!(
        workers(None),
        "workers 0",
        "the ops should run on the caller's thread"
    );
    // The user's choice wins.
    assert_eq!(workers(Some("3")), "workers 2");
    println!("threads: 2 cases passed");
}
