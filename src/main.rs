//! `driverlab`: the command-line front end. Each subcommand is a thin layer over a crate.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    cli::init_logging(cli.log_level.as_deref());
    match cli.command.run() {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(cli::exit_code_of(&e))
        }
    }
}
