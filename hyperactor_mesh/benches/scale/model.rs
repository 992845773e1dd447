//! The cost model: a least-squares fit of the simulated calls' CPU (per call, per tree
//! node, at the root) and hop latency, and the latencies it predicts.

use hyperactor_mesh::cast::tree::chunks;
use serde::Serialize;

use crate::calls::CallStats;

/// The cost model, fitted on the simulated calls (see `docs/benchmarks.md`):
///
/// - the CPU of a whole call, `a·n + b·E + c` (`n` actors, `E` entry-hops);
/// - the CPU of one tree node, `α + β·children + γ·entries`, fitted on the levels of
///   the call to the whole mesh;
/// - the root's (the client's) CPU, `r0 + r1·n`;
/// - the hop: a frame's latency beyond the CPU, from calls to one actor.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Model {
    /// CPU per actor reached, µs.
    pub(crate) a_us: f64,
    /// CPU per entry-hop (a receiver named in a header at one level, and its reply
    /// item reduced at that level), µs.
    pub(crate) b_us: f64,
    /// Fixed CPU per call, µs.
    pub(crate) c_us: f64,
    /// Root-mean-square relative error of the whole-call fit.
    pub(crate) rms_rel_err: f64,
    /// Per tree node: fixed, per child, per entry of its header, µs.
    pub(crate) node_us: f64,
    pub(crate) child_us: f64,
    pub(crate) entry_us: f64,
    /// The root: fixed and per actor, µs.
    pub(crate) root_us: f64,
    pub(crate) root_per_actor_us: f64,
    /// One hop's latency beyond the CPU, µs.
    pub(crate) hop_us: f64,
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

pub(crate) fn fit_model(calls: &[CallStats], fanout: usize, full: usize) -> Model {
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
pub(crate) fn predict_dedicated_us(model: &Model, n: usize, f: usize, hop_us: f64) -> f64 {
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
pub(crate) fn predict_shared_us(
    model: &Model,
    n: usize,
    f: usize,
    entry_hops: u64,
    cores: f64,
) -> f64 {
    let total = model.a_us * n as f64 + model.b_us * entry_hops as f64 + model.c_us;
    let crit = predict_dedicated_us(model, n, f, model.hop_us);
    crit.max(total / cores)
}
