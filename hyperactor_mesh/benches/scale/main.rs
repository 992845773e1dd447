//! The scale harness (`make bench-scale`): many hosts' worth of procs through the
//! production host agents, cast tree, codec, reply reduction and supervision, on one
//! machine, beside the same measurements with one OS process per proc.
//!
//! ```text
//! cargo bench -p hyperactor_mesh --bench scale                 # 1,024 x 8, and 1..256 real procs
//! cargo bench -p hyperactor_mesh --bench scale -- --quick      # 16 x 4, a minute
//! cargo bench -p hyperactor_mesh --bench scale -- --help
//! ```
//!
//! **Simulated hosts.** The driver (this program) starts a few *sim host* processes
//! (this program again, `--sim-host`). Each runs many host agents — a real [`Host`] and
//! [`ProcAgent`] per simulated host, each served on its own Unix socket — whose hosts
//! start their procs inside the sim host process through the
//! [`hyperactor_mesh::host::in_process`] seam instead of forking: each proc is a real
//! [`hyperactor::Proc`] on its own socket with a real agent and a native actor
//! (`Bench`), booted as a child process boots ([`BootInfo::serve`],
//! [`BootInfo::report_ready`]). The driver is the client: it builds a [`HostMesh`] of
//! the simulated hosts and spawns the proc mesh `{hosts, procs}` through
//! [`HostMesh::spawn_procs`] (the production spawn requests), spawns the actors, casts
//! gathered calls through the production tree, kills procs (as a `SIGKILL` would: the
//! host reaps them and its agent reports the deaths) and stops the mesh
//! ([`hyperactor_mesh::ProcMesh::stop`]).
//!
//! Inside a sim host, the procs of each tree level (for the whole mesh at the default
//! fan-out) run on a single-threaded runtime of their own, and the host agents on
//! another, so that the CPU time of each level is read from its thread's clock.
//!
//! **Real procs.** With `--real 16,64,256` the driver also runs as a host agent itself
//! and spawns that many OS processes (this program, as a child proc with `--real-workers`
//! runtime threads), one actor each, and measures the same calls.
//!
//! Everything is printed as tables (and written as JSON, `--json PATH`); nothing is
//! asserted about times. Every reply of every call is checked, and the failure test
//! checks that every killed proc is reported once, none other.
//!
//! **Modules.** [`options`] (the command line), [`actor`] (the actor every proc runs),
//! [`procfs`] (CPU, memory and file counters from `/proc`), [`replay`] (a call's tree
//! and its bytes), [`sim_host`] (the sim host process), [`sims`] (the sim host
//! processes as the driver sees them), [`calls`] (the measured calls), [`sim_run`] (the
//! simulated run and its failure test), [`real`] (the real-proc runs and the child
//! proc), [`model`] (the cost model) and [`report`] (the tables); this file holds
//! `main` and the driver.
//!
//! [`Host`]: hyperactor_mesh::host::Host
//! [`ProcAgent`]: hyperactor_mesh::agent::ProcAgent
//! [`BootInfo::serve`]: hyperactor_mesh::bootstrap::BootInfo::serve
//! [`BootInfo::report_ready`]: hyperactor_mesh::bootstrap::BootInfo::report_ready
//! [`HostMesh`]: hyperactor_mesh::HostMesh
//! [`HostMesh::spawn_procs`]: hyperactor_mesh::HostMesh::spawn_procs

mod actor;
mod calls;
mod model;
mod options;
mod procfs;
mod real;
mod replay;
mod report;
mod sim_host;
mod sim_run;
mod sims;

use hyperactor_mesh::bootstrap::BOOTSTRAP_ADDR_ENV;

use crate::actor::Res;
use crate::model::{fit_model, predict_dedicated_us, predict_shared_us};
use crate::options::{parse_options, Options};
use crate::procfs::{load_average, raise_nofile};
use crate::real::{real_child_main, run_reals};
use crate::report::{print_report, Prediction, Report};
use crate::sim_host::sim_host_main;
use crate::sim_run::run_sim;

async fn driver(opts: Options) -> Res<()> {
    raise_nofile();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut report = Report {
        date: std::process::Command::new("date")
            .arg("-u")
            .arg("+%Y-%m-%d %H:%M UTC")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default(),
        load_before: load_average(),
        cores,
        ..Report::default()
    };
    eprintln!("[scale] load average {}", report.load_before);
    report.real = run_reals(&opts).await?;
    if opts.sim {
        report.sim = Some(run_sim(&opts).await?);
    }
    report.load_after = load_average();
    if let Some(sim) = &report.sim {
        report.model = fit_model(&sim.calls, opts.fanout, opts.hosts * opts.per_host);
        let m = &report.model;
        for r in &report.real {
            if let Some(c) = &r.call {
                report.predictions.push(Prediction {
                    what: format!(
                        "{} real procs here, {cores} shared cores (measured: {:.3} ms)",
                        c.actors, c.p50_ms
                    ),
                    us: predict_shared_us(m, c.actors, c.fanout, c.entry_hops, cores as f64),
                });
            }
        }
        for n in [1024, 8192] {
            for hop in [m.hop_us, 25.0, 50.0, 100.0] {
                report.predictions.push(Prediction {
                    what: format!(
                        "{n} procs on dedicated hosts, fan-out {}, hop {hop:.0} µs",
                        opts.fanout
                    ),
                    us: predict_dedicated_us(m, n, opts.fanout, hop),
                });
            }
        }
    }
    print_report(&report, &opts);
    if let Some(path) = &opts.json {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
        eprintln!("[scale] wrote {}", path.display());
    }
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if std::env::var_os(BOOTSTRAP_ADDR_ENV).is_some() {
        return real_child_main();
    }
    if args.first().map(String::as_str) == Some("--sim-host") {
        return sim_host_main(&args);
    }
    let opts = parse_options(&args)?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(driver(opts))
}
