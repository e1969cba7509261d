//! The engine every plugin runs on: configuration, the epoch clock behind deadlines, the
//! on-disk cache of compiled components, loading and checking a component against a world.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine};

use super::inspect::{self, Inspection};
use super::sandbox::{stderr_sink, Judge, LogSink, Sandbox};
use super::{Failure, PluginError, World};

/// How often the epoch clock ticks; deadlines are whole ticks.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(10);
/// The most wasm stack a plugin may use.
pub(crate) const MAX_WASM_STACK: usize = 512 * 1024;

/// Options of a plugin [`Runtime`].
#[derive(Clone)]
pub struct RuntimeOptions {
    /// Where compiled components are cached; `None` disables the cache.
    pub cache_dir: Option<PathBuf>,
    /// The run seed: plugins' clocks and randomness derive from it.
    pub seed: u64,
    /// Where plugins' log lines go.
    pub log: LogSink,
    /// The learned verifier offered to plugins through `judge`, if the run has one.
    pub judge: Option<Arc<dyn Judge>>,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            cache_dir: default_cache_dir(),
            seed: 0,
            log: stderr_sink(),
            judge: None,
        }
    }
}

/// `$MAPORL_CACHE_DIR/components`, else the user's cache dir (`~/.cache/maporl/components`).
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("MAPORL_CACHE_DIR") {
        return Some(PathBuf::from(dir).join("components"));
    }
    dirs::cache_dir().map(|d| d.join("maporl").join("components"))
}

/// The wasmtime engine and everything shared by the plugins of one run.
pub struct Runtime {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<Sandbox>,
    pub(crate) options: RuntimeOptions,
    engine_key: String,
    /// The compiled-component cache, when one is configured and can be trusted.
    cache: Option<super::cache::CompiledCache>,
    compiled: AtomicU64,
    cache_hits: AtomicU64,
    _ticker: EpochTicker,
}

/// A component read from disk, compiled and checked against a world.
pub(crate) struct Loaded {
    pub name: String,
    pub sha256: String,
    /// The source sha256 the component declares (see [`super::source`]).
    pub source_sha256: Option<String>,
    /// Size of the component file in bytes.
    pub size: u64,
    pub component: Component,
}

impl Runtime {
    pub fn new(options: RuntimeOptions) -> anyhow::Result<Runtime> {
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .consume_fuel(true)
            .epoch_interruption(true)
            .max_wasm_stack(MAX_WASM_STACK);
        let engine = Engine::new(&config).map_err(|e| anyhow::anyhow!("{e:#}"))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| anyhow::anyhow!("linking WASI: {e:#}"))?;
        super::sandbox::forbid_waiting(&mut linker)
            .map_err(|e| anyhow::anyhow!("linking WASI's clocks: {e:#}"))?;
        super::wit::add_to_linker(&mut linker)
            .map_err(|e| anyhow::anyhow!("linking the host interface: {e:#}"))?;
        let engine_key = {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            engine.precompile_compatibility_hash().hash(&mut h);
            env!("CARGO_PKG_VERSION").hash(&mut h);
            format!("{:016x}", h.finish())
        };
        let ticker = EpochTicker::start(engine.clone());
        let cache = options.cache_dir.as_ref().and_then(|dir| {
            super::cache::CompiledCache::open(dir)
                .map_err(|why| tracing::warn!("not using the compiled-component cache: {why}"))
                .ok()
        });
        Ok(Runtime {
            cache,
            engine,
            linker,
            options,
            engine_key,
            compiled: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            _ticker: ticker,
        })
    }

    /// How many components this runtime compiled, and how many it took from the cache.
    pub fn compile_counts(&self) -> (u64, u64) {
        (
            self.compiled.load(Ordering::Relaxed),
            self.cache_hits.load(Ordering::Relaxed),
        )
    }

    /// Loads `path`, checks that it implements `world` at a compatible WIT version and that
    /// its imports and exports type-check, without running it.
    pub fn check(&self, path: &Path, world: World) -> Result<Inspection, PluginError> {
        let loaded = self.load(path, world, crate::files::COMPONENT_CAP_MAX)?;
        let pre = self
            .linker
            .instantiate_pre(&loaded.component)
            .map_err(|e| load_error(&loaded.name, world, format!("{e:#}")))?;
        use super::handle::WorldBindings;
        let typed = match world {
            World::Protocol => super::protocol::Exports::pre(pre).map(|_| ()),
            World::Verifier => super::verifier::Exports::pre(pre).map(|_| ()),
            World::RewardShaper => super::shaper::Exports::pre(pre).map(|_| ()),
        };
        typed.map_err(|e| load_error(&loaded.name, world, format!("{e:#}")))?;
        let initial_memory = self
            .initial_memory(&loaded, world)
            .map_err(|e| load_error(&loaded.name, world, format!("{e:#}")))?;
        Ok(Inspection {
            initial_memory: Some(initial_memory),
            ..inspect::describe(
                &self.engine,
                path,
                loaded.size,
                loaded.sha256,
                loaded.source_sha256,
                &loaded.component,
            )
        })
    }

    /// Bytes of memory and tables a fresh instance of `loaded` holds, instantiated (no call
    /// made) under the default limits but a memory cap of 1 GiB, so that the figure is the
    /// component's own and not the default cap's, while a component that grabs more at
    /// start (or runs a start function past the fuel or the deadline) fails the check.
    fn initial_memory(&self, loaded: &Loaded, world: World) -> wasmtime::Result<u64> {
        let limits = super::Limits {
            memory_mib: 1 << 10,
            ..super::Limits::default()
        };
        let sandbox = Sandbox::new(&loaded.name, world, &limits, 0, stderr_sink(), None);
        let mut store = wasmtime::Store::new(&self.engine, sandbox);
        store.limiter(|s| s as &mut dyn wasmtime::ResourceLimiter);
        store.set_fuel(limits.fuel)?;
        store.set_epoch_deadline(
            limits
                .deadline_ms
                .div_ceil(EPOCH_TICK.as_millis() as u64)
                .max(1),
        );
        store.epoch_deadline_trap();
        self.linker.instantiate(&mut store, &loaded.component)?;
        Ok(store.data().footprint() as u64)
    }

    /// Reads, compiles (or takes from the cache) and checks a component against `world`.
    /// A component file over `cap` bytes is refused before it is read.
    pub(crate) fn load(&self, path: &Path, world: World, cap: u64) -> Result<Loaded, PluginError> {
        let name = path.display().to_string();
        let bytes =
            super::builtin::read_component(path, cap).map_err(|e| load_error(&name, world, e))?;
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let source_sha256 =
            super::source::declared(&bytes).map_err(|e| load_error(&name, world, e))?;
        let component = self
            .compile(&bytes, &sha256)
            .map_err(|e| load_error(&name, world, e))?;
        inspect::check_world(&self.engine, &component, world)
            .map_err(|e| load_error(&name, world, e))?;
        Ok(Loaded {
            name,
            sha256,
            source_sha256,
            size: bytes.len() as u64,
            component,
        })
    }

    /// Compiles a component, or deserializes it from the cache written by an earlier run
    /// (only an entry whose MAC verifies: see [`super::cache`]).
    pub(crate) fn compile(&self, bytes: &[u8], sha256: &str) -> Result<Component, String> {
        inspect::check_header(bytes)?;
        if let Some(compiled) = self
            .cache
            .as_ref()
            .and_then(|c| c.get(sha256, &self.engine_key))
        {
            // SAFETY: the entry's HMAC, under a key only this user can read, binds these
            // bytes to this component's sha256 and this engine, and only this host writes
            // entries (atomically, from its own compilation); wasmtime still checks the
            // header and engine compatibility, and an entry that fails is recompiled below.
            // Read into memory rather than mmap: a file changed while mapped would crash the
            // process (SIGBUS) instead of failing cleanly.
            match unsafe { Component::deserialize(&self.engine, &compiled) } {
                Ok(component) => {
                    self.cache_hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(component);
                }
                Err(_) => {
                    if let Some(cache) = &self.cache {
                        let _ = std::fs::remove_file(cache.path(sha256, &self.engine_key));
                    }
                }
            }
        }
        let component = Component::from_binary(&self.engine, bytes)
            .map_err(|e| format!("not a valid WebAssembly component: {e:#}"))?;
        self.compiled.fetch_add(1, Ordering::Relaxed);
        if let Some(cache) = &self.cache {
            let written = component
                .serialize()
                .map_err(|e| anyhow::anyhow!("{e:#}"))
                .and_then(|compiled| cache.put(sha256, &self.engine_key, &compiled));
            if let Err(e) = written {
                tracing::warn!(
                    "cannot cache the compiled component at {}: {e}",
                    cache.path(sha256, &self.engine_key).display()
                );
            }
        }
        Ok(component)
    }
}

pub(crate) fn load_error(name: &str, world: World, msg: String) -> PluginError {
    PluginError {
        plugin: name.to_string(),
        world,
        function: "load",
        task: None,
        failure: Failure::Load(msg),
    }
}

/// Ticks the engine's epoch so that calls past their deadline trap.
struct EpochTicker {
    stop: Arc<AtomicBool>,
}

impl EpochTicker {
    fn start(engine: Engine) -> EpochTicker {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::Builder::new()
            .name("maporl-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })
            .expect("spawning the epoch thread");
        EpochTicker { stop }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
