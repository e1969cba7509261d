//! The team's evaluation: the `eval` command, the `off-the-shelf` baseline, and the
//! held-out evaluation before and after training.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::config::Config;
use crate::debate::{self, Debate, PluginHashes};
use crate::distributed::{self as dist, World};
use crate::eval::Report;
use crate::files::write_atomic;
use crate::session::{held_out as split, tasks, Progress, Session};
use crate::transcript::Task;

/// What an evaluation did and where it wrote it.
pub struct Evaluation {
    pub run_dir: PathBuf,
    pub report: Report,
    pub debates: Vec<Debate>,
    /// Wall time of the debates, and the parts of it in plugins and generating.
    pub elapsed: Duration,
    pub plugin_time: Duration,
    pub team_time: Duration,
}

/// Debates over the config's evaluation tasks (the held-out set, when it has one) with the
/// team as configured; writes `config.toml`, `plugins.lock`, the transcripts and `eval.json`
/// into the run directory.
///
/// Under `mpirun -np N` (with `[distributed]`), each rank debates a contiguous share of the
/// tasks and rank 0 gathers them and writes the run directory; since every response draws
/// from its own stream (seed, task, agent, turn), the debates are the ones one process
/// holds (with `placement = "agents"`, every rank takes part in every debate with its own
/// agents). The times are rank 0's.
pub fn evaluate(config: Config, progress: &mut dyn Progress) -> anyhow::Result<Evaluation> {
    let run_dir = PathBuf::from(&config.run_dir);
    let world = dist::world();
    super::check_distributed(world, &config)?;
    let leader = world.rank() == 0;
    let (tasks, _) = split(tasks(&config)?, &config)?;
    // Everything that can refuse the run (model, plugins, limits) before anything is
    // written: a refused run leaves no directory behind.
    let seed = config.seed;
    let mut session = Session::open(config)?;
    let hashes = PluginHashes::of(&session.plugins);
    super::check_same_run(world, &session.config, &hashes)?;
    if leader {
        session.start_run_dir(&run_dir)?;
    }
    // Paired draws: another row (config, checkpoint) evaluated at this seed shares this
    // one's sampling noise, question by question.
    session.team.pair_draws(Some(seed));
    let started = Instant::now();
    let debated = session.debate_all(share(&session, world, &tasks), "debating", progress)?;
    let debates = gather_debates(&session, world, debated.debates)?;
    let elapsed = started.elapsed();
    let report = if leader {
        debate::write_transcripts(&run_dir.join("transcripts.jsonl"), &debates, &hashes)?;
        write_report(&run_dir.join("eval.json"), &debates, &hashes)?
    } else {
        crate::eval::evaluate(&debates)
    };
    Ok(Evaluation {
        run_dir,
        report,
        debates,
        elapsed,
        plugin_time: debated.plugin_time,
        team_time: debated.team_time,
    })
}

/// The tasks this rank debates: a contiguous share of them, or all of them when the team's
/// agents are split between the ranks (every rank then takes part in every debate).
fn share<'t>(session: &Session, world: &dyn World, tasks: &'t [Task]) -> &'t [Task] {
    if session.config.spreads_agents() {
        tasks
    } else {
        &tasks[dist::shard(tasks.len(), world.rank(), world.size())]
    }
}

/// Every rank's debates of its [`share`], in rank order, on every rank.
fn gather_debates(
    session: &Session,
    world: &dyn World,
    mine: Vec<Debate>,
) -> anyhow::Result<Vec<Debate>> {
    if world.size() == 1 || session.config.spreads_agents() {
        return Ok(mine);
    }
    Ok(dist::gather_json(world, &mine, "debates")?.concat())
}

/// Debates the held-out tasks with the team as it stands, writing `eval-NAME.json` and
/// `transcripts-NAME.jsonl`. Leaves the run as it found it: the samplers are restored and
/// the plugins restarted afresh before the next step, so a run with a held-out evaluation
/// trains exactly like one without.
///
/// On several ranks each debates a share of the tasks and rank 0 gathers them and writes the
/// files (the others get the same report, unwritten).
pub(super) fn held_out(
    world: &dyn World,
    session: &mut Session,
    held: &[Task],
    run_dir: &Path,
    name: &str,
    seed: u64,
    progress: &mut dyn Progress,
) -> anyhow::Result<Report> {
    let samplers = session.team.rng_states();
    // An epoch no training step uses and paired draws at the run's seed; the same before
    // and after, so that the two evaluations (and other runs' at this seed) differ only by
    // the weights, question by question.
    session.plugins.restart(u64::MAX)?;
    session.team.pair_draws(Some(seed));
    let label = format!("evaluating ({name})");
    let mine = share(session, world, held);
    let debated = session
        .debate_all(mine, &label, progress)
        .with_context(|| format!("the held-out evaluation {name} training"));
    session.team.pair_draws(None);
    let debated = debated?;
    session.team.restore_rng_states(&samplers)?;
    let debates = gather_debates(session, world, debated.debates)
        .with_context(|| format!("gathering the held-out evaluation {name} training"))?;
    if world.rank() != 0 {
        return Ok(crate::eval::evaluate(&debates));
    }
    let hashes = PluginHashes::of(&session.plugins);
    debate::write_transcripts(
        &run_dir.join(format!("transcripts-{name}.jsonl")),
        &debates,
        &hashes,
    )?;
    write_report(
        &run_dir.join(format!("eval-{name}.json")),
        &debates,
        &hashes,
    )
}

/// The held-out report `eval-NAME.json` a run wrote.
pub(super) fn read_report(run_dir: &Path, name: &str) -> anyhow::Result<Report> {
    let path = run_dir.join(format!("eval-{name}.json"));
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not an evaluation report", path.display()))
}

/// Scores `debates` and writes the report to `path` (atomically), with the learned
/// verifier's checkpoint hash when one scored them.
fn write_report(path: &Path, debates: &[Debate], hashes: &PluginHashes) -> anyhow::Result<Report> {
    let report = crate::eval::evaluate(debates);
    let mut json = serde_json::to_value(&report)?;
    if let (Some(sha), Some(obj)) = (&hashes.verifier_checkpoint, json.as_object_mut()) {
        obj.insert("verifier_checkpoint_sha256".into(), sha.clone().into());
    }
    write_atomic(path, serde_json::to_string_pretty(&json)?.as_bytes())?;
    Ok(report)
}
