//! The real-proc runs (`--real`): the driver as a host agent spawning that many OS
//! processes (this program again, as a child proc), one actor each, measured with the
//! same calls; and the child proc's own `main`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hyperactor::{ChannelTransport, Client, SendContext};
use hyperactor_mesh::agent::{AgentOptions, ProcAgent};
use hyperactor_mesh::bootstrap::{serve_until_stopped, BootInfo, BootstrapCommand};
use hyperactor_mesh::host::Host;
use hyperactor_mesh::{ActorMesh, Extent, HostMesh};
use serde::Serialize;

use crate::actor::{Bench, Ping, Res, STOP_GRACE};
use crate::calls::{check_values, percentile, timed_calls, CallStats};
use crate::options::Options;
use crate::procfs::{process_cpu_ns, raise_nofile, rss_kib};
use crate::replay::{replay_call, tree_levels};

/// The environment variable that gives a real child proc its runtime's worker threads.
const REAL_WORKERS_ENV: &str = "SCALE_BENCH_REAL_WORKERS";

pub(crate) fn real_child_main() -> Res<()> {
    raise_nofile();
    let workers = std::env::var(REAL_WORKERS_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let info = BootInfo::from_env()?;
        let proc = info.serve(ChannelTransport::Unix).await?;
        let host = info.report.actor().proc_id().clone();
        let options = AgentOptions::default().register::<Bench>().spawned_by(host);
        let _agent = ProcAgent::new(proc.clone(), options)?;
        info.report_ready(&proc)?;
        serve_until_stopped(&proc, STOP_GRACE).await;
        Ok(())
    })
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct RealReport {
    pub(crate) procs: usize,
    pub(crate) workers: usize,
    pub(crate) spawn_procs_s: f64,
    pub(crate) spawn_actors_first_reply_s: f64,
    pub(crate) rss_per_proc_mib: f64,
    pub(crate) call: Option<CallStats>,
    pub(crate) stop_s: f64,
}

async fn run_real(agent: &ProcAgent, client: &Client, n: usize, opts: &Options) -> Res<RealReport> {
    let exe = std::env::current_exe()?;
    let command =
        BootstrapCommand::new(exe).with_env(REAL_WORKERS_ENV, opts.real_workers.to_string());
    let per_host = Extent::new(vec!["procs".to_string()], vec![n])?;
    let t = Instant::now();
    let procs = HostMesh::local(agent)?
        .spawn_procs(client, "real", &per_host, &command)
        .await?;
    let spawn_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mesh: ActorMesh<Bench> = procs.spawn(client, "bench", &())?;
    let values = mesh.call(client, &Ping(0)).await?;
    check_values(&values, n, 0)?;
    let first_s = t.elapsed().as_secs_f64();
    let pids: Vec<u32> = procs.procs().iter().map(|p| p.pid).collect();
    let mut seq = 1;
    agent.set_fanout(opts.fanout);
    timed_calls(&mesh, agent, client, &mut seq, Duration::ZERO, 3).await?;
    let me = std::process::id();
    let snapshot = |pids: &[u32]| -> (u64, u64) {
        (
            process_cpu_ns(me),
            pids.iter().map(|&p| process_cpu_ns(p)).sum(),
        )
    };
    let (c0, p0) = snapshot(&pids);
    let mut times =
        timed_calls(&mesh, agent, client, &mut seq, opts.budget, opts.max_calls).await?;
    let (c1, p1) = snapshot(&pids);
    let calls = times.len();
    times.sort_by(f64::total_cmp);
    let client_us = c1.saturating_sub(c0) as f64 / 1e3 / calls as f64;
    let procs_us = p1.saturating_sub(p0) as f64 / 1e3 / calls as f64;
    let rss: u64 = pids.iter().map(|&p| rss_kib(p)).sum();
    let levels = tree_levels(n, opts.fanout);
    let traffic = replay_call(
        client.actor_id(),
        &procs
            .procs()
            .iter()
            .map(|p| p.proc_id.clone())
            .collect::<Vec<_>>(),
        mesh.mesh_ref().view_extent(),
        mesh.mesh_ref().actor_name(),
        opts.fanout,
    )?;
    let call = CallStats {
        actors: n,
        fanout: opts.fanout,
        depth: usize::from(levels.iter().copied().max().unwrap_or(0)),
        calls,
        p10_ms: percentile(&times, 0.1),
        p50_ms: percentile(&times, 0.5),
        p90_ms: percentile(&times, 0.9),
        cpu_us: BTreeMap::from([
            ("client".to_string(), client_us),
            ("procs".to_string(), procs_us),
        ]),
        cpu_total_us: client_us + procs_us,
        cpu_per_actor_us: (client_us + procs_us) / n as f64,
        entry_hops: traffic.iter().map(|l| l.entries).sum(),
        traffic,
    };
    let t = Instant::now();
    procs.stop(client, "scale bench: stop").await?;
    Ok(RealReport {
        procs: n,
        workers: opts.real_workers,
        spawn_procs_s: spawn_s,
        spawn_actors_first_reply_s: first_s,
        rss_per_proc_mib: rss as f64 / 1024.0 / n as f64,
        call: Some(call),
        stop_s: t.elapsed().as_secs_f64(),
    })
}

pub(crate) async fn run_reals(opts: &Options) -> Res<Vec<RealReport>> {
    if opts.real.is_empty() {
        return Ok(Vec::new());
    }
    let host = Host::serve(ChannelTransport::Unix)
        .await?
        .with_log_dir(None);
    let agent = ProcAgent::new(host.proc().clone(), AgentOptions::default().host(host))?;
    let client = agent.proc().client("client")?;
    let mut out = Vec::new();
    for &n in &opts.real {
        eprintln!("[scale] real procs: {n}");
        let report = run_real(&agent, &client, n, opts).await?;
        if let Some(call) = &report.call {
            eprintln!(
                "[scale] real {n} procs: p50 {:.3} ms, {:.1} µs CPU per actor",
                call.p50_ms, call.cpu_per_actor_us
            );
        }
        out.push(report);
    }
    agent.shutdown_host(Duration::from_secs(5)).await;
    Ok(out)
}
