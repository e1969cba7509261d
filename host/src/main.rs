fn main() {
    maporl::model::keep_freed_memory();
    std::process::exit(maporl::cli::main());
}
