//! `maporl report RUN`: an HTML page for a run directory (see [`maporl::report`]).

use std::path::PathBuf;

use clap::Args;

#[derive(Args)]
pub struct ReportArgs {
    /// The run directory (what `maporl train` or `maporl eval` wrote).
    run: PathBuf,
    /// Where to write the page [default: RUN/report.html].
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    let out = args.out.unwrap_or_else(|| args.run.join("report.html"));
    let written = maporl::report::write(&args.run, &out)?;
    println!("wrote {}", written.display());
    Ok(())
}
