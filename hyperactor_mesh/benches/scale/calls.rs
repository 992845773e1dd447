//! The measured calls: gathered `Ping` calls to a view of the mesh, every reply
//! checked, timed, with the CPU they cost by thread and the traffic of their tree.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hyperactor::message::{handler_port, Serialized};
use hyperactor::{Client, ProcId, SendContext};
use hyperactor_mesh::agent::ProcAgent;
use hyperactor_mesh::cast::codec::{CastKind, ReplyMode};
use hyperactor_mesh::{ActorMesh, ProcMesh};
use serde::Serialize;

use crate::actor::{Bench, Ping, Res};
use crate::options::Options;
use crate::replay::{replay_call, tree_levels, LevelTraffic};
use crate::sims::{cpu_delta, cpu_snapshot, Sim};

pub(crate) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

/// The calls measured at one size and fan-out.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CallStats {
    pub(crate) actors: usize,
    pub(crate) fanout: usize,
    pub(crate) depth: usize,
    pub(crate) calls: usize,
    pub(crate) p10_ms: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p90_ms: f64,
    /// CPU per call, in µs, by thread label ("client", "hosts", "level1", ..., "other"),
    /// or by process kind for real procs ("client", "procs").
    pub(crate) cpu_us: BTreeMap<String, f64>,
    pub(crate) cpu_total_us: f64,
    pub(crate) cpu_per_actor_us: f64,
    /// Entries named in headers, summed over the tree (= reply items forwarded up).
    pub(crate) entry_hops: u64,
    pub(crate) traffic: Vec<LevelTraffic>,
}

/// How long one call may take before the harness gives up on it and says which ranks
/// did not answer.
const CALL_LIMIT: Duration = Duration::from_secs(60);

/// Makes `calls` of `Ping` to `mesh`, checking every reply; returns the latencies (ms).
pub(crate) async fn timed_calls(
    mesh: &ActorMesh<Bench>,
    agent: &ProcAgent,
    client: &Client,
    seq: &mut u64,
    budget: Duration,
    max_calls: usize,
) -> Res<Vec<f64>> {
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < max_calls && (start.elapsed() < budget || times.len() < 5) {
        *seq += 1;
        let t = Instant::now();
        let values = match tokio::time::timeout(CALL_LIMIT, mesh.call(client, &Ping(*seq))).await {
            Ok(values) => values?,
            Err(_) => {
                *seq += 1;
                let why = diagnose(mesh, agent, client, *seq).await;
                return Err(format!(
                    "a call to {} actors got no complete answer within {CALL_LIMIT:?}; {why}",
                    mesh.len()
                )
                .into());
            }
        };
        times.push(t.elapsed().as_secs_f64() * 1e3);
        check_values(&values, mesh.len(), *seq)?;
    }
    Ok(times)
}

/// Which ranks of `mesh` answer a cast whose replies come straight back (no reduction).
async fn diagnose(mesh: &ActorMesh<Bench>, agent: &ProcAgent, client: &Client, seq: u64) -> String {
    let queue = hyperactor_mesh::agent::ReplyQueue::open(agent);
    let parts = match Serialized::encode(&Ping(seq)) {
        Ok(p) => p.into_parts(),
        Err(e) => return e.to_string(),
    };
    mesh.mesh_ref().cast_parts(
        agent,
        client.actor_id(),
        CastKind::Message {
            port: handler_port::<Ping>(),
        },
        ReplyMode::Direct,
        Some(queue.reply_to().clone()),
        parts,
    );
    let mut got = std::collections::HashSet::new();
    while let Ok(item) = tokio::time::timeout(Duration::from_secs(5), queue.next()).await {
        got.insert(item.index);
    }
    let n = mesh.len();
    let levels = tree_levels(n, agent.fanout());
    let missing: Vec<String> = (0..n as u32)
        .filter(|i| !got.contains(i))
        .map(|i| format!("{i} (depth {})", levels[i as usize]))
        .collect();
    format!(
        "a cast with direct replies sent then: {} of {n} answered within 5 s; silent: {}",
        got.len(),
        missing
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    )
}

pub(crate) fn check_values(
    values: &hyperactor_mesh::ValueMesh<u64>,
    n: usize,
    seq: u64,
) -> Res<()> {
    if values.len() != n {
        return Err(format!("a call to {n} actors returned {} values", values.len()).into());
    }
    for i in 0..n {
        if values.get(i) != Some(&seq) {
            return Err(format!("rank {i} answered {:?} to call {seq}", values.get(i)).into());
        }
    }
    Ok(())
}

/// The view of the first `size` actors of `mesh` (extent `{hosts, procs}`).
fn prefix_view(mesh: &ActorMesh<Bench>, size: usize, per_host: usize) -> Res<ActorMesh<Bench>> {
    if size.is_multiple_of(per_host) {
        Ok(mesh.select_range("hosts", 0, size / per_host, 1)?)
    } else if size < per_host {
        Ok(mesh.select("hosts", 0)?.select_range("procs", 0, size, 1)?)
    } else {
        Err(format!("size {size} is neither below nor a multiple of --per-host {per_host}").into())
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn measure_sim(
    mesh: &ActorMesh<Bench>,
    procs: &ProcMesh,
    agent: &ProcAgent,
    client: &Client,
    sims: &[Sim],
    size: usize,
    fanout: usize,
    opts: &Options,
    seq: &mut u64,
    idle_ns_per_s: &BTreeMap<String, f64>,
) -> Res<CallStats> {
    agent.set_fanout(fanout);
    let view = prefix_view(mesh, size, opts.per_host)?;
    // Warm-up: links dialed, reducers' paths warm.
    timed_calls(&view, agent, client, seq, Duration::ZERO, 3).await?;
    let before = cpu_snapshot(sims);
    let t = Instant::now();
    let mut times = timed_calls(&view, agent, client, seq, opts.budget, opts.max_calls).await?;
    let wall = t.elapsed().as_secs_f64();
    let after = cpu_snapshot(sims);
    let calls = times.len();
    times.sort_by(f64::total_cmp);
    let delta = cpu_delta(&after, &before);
    // The background (heartbeats, leases), at its idle rate, is not the calls'.
    let cpu_us: BTreeMap<String, f64> = delta
        .iter()
        .map(|(k, v)| {
            let background = idle_ns_per_s.get(k).copied().unwrap_or(0.0) * wall;
            let ns = (*v as f64 - background).max(0.0);
            (k.clone(), ns / 1e3 / calls as f64)
        })
        .collect();
    let cpu_total_us: f64 = cpu_us.values().sum();
    let view_procs: Vec<ProcId> = view
        .shape()
        .iter()
        .map(|rank| procs.procs()[rank].proc_id.clone())
        .collect();
    let traffic = replay_call(
        client.actor_id(),
        &view_procs,
        view.mesh_ref().view_extent(),
        view.mesh_ref().actor_name(),
        fanout,
    )?;
    let levels = tree_levels(size, fanout);
    Ok(CallStats {
        actors: size,
        fanout,
        depth: usize::from(levels.iter().copied().max().unwrap_or(0)),
        calls,
        p10_ms: percentile(&times, 0.1),
        p50_ms: percentile(&times, 0.5),
        p90_ms: percentile(&times, 0.9),
        cpu_total_us,
        cpu_per_actor_us: cpu_total_us / size as f64,
        cpu_us,
        entry_hops: traffic.iter().map(|l| l.entries).sum(),
        traffic,
    })
}
