//! The simulated run: start the sim host processes, spawn the proc mesh over their
//! hosts, measure the calls at every size and fan-out, stop, spawn again and kill procs
//! at once (the failure test), and measure the heartbeats' cost.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use hyperactor::{ChannelTransport, Client, ProcId};
use hyperactor_mesh::agent::{AgentOptions, ProcAgent};
use hyperactor_mesh::bootstrap::BootstrapCommand;
use hyperactor_mesh::{ActorMesh, Extent, HostMesh, MeshFailure, ProcMesh};
use serde::Serialize;
use tokio::io::AsyncWriteExt;

use crate::actor::{Bench, Ping, Res};
use crate::calls::{check_values, measure_sim, percentile, CallStats};
use crate::options::Options;
use crate::procfs::{open_fds, raise_nofile, rss_kib};
use crate::sim_host::sim_liveness;
use crate::sims::{cpu_delta, cpu_snapshot, sims_rss_mib, start_sims, Sim};

#[derive(Debug, Default, Serialize)]
pub(crate) struct FailureStats {
    pub(crate) killed: usize,
    pub(crate) reported: usize,
    pub(crate) distinct: usize,
    pub(crate) duplicates: usize,
    pub(crate) unexpected: usize,
    pub(crate) missing: usize,
    /// Failures of other meshes (none expected).
    pub(crate) other_meshes: usize,
    pub(crate) first_ms: f64,
    pub(crate) p50_ms: f64,
    pub(crate) last_ms: f64,
    pub(crate) client_cpu_ms: f64,
    pub(crate) sims_cpu_ms: f64,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct SimReport {
    pub(crate) hosts: usize,
    pub(crate) per_host: usize,
    pub(crate) sim_procs: usize,
    pub(crate) start_sims_s: f64,
    pub(crate) spawn_procs_s: f64,
    pub(crate) spawn_actors_first_reply_s: f64,
    pub(crate) spawn_cpu_s: f64,
    pub(crate) rss_hosts_only_mib: f64,
    pub(crate) rss_after_spawn_mib: f64,
    pub(crate) rss_per_proc_kib: f64,
    pub(crate) client_rss_mib: f64,
    pub(crate) idle_cpu_pct: BTreeMap<String, f64>,
    /// Heartbeats at the production interval to every host, % of a core: the client,
    /// the host agents.
    pub(crate) heartbeats_client_pct: f64,
    pub(crate) heartbeats_hosts_pct: f64,
    /// The open-file limit, and the most descriptors a sim host process had open after
    /// the spawn and after the calls.
    pub(crate) fd_limit: u64,
    pub(crate) fds_after_spawn: usize,
    pub(crate) fds_after_calls: usize,
    pub(crate) calls: Vec<CallStats>,
    pub(crate) stop_s: f64,
    pub(crate) respawn_s: f64,
    pub(crate) failures: FailureStats,
    pub(crate) stop_after_failures_s: f64,
    /// Calls that did not complete (the measurement of sizes stops there).
    pub(crate) errors: Vec<String>,
}

async fn spawn_sim_mesh(
    hosts: &HostMesh,
    client: &Client,
    opts: &Options,
) -> Res<(ProcMesh, ActorMesh<Bench>, f64, f64)> {
    let per_host = Extent::new(vec!["procs".to_string()], vec![opts.per_host])?;
    let t = Instant::now();
    let procs = hosts
        .spawn_procs(
            client,
            "sim",
            &per_host,
            &BootstrapCommand::new("in-process"),
        )
        .await?;
    let spawn_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mesh: ActorMesh<Bench> = procs.spawn(client, "bench", &())?;
    let values = mesh.call(client, &Ping(0)).await?;
    check_values(&values, mesh.len(), 0)?;
    Ok((procs, mesh, spawn_s, t.elapsed().as_secs_f64()))
}

pub(crate) async fn run_sim(opts: &Options) -> Res<SimReport> {
    let n = opts.hosts * opts.per_host;
    let mut report = SimReport {
        hosts: opts.hosts,
        per_host: opts.per_host,
        ..SimReport::default()
    };
    eprintln!(
        "[scale] starting {} sim host processes for {} hosts",
        opts.sim_procs, opts.hosts
    );
    report.fd_limit = raise_nofile();
    let t = Instant::now();
    let (mut sims, host_ids) = start_sims(opts).await?;
    report.sim_procs = sims.len();
    report.start_sims_s = t.elapsed().as_secs_f64();
    report.rss_hosts_only_mib = sims_rss_mib(&sims);

    let options = AgentOptions::default().liveness(sim_liveness());
    let agent = ProcAgent::serve(ChannelTransport::Unix, "client", options).await?;
    agent.set_fanout(opts.fanout);
    let client = agent.proc().client("client")?;
    let host_mesh = HostMesh::new(
        host_ids,
        Extent::new(vec!["hosts".to_string()], vec![opts.hosts])?,
    )?;

    eprintln!(
        "[scale] spawning {n} procs ({} x {})",
        opts.hosts, opts.per_host
    );
    let cpu0 = cpu_snapshot(&sims);
    let (procs, mesh, spawn_s, first_s) = spawn_sim_mesh(&host_mesh, &client, opts).await?;
    let spawn_cpu = cpu_delta(&cpu_snapshot(&sims), &cpu0);
    report.spawn_cpu_s = spawn_cpu.values().sum::<u64>() as f64 / 1e9;
    report.spawn_procs_s = spawn_s;
    report.spawn_actors_first_reply_s = first_s;
    report.rss_after_spawn_mib = sims_rss_mib(&sims);
    report.rss_per_proc_kib =
        (report.rss_after_spawn_mib - report.rss_hosts_only_mib) * 1024.0 / n as f64;
    report.client_rss_mib = rss_kib(std::process::id()) as f64 / 1024.0;

    // Background: heartbeats to every host, leases (after the spawn's work settled).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = cpu_snapshot(&sims);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = cpu_delta(&cpu_snapshot(&sims), &before);
    report.idle_cpu_pct = idle
        .iter()
        .map(|(k, v)| (k.clone(), *v as f64 / 2e9 * 100.0))
        .collect();
    let idle_ns_per_s: BTreeMap<String, f64> = idle
        .iter()
        .map(|(k, v)| (k.clone(), *v as f64 / 2.0))
        .collect();

    report.fds_after_spawn = sims.iter().map(|s| open_fds(s.pid)).max().unwrap_or(0);

    let mut seq = 1;
    let mut configs: Vec<(usize, usize)> = opts.sizes.iter().map(|&s| (s, opts.fanout)).collect();
    for &f in &opts.fanouts {
        configs.extend(opts.other_fanout_sizes.iter().map(|&s| (s, f)));
    }
    for (size, fanout) in configs {
        if size != 1 && size % opts.per_host != 0 && size >= opts.per_host {
            continue;
        }
        let stats = match measure_sim(
            &mesh,
            &procs,
            &agent,
            &client,
            &sims,
            size,
            fanout,
            opts,
            &mut seq,
            &idle_ns_per_s,
        )
        .await
        {
            Ok(stats) => stats,
            Err(e) => {
                // A mesh with a call stuck in it cannot be measured further.
                let error = format!("{size} actors, fan-out {fanout}: {e}");
                eprintln!("[scale] {error}");
                report.errors.push(error);
                break;
            }
        };
        eprintln!(
            "[scale] sim {size} actors, fan-out {fanout}: p50 {:.3} ms, {:.1} µs CPU per actor ({} calls)",
            stats.p50_ms, stats.cpu_per_actor_us, stats.calls
        );
        report.calls.push(stats);
    }
    agent.set_fanout(opts.fanout);
    report.fds_after_calls = sims.iter().map(|s| open_fds(s.pid)).max().unwrap_or(0);

    eprintln!("[scale] stopping the proc mesh");
    let t = Instant::now();
    procs.stop(&client, "scale bench: stop").await?;
    report.stop_s = t.elapsed().as_secs_f64();
    drop((procs, mesh));

    if opts.fail > 0 {
        eprintln!("[scale] spawning again for the failure test");
        let phase: Res<()> = async {
            let (procs, mesh, spawn_s, _) = spawn_sim_mesh(&host_mesh, &client, opts).await?;
            report.respawn_s = spawn_s;
            report.failures =
                failure_test(&mut sims, &client, mesh.mesh_ref().info().id, n, opts).await?;
            let t = Instant::now();
            procs
                .stop(&client, "scale bench: stop after failures")
                .await?;
            report.stop_after_failures_s = t.elapsed().as_secs_f64();
            drop(mesh);
            Ok(())
        }
        .await;
        if let Err(e) = phase {
            let error = format!("the failure test: {e}");
            eprintln!("[scale] {error}");
            report.errors.push(error);
        }
    }
    // Last: the agent it starts keeps monitoring the hosts until the process ends.
    match heartbeat_cost(host_mesh.hosts(), &sims).await {
        Ok((client_hb, hosts_hb)) => {
            report.heartbeats_client_pct = client_hb;
            report.heartbeats_hosts_pct = hosts_hb;
        }
        Err(e) => report
            .errors
            .push(format!("the heartbeat measurement: {e}")),
    }
    for sim in &mut sims {
        let _ = sim.stdin.write_all(b"exit\n").await;
        let _ = sim.stdin.flush().await;
    }
    for sim in &mut sims {
        let _ = tokio::time::timeout(Duration::from_secs(10), sim.child.wait()).await;
    }
    Ok(report)
}

/// Kills `opts.fail` procs at once (spread evenly over the ranks) and waits for the
/// owner to hear of each.
async fn failure_test(
    sims: &mut [Sim],
    client: &Client,
    mesh_id: u64,
    n: usize,
    opts: &Options,
) -> Res<FailureStats> {
    let killed: Vec<usize> = (0..opts.fail).map(|i| i * n / opts.fail).collect();
    let killed_set: std::collections::HashSet<usize> = killed.iter().copied().collect();
    let per_sim_hosts = opts.hosts.div_ceil(opts.sim_procs);
    let mut by_sim: Vec<Vec<usize>> = vec![Vec::new(); sims.len()];
    for &rank in &killed {
        let sim = (rank / opts.per_host) / per_sim_hosts;
        by_sim[sim.min(sims.len() - 1)].push(rank);
    }
    eprintln!("[scale] killing {} procs at once", killed.len());
    let cpu0 = cpu_snapshot(sims);
    let t0 = Instant::now();
    for (sim, ranks) in sims.iter_mut().zip(&by_sim) {
        if ranks.is_empty() {
            continue;
        }
        let line = format!(
            "kill {}\n",
            ranks
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        );
        sim.stdin.write_all(line.as_bytes()).await?;
        sim.stdin.flush().await?;
    }
    let mut arrivals: Vec<(usize, f64)> = Vec::new();
    let mut other_meshes = 0;
    let mut seen: HashMap<usize, usize> = HashMap::new();
    let deadline = t0 + Duration::from_secs(120);
    let mut settle: Option<Instant> = None;
    loop {
        let until = settle.unwrap_or(deadline);
        let Ok(event) =
            tokio::time::timeout_at(until.into(), client.next_supervision_event()).await
        else {
            break;
        };
        let Some(event) = event else { break };
        let Some(failure) = MeshFailure::from_event(&event) else {
            eprintln!("[scale] a supervision event that is no mesh failure: {event}");
            continue;
        };
        if failure.mesh.id != mesh_id {
            other_meshes += 1;
            continue;
        }
        arrivals.push((failure.rank, t0.elapsed().as_secs_f64() * 1e3));
        *seen.entry(failure.rank).or_insert(0) += 1;
        if settle.is_none() && killed_set.iter().all(|r| seen.contains_key(r)) {
            // Every failure arrived: wait a little for duplicates.
            settle = Some(Instant::now() + Duration::from_secs(2));
        }
    }
    let cpu = cpu_delta(&cpu_snapshot(sims), &cpu0);
    for sim in sims.iter_mut() {
        // The sims acknowledged the kills (their `killed` lines).
        while let Ok(Ok(Some(line))) =
            tokio::time::timeout(Duration::from_millis(10), sim.lines.next_line()).await
        {
            if !line.starts_with("killed") {
                eprintln!("sim host {}: {line}", sim.pid);
            }
        }
    }
    let mut times: Vec<f64> = arrivals
        .iter()
        .filter(|(r, _)| killed_set.contains(r))
        .map(|(_, t)| *t)
        .collect();
    times.sort_by(f64::total_cmp);
    Ok(FailureStats {
        killed: killed.len(),
        reported: arrivals.len(),
        distinct: seen.len(),
        duplicates: seen.values().map(|c| c.saturating_sub(1)).sum(),
        unexpected: seen.keys().filter(|r| !killed_set.contains(r)).count(),
        missing: killed_set.iter().filter(|r| !seen.contains_key(r)).count(),
        other_meshes,
        first_ms: times.first().copied().unwrap_or(f64::NAN),
        p50_ms: percentile(&times, 0.5),
        last_ms: times.last().copied().unwrap_or(f64::NAN),
        client_cpu_ms: cpu.get("client").copied().unwrap_or(0) as f64 / 1e6,
        sims_cpu_ms: cpu
            .iter()
            .filter(|(k, _)| k.as_str() != "client")
            .map(|(_, v)| *v)
            .sum::<u64>() as f64
            / 1e6,
    })
}

/// The CPU, in % of a core, of heartbeats at the production interval to every host:
/// (the client, the sim hosts' host-agent threads). A second client agent monitors
/// every host; it goes on doing so until the process ends (an agent is not freed while
/// its tasks wait), so this is measured last.
pub(crate) async fn heartbeat_cost(hosts: &[ProcId], sims: &[Sim]) -> Res<(f64, f64)> {
    let agent = ProcAgent::serve(
        ChannelTransport::Unix,
        "heartbeats",
        AgentOptions::default(),
    )
    .await?;
    for host in hosts {
        agent.monitor_host(host);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = cpu_snapshot(sims);
    let counts = agent.heartbeat_counts();
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let delta = cpu_delta(&cpu_snapshot(sims), &before);
    let secs = t.elapsed().as_secs_f64();
    let after = agent.heartbeat_counts();
    eprintln!(
        "[scale] heartbeats to {} hosts over {:.1} s: {} rounds, {} direct, {} relayed \
         reaching {} hosts, {} hosts named to relays",
        hosts.len(),
        secs,
        after.rounds - counts.rounds,
        after.direct - counts.direct,
        after.relayed - counts.relayed,
        after.members - counts.members,
        after.named - counts.named,
    );
    drop(agent);
    let pct = |label: &str| delta.get(label).copied().unwrap_or(0) as f64 / 1e9 / secs * 100.0;
    Ok((pct("client"), pct("hosts")))
}
