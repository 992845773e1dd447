// Monarch admin dashboard: one file, no dependencies. It reads the JSON API v1 (relative
// URLs only, so it works behind tunnels, notebook proxies and path prefixes), polls the
// snapshot every 2 s while the tab is visible and refreshes at once on each event of the
// server-sent stream. Everything is built with DOM calls (never HTML strings): ids and log
// lines are untrusted text, and the page runs under `default-src 'self'`.
"use strict";
(() => {
  const POLL_MS = 2000;
  const WINDOW_S = 900;
  const st = {
    summary: null, snap: null, series: null, events: [], lastSeq: 0,
    showSystem: false, open: new Map(), big: false, detailId: null, detail: null,
    busy: false, again: [], detailSig: "", meshSig: "", chartSig: "", treeSig: "", failSig: "", authFailed: false, es: null,
  };

  // ---- small helpers ----------------------------------------------------------------
  const $ = (id) => document.getElementById(id);
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of kids.flat(4)) if (c != null && c !== false) el.append(c instanceof Node ? c : String(c));
    return el;
  }
  const SVGNS = "http://www.w3.org/2000/svg";
  function sv(tag, attrs, text) {
    const el = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    if (text != null) el.textContent = text;
    return el;
  }
  const fmtNum = (n) => n == null ? "—" : Math.abs(n) >= 1e6 ? (n / 1e6).toFixed(1) + "M"
    : Math.abs(n) >= 1e4 ? (n / 1e3).toFixed(1) + "k" : String(Math.round(n * 100) / 100);
  function fmtBytes(b) {
    if (b == null) return "—";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(b) >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return (i ? b.toFixed(b < 10 ? 2 : b < 100 ? 1 : 0) : b) + " " + u[i];
  }
  function fmtMs(ms) {
    if (ms == null || !isFinite(ms)) return "—";
    if (ms < 1) return (ms * 1000).toFixed(0) + " µs";
    if (ms < 1000) return ms.toFixed(ms < 10 ? 2 : 1) + " ms";
    if (ms < 60000) return (ms / 1000).toFixed(2) + " s";
    return fmtAge(ms / 1000);
  }
  function fmtAge(s) {
    s = Math.max(0, Math.floor(s));
    const d = Math.floor(s / 86400), hh = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60;
    if (d) return `${d}d ${hh}h`;
    if (hh) return `${hh}h ${m}m`;
    if (m) return `${m}m ${s % 60}s`;
    return `${s}s`;
  }
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
  const pad = (n) => String(n).padStart(2, "0");
  function clock(t) {
    const d = new Date(t * 1000);
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }
  const shortProc = (id) => id ? String(id).split("@")[0] : "—";
  const actorLabel = (a) => `${a.name}[${a.rank ?? "?"}]`;
  const badge = (text, kind) => h("span", { class: `badge s-${kind || text}` }, text);
  const mono = (text, extra) => h("span", { class: "mono trunc " + (extra || ""), title: text }, text);
  function detailLink(actorId, label, testid) {
    return h("a", {
      href: "#actor=" + encodeURIComponent(actorId), class: "link mono trunc", title: actorId,
      "data-testid": testid,
    }, label);
  }

  // ---- the API ----------------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }
  async function api(path) {
    let r;
    try {
      r = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
    } catch (e) {
      throw new ApiError(0, `cannot reach the admin server (${e.message}); is the program still running?`);
    }
    let body = null;
    try { body = await r.json(); } catch (_) { body = null; }
    if (r.status === 401) showAuthError();
    if (!r.ok) {
      const msg = body && body.error ? body.error : `the server answered HTTP ${r.status} to ${path}`;
      throw new ApiError(r.status, msg);
    }
    return body;
  }
  function showAuthError() {
    st.authFailed = true;
    const b = $("banner");
    b.replaceChildren(h("strong", null, "Not signed in. "),
      "This browser has no valid access cookie for the admin server. Open the dashboard with the " +
      "full URL the program printed at start (it ends in ", h("code", null, "?token=…"),
      "); the token sets the cookie, then reload.");
    b.hidden = false;
    setConn("down", "unauthorized");
  }
  function showBanner(msg) {
    if (st.authFailed) return;
    const b = $("banner");
    if (!msg) { b.hidden = true; return; }
    b.replaceChildren(msg);
    b.hidden = false;
  }
  function setConn(state, text) {
    const c = $("conn");
    c.dataset.state = state;
    $("conn-text").textContent = text;
  }

  // ---- refresh loop -----------------------------------------------------------------
  // For tests and the benchmark, the last REFRESH_LOG refreshes that drew a snapshot, in
  // order: why each ran (`start`, `poll`, `visible`, or `event:SEQ` for the event of the
  // stream that triggered it; several when requests made while one ran were merged into
  // the next), when it asked for the snapshot and drew it (ms, wall clock), and the
  // snapshot's `time` (which tells a reused snapshot from a new one).
  const REFRESH_LOG = 100;
  const refreshes = [];
  window.__monarchRefreshes = refreshes;
  async function refresh(...why) {
    if (st.busy) { st.again.push(...why); return; }
    st.busy = true;
    try {
      const asked = Date.now();
      const [summary, snap, series] = await Promise.all([
        api("v1/summary"), api("v1/snapshot"), api("v1/series?window=" + WINDOW_S),
      ]);
      st.authFailed = false;
      st.summary = summary; st.snap = snap; st.series = series;
      showBanner(null);
      if (!st.es || st.es.readyState !== 1) setConn("poll", "polling");
      else setConn("live", "live");
      render();
      refreshes.push({ why, asked, drawn: Date.now(), snapshot: snap.time });
      if (refreshes.length > REFRESH_LOG) refreshes.splice(0, refreshes.length - REFRESH_LOG);
      if (!document.body.dataset.ready) {
        // For tests and the benchmark: the first snapshot is on screen.
        document.body.dataset.ready = "1";
        performance.mark("monarch:first-render");
      }
      if (st.detailId) await loadDetail(false);
    } catch (e) {
      if (e.status !== 401) {
        showBanner(`Cannot refresh: ${e.message}`);
        setConn("down", "disconnected");
      }
    } finally {
      st.busy = false;
      if (st.again.length) refresh(...st.again.splice(0));
    }
  }
  function render() {
    renderHeader();
    renderCards();
    renderCharts();
    renderTree();
    renderFailures();
  }

  // ---- header and cards -------------------------------------------------------------
  function renderHeader() {
    const s = st.summary;
    $("program").textContent = s.program || "—";
    $("program").title = `${s.program} (pid ${s.pid})`;
    const hb = $("health");
    hb.textContent = s.health;
    hb.className = "badge s-" + s.health;
    $("uptime").textContent = fmtAge(s.now - s.started_at);
    $("session").textContent = "session " + s.session;
    document.title = `${s.health === "ok" ? "" : "⚠ "}${s.program} · Monarch`;
  }
  function card(key, label, value, sub, tone) {
    return h("div", { class: "card" + (tone ? " tone-" + tone : ""), "data-testid": "card-" + key },
      h("div", { class: "card-l" }, label), h("div", { class: "card-v" }, value),
      h("div", { class: "card-s" }, sub));
  }
  function renderCards() {
    const s = st.summary, snap = st.snap, c = s.counts;
    const hostsUp = snap.hosts.filter((x) => x.status === "alive").length;
    const procsUp = snap.procs.filter((p) => p.status === "running").length;
    const sys = snap.actors.filter((a) => a.system).length;
    const fails = c.failed_actors + c.failed_procs;
    $("cards").replaceChildren(
      card("hosts", "Hosts", String(c.hosts), `${hostsUp} alive`, hostsUp < c.hosts ? "bad" : ""),
      card("procs", "Procs", String(c.procs), `${procsUp} running`, procsUp < c.procs ? "warn" : ""),
      card("meshes", "Meshes", String(c.meshes), ((n) => `${n} actor mesh${n === 1 ? "" : "es"}`)(snap.meshes.filter((m) => m.kind === "actor").length)),
      card("actors", "Actors", String(c.actors), `+${sys} system`),
      card("failures", "Failures", String(fails), `${plural(c.failed_actors, "actor")} · ${plural(c.failed_procs, "proc")}`, fails ? "bad" : "good"),
      card("rate", "Messages/s", fmtNum(s.messages.rate), `${fmtNum(s.messages.handled)} handled · ${s.messages.errors} errors`),
    );
  }

  // ---- charts (inline SVG) ----------------------------------------------------------
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }
  function chart(key, title, lines, fmt) {
    const track = parseFloat(getComputedStyle($("charts")).gridTemplateColumns) || 300;
    const W = Math.max(180, Math.floor(track - 18)), H = 132;
    const L = 46, R = 8, T = 8, B = 20, pw = W - L - R, ph = H - T - B;
    const svg = sv("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
    const pts = st.series.points || [];
    const last = pts.length ? pts[pts.length - 1] : null;
    const t1 = last ? last.t : 0, t0 = pts.length ? Math.max(pts[0].t, t1 - WINDOW_S) : -1;
    const span = Math.max(1, t1 - t0);
    let max = 0;
    for (const ln of lines) for (const v of ln.values) if (v > max) max = v;
    max = niceMax(max);
    const x = (t) => L + ((t - t0) / span) * pw, y = (v) => T + ph - (v / max) * ph;
    for (let i = 0; i <= 2; i++) {
      const v = (max * i) / 2, yy = y(v);
      svg.append(sv("line", { x1: L, x2: W - R, y1: yy, y2: yy, class: "grid" }));
      svg.append(sv("text", { x: L - 5, y: yy + 3.5, class: "tick", "text-anchor": "end" }, fmt(v)));
    }
    for (let i = 0; i <= 3; i++) {
      const t = t0 + (span * i) / 3, ago = t1 - t;
      svg.append(sv("text", {
        x: x(t), y: H - 5, class: "tick", "text-anchor": i === 0 ? "start" : i === 3 ? "end" : "middle",
      }, i === 3 ? "now" : "-" + fmtAge(ago)));
    }
    if (!pts.length) svg.append(sv("text", { x: L + pw / 2, y: T + ph / 2, class: "tick", "text-anchor": "middle" }, "collecting samples…"));
    svg.append(sv("line", { x1: L, x2: L, y1: T, y2: T + ph, class: "axis" }));
    svg.append(sv("line", { x1: L, x2: W - R, y1: T + ph, y2: T + ph, class: "axis" }));
    for (const ln of lines) {
      if (!pts.length) break;
      const d = pts.map((p, i) => `${i ? "L" : "M"}${x(p.t).toFixed(1)},${y(ln.values[i] || 0).toFixed(1)}`).join("");
      if (ln.fill) svg.append(sv("path", { d: `${d}L${x(t1)},${T + ph}L${x(pts[0].t)},${T + ph}Z`, class: "area " + ln.cls }));
      svg.append(sv("path", { d, class: "line " + ln.cls }));
    }
    const cur = lines.map((ln) => h("span", { class: "legend " + ln.cls },
      `${ln.name} ${fmt(ln.values.length ? ln.values[ln.values.length - 1] : null)}`));
    const box = h("figure", { class: "chart", "data-testid": "chart-" + key },
      h("figcaption", null, h("span", { class: "chart-t" }, title), cur), svg);
    hover(box, svg, pts, lines, fmt, x, L, W - R);
    return box;
  }
  function hover(box, svg, pts, lines, fmt, x, x0, x1) {
    const tip = h("div", { class: "tip", hidden: true });
    const rule = sv("line", { y1: 8, y2: 112, class: "rule", visibility: "hidden" });
    svg.append(rule);
    box.append(tip);
    svg.addEventListener("mousemove", (ev) => {
      if (!pts.length) return;
      const r = svg.getBoundingClientRect(), mx = ev.clientX - r.left;
      if (mx < x0 || mx > x1) return;
      let best = 0;
      for (let i = 0; i < pts.length; i++) if (Math.abs(x(pts[i].t) - mx) < Math.abs(x(pts[best].t) - mx)) best = i;
      const px = x(pts[best].t);
      rule.setAttribute("x1", px); rule.setAttribute("x2", px); rule.setAttribute("visibility", "visible");
      tip.replaceChildren(h("b", null, clock(pts[best].t)), ...lines.map((ln) => h("div", null, `${ln.name}: ${fmt(ln.values[best])}`)));
      tip.hidden = false;
      tip.style.left = Math.min(px + 10, r.width - 120) + "px";
    });
    svg.addEventListener("mouseleave", () => { tip.hidden = true; rule.setAttribute("visibility", "hidden"); });
  }
  function renderCharts(force) {
    const pts = st.series.points || [];
    // Redraw only for new samples (or a resize): a redraw would drop the hover tooltip.
    const sig = `${pts.length}:${pts.length ? pts[pts.length - 1].t : 0}`;
    if (!force && sig === st.chartSig) return;
    st.chartSig = sig;
    const col = (k) => pts.map((p) => p[k]);
    const delta = (k) => pts.map((p, i) => i ? Math.max(0, p[k] - pts[i - 1][k]) / (p.t - pts[i - 1].t || 1) : 0);
    const rate = (v) => v == null ? "—" : fmtNum(v) + "/s";
    const count = (v) => v == null ? "—" : fmtNum(v);
    $("charts").replaceChildren(
      chart("rate", "Message rate", [{ name: "msgs", values: col("rate"), cls: "c1", fill: true }], rate),
      chart("errors", "Errors", [
        { name: "errors/s", values: delta("errors"), cls: "c3", fill: true },
        { name: "failed actors", values: col("actors_failed"), cls: "c4" }], count),
      chart("memory", "Memory (RSS, all procs)", [{ name: "rss", values: col("rss"), cls: "c2", fill: true }],
        (v) => v == null ? "—" : fmtBytes(v)),
      chart("cpu", "CPU (all procs)", [{ name: "cpu", values: col("cpu_pct"), cls: "c5", fill: true }],
        (v) => v == null ? "—" : Math.round(v) + "%"),
    );
  }

  // ---- topology tree ----------------------------------------------------------------
  function node(key, summaryKids, kids, attrs) {
    // Large jobs start with their procs folded; what the user opens or folds stays so.
    const open = st.open.has(key) ? st.open.get(key) : !(st.big && key.startsWith("p:"));
    const d = h("details", Object.assign({ class: "node", "data-key": key, open }, attrs || {}),
      h("summary", null, summaryKids), h("div", { class: "kids" }, kids));
    d.addEventListener("toggle", () => { if (d.open !== open || st.open.has(key)) st.open.set(key, d.open); });
    return d;
  }
  function renderTree() {
    const snap = st.snap;
    const meshById = new Map(snap.meshes.map((m) => [m.id, m]));
    const visible = snap.actors.filter((a) => st.showSystem || !a.system);
    const sig = JSON.stringify([snap.hosts, snap.procs, snap.meshes, visible, st.showSystem, st.detailId]);
    $("tree-sub").textContent = `${snap.hosts.length} hosts · ${snap.procs.length} procs · ${visible.length} actors shown`;
    renderMeshes(snap);
    if (sig === st.treeSig) return;
    st.treeSig = sig;
    // Keep the keyboard focus across the redraw: the same link, button or folder.
    const ae = document.activeElement;
    let refocus = null;
    if (ae && $("tree").contains(ae)) {
      if (ae.dataset.testid) refocus = `[data-testid="${CSS.escape(ae.dataset.testid)}"]`;
      else if (ae.tagName === "SUMMARY") refocus = `details[data-key="${CSS.escape(ae.parentElement.dataset.key)}"] > summary`;
    }
    st.big = snap.procs.length > 32 || visible.length > 400;
    const byProc = new Map();
    for (const a of visible) {
      if (!byProc.has(a.proc)) byProc.set(a.proc, []);
      byProc.get(a.proc).push(a);
    }
    const hostIds = new Set(snap.hosts.map((x) => x.id));
    const hosts = snap.hosts.slice();
    for (const p of snap.procs) if (!hostIds.has(p.host)) { hostIds.add(p.host); hosts.push({ id: p.host, status: "unknown" }); }
    const tree = hosts.map((host) => {
      const procs = snap.procs.filter((p) => p.host === host.id);
      const mem = host.mem_total ? `${fmtBytes(host.mem_total - host.mem_available)} / ${fmtBytes(host.mem_total)}` : "";
      const gpus = (host.gpus || []).map((g) => h("span", { class: "chip", title: `${g.name}: ${fmtBytes(g.mem_used)} / ${fmtBytes(g.mem_total)}` },
        `gpu${g.index} ${Math.round(g.util_pct)}%`));
      return node("h:" + host.id, [
        h("span", { class: "kind" }, "host"), h("span", { class: "dot s-" + host.status, title: host.status }),
        mono(host.hostname ? `${host.hostname}` : host.id, "strong"), mono(host.id, "dim"),
        h("span", { class: "stat" }, host.load ? `load ${host.load[0].toFixed(2)}` : ""),
        h("span", { class: "stat" }, mem), gpus,
      ], procs.map((p) => procNode(p, byProc.get(p.id) || [], meshById)), { "data-testid": "host-" + host.id });
    });
    $("tree").replaceChildren(...(tree.length ? tree : [h("div", { class: "empty" }, "no hosts yet")]));
    const el = refocus && $("tree").querySelector(refocus);
    if (el) el.focus();
  }
  function procNode(p, actors, meshById) {
    const groups = new Map();
    for (const a of actors) {
      const m = a.mesh != null ? meshById.get(a.mesh) : null;
      const name = m ? m.name : a.system ? "system" : "(no mesh)";
      if (!groups.has(name)) groups.set(name, { mesh: m, actors: [] });
      groups.get(name).actors.push(a);
    }
    const exit = p.exit ? h("span", { class: "stat bad", title: p.exit.reason }, p.exit.reason) : null;
    return node("p:" + p.id, [
      h("span", { class: "kind" }, "proc"), h("span", { class: "dot s-" + p.status, title: p.status }),
      mono(shortProc(p.id), "strong"), exit ? null : h("span", { class: "mono trunc dim id", title: p.id }, p.id),
      p.mesh ? h("span", { class: "chip" }, `${p.mesh}[${p.rank}]`) : null,
      h("span", { class: "stat" }, `pid ${p.pid}`), badge(p.status),
      h("span", { class: "stat" }, `RSS ${fmtBytes(p.rss)}`), h("span", { class: "stat" }, `CPU ${Math.round(p.cpu_pct)}%`),
      exit,
      h("button", {
        type: "button", class: "btn small", "data-testid": "stack-" + p.id, title: "dump the stack of every thread of this proc",
        onclick: (ev) => { ev.preventDefault(); ev.stopPropagation(); openStack(p); },
      }, "stack"),
    ], [...groups.entries()].map(([name, g]) => node("m:" + p.id + ":" + name, [
      h("span", { class: "kind" }, "mesh"), h("span", { class: "strong" }, name),
      g.mesh && g.mesh.class ? h("span", { class: "dim" }, g.mesh.class) : null,
      h("span", { class: "stat" }, `${g.actors.length} actor${g.actors.length === 1 ? "" : "s"}`),
    ], g.actors.map(actorRow), { "data-mesh": name }))
      .concat(groups.size ? [] : [h("div", { class: "empty" }, "no actors")]), { "data-testid": "proc-" + p.id });
  }
  function actorRow(a) {
    const cur = a.current ? h("span", { class: "cur", title: "current endpoint" },
      `▶ ${a.current.endpoint} · ${fmtMs(a.current.since_ms)}`) : null;
    return h("a", {
      href: "#actor=" + encodeURIComponent(a.id), class: "actor" + (st.detailId === a.id ? " sel" : ""),
      "data-testid": "actor-" + a.id, title: a.id,
    }, h("span", { class: "dot s-" + a.status }), h("span", { class: "mono strong" }, actorLabel(a)),
    h("span", { class: "dim" }, a.class), badge(a.status), cur,
    h("span", { class: "stat" }, `${fmtNum(a.handled)} msgs`), a.errors ? h("span", { class: "stat bad" }, `${a.errors} err`) : null,
    a.queue ? h("span", { class: "stat" }, `queue ${a.queue}`) : null);
  }
  function renderMeshes(snap) {
    const ms = snap.meshes.filter((m) => st.showSystem || !m.system);
    const sig = JSON.stringify(ms);
    if (sig === st.meshSig) return;
    st.meshSig = sig;
    $("meshes").replaceChildren(...ms.map((m) => {
      const ext = Object.entries(m.extent || {}).map(([k, v]) => `${k}=${v}`).join(" ");
      return h("div", { class: "mesh", "data-testid": "mesh-" + m.name, title: `mesh ${m.id} created ${clock(m.created)}` },
        h("span", { class: "dot s-" + m.status }), h("span", { class: "strong" }, m.name),
        h("span", { class: "kind" }, m.kind), m.class ? h("span", { class: "dim" }, m.class) : null,
        h("span", { class: "stat mono" }, ext), m.proc_mesh ? h("span", { class: "dim" }, "on " + m.proc_mesh) : null);
    }));
  }

  // ---- failures ---------------------------------------------------------------------
  function renderFailures() {
    const snap = st.snap;
    const failedActors = snap.actors.filter((a) => a.status === "failed");
    const failedProcs = snap.procs.filter((p) => p.status === "failed" || p.status === "lost");
    const sig = JSON.stringify([failedActors, failedProcs, st.events.length]);
    $("fail-sub").textContent = failedActors.length + failedProcs.length ? `${plural(failedActors.length, "actor")} · ${plural(failedProcs.length, "proc")}` : "";
    if (sig === st.failSig) return;
    st.failSig = sig;
    const items = failedActors.map((a) => {
      const f = a.failure || {};
      const cause = (f.cause && f.cause.length ? f.cause[f.cause.length - 1] : f.reason) || "unknown cause";
      return h("li", { class: "fail", "data-testid": "failure", "data-actor": a.id },
        h("div", { class: "fail-h" }, badge(f.class || "unknown", "class-" + (f.class || "unknown")),
          detailLink(a.id, `${a.name}[${a.rank}] ${a.class || ""}`, "failure-link"),
          h("span", { class: "dim mono trunc", title: a.proc }, shortProc(a.proc))),
        h("div", { class: "fail-c", title: (f.cause || []).join("\n← ") }, f.reason || cause));
    });
    for (const p of failedProcs) {
      const ev = [...st.events].reverse().find((e) => e.proc === p.id && (e.kind === "proc_exited" || e.kind === "proc_lost"));
      const cls = (ev && ev.class) || (p.status === "lost" ? "infrastructure" : "unknown");
      const onIt = failedActors.find((a) => a.proc === p.id);
      items.push(h("li", { class: "fail", "data-testid": "failure-proc", "data-proc": p.id },
        h("div", { class: "fail-h" }, badge(cls, "class-" + cls), h("span", { class: "kind" }, "proc"),
          onIt ? detailLink(onIt.id, shortProc(p.id), "failure-proc-link") : mono(shortProc(p.id)),
          h("span", { class: "dim" }, `pid ${p.pid}`)),
        h("div", { class: "fail-c" }, (p.exit && p.exit.reason) || p.status)));
    }
    const MAX = 50;
    if (items.length > MAX) {
      const more = items.length - MAX;
      items.splice(MAX, more, h("li", { class: "empty" }, `…and ${more} more (the tree marks every failed actor)`));
    }
    $("failures").replaceChildren(items.length ? h("ul", { class: "fails" }, items)
      : h("div", { class: "empty good" }, "no failures"));
  }

  // ---- actor detail -----------------------------------------------------------------
  function quantile(buckets, bounds, q) {
    const total = buckets.reduce((s, n) => s + n, 0);
    if (!total) return null;
    const want = q * total;
    let seen = 0;
    for (let i = 0; i < buckets.length; i++) {
      if (seen + buckets[i] >= want && buckets[i] > 0) {
        const lo = i ? bounds[i - 1] : 0, hi = i < bounds.length ? bounds[i] : bounds[bounds.length - 1];
        return (lo + ((want - seen) / buckets[i]) * (hi - lo)) / 1000;
      }
      seen += buckets[i];
    }
    return bounds[bounds.length - 1] / 1000;
  }
  async function loadDetail(scroll) {
    const id = st.detailId;
    if (!id) return;
    const panel = $("detail");
    panel.hidden = false;
    if (scroll) panel.replaceChildren(drawerHead("Actor", id, closeDetail), h("div", { class: "empty" }, "loading…"));
    try {
      const r = await api("v1/actor?id=" + encodeURIComponent(id));
      if (st.detailId !== id) return;
      const sig = JSON.stringify(r);
      if (!scroll && sig === st.detailSig) return;
      st.detailSig = sig;
      const top = scroll ? 0 : panel.scrollTop;
      renderDetail(r.actor, r.logs || []);
      panel.scrollTop = top;
      const lb = panel.querySelector(".logbox");
      if (scroll && lb) lb.scrollTop = lb.scrollHeight;
    } catch (e) {
      if (st.detailId !== id) return;
      panel.replaceChildren(drawerHead("Actor", id, closeDetail),
        h("div", { class: "err", "data-testid": "detail-error" }, e.message));
    }
    if (scroll) $("detail-close").focus();
  }
  function drawerHead(kind, id, close) {
    return h("div", { class: "drawer-h" }, h("span", { class: "kind" }, kind),
      h("span", { class: "mono trunc strong", title: id }, id),
      h("button", { type: "button", class: "btn small", id: kind === "Actor" ? "detail-close" : "stack-close", onclick: close, "aria-label": "close" }, "✕"));
  }
  function kv(label, value, testid) {
    return [h("dt", null, label), h("dd", { "data-testid": testid }, value)];
  }
  function renderDetail(a, logs) {
    const bounds = (st.snap && st.snap.bucket_bounds_us) || [];
    const f = a.failure;
    const eps = Object.entries(a.endpoints || {}).sort((x, y) => y[1].count - x[1].count);
    const table = h("table", { class: "tbl", "data-testid": "endpoint-table" },
      h("thead", null, h("tr", null, ["endpoint", "count", "errors", "mean", "p50", "p99", "total"].map((c) => h("th", null, c)))),
      h("tbody", null, eps.map(([name, e]) => h("tr", { "data-testid": "endpoint-" + name },
        h("td", { class: "mono" }, name), h("td", null, fmtNum(e.count)), h("td", { class: e.errors ? "bad" : "" }, String(e.errors)),
        h("td", null, e.count ? fmtMs(e.total_ms / e.count) : "—"),
        h("td", null, fmtMs(quantile(e.buckets || [], bounds, 0.5))), h("td", null, fmtMs(quantile(e.buckets || [], bounds, 0.99))),
        h("td", null, fmtMs(e.total_ms))))));
    const failure = f ? h("div", { class: "failbox" },
      h("div", { class: "fail-h" }, badge(f.class, "class-" + f.class), h("strong", null, "Failed")),
      h("div", { class: "fail-c", "data-testid": "failure-cause" }, f.reason),
      f.cause && f.cause.length ? h("ol", { class: "chain" }, f.cause.map((c) => h("li", null, c))) : null) : null;
    const lines = logs.slice(-200);
    $("detail").replaceChildren(
      drawerHead("Actor", a.id, closeDetail),
      h("div", { class: "detail-title" }, h("span", { class: "dot s-" + a.status }), h("h3", null, `${actorLabel(a)} `),
        h("span", { class: "dim" }, a.class), badge(a.status), a.system ? h("span", { class: "chip" }, "system") : null),
      failure || "",
      h("dl", { class: "kv" },
        kv("status", a.status, "detail-status"),
        kv("current", a.current ? `${a.current.endpoint} for ${fmtMs(a.current.since_ms)}` : a.status === "idle" ? "idle" : "—", "detail-current"),
        kv("handled", fmtNum(a.handled)), kv("errors", String(a.errors)), kv("busy", fmtMs(a.busy_ms)),
        kv("queue", String(a.queue)), kv("mesh", a.name), kv("rank", `${a.rank ?? "—"} (${Object.entries(a.point || {}).map(([k, v]) => `${k}=${v}`).join(", ")})`),
        kv("proc", [mono(a.proc), " ", h("button", {
          type: "button", class: "btn small", "data-testid": "detail-stack",
          onclick: () => { const p = st.snap && st.snap.procs.find((x) => x.id === a.proc); openStack(p || { id: a.proc, pid: "?" }); },
        }, "stack")])),
      h("h4", null, "Endpoints"), eps.length ? table : h("div", { class: "empty" }, "no messages handled yet"),
      h("h4", null, `Logs of its proc (${lines.length})`),
      h("div", { class: "logbox", "data-testid": "detail-logs" }, lines.length ? lines.map((l) => logLine(l)) : h("div", { class: "empty" }, "no output")));
  }
  function closeDetail() {
    if (location.hash) history.replaceState(null, "", location.pathname + location.search);
    st.detailId = null;
    $("detail").hidden = true;
    if (st.snap) renderTree();
  }
  function fromHash() {
    const m = /^#actor=(.*)$/.exec(location.hash);
    if (m) {
      st.detailId = decodeURIComponent(m[1]);
      if (st.snap) renderTree();
      loadDetail(true);
    } else if (st.detailId) closeDetail();
  }

  // ---- logs -------------------------------------------------------------------------
  function logLine(l, q) {
    const line = h("span", { class: "ll-t" });
    const text = String(l.line);
    const i = q ? text.toLowerCase().indexOf(q.toLowerCase()) : -1;
    if (i >= 0) line.append(text.slice(0, i), h("mark", null, text.slice(i, i + q.length)), text.slice(i + q.length));
    else line.textContent = text;
    return h("div", { class: "ll" + (l.stream === "stderr" ? " err-s" : ""), "data-testid": "log-line" },
      h("span", { class: "ll-time" }, clock(l.time)), h("span", { class: "ll-p mono", title: l.proc }, `${shortProc(l.proc)}[${l.rank ?? "?"}]`),
      h("span", { class: "ll-s" }, l.stream), line);
  }
  async function searchLogs(ev) {
    if (ev) ev.preventDefault();
    const q = $("log-q").value;
    const box = $("log-results");
    $("log-sub").textContent = "searching…";
    try {
      const r = await api("v1/logs?limit=200&q=" + encodeURIComponent(q));
      const items = r.items || [];
      $("log-sub").textContent = `${items.length} line${items.length === 1 ? "" : "s"}${q ? ` matching “${q}”` : ""}`;
      box.replaceChildren(...(items.length ? items.map((l) => logLine(l, q)) : [h("div", { class: "empty" }, "no matching lines")]));
      box.scrollTop = box.scrollHeight;
    } catch (e) {
      $("log-sub").textContent = "";
      box.replaceChildren(h("div", { class: "err" }, e.message));
    }
  }

  // ---- events (initial page, then the live stream) ------------------------------------
  function eventRow(e) {
    const link = e.actor ? detailLink(e.actor, "open", "event-link") : null;
    return h("li", { class: "ev k-" + e.kind, "data-testid": "event", "data-seq": e.seq },
      h("span", { class: "ll-time" }, clock(e.time)), h("span", { class: "ev-k" }, e.kind.replace(/_/g, " ")),
      e.class ? badge(e.class, "class-" + e.class) : null,
      h("span", { class: "ev-m", title: [e.message, ...(e.cause || [])].join("\n") }, e.message), link);
  }
  function addEvents(list) {
    const fresh = list.filter((e) => e.seq > st.lastSeq).sort((a, b) => a.seq - b.seq);
    if (!fresh.length) return false;
    st.lastSeq = fresh[fresh.length - 1].seq;
    st.events.push(...fresh);
    if (st.events.length > 500) st.events.splice(0, st.events.length - 500);
    const ol = $("events");
    for (const e of fresh) ol.prepend(eventRow(e));
    while (ol.children.length > 500) ol.lastChild.remove();
    $("events-sub").textContent = `${st.events.length} · last #${st.lastSeq}`;
    return true;
  }
  async function loadEvents() {
    try {
      const r = await api("v1/events?limit=500&since=" + st.lastSeq);
      if (addEvents(r.items || []) && st.snap) { st.failSig = ""; renderFailures(); }
    } catch (_) { /* the refresh loop shows connection trouble */ }
  }
  function connectStream() {
    if (typeof EventSource === "undefined") return;
    const es = new EventSource("v1/events/stream");
    st.es = es;
    es.addEventListener("open", () => { setConn("live", "live"); loadEvents(); });
    es.addEventListener("monarch", (m) => {
      let e;
      try { e = JSON.parse(m.data); } catch (_) { return; }
      // The stream first replays what the page has already: refresh only for news.
      if (addEvents([e]) && document.visibilityState === "visible") refresh(`event:${e.seq}`);
    });
    es.addEventListener("error", () => {
      if (es.readyState === 2) {
        setConn("down", "disconnected");
        st.es = null;
        setTimeout(connectStream, 5000);
      } else if ($("conn").dataset.state !== "down") setConn("poll", "reconnecting");
    });
  }

  // ---- stack dumps --------------------------------------------------------------------
  async function openStack(p) {
    const panel = $("stack-panel");
    panel.hidden = false;
    panel.replaceChildren(drawerHead("Stack", p.id, closeStack), h("div", { class: "empty" }, `collecting the stack of pid ${p.pid}…`));
    $("stack-close").focus();
    try {
      const r = await api("v1/stack?proc=" + encodeURIComponent(p.id));
      panel.replaceChildren(drawerHead("Stack", p.id, closeStack),
        h("div", { class: "sub" }, `pid ${r.pid} · ${r.method}`),
        h("pre", { class: "stack-text", "data-testid": "stack-text", tabindex: 0 }, r.text));
    } catch (e) {
      panel.replaceChildren(drawerHead("Stack", p.id, closeStack),
        h("div", { class: "err", "data-testid": "stack-error" }, h("strong", null, "Could not get the stack: "), e.message));
    }
    $("stack-close").focus();
  }
  function closeStack() { $("stack-panel").hidden = true; }

  // ---- start --------------------------------------------------------------------------
  function start() {
    $("toggle-system").addEventListener("change", (e) => { st.showSystem = e.target.checked; if (st.snap) render(); });
    $("expand-all").addEventListener("click", () => {
      for (const d of $("tree").querySelectorAll("details.node")) { d.open = true; st.open.set(d.dataset.key, true); }
    });
    $("collapse-all").addEventListener("click", () => {
      for (const d of $("tree").querySelectorAll("details.node")) {
        if (!d.dataset.key.startsWith("h:")) { d.open = false; st.open.set(d.dataset.key, false); }
      }
    });
    $("log-form").addEventListener("submit", searchLogs);
    window.addEventListener("hashchange", fromHash);
    document.addEventListener("keydown", (e) => {
      if (e.key !== "Escape") return;
      if (!$("stack-panel").hidden) closeStack();
      else if (st.detailId) closeDetail();
    });
    document.addEventListener("visibilitychange", () => { if (document.visibilityState === "visible") refresh("visible"); });
    let rt = null;
    window.addEventListener("resize", () => { clearTimeout(rt); rt = setTimeout(() => { if (st.series) renderCharts(true); }, 150); });
    setInterval(() => { if (document.visibilityState === "visible") refresh("poll"); }, POLL_MS);
    refresh("start").then(fromHash);
    loadEvents().then(connectStream);
    searchLogs(null);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
