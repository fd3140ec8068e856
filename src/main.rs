//! `driverlab`: the command-line front end. Each subcommand is a thin layer over a crate.

mod cli;

use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind as ClapErrorKind;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ClapErrorKind::DisplayHelp | ClapErrorKind::DisplayVersion) => e.exit(),
        Err(e) => {
            // `vm run` always ends with its JSON line, even when its flags do not parse.
            let args: Vec<String> =
                std::env::args().skip(1).filter(|a| !a.starts_with("--log-level")).take(2).collect();
            if args == ["vm", "run"] {
                return ExitCode::from(vmm::cli::usage_error(&e));
            }
            let _ = e.print();
            return ExitCode::from(vm_spec::exit::code::BAD_INPUT as u8);
        }
    };
    cli::init_logging(cli.log_level.as_deref());
    match cli.command.run() {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(cli::exit_code_of(&e))
        }
    }
}
