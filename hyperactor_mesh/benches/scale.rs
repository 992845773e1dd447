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

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write};
use std::ops::Range;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyperactor::message::{handler_port, Envelope, EnvelopeHeader, Serialized, UNDELIVERABLE_PORT};
use hyperactor::sync::Mutex;
use hyperactor::{
    Actor, ActorId, BoxError, ChannelTransport, Client, Context, Handler, ProcId, SendContext,
};
use hyperactor_mesh::agent::{agent_id, cast_port, reply_port, AgentOptions, Liveness, ProcAgent};
use hyperactor_mesh::bootstrap::{
    serve_until_stopped, BootInfo, BootstrapCommand, BOOTSTRAP_ADDR_ENV,
};
use hyperactor_mesh::cast::codec::{CastHeader, CastKind, Entry, ReplyMode, ReplyTo, ViewExtent};
use hyperactor_mesh::cast::reply::{encode_reply, ReplyItem};
use hyperactor_mesh::cast::tree::chunks;
use hyperactor_mesh::host::in_process::{InProcessControl, LaunchedProc, ProcLauncher};
use hyperactor_mesh::host::{Host, ProcStatus};
use hyperactor_mesh::{reply, ActorMesh, Extent, HostMesh, MeshFailure, ProcMesh, Request};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::watch;

type Res<T> = Result<T, BoxError>;

/// The environment variable that gives a real child proc its runtime's worker threads.
const REAL_WORKERS_ENV: &str = "SCALE_BENCH_REAL_WORKERS";

/// How long a stopped proc's actors get (as `serve_until_stopped` gives them).
const STOP_GRACE: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------
// The actor.

/// One actor per proc: answers a `Ping` with its number.
#[derive(Debug)]
struct Bench;

/// A call: every actor replies with the number.
#[derive(Debug, Serialize, Deserialize)]
struct Ping(u64);

impl Request for Ping {
    type Reply = u64;
}

impl Actor for Bench {
    type Params = ();
    async fn new((): ()) -> Result<Self, BoxError> {
        Ok(Bench)
    }
    fn bind(binder: &mut hyperactor::Binder<Self>) {
        binder.handle::<Ping>();
    }
}

impl Handler<Ping> for Bench {
    async fn handle(&mut self, cx: &Context<Self>, Ping(value): Ping) -> Result<(), BoxError> {
        reply(cx, &value)?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------
// Options.

#[derive(Debug, Clone)]
struct Options {
    hosts: usize,
    per_host: usize,
    sim_procs: usize,
    fanout: usize,
    sizes: Vec<usize>,
    fanouts: Vec<usize>,
    other_fanout_sizes: Vec<usize>,
    real: Vec<usize>,
    real_workers: usize,
    fail: usize,
    budget: Duration,
    max_calls: usize,
    json: Option<PathBuf>,
    sim: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            hosts: 1024,
            per_host: 8,
            sim_procs: 32,
            fanout: 16,
            sizes: vec![1, 16, 64, 256, 1024, 4096, 8192],
            fanouts: vec![4, 64],
            other_fanout_sizes: vec![256, 1024, 8192],
            real: vec![1, 16, 64, 256],
            real_workers: 2,
            fail: 1000,
            budget: Duration::from_millis(2000),
            max_calls: 400,
            json: Some(PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../.bench/results/scale.json"
            ))),
            sim: true,
        }
    }
}

const HELP: &str = "\
scale bench: simulated hosts through the production mesh code, beside real procs

options (defaults in brackets):
  --hosts N          simulated hosts [1024]
  --per-host N       procs per simulated host [8]
  --sim-procs N      OS processes the simulated hosts are spread over [32]
  --fanout N         the cast tree's fan-out [16]
  --sizes A,B,..     view sizes (actors) of the calls measured [1,16,64,256,1024,4096,8192]
  --fanouts A,B,..   other fan-outs measured [4,64], at --other-sizes [256,1024,8192]
  --real A,B,..      real-proc runs: that many OS procs, one actor each [1,16,64,256]
  --real-workers N   tokio worker threads of each real proc [2]
  --fail N           procs killed at once in the failure test [1000]
  --budget-ms N      time spent on the calls of one size [2000]
  --json PATH        where the results go [.bench/results/scale.json]; `-` for none
  --no-sim           only the real-proc runs
  --quick            16 hosts x 4, sizes 1,16,64, real 1,16, 16 failures
";

fn parse_list(value: &str) -> Res<Vec<usize>> {
    if value.is_empty() {
        return Ok(Vec::new());
    }
    value
        .split(',')
        .map(|v| {
            v.trim().parse::<usize>().map_err(|e| {
                format!("expected numbers separated by commas, got {value:?}: {e}").into()
            })
        })
        .collect()
}

fn parse_options(args: &[String]) -> Res<Options> {
    let mut o = Options::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || -> Res<String> {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{arg} needs a value (see --help)").into())
        };
        let number = |v: String| -> Res<usize> {
            v.parse()
                .map_err(|e| format!("{arg} takes a number, got {v:?}: {e}").into())
        };
        match arg.as_str() {
            "--bench" => {}
            "--help" | "-h" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            "--hosts" => o.hosts = number(value()?)?,
            "--per-host" => o.per_host = number(value()?)?,
            "--sim-procs" => o.sim_procs = number(value()?)?,
            "--fanout" => o.fanout = number(value()?)?,
            "--sizes" => o.sizes = parse_list(&value()?)?,
            "--fanouts" => o.fanouts = parse_list(&value()?)?,
            "--other-sizes" => o.other_fanout_sizes = parse_list(&value()?)?,
            "--real" => o.real = parse_list(&value()?)?,
            "--real-workers" => o.real_workers = number(value()?)?,
            "--fail" => o.fail = number(value()?)?,
            "--budget-ms" => o.budget = Duration::from_millis(number(value()?)? as u64),
            "--json" => {
                let v = value()?;
                o.json = (v != "-").then(|| PathBuf::from(v));
            }
            "--no-sim" => o.sim = false,
            "--quick" => {
                o.hosts = 16;
                o.per_host = 4;
                o.sim_procs = 2;
                o.sizes = vec![1, 16, 64];
                o.fanouts = vec![4];
                o.other_fanout_sizes = vec![64];
                o.real = vec![1, 16];
                o.fail = 16;
                o.budget = Duration::from_millis(500);
            }
            other => return Err(format!("unknown option {other:?} (see --help)").into()),
        }
    }
    if o.hosts == 0 || o.per_host == 0 || o.sim_procs == 0 || o.fanout == 0 {
        return Err("--hosts, --per-host, --sim-procs and --fanout must be at least 1".into());
    }
    let n = o.hosts * o.per_host;
    o.sizes.retain(|&s| s >= 1 && s <= n);
    o.other_fanout_sizes.retain(|&s| s >= 1 && s <= n);
    if o.fail > n {
        return Err(format!("--fail {} is more than the {n} simulated procs", o.fail).into());
    }
    Ok(o)
}

// ---------------------------------------------------------------------------------
// Process and thread counters (Linux /proc).

/// CPU time of thread `tid` of process `pid`, in ns (its scheduler's clock).
fn thread_cpu_ns(pid: u32, tid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU time of every live thread of process `pid`, in ns.
fn process_cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| t.file_name().to_str()?.parse::<u32>().ok())
        .map(|tid| thread_cpu_ns(pid, tid))
        .sum()
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    u32::try_from(tid).unwrap_or(0)
}

/// Raises this process's open-file limit as far as it may go (thousands of sockets per
/// sim host process): to 2^20 where allowed (root), else to the hard limit. Returns the
/// limit in force.
fn raise_nofile() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct passed; it is valid.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        let wanted = libc::rlimit {
            rlim_cur: 1 << 20,
            rlim_max: limit.rlim_max.max(1 << 20),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) == 0 {
            return wanted.rlim_cur;
        }
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        limit.rlim_cur
    }
}

/// How many file descriptors process `pid` has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

// ---------------------------------------------------------------------------------
// The tree, replayed: levels and bytes.

/// The depth (1: the root's direct receivers) of each position of a cast to `n`
/// receivers with fan-out `fanout`, as `cast_out` and `cast_in` cut it.
fn tree_levels(n: usize, fanout: usize) -> Vec<u8> {
    fn walk(range: Range<usize>, depth: u8, fanout: usize, out: &mut [u8]) {
        for chunk in chunks(range.len(), fanout) {
            let (start, end) = (range.start + chunk.start, range.start + chunk.end);
            out[start] = depth;
            walk(start + 1..end, depth.saturating_add(1), fanout, out);
        }
    }
    let mut out = vec![0; n];
    walk(0..n, 1, fanout, &mut out);
    out
}

/// The traffic of one level of a call's tree (level `k`: the receivers at depth `k`).
#[derive(Debug, Clone, Default, Serialize)]
struct LevelTraffic {
    /// Receivers at this depth.
    nodes: u64,
    /// Entries (receivers named) in the headers they receive.
    entries: u64,
    /// Frames and bytes they receive from their parents (the cast).
    frames_down: u64,
    bytes_down: u64,
    /// Frames and bytes they send to their parents (replies, reduced).
    frames_up: u64,
    bytes_up: u64,
}

/// What every frame of a call shares, for the replay.
struct Replay<'a> {
    header: CastHeader,
    parts: Vec<Bytes>,
    actor: &'a str,
    fanout: usize,
}

impl Replay<'_> {
    /// Replays the frames of a call whose receivers are `entries`, as the agents build
    /// them (`cast_out`, `cast_in`, the reducers), into `out` by depth.
    fn walk(
        &self,
        entries: &[Entry],
        depth: usize,
        sender: &ActorId,
        agent: &ActorId,
        reply: &ReplyTo,
        out: &mut Vec<LevelTraffic>,
    ) -> Res<()> {
        for range in chunks(entries.len(), self.fanout) {
            let chunk = &entries[range];
            let head = &chunk[0];
            if out.len() <= depth {
                out.resize(depth + 1, LevelTraffic::default());
            }
            let hops = u8::try_from(depth).unwrap_or(u8::MAX);
            let mut parts = vec![self.header.encode_chunk(hops, Some(reply), chunk)?];
            parts.extend(self.parts.iter().cloned());
            let down = frame_len(sender, cast_port(&head.proc), Some(agent), parts)?;
            let level = &mut out[depth];
            level.nodes += 1;
            level.entries += chunk.len() as u64;
            level.frames_down += 1;
            level.bytes_down += down;
            let rest = &chunk[1..];
            let head_agent = agent_id(&head.proc);
            let items: Vec<ReplyItem> = chunk
                .iter()
                .map(|e| ReplyItem::ok(e.index, vec![Bytes::from(e.index.to_le_bytes().repeat(2))]))
                .collect();
            let up = if rest.is_empty() {
                // The actor replies to its parent's reducer.
                let actor = head.proc.actor_id(self.actor, 0)?;
                let parts = encode_reply(reply.key, &items);
                frame_len(&actor, reply.port.clone(), Some(&actor), parts)?
            } else {
                let mine = ReplyTo {
                    port: reply_port(&head.proc),
                    key: 1,
                };
                self.walk(rest, depth + 1, &head_agent, &head_agent, &mine, out)?;
                // Its reducer sends the whole subtree's items up.
                let parts = encode_reply(reply.key, &items);
                frame_len(&head_agent, reply.port.clone(), Some(&head_agent), parts)?
            };
            let level = &mut out[depth];
            level.frames_up += 1;
            level.bytes_up += up;
        }
        Ok(())
    }
}

fn frame_len(
    sender: &ActorId,
    dest: hyperactor::PortId,
    return_to: Option<&ActorId>,
    parts: Vec<Bytes>,
) -> Res<u64> {
    let envelope = Envelope {
        header: EnvelopeHeader {
            sender: sender.clone(),
            dest,
            return_to: return_to.map(|a| a.port_id(UNDELIVERABLE_PORT)),
            extra: None,
        },
        payload: Serialized::from_parts(parts),
    };
    Ok(envelope.into_frame()?.len() as u64)
}

/// The traffic of a `Ping` call from `client` to `procs` (in view order), by depth
/// (index 0 unused).
fn replay_call(
    client: &ActorId,
    procs: &[ProcId],
    view: ViewExtent,
    actor: &str,
    fanout: usize,
) -> Res<Vec<LevelTraffic>> {
    let client_proc = client.proc_id();
    let reply = ReplyTo {
        port: reply_port(client_proc),
        key: 1,
    };
    let header = CastHeader {
        sender: 1,
        origin: client.clone(),
        actor: actor.to_string(),
        kind: CastKind::Message {
            port: handler_port::<Ping>(),
        },
        mode: ReplyMode::Reduce,
        reply: Some(reply.clone()),
        view,
        hops: 1,
        fanout: u16::try_from(fanout).unwrap_or(u16::MAX),
        entries: Vec::new(),
        dead: Vec::new(),
    };
    let entries: Vec<Entry> = procs
        .iter()
        .enumerate()
        .map(|(i, p)| Entry {
            index: i as u32,
            seq: 1,
            proc: p.clone(),
        })
        .collect();
    let replay = Replay {
        header,
        parts: Serialized::encode(&Ping(1))?.into_parts(),
        actor,
        fanout,
    };
    let mut out = Vec::new();
    replay.walk(
        &entries,
        1,
        client,
        &agent_id(client_proc),
        &reply,
        &mut out,
    )?;
    Ok(out)
}

// ---------------------------------------------------------------------------------
// The sim host process.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    Run,
    Stop,
    Kill,
}

/// Stops or kills one simulated proc.
struct SimControl(watch::Sender<Signal>);

impl InProcessControl for SimControl {
    fn stop(&self) {
        self.0.send_if_modified(|s| {
            let run = *s == Signal::Run;
            if run {
                *s = Signal::Stop;
            }
            run
        });
    }
    fn kill(&self) {
        self.0.send_replace(Signal::Kill);
    }
}

/// The procs of the sim host process, by global rank (for `kill` commands).
type Registry = Arc<Mutex<HashMap<usize, Arc<SimControl>>>>;

/// Starts the procs of one simulated host inside the sim host process, each on the
/// runtime of its tree level.
struct SimLauncher {
    host: ProcId,
    host_index: usize,
    per_host: usize,
    levels: Arc<Vec<u8>>,
    runtimes: Arc<Vec<tokio::runtime::Handle>>,
    registry: Registry,
}

impl ProcLauncher for SimLauncher {
    fn launch(&self, info: &BootInfo, _: &BootstrapCommand) -> std::io::Result<LaunchedProc> {
        let rank = self.host_index * self.per_host + info.rank;
        let level = usize::from(self.levels.get(rank).copied().unwrap_or(1));
        let runtime = &self.runtimes[level.clamp(1, self.runtimes.len() - 1)];
        let (signal, signals) = watch::channel(Signal::Run);
        let control = Arc::new(SimControl(signal));
        self.registry.lock().insert(rank, Arc::clone(&control));
        let (exit_tx, exit_rx) = tokio::sync::oneshot::channel();
        let (info, host) = (info.clone(), self.host.clone());
        runtime.spawn(async move {
            let _ = exit_tx.send(run_sim_proc(info, host, signals).await);
        });
        Ok(LaunchedProc {
            control,
            exit: Box::pin(async move {
                exit_rx.await.unwrap_or_else(|_| ProcStatus::Lost {
                    reason: "its runtime dropped it".to_string(),
                })
            }),
        })
    }
}

/// One simulated proc, booted as a child process boots, until stopped or killed.
async fn run_sim_proc(
    info: BootInfo,
    host: ProcId,
    mut signals: watch::Receiver<Signal>,
) -> ProcStatus {
    let lost = |reason: String| ProcStatus::Lost { reason };
    let proc = match info.serve(ChannelTransport::Unix).await {
        Ok(proc) => proc,
        Err(e) => return lost(e.to_string()),
    };
    let options = AgentOptions::default().register::<Bench>().spawned_by(host);
    let agent = match ProcAgent::new(proc.clone(), options) {
        Ok(agent) => agent,
        Err(e) => return lost(e.to_string()),
    };
    if let Err(e) = info.report_ready(&proc) {
        return lost(e.to_string());
    }
    let signal = match signals.wait_for(|s| *s != Signal::Run).await {
        Ok(s) => *s,
        Err(_) => Signal::Kill,
    };
    let status = if signal == Signal::Stop {
        proc.stop(STOP_GRACE).await;
        0
    } else {
        // SIGKILL's status; its actors get no time to stop.
        proc.stop(Duration::ZERO).await;
        libc::SIGKILL
    };
    drop(agent);
    ProcStatus::Exited(std::process::ExitStatus::from_raw(status))
}

/// The heartbeats of the simulation: every 5 s (production: 250 ms; their cost at that
/// rate is measured apart, see [`heartbeat_cost`]), a host found lost only after 30 s
/// without an answer (production: 2 s), and a client's procs outliving its silence for
/// 60 s (production: 10 s). Thousands of simulated hosts
/// share two cores with the work measured: a host agent starved of CPU for 2 s is not
/// lost, and a lost host's procs are told to exit, which for procs inside a sim host
/// process ends the whole process (`Control::Abandon` exits the process).
fn sim_liveness() -> Liveness {
    Liveness {
        interval: SIM_HEARTBEAT_INTERVAL,
        timeout: Duration::from_secs(30),
        lease: Duration::from_secs(60),
    }
}

/// How often the client of the simulation sends each host a heartbeat.
const SIM_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);

/// The CPU, in % of a core, of heartbeats at the production interval to every host:
/// (the client, the sim hosts' host-agent threads). A second client agent monitors
/// every host; it goes on doing so until the process ends (an agent is not freed while
/// its tasks wait), so this is measured last.
async fn heartbeat_cost(hosts: &[ProcId], sims: &[Sim]) -> Res<(f64, f64)> {
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
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let delta = cpu_delta(&cpu_snapshot(sims), &before);
    let secs = t.elapsed().as_secs_f64();
    drop(agent);
    let pct = |label: &str| delta.get(label).copied().unwrap_or(0) as f64 / 1e9 / secs * 100.0;
    Ok((pct("client"), pct("hosts")))
}

struct SimArgs {
    first_host: usize,
    hosts: usize,
    total_hosts: usize,
    per_host: usize,
    fanout: usize,
}

fn sim_host_main(args: &[String]) -> Res<()> {
    raise_nofile();
    let get = |name: &str| -> Res<usize> {
        let at = args
            .iter()
            .position(|a| a == name)
            .ok_or_else(|| format!("sim host: {name} missing"))?;
        let v = args
            .get(at + 1)
            .ok_or_else(|| format!("sim host: {name} needs a value"))?;
        Ok(v.parse()?)
    };
    let a = SimArgs {
        first_host: get("--first-host")?,
        hosts: get("--hosts")?,
        total_hosts: get("--total-hosts")?,
        per_host: get("--per-host")?,
        fanout: get("--fanout")?,
    };
    let levels = Arc::new(tree_levels(a.total_hosts * a.per_host, a.fanout));
    let depth = usize::from(levels.iter().copied().max().unwrap_or(1));
    // Runtime 0 runs the host agents; runtime k the procs at depth k.
    let mut handles = Vec::new();
    let mut threads = Vec::new();
    for i in 0..=depth {
        let label = if i == 0 {
            "hosts".to_string()
        } else {
            format!("level{i}")
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(label.clone())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        eprintln!("sim host: cannot build a runtime: {e}");
                        std::process::exit(2);
                    }
                };
                let _ = tx.send((runtime.handle().clone(), gettid()));
                runtime.block_on(std::future::pending::<()>());
            })?;
        let (handle, tid) = rx.recv()?;
        handles.push(handle);
        threads.push((label, tid));
    }
    let runtimes = Arc::new(handles);
    let registry: Registry = Arc::default();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Res<Vec<(usize, ProcId)>>>();
    {
        let (runtimes, registry, levels) = (
            Arc::clone(&runtimes),
            Arc::clone(&registry),
            Arc::clone(&levels),
        );
        let (first_host, hosts, per_host) = (a.first_host, a.hosts, a.per_host);
        runtimes[0].clone().spawn(async move {
            let mut agents = Vec::new();
            let mut ids = Vec::new();
            let result: Res<()> = async {
                for h in 0..hosts {
                    let host = Host::serve(ChannelTransport::Unix).await?;
                    let id = host.proc().proc_id().clone();
                    let launcher = SimLauncher {
                        host: id.clone(),
                        host_index: first_host + h,
                        per_host,
                        levels: Arc::clone(&levels),
                        runtimes: Arc::clone(&runtimes),
                        registry: Arc::clone(&registry),
                    };
                    let host = host.with_launcher(Arc::new(launcher)).with_log_dir(None);
                    let proc = host.proc().clone();
                    let options = AgentOptions::default().host(host).liveness(sim_liveness());
                    agents.push(ProcAgent::new(proc, options)?);
                    ids.push((first_host + h, id));
                }
                Ok(())
            }
            .await;
            let _ = ready_tx.send(result.map(|()| ids));
            // The host agents live as long as the process.
            std::future::pending::<()>().await;
            drop(agents);
        });
    }
    let hosts = ready_rx.recv()??;
    let mut out = std::io::stdout().lock();
    for (index, id) in &hosts {
        writeln!(out, "host {index} {id}")?;
    }
    for (label, tid) in &threads {
        writeln!(out, "thread {label} {tid}")?;
    }
    writeln!(out, "ready")?;
    out.flush()?;
    drop(out);
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let mut words = line.split_whitespace();
        match words.next() {
            Some("kill") => {
                let ranks: Vec<usize> = words.filter_map(|w| w.parse().ok()).collect();
                let controls: Vec<Arc<SimControl>> = {
                    let registry = registry.lock();
                    ranks
                        .iter()
                        .filter_map(|r| registry.get(r).cloned())
                        .collect()
                };
                for control in &controls {
                    control.kill();
                }
                let mut out = std::io::stdout().lock();
                writeln!(out, "killed {}", controls.len())?;
                out.flush()?;
            }
            Some("exit") | None => break,
            Some(other) => eprintln!("sim host: unknown command {other:?}"),
        }
    }
    // The driver stopped the procs; nothing else needs a graceful end.
    std::process::exit(0)
}

// ---------------------------------------------------------------------------------
// The real child proc.

fn real_child_main() -> Res<()> {
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

// ---------------------------------------------------------------------------------
// The driver.

/// A sim host process as the driver sees it.
struct Sim {
    child: tokio::process::Child,
    pid: u32,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    /// Its threads: "hosts", "level1", ...
    threads: Vec<(String, u32)>,
}

impl Sim {
    fn cpu_by_label(&self) -> BTreeMap<String, u64> {
        let mut by = BTreeMap::new();
        for (label, tid) in &self.threads {
            *by.entry(label.clone()).or_insert(0) += thread_cpu_ns(self.pid, *tid);
        }
        let total = process_cpu_ns(self.pid);
        let known: u64 = by.values().sum();
        by.insert("other".to_string(), total.saturating_sub(known));
        by
    }
}

/// CPU time by thread label, summed over every sim host process, plus the client's.
fn cpu_snapshot(sims: &[Sim]) -> BTreeMap<String, u64> {
    let mut by = BTreeMap::new();
    for sim in sims {
        for (label, ns) in sim.cpu_by_label() {
            *by.entry(label).or_insert(0) += ns;
        }
    }
    by.insert("client".to_string(), process_cpu_ns(std::process::id()));
    by
}

fn cpu_delta(
    after: &BTreeMap<String, u64>,
    before: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.saturating_sub(before.get(k).copied().unwrap_or(0)),
            )
        })
        .collect()
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

/// The calls measured at one size and fan-out.
#[derive(Debug, Clone, Serialize)]
struct CallStats {
    actors: usize,
    fanout: usize,
    depth: usize,
    calls: usize,
    p10_ms: f64,
    p50_ms: f64,
    p90_ms: f64,
    /// CPU per call, in µs, by thread label ("client", "hosts", "level1", ..., "other"),
    /// or by process kind for real procs ("client", "procs").
    cpu_us: BTreeMap<String, f64>,
    cpu_total_us: f64,
    cpu_per_actor_us: f64,
    /// Entries named in headers, summed over the tree (= reply items forwarded up).
    entry_hops: u64,
    traffic: Vec<LevelTraffic>,
}

/// Makes `calls` of `Ping` to `mesh`, checking every reply; returns the latencies (ms).
/// How long one call may take before the harness gives up on it and says which ranks
/// did not answer.
const CALL_LIMIT: Duration = Duration::from_secs(60);

async fn timed_calls(
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

fn check_values(values: &hyperactor_mesh::ValueMesh<u64>, n: usize, seq: u64) -> Res<()> {
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
async fn measure_sim(
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

#[derive(Debug, Default, Serialize)]
struct FailureStats {
    killed: usize,
    reported: usize,
    distinct: usize,
    duplicates: usize,
    unexpected: usize,
    missing: usize,
    /// Failures of other meshes (none expected).
    other_meshes: usize,
    first_ms: f64,
    p50_ms: f64,
    last_ms: f64,
    client_cpu_ms: f64,
    sims_cpu_ms: f64,
}

#[derive(Debug, Default, Serialize)]
struct SimReport {
    hosts: usize,
    per_host: usize,
    sim_procs: usize,
    start_sims_s: f64,
    spawn_procs_s: f64,
    spawn_actors_first_reply_s: f64,
    spawn_cpu_s: f64,
    rss_hosts_only_mib: f64,
    rss_after_spawn_mib: f64,
    rss_per_proc_kib: f64,
    client_rss_mib: f64,
    idle_cpu_pct: BTreeMap<String, f64>,
    /// Heartbeats at the production interval to every host, % of a core: the client,
    /// the host agents.
    heartbeats_client_pct: f64,
    heartbeats_hosts_pct: f64,
    /// The open-file limit, and the most descriptors a sim host process had open after
    /// the spawn and after the calls.
    fd_limit: u64,
    fds_after_spawn: usize,
    fds_after_calls: usize,
    calls: Vec<CallStats>,
    stop_s: f64,
    respawn_s: f64,
    failures: FailureStats,
    stop_after_failures_s: f64,
    /// Calls that did not complete (the measurement of sizes stops there).
    errors: Vec<String>,
}

async fn start_sims(opts: &Options) -> Res<(Vec<Sim>, Vec<ProcId>)> {
    let exe = std::env::current_exe()?;
    let per_sim = opts.hosts.div_ceil(opts.sim_procs);
    let mut sims = Vec::new();
    let mut hosts: Vec<Option<ProcId>> = vec![None; opts.hosts];
    let mut first = 0;
    while first < opts.hosts {
        let count = per_sim.min(opts.hosts - first);
        let mut child = tokio::process::Command::new(&exe)
            .args([
                "--sim-host".to_string(),
                "--first-host".to_string(),
                first.to_string(),
                "--hosts".to_string(),
                count.to_string(),
                "--total-hosts".to_string(),
                opts.hosts.to_string(),
                "--per-host".to_string(),
                opts.per_host.to_string(),
                "--fanout".to_string(),
                opts.fanout.to_string(),
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().ok_or("a sim host exited at once")?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        sims.push(Sim {
            child,
            pid,
            stdin,
            lines: tokio::io::BufReader::new(stdout).lines(),
            threads: Vec::new(),
        });
        first += count;
    }
    for sim in &mut sims {
        loop {
            let line = tokio::time::timeout(Duration::from_secs(120), sim.lines.next_line())
                .await
                .map_err(|_| format!("sim host {} did not start within 120 s", sim.pid))??
                .ok_or_else(|| format!("sim host {} exited while starting", sim.pid))?;
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["host", index, id] => {
                    let index: usize = index.parse()?;
                    hosts[index] = Some(id.parse()?);
                }
                ["thread", label, tid] => sim.threads.push((label.to_string(), tid.parse()?)),
                ["ready"] => break,
                _ => eprintln!("sim host {}: {line}", sim.pid),
            }
        }
    }
    let hosts = hosts
        .into_iter()
        .enumerate()
        .map(|(i, h)| h.ok_or_else(|| format!("no sim host reported host {i}").into()))
        .collect::<Res<Vec<ProcId>>>()?;
    Ok((sims, hosts))
}

fn sims_rss_mib(sims: &[Sim]) -> f64 {
    sims.iter().map(|s| rss_kib(s.pid)).sum::<u64>() as f64 / 1024.0
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

async fn run_sim(opts: &Options) -> Res<SimReport> {
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

#[derive(Debug, Default, Serialize)]
struct RealReport {
    procs: usize,
    workers: usize,
    spawn_procs_s: f64,
    spawn_actors_first_reply_s: f64,
    rss_per_proc_mib: f64,
    call: Option<CallStats>,
    stop_s: f64,
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

async fn run_reals(opts: &Options) -> Res<Vec<RealReport>> {
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

// ---------------------------------------------------------------------------------
// The cost model.

/// The cost model, fitted on the simulated calls (see `docs/benchmarks.md`):
///
/// - the CPU of a whole call, `a·n + b·E + c` (`n` actors, `E` entry-hops);
/// - the CPU of one tree node, `α + β·children + γ·entries`, fitted on the levels of
///   the call to the whole mesh;
/// - the root's (the client's) CPU, `r0 + r1·n`;
/// - the hop: a frame's latency beyond the CPU, from calls to one actor.
#[derive(Debug, Default, Serialize)]
struct Model {
    /// CPU per actor reached, µs.
    a_us: f64,
    /// CPU per entry-hop (a receiver named in a header at one level, and its reply
    /// item reduced at that level), µs.
    b_us: f64,
    /// Fixed CPU per call, µs.
    c_us: f64,
    /// Root-mean-square relative error of the whole-call fit.
    rms_rel_err: f64,
    /// Per tree node: fixed, per child, per entry of its header, µs.
    node_us: f64,
    child_us: f64,
    entry_us: f64,
    /// The root: fixed and per actor, µs.
    root_us: f64,
    root_per_actor_us: f64,
    /// One hop's latency beyond the CPU, µs.
    hop_us: f64,
}

/// Least squares `y ≈ Σ x_i·k_i` (weighted by `1/y²`: relative errors count).
#[allow(clippy::needless_range_loop)] // Gaussian elimination reads best with indices.
fn fit<const K: usize>(rows: &[([f64; K], f64)]) -> Option<[f64; K]> {
    let mut m = vec![[0.0f64; 8]; K];
    for (x, y) in rows {
        let w = 1.0 / (y * y).max(1e-9);
        for i in 0..K {
            for j in 0..K {
                m[i][j] += w * x[i] * x[j];
            }
            m[i][K] += w * x[i] * y;
        }
    }
    for col in 0..K {
        let pivot = (col..K).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        m.swap(col, pivot);
        if m[col][col].abs() < 1e-12 {
            return None;
        }
        for row in 0..K {
            if row != col {
                let f = m[row][col] / m[col][col];
                for k in col..=K {
                    m[row][k] -= f * m[col][k];
                }
            }
        }
    }
    let mut out = [0.0; K];
    for (i, o) in out.iter_mut().enumerate() {
        *o = m[i][K] / m[i][i];
    }
    Some(out)
}

fn fit_model(calls: &[CallStats], fanout: usize, full: usize) -> Model {
    let mut model = Model::default();
    let rows: Vec<([f64; 3], f64)> = calls
        .iter()
        .filter(|c| c.actors > 1)
        .map(|c| ([c.actors as f64, c.entry_hops as f64, 1.0], c.cpu_total_us))
        .collect();
    if let Some([a, b, c]) = fit(&rows) {
        model.a_us = a;
        model.b_us = b;
        model.c_us = c;
        model.rms_rel_err = (rows
            .iter()
            .map(|(x, y)| ((a * x[0] + b * x[1] + c * x[2] - y) / y).powi(2))
            .sum::<f64>()
            / rows.len().max(1) as f64)
            .sqrt();
    }
    let roots: Vec<([f64; 2], f64)> = calls
        .iter()
        .filter(|c| c.fanout == fanout && c.actors > 1)
        .map(|c| {
            (
                [1.0, c.actors as f64],
                c.cpu_us.get("client").copied().unwrap_or(0.0),
            )
        })
        .collect();
    if let Some([r0, r1]) = fit(&roots) {
        model.root_us = r0;
        model.root_per_actor_us = r1;
    }
    if let Some(whole) = calls
        .iter()
        .find(|c| c.actors == full && c.fanout == fanout)
    {
        let levels: Vec<([f64; 3], f64)> = whole
            .traffic
            .iter()
            .enumerate()
            .skip(1)
            .map(|(k, level)| {
                let children = whole.traffic.get(k + 1).map_or(0, |l| l.nodes);
                let cpu = whole
                    .cpu_us
                    .get(&format!("level{k}"))
                    .copied()
                    .unwrap_or(0.0);
                (
                    [level.nodes as f64, children as f64, level.entries as f64],
                    cpu,
                )
            })
            .collect();
        if let Some([node, child, entry]) = fit(&levels) {
            model.node_us = node;
            model.child_us = child;
            model.entry_us = entry;
        }
    }
    model.hop_us = calls.iter().find(|c| c.actors == 1).map_or(f64::NAN, |c| {
        ((c.p50_ms * 1e3 - c.cpu_total_us) / 2.0).max(0.0)
    });
    model
}

/// The latency of a call to `n` actors over dedicated hosts (no core shared): the
/// critical path — the root, then the head of the largest chunk at each level — each
/// node's whole CPU on it, and a hop each way per level.
fn predict_dedicated_us(model: &Model, n: usize, f: usize, hop_us: f64) -> f64 {
    let mut t = model.root_us + model.root_per_actor_us * n as f64;
    let mut size = chunks(n, f).first().map_or(0, |c| c.len());
    while size > 0 {
        let children = chunks(size - 1, f);
        t += model.node_us
            + model.child_us * children.len() as f64
            + model.entry_us * size as f64
            + 2.0 * hop_us;
        size = children.first().map_or(0, |c| c.len());
    }
    t
}

/// The latency on a machine of `cores` cores shared by every proc: the total CPU spread
/// over the cores, or the critical path if that is longer.
fn predict_shared_us(model: &Model, n: usize, f: usize, entry_hops: u64, cores: f64) -> f64 {
    let total = model.a_us * n as f64 + model.b_us * entry_hops as f64 + model.c_us;
    let crit = predict_dedicated_us(model, n, f, model.hop_us);
    crit.max(total / cores)
}

// ---------------------------------------------------------------------------------
// Report.

#[derive(Debug, Default, Serialize)]
struct Report {
    date: String,
    load_before: String,
    load_after: String,
    cores: usize,
    sim: Option<SimReport>,
    real: Vec<RealReport>,
    model: Model,
    predictions: Vec<Prediction>,
}

#[derive(Debug, Serialize)]
struct Prediction {
    what: String,
    us: f64,
}

fn print_report(report: &Report, opts: &Options) {
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
