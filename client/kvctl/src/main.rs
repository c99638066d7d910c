//! The `kvctl` binary: everything is in the library ([`kvctl::run_with`]).

fn main() {
    std::process::exit(kvctl::run_with(std::env::args_os()));
}
