#!/usr/bin/env bash
# maporl train over MPI on a Slurm cluster: one rank per node (each holds the whole team;
# `[distributed] placement = "data"` splits every step's debates between them).
#
#   sbatch deploy/slurm-train.sh configs/gsm8k-maporl.toml
#
# One agent per rank (`placement = "agents"`, a team whose models do not fit on one GPU
# together): one rank per agent, each with a GPU of its own, which it sees as cuda:0 (so the
# config's agents all say device = "cuda:0"):
#
#   MAPORL_PLACEMENT=agents sbatch --nodes=1 --ntasks-per-node=2 --gpus-per-task=1 \
#     deploy/slurm-train.sh team.toml
#
# The run directory (the config's run_dir) must be on a filesystem every node sees: rank 0
# writes it, and every rank reads the checkpoint on --resume. Slurm's PMIx plugin starts the
# ranks (`srun --mpi=list` shows what this cluster has); the binary is built once, with
# `cargo build --release -p maporl --features mpi` (add `cuda` for GPUs), against the same
# OpenMPI the nodes have.
#SBATCH --job-name=maporl
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=16
#SBATCH --time=24:00:00
#SBATCH --output=maporl-%j.out
# Ten minutes before the time limit Slurm sends SIGUSR1 to every rank: they checkpoint after
# the same step and stop (continue with --resume). `scancel --signal=USR1 JOB` does the same.
#SBATCH --signal=USR1@600
set -euo pipefail
config=${1:?usage: sbatch deploy/slurm-train.sh CONFIG [maporl train args]}
shift
maporl=${MAPORL_BIN:-target/release/maporl}
# A rank that waits longer than this in a collective ends the job (another rank died).
export MAPORL_COLLECTIVE_TIMEOUT=${MAPORL_COLLECTIVE_TIMEOUT:-1800}
# --kill-on-bad-exit: one rank failing ends the others at once.
srun --mpi=pmix --kill-on-bad-exit=1 "$maporl" train --config "$config" \
  --set distributed.placement="${MAPORL_PLACEMENT:-data}" "$@"
# To continue after a failure (same number of ranks): sbatch deploy/slurm-train.sh CONFIG --resume
