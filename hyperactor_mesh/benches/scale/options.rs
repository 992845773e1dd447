//! The driver's command line: the options, their defaults, `--help` and `--quick`.

use std::path::PathBuf;
use std::time::Duration;

use crate::actor::Res;

#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) hosts: usize,
    pub(crate) per_host: usize,
    pub(crate) sim_procs: usize,
    pub(crate) fanout: usize,
    pub(crate) sizes: Vec<usize>,
    pub(crate) fanouts: Vec<usize>,
    pub(crate) other_fanout_sizes: Vec<usize>,
    pub(crate) real: Vec<usize>,
    pub(crate) real_workers: usize,
    pub(crate) fail: usize,
    pub(crate) budget: Duration,
    pub(crate) max_calls: usize,
    pub(crate) json: Option<PathBuf>,
    pub(crate) sim: bool,
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

pub(crate) fn parse_options(args: &[String]) -> Res<Options> {
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
