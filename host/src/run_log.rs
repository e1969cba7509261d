//! A run's metrics as every training command writes them: one JSON line per record in
//! `RUN/metrics.jsonl`, flushed as it goes, and the same numbers as TensorBoard scalars in
//! `RUN/tensorboard/`. Rank 0 is the one writer: on the other ranks a log takes the same
//! calls and writes nothing.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use crate::tensorboard::{scalars_of, EventWriter};

/// The metrics of one run, open for writing on rank 0.
pub(crate) struct RunLog {
    out: Option<(std::fs::File, EventWriter)>,
    path: PathBuf,
}

/// Where a [`RunLog`] starts.
pub(crate) enum Start {
    /// A new run: `metrics.jsonl` is created (emptied if it exists).
    Fresh,
    /// A run that goes on: lines are appended to its `metrics.jsonl` (truncated to the
    /// checkpoint by whoever resumed it); `resume_at` is the first TensorBoard step this
    /// process logs again, if it redoes any (see [`EventWriter::create`]).
    Continue { resume_at: Option<i64> },
}

impl RunLog {
    /// Opens `run_dir`'s log; `leader`: this process is rank 0, the one that writes.
    pub(crate) fn open(run_dir: &Path, leader: bool, start: Start) -> anyhow::Result<RunLog> {
        let path = run_dir.join("metrics.jsonl");
        if !leader {
            return Ok(RunLog { out: None, path });
        }
        let (file, resume_at) = match start {
            Start::Fresh => (std::fs::File::create(&path), None),
            Start::Continue { resume_at } => (
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path),
                resume_at,
            ),
        };
        let file = file.with_context(|| format!("opening {}", path.display()))?;
        let events = EventWriter::create(run_dir, resume_at)?;
        Ok(RunLog {
            out: Some((file, events)),
            path,
        })
    }

    /// The `metrics.jsonl` this log writes.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `line` as one JSON line, and its numbers as scalars at `step` tagged by their
    /// path in the line under `prefix` (the keys `skip` left out).
    pub(crate) fn write(
        &mut self,
        line: &impl Serialize,
        step: i64,
        prefix: &str,
        skip: &[&str],
    ) -> anyhow::Result<()> {
        let Some((file, events)) = &mut self.out else {
            return Ok(());
        };
        // The line as its type writes it (field order, f32 as f32); the scalars from its
        // value.
        let mut text = serde_json::to_vec(line)?;
        text.push(b'\n');
        let value = serde_json::to_value(line)?;
        file.write_all(&text)
            .and_then(|()| file.flush())
            .with_context(|| format!("writing {}", self.path.display()))?;
        events.scalars(step, &scalars_of(&value, prefix, skip))
    }
}
