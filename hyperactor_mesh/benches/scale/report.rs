//! The report: what the runs measured and the model predicts, printed as tables (and
//! serialised to JSON by the driver).

use serde::Serialize;

use crate::model::Model;
use crate::options::Options;
use crate::real::RealReport;
use crate::sim_run::SimReport;

#[derive(Debug, Default, Serialize)]
pub(crate) struct Report {
    pub(crate) date: String,
    pub(crate) load_before: String,
    pub(crate) load_after: String,
    pub(crate) cores: usize,
    pub(crate) sim: Option<SimReport>,
    pub(crate) real: Vec<RealReport>,
    pub(crate) model: Model,
    pub(crate) predictions: Vec<Prediction>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Prediction {
    pub(crate) what: String,
    pub(crate) us: f64,
}

pub(crate) fn print_report(report: &Report, opts: &Options) {
    println!(
        "\n## Scale: {} simulated hosts x {} procs",
        opts.hosts, opts.per_host
    );
    println!(
        "\nload average before {}, after {}; {} cores",
        report.load_before, report.load_after, report.cores
    );
    if let Some(sim) = &report.sim {
        println!("\n| what | value |\n|---|---|");
        println!("| sim host processes | {} |", sim.sim_procs);
        println!(
            "| start the sim hosts ({} host agents) | {:.2} s |",
            sim.hosts, sim.start_sims_s
        );
        println!(
            "| spawn {} procs (HostMesh::spawn_procs) | {:.2} s ({:.1} s CPU) |",
            sim.hosts * sim.per_host,
            sim.spawn_procs_s,
            sim.spawn_cpu_s
        );
        println!(
            "| spawn the actors -> first reply | {:.2} s |",
            sim.spawn_actors_first_reply_s
        );
        println!("| stop the proc mesh | {:.2} s |", sim.stop_s);
        println!(
            "| spawn again (for the failure test) | {:.2} s |",
            sim.respawn_s
        );
        println!(
            "| memory: sim hosts RSS, host agents only / with procs | {:.0} MiB / {:.0} MiB |",
            sim.rss_hosts_only_mib, sim.rss_after_spawn_mib
        );
        println!(
            "| memory per simulated proc | {:.0} KiB |",
            sim.rss_per_proc_kib
        );
        println!("| client RSS | {:.0} MiB |", sim.client_rss_mib);
        println!(
            "| heartbeats every 250 ms to {} hosts (production's interval): CPU | client {:.1}% of a core, host agents {:.1}% |",
            sim.hosts, sim.heartbeats_client_pct, sim.heartbeats_hosts_pct
        );
        println!(
            "| open files per sim host process, most: after the spawn / after the calls (limit) | {} / {} ({}) |",
            sim.fds_after_spawn, sim.fds_after_calls, sim.fd_limit
        );
        let idle: Vec<String> = sim
            .idle_cpu_pct
            .iter()
            .map(|(k, v)| format!("{k} {v:.1}%"))
            .collect();
        println!(
            "| idle CPU (heartbeats every 5 s, leases), % of a core | {} |",
            idle.join(", ")
        );
        let f = &sim.failures;
        println!(
            "| {} procs killed at once: failures at the owner | {} reported, {} distinct, {} duplicates, {} unexpected, {} missing, {} of other meshes |",
            f.killed, f.reported, f.distinct, f.duplicates, f.unexpected, f.missing, f.other_meshes
        );
        println!(
            "| ... time to first / median / last failure | {:.1} / {:.1} / {:.1} ms |",
            f.first_ms, f.p50_ms, f.last_ms
        );
        println!(
            "| ... CPU: client / sim hosts | {:.0} ms / {:.0} ms |",
            f.client_cpu_ms, f.sims_cpu_ms
        );
        println!(
            "| stop after the failures | {:.2} s |",
            sim.stop_after_failures_s
        );
        for error in &sim.errors {
            println!("| a call failed | {error} |");
        }

        println!("\nCalls with gathered replies (simulated):\n");
        println!("| actors | fan-out | depth | calls | p50 ms | p10-p90 ms | CPU per call ms | CPU per actor µs | client µs | entry-hops |");
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for c in &sim.calls {
            println!(
                "| {} | {} | {} | {} | {:.3} | {:.3}-{:.3} | {:.2} | {:.1} | {:.0} | {} |",
                c.actors,
                c.fanout,
                c.depth,
                c.calls,
                c.p50_ms,
                c.p10_ms,
                c.p90_ms,
                c.cpu_total_us / 1e3,
                c.cpu_per_actor_us,
                c.cpu_us.get("client").copied().unwrap_or(0.0),
                c.entry_hops
            );
        }
        if let Some(full) = sim
            .calls
            .iter()
            .find(|c| c.actors == sim.hosts * sim.per_host && c.fanout == opts.fanout)
        {
            println!(
                "\nBy tree level, a call to all {} actors (fan-out {}):\n",
                full.actors, full.fanout
            );
            println!("| level | procs | CPU per call ms | CPU per proc µs | entries per header | bytes down | bytes up | bytes per proc |");
            println!("|---|---|---|---|---|---|---|---|");
            let client = full.cpu_us.get("client").copied().unwrap_or(0.0);
            println!(
                "| 0 (client) | 1 | {:.2} | {:.0} | | | | |",
                client / 1e3,
                client
            );
            for (k, level) in full.traffic.iter().enumerate().skip(1) {
                let cpu = full
                    .cpu_us
                    .get(&format!("level{k}"))
                    .copied()
                    .unwrap_or(0.0);
                let bytes = level.bytes_down + level.bytes_up;
                println!(
                    "| {k} | {} | {:.2} | {:.1} | {:.1} | {} | {} | {:.0} |",
                    level.nodes,
                    cpu / 1e3,
                    cpu / level.nodes.max(1) as f64,
                    level.entries as f64 / level.nodes.max(1) as f64,
                    level.bytes_down,
                    level.bytes_up,
                    bytes as f64 / level.nodes.max(1) as f64
                );
            }
            let hosts = full.cpu_us.get("hosts").copied().unwrap_or(0.0);
            let other = full.cpu_us.get("other").copied().unwrap_or(0.0);
            println!(
                "| host agents / other threads | | {:.2} / {:.2} | | | | | |",
                hosts / 1e3,
                other / 1e3
            );
        }
    }
    if !report.real.is_empty() {
        println!(
            "\nReal procs (one OS process each, {} tokio workers):\n",
            opts.real_workers
        );
        println!("| procs | spawn -> ready s | -> first reply s | p50 ms | p10-p90 ms | CPU per call ms | CPU per actor µs | RSS per proc MiB | stop s |");
        println!("|---|---|---|---|---|---|---|---|---|");
        for r in &report.real {
            if let Some(c) = &r.call {
                println!(
                    "| {} | {:.2} | {:.2} | {:.3} | {:.3}-{:.3} | {:.2} | {:.1} | {:.1} | {:.2} |",
                    r.procs,
                    r.spawn_procs_s,
                    r.spawn_actors_first_reply_s,
                    c.p50_ms,
                    c.p10_ms,
                    c.p90_ms,
                    c.cpu_total_us / 1e3,
                    c.cpu_per_actor_us,
                    r.rss_per_proc_mib,
                    r.stop_s
                );
            }
        }
    }
    let m = &report.model;
    println!(
        "\nModel, fitted on the simulated calls:\n\
         - a call's CPU = {:.2} µs x actors + {:.3} µs x entry-hops + {:.0} µs (rms relative error {:.1}%)\n\
         - a tree node's CPU = {:.1} µs + {:.2} µs x children + {:.3} µs x entries of its header\n\
         - the root's CPU = {:.0} µs + {:.3} µs x actors\n\
         - hop beyond the CPU: {:.1} µs\n\
         Predictions (p50):",
        m.a_us,
        m.b_us,
        m.c_us,
        m.rms_rel_err * 100.0,
        m.node_us,
        m.child_us,
        m.entry_us,
        m.root_us,
        m.root_per_actor_us,
        m.hop_us
    );
    for p in &report.predictions {
        println!("  {}: {:.3} ms", p.what, p.us / 1e3);
    }
}
