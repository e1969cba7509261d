//! One run over several processes (`mpirun -np N maporl train ...`): the collectives the
//! training loop needs, behind one small trait, [`World`]. A process started without
//! `mpirun` is a world of one ([`Single`]), whose collectives do nothing, so the
//! single-process path is the one it always was; under `mpirun`, a build with the `mpi`
//! feature joins MPI's world ([`mpi_world`], rsmpi over the system's OpenMPI).
//!
//! Every collective here is deterministic and gives every rank the same bytes: the sum of
//! f32 slices is taken in rank order on every rank from an all-gather, never in whatever
//! order the library's reduction tree chooses, so two runs on the same number of ranks make
//! the same update, and each rank holds the same weights as the others.
//!
//! A rank that dies (SIGKILL, OOM) must not leave the others waiting in a collective for
//! ever: MPI's world communicator keeps its default handler (errors are fatal), OpenMPI's
//! `mpirun` ends the whole job when a rank exits without finalising, and a watchdog ends a
//! rank whose collective has waited longer than `distributed.timeout_seconds`.
//!
//! ```no_run
//! let world = maporl::distributed::world();
//! let mut grads = vec![1.0f32; 4];
//! world.all_reduce_sum(&mut grads).unwrap(); // now N on every rank
//! ```

#[cfg(feature = "mpi")]
mod mpi_impl;

use std::sync::OnceLock;
use std::time::Duration;

use anyhow::bail;

/// The processes of one run and the collectives between them. Ranks are numbered from 0;
/// rank 0 is the one writer of the run directory.
pub trait World: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Every rank's `mine`, in rank order, on every rank.
    fn all_gather_bytes(&self, mine: &[u8]) -> anyhow::Result<Vec<Vec<u8>>>;
    /// Rank `root`'s `data` on every rank (the others' `data` is replaced).
    fn broadcast_bytes(&self, root: usize, data: &mut Vec<u8>) -> anyhow::Result<()>;
    /// Returns once every rank has called it.
    fn barrier(&self) -> anyhow::Result<()>;
    /// Ends every rank of the job with `code` (a rank that cannot go on; the others would
    /// otherwise wait for it).
    fn abort(&self, code: i32) -> !;
    /// Ends the world at the end of the process (MPI_Finalize); nothing for one process.
    fn finalize(&self) {}
    /// Bytes this rank has sent through collectives so far.
    fn bytes_sent(&self) -> u64 {
        0
    }
    /// Replaces `x` by its sum over ranks, added in rank order on every rank (so every rank
    /// gets the same bits, and the same ranks give the same bits every time). Every rank
    /// must pass the same length.
    fn all_reduce_sum(&self, x: &mut [f32]) -> anyhow::Result<()> {
        if self.size() == 1 {
            return Ok(());
        }
        let mine: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let all = self.all_gather_bytes(&mine)?;
        for (r, bytes) in all.iter().enumerate() {
            if bytes.len() != mine.len() {
                bail!(
                    "all-reduce: rank {r} sent {} values, rank {} sent {}: the ranks are not \
                     running the same step",
                    bytes.len() / 4,
                    self.rank(),
                    x.len()
                );
            }
        }
        for (i, v) in x.iter_mut().enumerate() {
            let at = |r: usize| {
                let b = &all[r][4 * i..4 * i + 4];
                f32::from_le_bytes([b[0], b[1], b[2], b[3]])
            };
            let mut sum = at(0);
            for r in 1..all.len() {
                sum += at(r);
            }
            *v = sum;
        }
        Ok(())
    }
}

/// A process on its own: rank 0 of 1; every collective is the identity.
#[derive(Clone, Copy, Debug, Default)]
pub struct Single;

impl World for Single {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_gather_bytes(&self, mine: &[u8]) -> anyhow::Result<Vec<Vec<u8>>> {
        Ok(vec![mine.to_vec()])
    }
    fn broadcast_bytes(&self, _root: usize, _data: &mut Vec<u8>) -> anyhow::Result<()> {
        Ok(())
    }
    fn barrier(&self) -> anyhow::Result<()> {
        Ok(())
    }
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

static WORLD: OnceLock<Box<dyn World>> = OnceLock::new();

/// The ranks the launcher says this process is one of, from the environment OpenMPI
/// (`OMPI_COMM_WORLD_SIZE`), PMIx (`PMIX_SIZE`, as Slurm's `srun --mpi=pmix` sets it) or
/// MPICH/Hydra (`PMI_SIZE`) give their processes; `None` without a launcher.
pub fn launched_size() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.parse().ok())
}

/// Joins the launcher's world when started under `mpirun`/`srun` (a build with the `mpi`
/// feature), else a world of one. Called once, first thing, by the command line; a library
/// user who never calls it gets [`Single`]. A collective that waits longer than `timeout`
/// ends the process (see the module's docs).
pub fn init(timeout: Duration) -> anyhow::Result<&'static dyn World> {
    let joined: Box<dyn World> = match launched_size() {
        Some(n) if n > 1 => mpi_world(timeout)?,
        _ => Box::new(Single),
    };
    if WORLD.set(joined).is_err() {
        bail!("distributed::init called twice");
    }
    Ok(world())
}

/// The world [`init`] joined ([`Single`] before, or without, it).
pub fn world() -> &'static dyn World {
    WORLD.get_or_init(|| Box::new(Single)).as_ref()
}

#[cfg(feature = "mpi")]
fn mpi_world(timeout: Duration) -> anyhow::Result<Box<dyn World>> {
    Ok(Box::new(mpi_impl::MpiWorld::init(timeout)?))
}

#[cfg(not(feature = "mpi"))]
fn mpi_world(_timeout: Duration) -> anyhow::Result<Box<dyn World>> {
    bail!(
        "this maporl was started as one of {} processes (under mpirun or srun), but it was \
         built without MPI support: build it with `--features mpi` (the README's commands \
         do), or run it without mpirun",
        launched_size().unwrap_or(0)
    )
}

/// The collective watchdog's limit when the config does not say (`distributed.timeout_seconds`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// The timeout the launcher's environment asks for (`MAPORL_COLLECTIVE_TIMEOUT`, seconds),
/// else [`DEFAULT_TIMEOUT`]; the world starts before the config is read.
pub fn timeout_from_env() -> anyhow::Result<Duration> {
    match std::env::var("MAPORL_COLLECTIVE_TIMEOUT") {
        Err(_) => Ok(DEFAULT_TIMEOUT),
        Ok(v) => match v.parse::<u64>() {
            Ok(s) if s > 0 => Ok(Duration::from_secs(s)),
            _ => bail!(
                "MAPORL_COLLECTIVE_TIMEOUT = {v:?}: expected a whole number of seconds above 0"
            ),
        },
    }
}

/// Checks that every rank runs the same thing: `items` are (what, fingerprint) pairs, e.g.
/// the binary's and the config's sha256; the first that differs from rank 0's is named
/// with the ranks that disagree.
pub fn check_agreement(world: &dyn World, items: &[(&str, String)]) -> anyhow::Result<()> {
    if world.size() == 1 {
        return Ok(());
    }
    let mine = serde_json::to_vec(&items.iter().map(|(_, v)| v).collect::<Vec<_>>())?;
    let all = world.all_gather_bytes(&mine)?;
    let parsed: Vec<Vec<String>> = all
        .iter()
        .map(|b| serde_json::from_slice(b).unwrap_or_default())
        .collect();
    for (i, (what, _)) in items.iter().enumerate() {
        let first = parsed[0].get(i);
        let differ: Vec<usize> = (1..parsed.len())
            .filter(|&r| parsed[r].get(i) != first)
            .collect();
        if !differ.is_empty() {
            bail!(
                "the ranks of this job do not run the same {what}: rank 0 has {}, rank(s) \
                 {differ:?} have {}; start every rank with the same binary, config and plugins",
                first.map_or("nothing", |s| s.as_str()),
                parsed[differ[0]].get(i).map_or("nothing", |s| s.as_str())
            );
        }
    }
    Ok(())
}

/// Every rank's `mine`, sent as JSON, in rank order, on every rank; `what` names it in the
/// error if a rank's is unreadable.
pub fn gather_json<T: serde::Serialize + serde::de::DeserializeOwned>(
    world: &dyn World,
    mine: &T,
    what: &str,
) -> anyhow::Result<Vec<T>> {
    use anyhow::Context as _;
    world
        .all_gather_bytes(&serde_json::to_vec(mine)?)?
        .iter()
        .enumerate()
        .map(|(r, bytes)| {
            serde_json::from_slice(bytes)
                .with_context(|| format!("rank {r}'s {what} are not readable"))
        })
        .collect()
}

/// Whether any rank says `yes` (e.g. a stop request that reached one rank, so that every
/// rank stops after the same step). A collective: every rank must call it.
pub fn any(world: &dyn World, yes: bool) -> anyhow::Result<bool> {
    let mut flag = [f32::from(u8::from(yes))];
    world.all_reduce_sum(&mut flag)?;
    Ok(flag[0] > 0.0)
}

/// Refuses to resume from the checkpoint `dir`, written by a run on `written` ranks, on a
/// world of another size; `why` says what depends on the number of ranks.
pub fn check_resume_ranks(
    world: &dyn World,
    written: usize,
    dir: &std::path::Path,
    why: &str,
) -> anyhow::Result<()> {
    if written != world.size() {
        bail!(
            "cannot resume from {}: it was written by a run on {written} process(es), this run \
             has {}; resume it with `mpirun -np {written}` (or without mpirun for 1), since {why}",
            dir.display(),
            world.size()
        );
    }
    Ok(())
}

/// Which rank holds agent `agent` when a team's agents are split between `size` ranks
/// (`distributed.placement = "agents"`): agent r on rank r, and round again when there are
/// more agents than ranks.
pub fn agent_rank(agent: usize, size: usize) -> usize {
    agent % size.max(1)
}

/// The sha256 of this process's own executable (hex).
pub fn binary_sha256() -> anyhow::Result<String> {
    use sha2::Digest as _;
    let exe = std::env::current_exe()?;
    let mut f = std::fs::File::open(&exe)
        .map_err(|e| anyhow::anyhow!("reading this binary {}: {e}", exe.display()))?;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(hex::encode(h.finalize()))
}

/// The contiguous share of `n` items that rank `rank` of `size` takes: ranks below
/// `n % size` take one more, so every item is taken once, in order.
pub fn shard(n: usize, rank: usize, size: usize) -> std::ops::Range<usize> {
    let (base, extra) = (n / size, n % size);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_item_once_in_order() {
        for n in 0..12 {
            for size in 1..5 {
                let all: Vec<usize> = (0..size).flat_map(|r| shard(n, r, size)).collect();
                assert_eq!(all, (0..n).collect::<Vec<_>>(), "{n} over {size}");
                let lens: Vec<usize> = (0..size).map(|r| shard(n, r, size).len()).collect();
                assert!(lens.iter().max().unwrap() - lens.iter().min().unwrap() <= 1);
            }
        }
    }

    #[test]
    fn a_single_world_is_the_identity() {
        let w = Single;
        let mut x = vec![1.5f32, -2.0];
        w.all_reduce_sum(&mut x).unwrap();
        assert_eq!(x, vec![1.5, -2.0]);
        assert_eq!(w.all_gather_bytes(b"ab").unwrap(), vec![b"ab".to_vec()]);
        check_agreement(&w, &[("config", "x".into())]).unwrap();
    }
}
