//! The `fleetd` binary.

fn main() -> std::process::ExitCode {
    fleetd::cli::main()
}
