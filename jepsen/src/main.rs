//! The `jepsen` command line: `jepsen check` runs the checkers on a recorded
//! history; `jepsen export` converts a history to Jepsen log lines;
//! `jepsen run` runs one scenario; `jepsen suite` and `jepsen controls` run
//! fixed lists of them.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use jepsen::check::{EXIT_ERROR, ModelName, check};
use jepsen::formats::{self, Format};
use jepsen::linearizability::{STEP_BUDGET_DEFAULT, Settings};

/// raftcask's fault suite.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// How to print the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    /// A short human verdict.
    Text,
    /// The whole report as JSON.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check a recorded history. Exit 0 valid (linearizable), 1 not, 2 error
    /// or undecided (budget exhausted).
    Check {
        /// The model, which picks the checkers.
        #[arg(long, value_enum)]
        model: ModelName,
        /// The file's format (detected from its first line if not given).
        #[arg(long, value_enum)]
        format: Option<Format>,
        /// Search steps allowed per key.
        #[arg(long, default_value_t = STEP_BUDGET_DEFAULT)]
        step_budget: u64,
        /// Check every key even after one fails (slower on bad histories).
        #[arg(long)]
        all_keys: bool,
        /// Output: text or json.
        #[arg(short = 'o', long, value_enum, default_value = "text")]
        output: Output,
        /// The history file.
        file: PathBuf,
    },
    /// Run one fault-injection scenario (needs root: a private network
    /// namespace): real kvnode members, a workload, faults; writes
    /// history.jsonl, summary.txt and checker.json to --out. Exit 0 when the
    /// run did enough and the checker passes, 1 otherwise.
    Run(jepsen::run::RunArgs),
    /// Run the fixed scenario list (needs root and cargo: builds the
    /// lazy-disk kvnode into target/jepsen-builds); prints a table and
    /// `N passed, N failed`. Exit 0 when every scenario passed.
    Suite(jepsen::suite::SuiteArgs),
    /// Build each negative-control kvnode (target/jepsen-builds) and run the
    /// scenario that must catch it. Exit 0 only if every control was caught
    /// by the checker (`--baseline`: every scenario passes without the
    /// control's feature).
    Controls(jepsen::suite::ControlsArgs),
    /// Print a history as Jepsen log lines.
    Export {
        /// The file's format (detected if not given).
        #[arg(long, value_enum)]
        format: Option<Format>,
        /// The history file.
        file: PathBuf,
    },
}

fn read(file: &PathBuf, format: Option<Format>) -> anyhow::Result<Vec<jepsen::history::Event>> {
    let text = std::fs::read_to_string(file)
        .map_err(|error| anyhow::anyhow!("reading {}: {error}", file.display()))?;
    let format = format.unwrap_or_else(|| formats::detect(&text));
    formats::read(&text, format).map_err(|error| anyhow::anyhow!("{}: {error}", file.display()))
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Check {
            model,
            format,
            step_budget,
            all_keys,
            output,
            file,
        } => {
            let events = read(&file, format)?;
            let settings = Settings {
                step_budget,
                stop_at_first_failure: !all_keys,
            };
            let report = check(model, &events, settings)?;
            match output {
                Output::Text => print!("{}", report.summary()),
                Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
            Ok(report.exit_code())
        }
        Command::Run(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let code = runtime.block_on(jepsen::run::run(args))?;
            Ok(if code == ExitCode::SUCCESS { 0 } else { 1 })
        }
        Command::Suite(args) => {
            let code = jepsen::suite::suite(args)?;
            Ok(if code == ExitCode::SUCCESS { 0 } else { 1 })
        }
        Command::Controls(args) => {
            let code = jepsen::suite::controls(args)?;
            Ok(if code == ExitCode::SUCCESS { 0 } else { 1 })
        }
        Command::Export { format, file } => {
            let events = read(&file, format)?;
            print!("{}", formats::export_jepsen_log(&events));
            Ok(0)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(2)),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(EXIT_ERROR as u8)
        }
    }
}
