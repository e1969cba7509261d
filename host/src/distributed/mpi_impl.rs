//! [`World`] over MPI (rsmpi): the world communicator of the job `mpirun` started, with a
//! watchdog on every collective.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use mpi::datatype::PartitionMut;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;

use super::World;

/// What the watchdog watches: when the collective in progress started (milliseconds after
/// `epoch`, plus one; 0 when none is) and which it is.
struct Watch {
    epoch: Instant,
    since: AtomicU64,
    what: Mutex<&'static str>,
}

pub struct MpiWorld {
    // Kept for the process's life; `finalize` ends MPI (never dropped: the world is static).
    _universe: mpi::environment::Universe,
    comm: SimpleCommunicator,
    rank: usize,
    size: usize,
    watch: Arc<Watch>,
    sent: AtomicU64,
}

// SAFETY: MPI is initialised with the `Single` threading level, so its calls must all come
// from one thread: the command line's main thread is the only one that calls the
// collectives (the training loop runs there; candle's worker threads never touch the
// world). The watchdog thread only reads `Watch` and never calls MPI.
unsafe impl Send for MpiWorld {}
unsafe impl Sync for MpiWorld {}

impl MpiWorld {
    pub fn init(timeout: Duration) -> anyhow::Result<MpiWorld> {
        let Some(universe) = mpi::initialize() else {
            bail!("MPI was initialised twice in this process");
        };
        let comm = universe.world();
        // MPI_COMM_WORLD's default handler is MPI_ERRORS_ARE_FATAL: an error in a collective
        // (a peer's connection gone) aborts the job rather than returning to a loop that
        // would wait again.
        let (rank, size) = (comm.rank() as usize, comm.size() as usize);
        let watch = Arc::new(Watch {
            epoch: Instant::now(),
            since: AtomicU64::new(0),
            what: Mutex::new(""),
        });
        let w = watch.clone();
        std::thread::Builder::new()
            .name("maporl-collective-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(500));
                let since = w.since.load(Ordering::SeqCst);
                if since == 0 {
                    continue;
                }
                let now = w.epoch.elapsed().as_millis() as u64 + 1;
                if now.saturating_sub(since) > timeout.as_millis() as u64 {
                    let what = *w.what.lock().unwrap_or_else(|e| e.into_inner());
                    eprintln!(
                        "maporl: rank {rank} of {size}: the collective `{what}` has waited more \
                         than {} s for the other ranks (MAPORL_COLLECTIVE_TIMEOUT); another \
                         rank has probably died; ending this rank so that the job stops",
                        timeout.as_secs()
                    );
                    // SAFETY: `_exit` ends the process at once; nothing is left to unwind.
                    unsafe { libc::_exit(75) };
                }
            })?;
        Ok(MpiWorld {
            _universe: universe,
            comm,
            rank,
            size,
            watch,
            sent: AtomicU64::new(0),
        })
    }

    fn watched<T>(&self, what: &'static str, f: impl FnOnce() -> T) -> T {
        *self.watch.what.lock().unwrap_or_else(|e| e.into_inner()) = what;
        self.watch.since.store(
            self.watch.epoch.elapsed().as_millis() as u64 + 1,
            Ordering::SeqCst,
        );
        let out = f();
        self.watch.since.store(0, Ordering::SeqCst);
        out
    }
}

impl World for MpiWorld {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_gather_bytes(&self, mine: &[u8]) -> anyhow::Result<Vec<Vec<u8>>> {
        let Ok(n) = i32::try_from(mine.len()) else {
            bail!(
                "all-gather: {} bytes from rank {} is over MPI's 2 GiB count",
                mine.len(),
                self.rank
            );
        };
        let mut counts = vec![0i32; self.size];
        self.watched("all-gather (sizes)", || {
            self.comm.all_gather_into(&n, &mut counts[..])
        });
        let mut displs = Vec::with_capacity(self.size);
        let mut total: i64 = 0;
        for &c in &counts {
            displs.push(total as i32);
            total += i64::from(c);
        }
        if total > i64::from(i32::MAX) {
            bail!("all-gather: {total} bytes in all is over MPI's 2 GiB count");
        }
        let mut buf = vec![0u8; total as usize];
        {
            let mut part = PartitionMut::new(&mut buf[..], &counts[..], &displs[..]);
            self.watched("all-gather", || {
                self.comm.all_gather_varcount_into(mine, &mut part)
            });
        }
        self.sent.fetch_add(mine.len() as u64, Ordering::Relaxed);
        Ok(counts
            .iter()
            .zip(&displs)
            .map(|(&c, &d)| buf[d as usize..(d + c) as usize].to_vec())
            .collect())
    }

    fn broadcast_bytes(&self, root: usize, data: &mut Vec<u8>) -> anyhow::Result<()> {
        let root_process = self.comm.process_at_rank(root as i32);
        let mut len = data.len() as u64;
        self.watched("broadcast (size)", || root_process.broadcast_into(&mut len));
        if self.rank != root {
            data.resize(len as usize, 0);
        } else {
            self.sent.fetch_add(len, Ordering::Relaxed);
        }
        // Nothing to send (MPI refuses an empty buffer's pointer).
        if len > 0 {
            self.watched("broadcast", || root_process.broadcast_into(&mut data[..]));
        }
        Ok(())
    }

    fn barrier(&self) -> anyhow::Result<()> {
        self.watched("barrier", || self.comm.barrier());
        Ok(())
    }

    fn abort(&self, code: i32) -> ! {
        self.comm.abort(code)
    }

    fn bytes_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    fn finalize(&self) {
        // SAFETY: called once, at the end of main, from the thread that initialised MPI;
        // the universe is static and never dropped, so MPI is not finalised twice.
        unsafe {
            mpi::ffi::MPI_Finalize();
        }
    }
}
