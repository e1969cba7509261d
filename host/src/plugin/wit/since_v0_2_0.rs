//! Contract 0.2.0, the latest (`wit/maporl.wit`, frozen as `wit/since_v0.2.0/`): its `host`
//! interface as the sandbox implements it, and the records the host lifts results into.

#![allow(
    dead_code,
    reason = "the bindings of the exports are unused: see `plugin::bindings`"
)]

wasmtime::component::bindgen!({
    world: "protocol",
    path: "../wit",
});

pub(crate) use self::maporl::plugin::host;
pub(crate) use self::maporl::plugin::types;
