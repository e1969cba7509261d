//! `mpirun -np 2 maporl train` on one machine (loopback and shared memory): data-parallel
//! training (MAPoRL, SFT, the learned verifier) makes the update one process makes on the
//! same global batch, a resume needs the same number of ranks, and a rank that dies or hangs
//! ends the whole job in bounded time, after which `--resume` continues exactly.
//!
//! Needs a build with the `mpi` feature and OpenMPI's `mpirun` (`cargo xtask test` installs
//! it and enables both).

#![cfg(feature = "mpi")]

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// One job at a time: each is two ranks on a 2-core machine, and the timing tests (the
/// collective timeout, the bounded end of a job) must not see the others' load.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static JOBS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    JOBS.lock().unwrap_or_else(|e| e.into_inner())
}

fn tiny_model(dir: &Path) -> PathBuf {
    let model = dir.join("tiny-qwen2");
    std::fs::create_dir(&model).unwrap();
    write_tiny_qwen2(&model);
    model
}

/// `maporl train` on a tiny data-parallel run, on `ranks` processes (`None`: without
/// mpirun at all).
fn command(ranks: Option<usize>, run: &Path, model: &Path, extra: &[&str]) -> Command {
    command_with(ranks, run, model, extra, true)
}

/// [`command`], with `distributed: false` leaving `[distributed]` out of the config.
fn command_with(
    ranks: Option<usize>,
    run: &Path,
    model: &Path,
    extra: &[&str],
    distributed: bool,
) -> Command {
    job("train", ranks, run, model, extra, distributed)
}

/// `maporl SUBCOMMAND` on the tiny run's config (`subcommand`: words separated by spaces,
/// e.g. "verifier train").
fn job(
    subcommand: &str,
    ranks: Option<usize>,
    run: &Path,
    model: &Path,
    extra: &[&str],
    distributed: bool,
) -> Command {
    let config = repo().join("configs/smollm2-arith.toml");
    job_on(&config, subcommand, ranks, run, model, extra, distributed)
}

/// [`job`] on the config file `config`.
fn job_on(
    config: &Path,
    subcommand: &str,
    ranks: Option<usize>,
    run: &Path,
    model: &Path,
    extra: &[&str],
    distributed: bool,
) -> Command {
    let bin = env!("CARGO_BIN_EXE_maporl");
    let mut cmd = match ranks {
        None => Command::new(bin),
        Some(n) => {
            let mut c = Command::new("mpirun");
            c.args([
                "--allow-run-as-root",
                "--oversubscribe",
                "--bind-to",
                "none",
            ])
            .args(["--mca", "btl", "self,vader,tcp"])
            .args(["--mca", "btl_tcp_if_include", "lo"])
            .args(["-np", &n.to_string()])
            .arg(bin);
            c
        }
    };
    cmd.args(subcommand.split(' '))
        .args(["--config", config.to_str().unwrap()]);
    for set in [
        format!("model.path={}", model.display()),
        format!("run_dir={}", run.display()),
        "train.steps=3".into(),
        "debate.batch_size=4".into(),
        "debate.turns=2".into(),
        "generation.max_new_tokens=6".into(),
        "train.ppo.minibatches=2".into(),
        "train.ppo.epochs=2".into(),
        "train.ppo.lr=0.001".into(),
        "data.held_out=0".into(),
    ] {
        cmd.args(["--set", &set]);
    }
    if distributed {
        cmd.args(["--set", "distributed.placement=data"]);
    }
    // The ranks on this machine inherit mpirun's environment.
    cmd.args(extra)
        .env("MAPORL_PLUGINS", plugins_dir())
        .env("MAPORL_TEST_STALL_CHECKPOINT", "")
        .env("MAPORL_COLLECTIVE_TIMEOUT", "120");
    cmd
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn train(ranks: Option<usize>, run: &Path, model: &Path, extra: &[&str]) -> String {
    let out = command(ranks, run, model, extra).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    text(&out)
}

fn metrics(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The metrics without what differs between any two runs (wall times, memory) or between
/// numbers of ranks (the bytes sent).
fn comparable(lines: &[serde_json::Value]) -> Vec<serde_json::Value> {
    lines
        .iter()
        .map(|l| {
            let mut l = l.clone();
            fn strip(v: &mut serde_json::Value) {
                if let Some(o) = v.as_object_mut() {
                    o.retain(|k, _| {
                        !k.ends_with("_seconds")
                            && !k.ends_with("_per_second")
                            && !k.ends_with("_mib")
                            && k != "collective_bytes"
                            // Each rank shares prefixes within its share of the batch only
                            // (the reference's scoring and generation).
                            && !k.ends_with("prefix_hit_rate")
                    });
                    for v in o.values_mut() {
                        strip(v);
                    }
                }
            }
            strip(&mut l);
            l
        })
        .collect()
}

/// Every number in `a` and `b` (same shape) within `tol`; returns the largest difference.
fn close(a: &serde_json::Value, b: &serde_json::Value, tol: f64, at: &str) -> f64 {
    use serde_json::Value::*;
    match (a, b) {
        (Number(x), Number(y)) => {
            let d = (x.as_f64().unwrap() - y.as_f64().unwrap()).abs();
            assert!(d <= tol, "{at}: {x} against {y}");
            d
        }
        (Array(x), Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}");
            x.iter()
                .zip(y)
                .enumerate()
                .map(|(i, (x, y))| close(x, y, tol, &format!("{at}[{i}]")))
                .fold(0.0, f64::max)
        }
        (Object(x), Object(y)) => {
            assert_eq!(
                x.keys().collect::<Vec<_>>(),
                y.keys().collect::<Vec<_>>(),
                "{at}"
            );
            x.iter()
                .map(|(k, v)| close(v, &y[k], tol, &format!("{at}.{k}")))
                .fold(0.0, f64::max)
        }
        _ => {
            assert_eq!(a, b, "{at}");
            0.0
        }
    }
}

/// Two 3-step training runs made the same updates, within 1e-5: every metric (but times,
/// memory and bytes sent), the final adapters and value heads, and the optimizer's moments
/// in the last checkpoint. Prints the largest differences, after `what`.
fn assert_same_training(one: &Path, two: &Path, what: &str) {
    let gap = close(
        &serde_json::Value::Array(comparable(&metrics(one))),
        &serde_json::Value::Array(comparable(&metrics(two))),
        1e-5,
        "metrics",
    );
    let weights = tensor_gap(
        &one.join("checkpoints/final"),
        &two.join("checkpoints/final"),
    );
    let moments = tensor_gap(
        &one.join("checkpoints/step-000003"),
        &two.join("checkpoints/step-000003"),
    );
    assert!(weights <= 1e-5 && moments <= 1e-5, "{weights} {moments}");
    eprintln!("{what}: metrics within {gap}, weights within {weights}, moments within {moments}");
}

/// Every tensor of every safetensors file under `dir`, by relative path and name.
fn tensors(dir: &Path) -> BTreeMap<String, Vec<f32>> {
    let mut out = BTreeMap::new();
    for (rel, bytes) in files(dir) {
        if !rel.ends_with(".safetensors") {
            continue;
        }
        let file = candle_core::safetensors::load_buffer(&bytes, &candle_core::Device::Cpu)
            .unwrap_or_else(|e| panic!("{rel}: {e}"));
        for (name, t) in file {
            let v = t
                .to_dtype(candle_core::DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            out.insert(format!("{rel}:{name}"), v);
        }
    }
    out
}

/// The largest difference between two runs' tensors under `rel` (same names required).
fn tensor_gap(a: &Path, b: &Path) -> f32 {
    let (x, y) = (tensors(a), tensors(b));
    assert!(!x.is_empty(), "no tensors under {}", a.display());
    assert_eq!(
        x.keys().collect::<Vec<_>>(),
        y.keys().collect::<Vec<_>>(),
        "{} against {}",
        a.display(),
        b.display()
    );
    let mut gap = 0.0f32;
    for (k, v) in &x {
        let w = &y[k];
        assert_eq!(v.len(), w.len(), "{k}");
        for (p, q) in v.iter().zip(w) {
            assert!(p.is_finite() && q.is_finite(), "{k}");
            gap = gap.max((p - q).abs());
        }
    }
    gap
}

#[test]
fn two_ranks_make_the_update_one_process_makes_on_the_same_batch() {
    let _job = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let one = dir.path().join("one");
    let two = dir.path().join("two");
    train(None, &one, &model, &[]);
    let printed = train(Some(2), &two, &model, &[]);
    // Rank 0 alone speaks for the run.
    assert_eq!(printed.matches("trained 3 steps").count(), 1, "{printed}");

    let (a, b) = (metrics(&one), metrics(&two));
    assert_eq!(a.len(), 3);
    assert_eq!(b.len(), 3, "rank 0 alone writes the metrics");
    for line in &b {
        let sent = line["collective_bytes"].as_u64().unwrap();
        assert!(sent > 0, "{line}");
        assert_eq!(line["tasks"], 4, "the whole batch's debates: {line}");
    }
    assert!(
        a[0].get("collective_bytes").is_none(),
        "one process sends nothing"
    );
    assert_same_training(&one, &two, "np 2 against np 1");
    // The run directory is rank 0's alone: one config, one lock, no second metrics file.
    for f in ["config.toml", "plugins.lock", "metrics.jsonl"] {
        assert!(two.join(f).is_file(), "{f}");
    }
}

/// GRPO's groups split between ranks (2 questions, each debated twice: each rank holds
/// one group): the update is the one process's, as PPO's is.
#[test]
fn with_grpo_two_ranks_make_the_update_one_process_makes() {
    let _job = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let grpo = [
        "--set",
        "train.algorithm=grpo",
        "--set",
        "train.grpo.group_size=2",
    ];
    let one = dir.path().join("one");
    let two = dir.path().join("two");
    train(None, &one, &model, &grpo);
    train(Some(2), &two, &model, &grpo);
    for line in metrics(&two) {
        assert!(line["agents"]["0"]["zero_spread"].is_number(), "{line}");
    }
    assert_same_training(&one, &two, "GRPO, np 2 against np 1");
}

#[test]
fn two_ranks_evaluate_the_debates_one_process_holds() {
    // Five held-out tasks over two ranks (three and two): rank 0 gathers them and writes the
    // same transcripts and report, to the byte, as one process with or without
    // [distributed] (every response draws from its own stream), and alone prints the table.
    let _job = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let eval = |ranks: Option<usize>, name: &str, distributed: bool| {
        let run = dir.path().join(name);
        let extra = [
            "--set",
            "data.held_out=5",
            "--set",
            "generation.max_new_tokens=12",
        ];
        let out = job("eval", ranks, &run, &model, &extra, distributed)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let read = |f: &str| std::fs::read_to_string(run.join(f)).unwrap();
        (text(&out), read("eval.json"), read("transcripts.jsonl"))
    };
    let (_, report, transcripts) = eval(None, "plain", false);
    assert_eq!(transcripts.lines().count(), 5, "{transcripts}");
    for (ranks, name) in [(None, "one"), (Some(2), "two")] {
        let (printed, r, t) = eval(ranks, name, true);
        assert_eq!(r, report, "{name}: eval.json");
        assert_eq!(t, transcripts, "{name}: transcripts.jsonl");
        assert_eq!(printed.matches("majority accuracy").count(), 1, "{printed}");
    }
    // A command that runs in one process only refuses several.
    let out = job(
        "warm-start",
        Some(2),
        &dir.path().join("w"),
        &model,
        &[],
        true,
    )
    .output()
    .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).contains(
            "only `maporl train`, `maporl eval` and `maporl verifier train` run over several \
             processes"
        ),
        "{}",
        text(&out)
    );
    // So does the off-the-shelf baseline (an evaluation: `maporl eval` shares one), with
    // [distributed] or without.
    for distributed in [false, true] {
        let run = dir.path().join(format!("off-{distributed}"));
        let extra = ["--set", "train.mode=off-the-shelf"];
        let out = job("train", Some(2), &run, &model, &extra, distributed)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let said = text(&out);
        assert!(
            said.contains("train.mode = \"off-the-shelf\" is an evaluation")
                && said.contains("maporl eval"),
            "{said}"
        );
        assert!(!run.exists(), "a refused run writes nothing");
    }
}

#[test]
fn the_held_out_evaluations_are_shared_between_ranks() {
    // A run with five held-out tasks on two ranks: rank 0 writes the evaluation before
    // training byte for byte as one process does, and the one after it over every task.
    let _job = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let extra = ["--set", "data.held_out=5", "--set", "train.steps=1"];
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    train(None, &one, &model, &extra);
    let printed = train(Some(2), &two, &model, &extra);
    assert_eq!(
        printed.matches("held-out tasks, after training:").count(),
        1,
        "{printed}"
    );
    let read = |run: &Path, f: &str| std::fs::read_to_string(run.join(f)).unwrap();
    for f in ["eval-before.json", "transcripts-before.jsonl"] {
        assert_eq!(read(&one, f), read(&two, f), "{f}");
    }
    assert_eq!(read(&two, "transcripts-after.jsonl").lines().count(), 5);
}

#[test]
fn a_resume_needs_as_many_ranks_as_the_run_had() {
    let _job = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let run = dir.path().join("run");
    train(Some(2), &run, &model, &["--stop-after", "1"]);
    let state = std::fs::read_to_string(run.join("checkpoints/step-000001/state.json")).unwrap();
    assert!(state.contains("\"ranks\": 2"), "{state}");
    let out = command(None, &run, &model, &["--resume"]).output().unwrap();
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains("written by a run on 2 process(es), this run has 1")
            && said.contains("mpirun -np 2"),
        "{said}"
    );
    // And a run on two ranks without [distributed] is refused, saying what to add.
    let other = dir.path().join("other");
    let out = command_with(Some(2), &other, &model, &[], false)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains("its config has no [distributed] table"),
        "{said}"
    );
    assert!(!other.exists(), "a refused run writes nothing");
}

/// The pid of rank `rank` among `mpirun`'s descendants (OMPI_COMM_WORLD_RANK in its
/// environment).
fn rank_pid(launcher: u32, rank: usize) -> Option<u32> {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if env.split(|&b| b == 0).any(|kv| kv == want.as_bytes()) && descends_from(pid, launcher) {
            return Some(pid);
        }
    }
    None
}

fn descends_from(mut pid: u32, ancestor: u32) -> bool {
    for _ in 0..16 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        // pid (comm) state ppid ...
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let ppid: u32 = after.split(' ').nth(1).unwrap().parse().unwrap();
        if ppid == ancestor {
            return true;
        }
        if ppid <= 1 {
            return false;
        }
        pid = ppid;
    }
    false
}

/// Waits for `child` at most `limit`; kills it (and fails) past that.
fn wait_bounded(
    child: &mut std::process::Child,
    limit: Duration,
) -> (std::process::ExitStatus, Duration) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("the job was still running {limit:?} after a rank died");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "stalls a checkpoint through a hook: needs --features test-hooks"
)]
fn a_killed_rank_ends_the_job_and_resume_continues_exactly() {
    killed_rank_then_resume(&[]);
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "stalls a checkpoint through a hook: needs --features test-hooks"
)]
fn with_one_agent_per_rank_a_killed_rank_ends_the_job_and_resume_continues_exactly() {
    // Rank 1 dies after writing its agent into the staging directory of step 2, while rank
    // 0 finishes it: the half-made checkpoint is not taken, the resume starts from step 1.
    killed_rank_then_resume(&AGENTS);
}

/// Kills rank 1 of a two-rank run (`placement`: extra arguments) while rank 0 writes the
/// checkpoint of step 2; the job must end by itself, and `--resume` must continue from
/// step 1's checkpoint to the run that was never killed.
fn killed_rank_then_resume(placement: &[&str]) {
    let _job = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let every: Vec<&str> = ["--set", "train.checkpoint_every=1"]
        .into_iter()
        .chain(placement.iter().copied())
        .collect();
    let whole = dir.path().join("whole");
    train(Some(2), &whole, &model, &every);

    // Rank 0 stalls writing the checkpoint of step 2 (step 1's is complete); rank 1 waits
    // for it in a barrier, and is killed there.
    let run = dir.path().join("killed");
    let mut cmd = command(Some(2), &run, &model, &every);
    cmd.env("MAPORL_TEST_STALL_CHECKPOINT", "2")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut job = cmd.spawn().unwrap();
    let start = Instant::now();
    while !run.join("checkpoint-stalled").exists() {
        assert!(start.elapsed() < Duration::from_secs(300), "never stalled");
        assert!(
            job.try_wait().unwrap().is_none(),
            "the job ended before the stall"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let victim = rank_pid(job.id(), 1).expect("rank 1's process");
    let killed = Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // The collective timeout is 120 s: the job must end well before it, by mpirun's
    // noticing the dead rank.
    let (status, took) = wait_bounded(&mut job, Duration::from_secs(60));
    assert!(!status.success(), "a job with a dead rank succeeded");
    eprintln!("the job ended {took:?} after rank 1 was killed");
    assert!(
        run.join("checkpoints/step-000001/state.json").is_file(),
        "the last complete checkpoint"
    );

    let resume: Vec<&str> = ["--resume"].into_iter().chain(every).collect();
    train(Some(2), &run, &model, &resume);
    assert_eq!(
        comparable(&metrics(&run)),
        comparable(&metrics(&whole)),
        "the resumed run's metrics"
    );
    assert_eq!(
        tensor_gap(
            &run.join("checkpoints/final"),
            &whole.join("checkpoints/final")
        ),
        0.0,
        "the resumed run's adapters and value heads"
    );
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "stalls a checkpoint through a hook: needs --features test-hooks"
)]
fn a_rank_that_hangs_ends_the_job_after_the_collective_timeout() {
    // Rank 1 waits for the checkpoint in a barrier.
    hung_rank(&[], "barrier");
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "stalls a checkpoint through a hook: needs --features test-hooks"
)]
fn with_one_agent_per_rank_a_rank_that_hangs_ends_the_job_after_the_collective_timeout() {
    // Rank 1 has written its agent and waits for rank 0 to say how the checkpoint ended.
    hung_rank(&AGENTS, "broadcast (size)");
}

/// Rank 0 stalls (10 minutes) in the checkpoint of step 1; rank 1's `collective` gives up
/// after 5 s, and its exit ends the job.
fn hung_rank(placement: &[&str], collective: &str) {
    let _job = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let run = dir.path().join("hung");
    let mut cmd = command(Some(2), &run, &model, placement);
    cmd.env("MAPORL_TEST_STALL_CHECKPOINT", "1")
        .env("MAPORL_COLLECTIVE_TIMEOUT", "5")
        .args(["--set", "train.checkpoint_every=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut job = cmd.spawn().unwrap();
    let (status, took) = wait_bounded(&mut job, Duration::from_secs(300));
    let mut err = String::new();
    std::io::Read::read_to_string(job.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert!(
        run.join("checkpoint-stalled").exists(),
        "the stall was reached: {err}"
    );
    assert!(
        err.contains(&format!(
            "rank 1 of 2: the collective `{collective}` has waited more than 5 s"
        )),
        "{err}"
    );
    eprintln!("the job ended {took:?} after it started");
}

#[test]
fn ranks_that_do_not_run_the_same_config_stop_naming_what_differs() {
    let _job = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let run = dir.path().join("run");
    // Two programs in one job (MPMD): the second rank's config has another seed.
    let args = |seed: &str| -> Vec<String> {
        command(None, &run, &model, &["--set", seed])
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    };
    let bin = env!("CARGO_BIN_EXE_maporl");
    let out = Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "--bind-to",
            "none",
        ])
        .args(["--mca", "btl", "self,vader,tcp"])
        .args(["--mca", "btl_tcp_if_include", "lo"])
        .args(["-np", "1", bin])
        .args(args("seed=0"))
        .args([":", "-np", "1", bin])
        .args(args("seed=1"))
        .env("MAPORL_PLUGINS", plugins_dir())
        .env("MAPORL_COLLECTIVE_TIMEOUT", "120")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains(
            "the ranks of this job do not run the same config (sha256 of the resolved config.toml)"
        ) && said.contains("rank(s) [1]"),
        "{said}"
    );
    assert!(!run.join("metrics.jsonl").exists(), "nothing was trained");
}

#[test]
fn sigusr1_to_mpirun_checkpoints_every_rank_after_the_same_step_and_resume_is_exact() {
    let _job = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let four = ["--set", "train.steps=4"];
    let whole = dir.path().join("whole");
    train(Some(2), &whole, &model, &four);

    let run = dir.path().join("stopped");
    let mut cmd = command(Some(2), &run, &model, &four);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let job = cmd.spawn().unwrap();
    let start = Instant::now();
    while !std::fs::read_to_string(run.join("metrics.jsonl")).is_ok_and(|m| !m.is_empty()) {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "no step finished"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let sent = Command::new("kill")
        .args(["-USR1", &job.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let out = job.wait_with_output().unwrap();
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("continue with --resume"), "{said}");
    let stopped_at = metrics(&run).len();
    assert!(stopped_at < 4, "stopped early: {said}");

    train(Some(2), &run, &model, &["--resume", four[0], four[1]]);
    assert_eq!(comparable(&metrics(&run)), comparable(&metrics(&whole)));
    assert_eq!(
        tensor_gap(
            &run.join("checkpoints/final"),
            &whole.join("checkpoints/final")
        ),
        0.0
    );
}

/// Every file under `dir`, by relative path, in order.
fn file_names(dir: &Path) -> Vec<String> {
    files(dir).into_keys().collect()
}

/// The event files' names hold the host and the time: the directory without them.
fn without_events(names: Vec<String>) -> Vec<String> {
    names
        .into_iter()
        .filter(|n| !n.contains("events.out.tfevents"))
        .collect()
}

/// The largest absolute value among the tensors under `dir` whose name holds `part`.
fn largest(dir: &Path, part: &str) -> f32 {
    tensors(dir)
        .iter()
        .filter(|(k, _)| k.contains(part))
        .flat_map(|(_, v)| v.iter().map(|x| x.abs()))
        .fold(0.0, f32::max)
}

#[test]
fn sft_on_two_ranks_tunes_the_adapters_one_process_tunes() {
    // Five training tasks debated three and two, the best three kept (six utterances per
    // agent), minibatches of three split two and one between the ranks, two epochs; three
    // held-out tasks evaluated before and after, shared between the ranks.
    let _job = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let extra = [
        "--set",
        "train.mode=sft",
        "--set",
        "train.sft.top_fraction=0.5",
        "--set",
        "train.sft.epochs=2",
        "--set",
        "train.sft.batch_size=3",
        "--set",
        "train.sft.lr=0.01",
        "--set",
        "data.held_out=3",
    ];
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    let sft = |ranks: Option<usize>, run: &Path| {
        let out = job("train", ranks, run, &model, &extra, true)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        text(&out)
    };
    sft(None, &one);
    let printed = sft(Some(2), &two);
    // Rank 0 alone speaks for the run and writes it: the same files as one process's.
    assert_eq!(printed.matches("SFT done").count(), 1, "{printed}");
    assert_eq!(
        printed.matches("held-out tasks, after training:").count(),
        1,
        "{printed}"
    );
    assert_eq!(
        without_events(file_names(&two)),
        without_events(file_names(&one))
    );
    let read = |run: &Path, f: &str| std::fs::read_to_string(run.join(f)).unwrap();
    // The same debates (gathered from both ranks), so the same kept ones.
    for f in [
        "transcripts.jsonl",
        "eval-before.json",
        "transcripts-before.jsonl",
    ] {
        assert_eq!(read(&one, f), read(&two, f), "{f}");
    }
    assert_eq!(read(&two, "transcripts.jsonl").lines().count(), 5);
    assert_eq!(read(&two, "transcripts-after.jsonl").lines().count(), 3);
    let (a, b) = (metrics(&one), metrics(&two));
    assert_eq!(a.len(), 4, "two agents x two epochs: {a:?}");
    let gap = close(
        &serde_json::Value::Array(comparable(&a)),
        &serde_json::Value::Array(comparable(&b)),
        1e-5,
        "metrics",
    );
    let weights = tensor_gap(
        &one.join("checkpoints/final"),
        &two.join("checkpoints/final"),
    );
    assert!(weights <= 1e-5, "the adapters differ by {weights}");
    // The tuning moved the adapters far more than the tolerance (LoRA's B starts at 0).
    let moved = largest(&two.join("checkpoints/final"), "lora_B");
    assert!(moved > 1e-3, "lora_B at most {moved}");
    eprintln!("sft, np 2 against np 1: metrics within {gap}, adapters within {weights} (lora_B up to {moved})");
}

/// Labelled answers to "What is a + b?": `per_class` right and wrong per question.
fn answers(path: &Path, questions: usize, per_class: usize) {
    let mut out = Vec::new();
    for q in 0..questions {
        let (a, b) = (1 + q % 3, 1 + q / 3 % 2);
        for k in 0..2 * per_class {
            let correct = k % 2 == 0;
            let c = if correct { a + b } else { a + b + 1 + k };
            out.push(maporl::verifier::data::Sample {
                task_id: format!("q{q}"),
                question: format!("What is {a} + {b}?"),
                response: format!("The answer is \\boxed{{{c}}}."),
                correct,
                answer: Some(c.to_string()),
                reference: (a + b).to_string(),
            });
        }
    }
    maporl::verifier::data::write_jsonl(path, &out).unwrap();
}

/// `maporl verifier train` on the tiny model: 16 training answers in minibatches of 5 (the
/// last of one, which rank 1 has no share of), 2 epochs (8 steps), validation on 8.
fn verifier_train(
    ranks: Option<usize>,
    run: &Path,
    model: &Path,
    data: &Path,
    extra: &[&str],
) -> Output {
    let mut args = vec![
        "--data".to_string(),
        data.display().to_string(),
        "--out".into(),
        run.display().to_string(),
    ];
    for set in [
        "verifier.max_response_tokens=64",
        "verifier.train.epochs=2",
        "verifier.train.batch_size=5",
        "verifier.train.lr=0.002",
        "verifier.train.lora_r=4",
        "verifier.train.lora_alpha=8.0",
        "verifier.train.val_fraction=0.25",
        "verifier.train.checkpoint_every=0",
    ] {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    job("verifier train", ranks, run, model, &args, true)
        .output()
        .unwrap()
}

#[test]
fn verifier_train_on_two_ranks_trains_the_verifier_one_process_trains() {
    let _job = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let data = dir.path().join("answers.jsonl");
    answers(&data, 6, 2);
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    let out = verifier_train(None, &one, &model, &data, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let out = verifier_train(Some(2), &two, &model, &data, &[]);
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert_eq!(
        printed.matches("verifier trained: 8 steps").count(),
        1,
        "rank 0 alone speaks for the run: {printed}"
    );
    assert_eq!(
        without_events(file_names(&two)),
        without_events(file_names(&one))
    );
    let (a, b) = (metrics(&one), metrics(&two));
    assert_eq!(a.len(), 2, "one line per epoch: {a:?}");
    let gap = close(
        &serde_json::Value::Array(comparable(&a)),
        &serde_json::Value::Array(comparable(&b)),
        1e-5,
        "metrics",
    );
    let meta = |run: &Path| -> serde_json::Value {
        serde_json::from_str(
            &std::fs::read_to_string(run.join("checkpoints/final/verifier.json")).unwrap(),
        )
        .unwrap()
    };
    close(&meta(&one), &meta(&two), 1e-5, "verifier.json");
    // The adapter and head, and the optimizer's moments in the last checkpoint.
    let weights = tensor_gap(
        &one.join("checkpoints/final"),
        &two.join("checkpoints/final"),
    );
    let moments = tensor_gap(
        &one.join("checkpoints/step-000008"),
        &two.join("checkpoints/step-000008"),
    );
    assert!(weights <= 1e-5 && moments <= 1e-5, "{weights} {moments}");
    let moved = largest(&two.join("checkpoints/final"), "lora_B");
    assert!(moved > 1e-3, "lora_B at most {moved}");
    eprintln!(
        "verifier train, np 2 against np 1: metrics within {gap}, weights within {weights}, \
         moments within {moments} (lora_B up to {moved})"
    );

    // Stopped after step 3 on two ranks: a resume on one is refused, one on two ends as the
    // uninterrupted run did, to the bit.
    let run = dir.path().join("stopped");
    let out = verifier_train(Some(2), &run, &model, &data, &["--stop-after", "3"]);
    assert!(out.status.success(), "{}", text(&out));
    let state = std::fs::read_to_string(run.join("checkpoints/step-000003/state.json")).unwrap();
    assert!(state.contains("\"ranks\": 2"), "{state}");
    let out = verifier_train(None, &run, &model, &data, &["--resume"]);
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains("written by a run on 2 process(es), this run has 1")
            && said.contains("mpirun -np 2"),
        "{said}"
    );
    let out = verifier_train(Some(2), &run, &model, &data, &["--resume"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(comparable(&metrics(&run)), comparable(&metrics(&two)));
    assert_eq!(
        tensor_gap(
            &run.join("checkpoints/final"),
            &two.join("checkpoints/final")
        ),
        0.0
    );
}

/// The tiny run's config with a team of two models, agent 0's `model` and agent 1's a copy
/// of it in a directory of its own (so that one process loads two models, as a team of two
/// model families would), and one agent per rank.
fn team_of_two_models(dir: &Path, model: &Path) -> PathBuf {
    let other = dir.join("tiny-qwen2-b");
    std::fs::create_dir(&other).unwrap();
    write_tiny_qwen2(&other);
    let mut text = std::fs::read_to_string(repo().join("configs/smollm2-arith.toml")).unwrap();
    text.push_str(&format!(
        "\n[[agents]]\nmodel = {:?}\n\n[[agents]]\nmodel = {:?}\n",
        model.display().to_string(),
        other.display().to_string()
    ));
    let config = dir.join("team.toml");
    std::fs::write(&config, text).unwrap();
    config
}

const AGENTS: [&str; 2] = ["--set", "distributed.placement=agents"];

/// `maporl train` with one agent per rank on the two-model team.
fn train_agents(
    config: &Path,
    ranks: Option<usize>,
    run: &Path,
    model: &Path,
    extra: &[&str],
) -> String {
    // Three held-out tasks, debated before and after training.
    let held = ["--set", "data.held_out=3"];
    let extra: Vec<&str> = AGENTS.iter().chain(&held).chain(extra).copied().collect();
    let out = job_on(config, "train", ranks, run, model, &extra, true)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    text(&out)
}

#[test]
fn one_agent_per_rank_trains_as_one_process_does_and_resumes_exactly() {
    let _job = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let config = team_of_two_models(dir.path(), &model);
    let (one, two, stopped) = (
        dir.path().join("one"),
        dir.path().join("two"),
        dir.path().join("stopped"),
    );
    let printed_one = train_agents(&config, None, &one, &model, &[]);
    assert!(
        printed_one.contains("devices: agent 0 on cpu (auto), agent 1 on cpu (auto)"),
        "one process holds both agents: {printed_one}"
    );
    let printed = train_agents(&config, Some(2), &two, &model, &[]);
    // Each rank loads its own agent's model, and only it.
    assert!(
        printed.contains("devices: agent 0 on cpu (auto)\n")
            && printed.contains("devices: agent 1 on cpu (auto)\n")
            && !printed.contains("agent 0 on cpu (auto), agent 1"),
        "{printed}"
    );
    assert_eq!(printed.matches("trained 3 steps").count(), 1, "{printed}");
    let b = metrics(&two);
    assert_eq!(b.len(), 3, "rank 0 alone writes the metrics");
    for line in &b {
        assert!(line["collective_bytes"].as_u64().unwrap() > 0, "{line}");
        let agents = line["agents"].as_object().unwrap();
        assert_eq!(
            agents.keys().collect::<Vec<_>>(),
            ["0", "1"],
            "both agents' statistics, gathered to rank 0: {line}"
        );
        assert!(line["optimize_seconds"].as_f64().unwrap() > 0.0, "{line}");
    }
    // Each rank wrote its own agent (adapter, value head, AdamW moments) into rank 0's
    // checkpoint and final adapters.
    assert_same_training(&one, &two, "agents on 2 ranks against 1 process");
    // The held-out evaluations: every rank takes part in every debate, rank 0 writes.
    for f in [
        "eval-before.json",
        "transcripts-before.jsonl",
        "eval-after.json",
        "transcripts-after.jsonl",
    ] {
        let read = |run: &Path| std::fs::read_to_string(run.join(f)).unwrap();
        assert_eq!(read(&one), read(&two), "{f}");
    }
    assert_eq!(
        std::fs::read_to_string(two.join("transcripts-after.jsonl"))
            .unwrap()
            .lines()
            .count(),
        3
    );
    let state = std::fs::read_to_string(two.join("checkpoints/step-000003/state.json")).unwrap();
    assert!(state.contains("\"ranks\": 2"), "{state}");
    assert!(!two.join("checkpoints").read_dir().unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with(".staging")));

    // Stopped after a step and resumed on two ranks: the run that never stopped, exactly.
    train_agents(&config, Some(2), &stopped, &model, &["--stop-after", "1"]);
    assert_eq!(metrics(&stopped).len(), 1);
    train_agents(&config, Some(2), &stopped, &model, &["--resume"]);
    assert_eq!(comparable(&metrics(&stopped)), comparable(&b));
    assert_eq!(
        tensor_gap(
            &stopped.join("checkpoints/final"),
            &two.join("checkpoints/final")
        ),
        0.0
    );
}

#[test]
fn one_agent_per_rank_evaluates_the_debates_one_process_holds() {
    let _job = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let config = team_of_two_models(dir.path(), &model);
    let eval = |ranks: Option<usize>, name: &str| {
        let run = dir.path().join(name);
        let extra = [
            "--set",
            "data.held_out=5",
            "--set",
            "generation.max_new_tokens=12",
            AGENTS[0],
            AGENTS[1],
        ];
        let out = job_on(&config, "eval", ranks, &run, &model, &extra, true)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let read = |f: &str| std::fs::read_to_string(run.join(f)).unwrap();
        (text(&out), read("eval.json"), read("transcripts.jsonl"))
    };
    let (_, report, transcripts) = eval(None, "one");
    assert_eq!(transcripts.lines().count(), 5, "{transcripts}");
    let (printed, r, t) = eval(Some(2), "two");
    assert_eq!(r, report, "eval.json");
    assert_eq!(t, transcripts, "transcripts.jsonl");
    assert_eq!(printed.matches("majority accuracy").count(), 1, "{printed}");
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "skews a rank's rewards through a hook: needs --features test-hooks"
)]
fn ranks_whose_plugins_disagree_stop_naming_the_plugin() {
    // With one agent per rank every rank runs the plugins; a rank whose shaper gives other
    // rewards for the same debates (as a nondeterministic plugin would) stops the run at
    // that step, naming the shaper, before anything of the step is saved.
    let _job = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let config = team_of_two_models(dir.path(), &model);
    let run = dir.path().join("run");
    let mut cmd = job_on(&config, "train", Some(2), &run, &model, &AGENTS, true);
    let out = cmd
        .env("MAPORL_TEST_SKEW_REWARDS_ON_RANK", "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains("step 0")
            && said.contains(
                "the shaper plugin (influence.wasm) gave rank 1 other rewards than rank 0"
            ),
        "{said}"
    );
    assert_eq!(
        std::fs::read_to_string(run.join("metrics.jsonl")).unwrap(),
        ""
    );
    assert!(!run.join("checkpoints/latest").exists());

    // More ranks than agents: refused before anything is written.
    let other = dir.path().join("other");
    let out = job_on(&config, "train", Some(3), &other, &model, &AGENTS, true)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = text(&out);
    assert!(said.contains("this job has 3 ranks for 2 agents"), "{said}");
    assert!(!other.exists(), "a refused run writes nothing");
}
