//! `maporl compare FIRST SECOND`: two evaluations of the same tasks, paired task by task
//! (see [`maporl::eval::paired`]).

use std::path::{Path, PathBuf};

use clap::Args;

#[derive(Args)]
pub struct CompareArgs {
    /// The first evaluation's transcripts (`transcripts.jsonl` of `maporl eval`, or
    /// `transcripts-before.jsonl` of a run with held-out tasks), or a directory: a training
    /// run's `transcripts-before.jsonl`, else `maporl eval`'s `transcripts.jsonl`.
    first: PathBuf,
    /// The second evaluation's transcripts, or a directory: a training run's
    /// `transcripts-after.jsonl`, else `maporl eval`'s `transcripts.jsonl`.
    second: PathBuf,
    /// Bootstrap resamples of the tasks.
    #[arg(long, default_value_t = 10_000)]
    resamples: usize,
    /// Seed of the resampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// A transcripts file; or in a directory, a training run's `name` or else `maporl eval`'s
/// `transcripts.jsonl`.
fn transcripts(path: &Path, name: &str) -> PathBuf {
    if !path.is_dir() {
        return path.to_path_buf();
    }
    let run = path.join(name);
    if run.exists() {
        run
    } else {
        path.join("transcripts.jsonl")
    }
}

pub fn run(args: CompareArgs) -> anyhow::Result<()> {
    let first = transcripts(&args.first, "transcripts-before.jsonl");
    let second = transcripts(&args.second, "transcripts-after.jsonl");
    let p = maporl::eval::paired(
        &maporl::eval::read_debates(&first)?,
        &maporl::eval::read_debates(&second)?,
        args.resamples,
        args.seed,
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&p)?);
    } else {
        print!("{}", p.table("first", "second"));
    }
    Ok(())
}

/// The paired comparison of a run's held-out evaluations before and after training, when
/// both transcripts are there.
pub fn held_out_table(run_dir: &Path) -> Option<String> {
    let read = |name: &str| maporl::eval::read_debates(&run_dir.join(name)).ok();
    let (before, after) = (
        read("transcripts-before.jsonl")?,
        read("transcripts-after.jsonl")?,
    );
    let p = maporl::eval::paired(&before, &after, 10_000, 0).ok()?;
    Some(p.table("before", "after"))
}
