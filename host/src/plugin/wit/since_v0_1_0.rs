//! Contract 0.1.0 (`wit/since_v0.1.0/`): its `host` interface, answered by the latest one.
//! 0.1.0 has `log` and `judge` as 0.2.0 does; 0.2.0 added `limits`.

#![allow(
    dead_code,
    reason = "only the host interface is used: see `plugin::wit`"
)]

wasmtime::component::bindgen!({
    world: "protocol",
    path: "../wit/since_v0.1.0",
});

pub(crate) use self::maporl::plugin::host;

use super::latest::host as latest;
use crate::plugin::sandbox::Sandbox;

impl host::Host for Sandbox {
    fn log(&mut self, level: host::Level, message: String) {
        let level = match level {
            host::Level::Debug => latest::Level::Debug,
            host::Level::Info => latest::Level::Info,
            host::Level::Warn => latest::Level::Warn,
            host::Level::Error => latest::Level::Error,
        };
        latest::Host::log(self, level, message)
    }

    fn judge(&mut self, question: String, responses: Vec<String>) -> Result<Vec<f32>, String> {
        latest::Host::judge(self, question, responses)
    }
}
