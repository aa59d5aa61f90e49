//! The `minfer` command line.

use std::process::ExitCode;

use clap::Parser;
use minfer::cli::{Cli, run_cli};

fn main() -> ExitCode {
    // An internal bug must still end as one readable line, never a backtrace dump.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        eprintln!("minfer: internal error: {msg}{at}");
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand) {
                let _ = e.print();
                return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand { ExitCode::from(2) } else { ExitCode::SUCCESS };
            }
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            eprintln!("minfer: {} (see --help)", first.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    match run_cli(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("minfer: error: {}", one_line(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}

/// Folds a multi-line message into one line.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
