fn main() {
    std::process::exit(maporl::cli::main());
}
