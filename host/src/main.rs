//! The `maporl` command line: each command parses its arguments, calls the library and
//! prints what came back.

mod cli;

fn main() {
    maporl::model::keep_freed_memory();
    std::process::exit(cli::main());
}
