//! The sim host process (`--sim-host`): many host agents, each a real `Host` and
//! `ProcAgent` on its own socket, whose procs run inside this process (through the
//! `in_process` launcher seam) on one single-threaded runtime per tree level; it
//! reports its hosts and threads to the driver and takes `kill` commands on stdin.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::Duration;

use hyperactor::sync::Mutex;
use hyperactor::{ChannelTransport, ProcId};
use hyperactor_mesh::agent::{AgentOptions, Liveness, ProcAgent};
use hyperactor_mesh::bootstrap::{BootInfo, BootstrapCommand};
use hyperactor_mesh::host::in_process::{InProcessControl, LaunchedProc, ProcLauncher};
use hyperactor_mesh::host::{Host, ProcStatus};
use tokio::sync::watch;

use crate::actor::{Bench, Res, STOP_GRACE};
use crate::procfs::{gettid, raise_nofile};
use crate::replay::tree_levels;

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
/// rate is measured apart, see
/// [`heartbeat_cost`](crate::sim_run::heartbeat_cost)), a host found lost only after 30 s
/// without an answer (production: 2 s), and a client's procs outliving its silence for
/// 60 s (production: 10 s). Thousands of simulated hosts
/// share two cores with the work measured: a host agent starved of CPU for 2 s is not
/// lost, and a lost host's procs are told to exit, which for procs inside a sim host
/// process ends the whole process (`Control::Abandon` exits the process).
pub(crate) fn sim_liveness() -> Liveness {
    Liveness {
        interval: SIM_HEARTBEAT_INTERVAL,
        timeout: Duration::from_secs(30),
        lease: Duration::from_secs(60),
        ..Liveness::default()
    }
}

/// How often the client of the simulation sends each host a heartbeat.
const SIM_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);

struct SimArgs {
    first_host: usize,
    hosts: usize,
    total_hosts: usize,
    per_host: usize,
    fanout: usize,
}

pub(crate) fn sim_host_main(args: &[String]) -> Res<()> {
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
