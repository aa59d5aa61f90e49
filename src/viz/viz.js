// minfer viz: draws a minfer-graph layer by layer and paints each node with its captured output
// (a minfer-trace, loaded from a file or streamed live over /viz/events). Hand written, no
// dependencies, no build step. docs/VIZ.md describes the page and the endpoints.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const NODE_W = 140, NODE_H = 38, GAP_X = 26, GAP_Y = 10, PAD = 10;
const BACKENDS = { cpu: "CPU", metal: "Metal", cuda: "CUDA", "": "unassigned" };
const $ = (id) => document.getElementById(id);

// The page's whole state. A phase is {kind, graph, steps: [{n_past, input, token, text,
// logits_top, nodes: Map(id -> node trace)}]}; `cur` indexes `flat`, the steps in order.
const S = {
  model: "",
  phases: [],
  flat: [],
  cur: -1,
  follow: true,
  rendered: null,     // the graph object drawn now
  views: new Map(),   // node id -> {g, sub, node}
  bands: [],          // [{key, label, ids, el, summary}]
  collapsed: new Set(),
  folded: false,      // the first drawing folded the middle layers
  selected: null,     // node name (names carry the layer, so they survive phase changes)
  run: null,          // the live run shown, by id; null when showing a loaded trace
  lagged: false,      // events of this run were missed: reload /viz/trace when it ends
  connected: false,   // the event stream said hello
  nan: { count: 0, first: null }, // nodes with NaN/Inf over all steps, and the first
  output: "",
};
window.vizState = S; // for tests and the console

function el(tag, attrs, ...kids) {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.setAttribute("class", v);
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}

function fmt(v) {
  if (v === null || v === undefined) return "—";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v) && Math.abs(v) < 1e9) return String(v);
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(3) : v.toFixed(4);
}

function setStatus(state, text) {
  const s = $("status");
  s.dataset.state = state;
  s.textContent = text;
}

const bad = (t) => !!t && (t.stats.nan > 0 || t.stats.inf > 0);

// ---- loading ----

function phaseFrom(p) {
  return {
    kind: p.kind,
    graph: p.graph,
    steps: (p.steps || []).map((s) => ({ ...s, nodes: new Map((s.nodes || []).map((n) => [n.id, n])) })),
  };
}

function reflatten() {
  S.flat = [];
  S.phases.forEach((p, pi) => p.steps.forEach((_, si) => S.flat.push([pi, si])));
  const r = $("step-range");
  r.max = Math.max(0, S.flat.length - 1);
}

/** A trace's phases, checked: every phase has a graph with nodes and a list of steps; node
 *  data for ids the graph does not have is dropped. Throws on what cannot be shown. */
function phasesOf(t) {
  return t.phases.map((p, i) => {
    if (!p || !p.graph || !Array.isArray(p.graph.nodes) || !Array.isArray(p.steps)) throw new Error(`phase ${i} has no graph or no steps`);
    const n = p.graph.nodes.length;
    const steps = p.steps.map((s) => ({ ...s, input: s.input || [], nodes: (s.nodes || []).filter((x) => x && Number.isInteger(x.id) && x.id >= 0 && x.id < n && x.stats) }));
    return phaseFrom({ ...p, steps });
  });
}

/** Shows a whole trace document (a file, a saved sample, /viz/trace). */
function loadTrace(t, origin) {
  let phases;
  try {
    if (!t || t.format !== "minfer-trace" || !Array.isArray(t.phases)) throw new Error("not a minfer-trace document");
    phases = phasesOf(t);
  } catch (e) {
    setStatus("error", `${origin}: ${e.message}`);
    return;
  }
  S.run = null;
  S.model = t.model;
  $("model").textContent = t.model;
  S.phases = phases;
  S.output = "";
  $("output").textContent = t.prompt ? `prompt: ${t.prompt}` : "";
  reflatten();
  scanNan();
  S.follow = false;
  const steps = S.flat.length;
  setStatus("done", `${origin}: ${steps} step${steps === 1 ? "" : "s"}`);
  S.cur = steps ? 0 : -1;
  if (!steps && S.phases.length) draw(S.phases[0].graph);
  paint();
}

/** Shows a graph with no data yet (before the first run). */
function loadGraph(g) {
  S.phases = [{ kind: g.kind, graph: g, steps: [] }];
  reflatten();
  scanNan();
  S.cur = -1;
  draw(g);
  paint();
}

async function fetchJson(url, init) {
  const r = await fetch(url, init);
  const body = await r.json().catch(() => null);
  if (!r.ok) throw new Error((body && body.error && body.error.message) || `${url}: HTTP ${r.status}`);
  return body;
}

// ---- layout ----

/** Bands: the nodes before the first layer ("input"), each layer, the nodes after ("output"). */
function bandsOf(graph) {
  const bands = new Map();
  let seenLayer = false;
  for (const n of graph.nodes) {
    let key, label;
    if (n.layer !== null && n.layer !== undefined) {
      seenLayer = true;
      key = `L${n.layer}`;
      label = `layer ${n.layer}`;
    } else if (!seenLayer) {
      key = "in";
      label = "input · embedding";
    } else {
      key = "out";
      label = "output · head";
    }
    if (!bands.has(key)) bands.set(key, { key, label, ids: [] });
    bands.get(key).ids.push(n.id);
  }
  return [...bands.values()];
}

/** Columns by longest path inside the band (sources outside it count as rank 0). Columns that
 *  do not fit the page's width wrap into another row of columns below. */
function layoutBand(graph, ids) {
  const inBand = new Set(ids);
  const rank = new Map(), cols = [];
  for (const id of ids) {
    const r = graph.nodes[id].src.filter((s) => inBand.has(s)).reduce((m, s) => Math.max(m, rank.get(s) + 1), 0);
    rank.set(id, r);
    (cols[r] = cols[r] || []).push(id);
  }
  const avail = Math.max(NODE_W + 2 * PAD, $("graph").clientWidth - 40);
  const perRow = Math.max(1, Math.floor((avail - 2 * PAD + GAP_X) / (NODE_W + GAP_X)));
  const pos = new Map();
  let y0 = PAD, width = 0;
  for (let start = 0; start < cols.length; start += perRow) {
    const block = cols.slice(start, start + perRow);
    block.forEach((col, c) => col.forEach((id, i) => pos.set(id, { x: PAD + c * (NODE_W + GAP_X), y: y0 + i * (NODE_H + GAP_Y) })));
    width = Math.max(width, PAD * 2 + block.length * (NODE_W + GAP_X) - GAP_X);
    y0 += Math.max(...block.map((c) => c.length)) * (NODE_H + GAP_Y) + 2 * GAP_Y;
  }
  return { pos, width, height: y0 - 2 * GAP_Y - GAP_Y + PAD };
}

function clip(s, n) {
  return s.length > n ? s.slice(0, n - 1) + "…" : s;
}

/** Builds the DOM of `graph` (once per graph; steps only repaint). */
function draw(graph) {
  const root = $("graph");
  root.replaceChildren();
  root.dataset.kind = graph.kind || "";
  S.rendered = graph;
  S.views = new Map();
  S.bands = bandsOf(graph);
  if (!S.folded) {
    // First drawing: show the ends and the first layer, fold the rest.
    S.bands.forEach((b) => { if (!["in", "L0", "out"].includes(b.key)) S.collapsed.add(b.key); });
    S.folded = true;
  }
  for (const band of S.bands) {
    const { pos, width, height } = layoutBand(graph, band.ids);
    const svg = el("svg:svg", { width, height, viewBox: `0 0 ${width} ${height}` });
    const edges = el("svg:g");
    svg.append(edges);
    for (const id of band.ids) {
      const n = graph.nodes[id];
      const p = pos.get(id);
      for (const s of n.src) {
        const q = pos.get(s);
        if (!q) continue;
        const x1 = q.x + NODE_W, y1 = q.y + NODE_H / 2, x2 = p.x, y2 = p.y + NODE_H / 2;
        const bend = Math.max(GAP_X / 2, (x2 - x1) / 2);
        edges.append(el("svg:path", { class: "edge", d: `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}` }));
      }
      const sub = el("svg:text", { x: p.x + 6, y: p.y + 29, class: "sub" }, n.op);
      const g = el(
        "svg:g",
        { class: "node" + (n.live === false ? " dead" : ""), "data-id": id, "data-name": n.name, "data-backend": n.backend || "" },
        el("svg:rect", { x: p.x, y: p.y, width: NODE_W, height: NODE_H }),
        el("svg:text", { x: p.x + 6, y: p.y + 14 }, clip(n.name, 24)),
        sub,
      );
      g.append(el("svg:title", {}, `${n.name} · ${n.op} · [${n.shape.join(", ")}]`));
      g.addEventListener("click", () => select(n.name));
      svg.append(g);
      S.views.set(id, { g, sub, node: n });
    }
    const summary = el("span", { class: "summary" });
    const twisty = el("span", { class: "twisty" });
    const head = el("div", { class: "band-head", onclick: () => toggle(band.key) }, twisty, el("strong", {}, band.label), el("span", { class: "summary" }, `${band.ids.length} nodes`), summary);
    band.el = el("section", { class: "band", "data-band": band.key }, head, svg);
    band.summary = summary;
    band.twisty = twisty;
    root.append(band.el);
  }
  applyCollapse();
}

function applyCollapse() {
  for (const b of S.bands) {
    const c = S.collapsed.has(b.key);
    b.el.classList.toggle("collapsed", c);
    b.twisty.textContent = c ? "▸" : "▾";
  }
}

function toggle(key) {
  if (S.collapsed.has(key)) S.collapsed.delete(key);
  else S.collapsed.add(key);
  applyCollapse();
}

// ---- painting a step ----

function current() {
  const at = S.flat[S.cur];
  if (!at) return { phase: S.phases[S.phases.length - 1], step: null };
  const phase = S.phases[at[0]];
  return { phase, step: phase.steps[at[1]] };
}

/** Whether step `si` of phase `pi` is the one on screen. */
function showing(pi, si) {
  const at = S.flat[S.cur];
  return !!at && at[0] === pi && at[1] === si;
}

function paintNode(id, step) {
  const v = S.views.get(id);
  if (!v) return;
  const t = step ? step.nodes.get(id) : undefined;
  v.g.classList.toggle("has-data", !!t);
  v.g.classList.toggle("no-data", !t);
  v.g.classList.toggle("nan", bad(t));
  v.g.dataset.hasData = t ? "1" : "0";
  v.sub.textContent = !t ? v.node.op : bad(t) ? `${v.node.op} · NaN ${t.stats.nan} Inf ${t.stats.inf}` : `${v.node.op} · rms ${t.stats.rms.toPrecision(3)}`;
}

function paintBands(step) {
  for (const b of S.bands) {
    let n = 0, nan = 0, lo = Infinity, hi = -Infinity;
    for (const id of b.ids) {
      const t = step && step.nodes.get(id);
      if (!t) continue;
      n++;
      if (bad(t)) nan++;
      lo = Math.min(lo, t.stats.rms);
      hi = Math.max(hi, t.stats.rms);
    }
    b.el.classList.toggle("nan", nan > 0);
    b.summary.textContent = n === 0 ? "· no data" : `· rms ${fmt(lo)}…${fmt(hi)}` + (nan ? ` · ${nan} with NaN/Inf` : "");
  }
}

function stepLabel(phase, step) {
  if (!step) return S.flat.length ? "" : "no run yet";
  const tok = JSON.stringify(step.text ?? "");
  const what = phase.kind === "prefill" ? `prefill of ${step.input.length} tokens, last ${tok}` : `decode ${tok}`;
  return `step ${S.cur + 1}/${S.flat.length} · ${what} · pos ${step.n_past}`;
}

function paint() {
  const { phase, step } = current();
  if (phase && phase.graph !== S.rendered) draw(phase.graph);
  for (const id of S.views.keys()) paintNode(id, step);
  paintBands(step);
  $("step-range").value = Math.max(0, S.cur);
  $("step-label").textContent = stepLabel(phase, step);
  paintNanBanner();
  showDetails();
}

function goto(i) {
  if (!S.flat.length) return;
  S.cur = Math.max(0, Math.min(S.flat.length - 1, i));
  S.follow = S.cur === S.flat.length - 1 && S.run !== null;
  paint();
}

/** Counts the nodes with NaN or Inf over every step, remembering the first. */
function scanNan() {
  S.nan = { count: 0, first: null };
  S.flat.forEach(([pi, si]) => { for (const t of S.phases[pi].steps[si].nodes.values()) noteNan(pi, si, t); });
}

function noteNan(pi, si, t) {
  if (!bad(t)) return;
  S.nan.count++;
  const fi = S.flat.findIndex(([a, b]) => a === pi && b === si);
  if (!S.nan.first || fi < S.nan.first.fi) S.nan.first = { fi, name: S.phases[pi].graph.nodes[t.id].name };
}

/** The banner: how many node outputs have NaN or Inf, the first of them, a jump to it. */
function paintNanBanner() {
  const b = $("nan-banner");
  const { count, first } = S.nan;
  b.hidden = count === 0;
  if (!first) return;
  b.replaceChildren(
    `NaN/Inf in ${count} node output${count === 1 ? "" : "s"}; first: ${first.name} at step ${first.fi + 1} `,
    el("button", { type: "button", onclick: () => { goto(first.fi); select(first.name, true); } }, "show"),
  );
}

// ---- details ----

/** Selects a node by name; `reveal` also scrolls it into view (a jump from elsewhere). */
function select(name, reveal) {
  S.selected = name;
  for (const v of S.views.values()) v.g.classList.toggle("selected", v.node.name === name);
  const v = [...S.views.values()].find((x) => x.node.name === name);
  if (v) {
    const band = S.bands.find((b) => b.ids.includes(v.node.id));
    if (band && S.collapsed.has(band.key)) toggle(band.key);
    if (reveal) v.g.scrollIntoView({ block: "center", inline: "nearest" });
  }
  showDetails();
}

function nodeLink(graph, id) {
  const n = graph.nodes[id];
  return el("a", { onclick: () => select(n.name, true) }, n.name);
}

function rows(table, pairs) {
  for (const [k, v] of pairs) {
    if (v === undefined || v === null || v === "") continue;
    table.append(el("tr", {}, el("td", {}, k), el("td", {}, v)));
  }
}

function histogram(values, stats) {
  const nums = values.filter((v) => v !== null);
  const nulls = values.length - nums.length;
  const W = 350, H = 90, BINS = 24;
  const svg = el("svg:svg", { width: W, height: H + 16, class: "histogram" });
  if (!nums.length && !nulls) return svg;
  let lo = Infinity, hi = -Infinity;
  for (const v of nums) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  const counts = new Array(BINS).fill(0);
  for (const v of nums) counts[hi > lo ? Math.min(BINS - 1, Math.floor(((v - lo) / (hi - lo)) * BINS)) : 0]++;
  const bins = nulls ? [...counts, nulls] : counts;
  const max = bins.reduce((m, c) => Math.max(m, c), 0);
  const bw = W / bins.length;
  bins.forEach((c, i) => {
    const h = (c / max) * H;
    const isNull = nulls && i === bins.length - 1;
    svg.append(el("svg:rect", { x: i * bw + 1, y: H - h, width: bw - 2, height: h, fill: isNull ? "#d7263d" : "#5b8fd1", class: isNull ? "bar nan-bar" : "bar" }, el("svg:title", {}, isNull ? `${c} NaN/Inf` : `${c}`)));
  });
  if (nums.length) {
    svg.append(el("svg:text", { x: 2, y: H + 13, "font-size": 10 }, fmt(lo)));
    svg.append(el("svg:text", { x: W - 2, y: H + 13, "font-size": 10, "text-anchor": "end" }, fmt(hi)));
  }
  return svg;
}

/** rms of the node (matched by name) over every step; the current one marked. */
function sparkline(name) {
  const pts = [];
  S.flat.forEach(([pi, si], fi) => {
    const phase = S.phases[pi];
    const node = phase.graph.nodes.find((n) => n.name === name);
    const t = node && phase.steps[si].nodes.get(node.id);
    if (t) pts.push({ fi, v: t.stats.rms, bad: bad(t) });
  });
  const W = 350, H = 40;
  const svg = el("svg:svg", { width: W, height: H, class: "sparkline" });
  if (pts.length < 1) return svg;
  const lo = Math.min(...pts.map((p) => p.v)), hi = Math.max(...pts.map((p) => p.v));
  const x = (fi) => (S.flat.length > 1 ? 4 + (fi / (S.flat.length - 1)) * (W - 8) : W / 2);
  const y = (v) => (hi > lo ? H - 4 - ((v - lo) / (hi - lo)) * (H - 8) : H / 2);
  svg.append(el("svg:polyline", { points: pts.map((p) => `${x(p.fi)},${y(p.v)}`).join(" "), fill: "none", stroke: "#5b8fd1", "stroke-width": 1.5 }));
  for (const p of pts) {
    const here = p.fi === S.cur;
    svg.append(el("svg:circle", { cx: x(p.fi), cy: y(p.v), r: here ? 4 : 2, fill: p.bad ? "#d7263d" : here ? "#1f5fbf" : "#5b8fd1" }));
  }
  return svg;
}

function showDetails() {
  const box = $("details");
  const { phase, step } = current();
  const graph = S.rendered;
  const n = graph && graph.nodes.find((x) => x.name === S.selected);
  if (!n) {
    box.replaceChildren(el("p", { class: "hint" }, "Click a node to see its op, shapes, weight, backend and values."));
    if (step) box.append(logitsTable(step));
    return;
  }
  const m = n.meta || {};
  const info = el("table", { class: "info" });
  rows(info, [
    ["op", n.op],
    ["detail", n.detail],
    ["shape", `[${n.shape.join(", ")}]`],
    ["dtype", n.dtype],
    ["backend", BACKENDS[n.backend || ""] || n.backend],
    ["layer", n.layer],
    ["weight", m.weight],
    ["bias", m.bias],
    ["weight type", m.weight_type],
    ["in → out", m.in_dim !== undefined ? `${m.in_dim} → ${m.out_dim}` : undefined],
    ["live", n.live === false ? "no (dead: folded by fusion, no buffer)" : undefined],
  ]);
  const srcs = el("td", {});
  n.src.forEach((s, i) => { if (i) srcs.append(", "); srcs.append(nodeLink(graph, s)); });
  const users = el("td", {});
  graph.nodes.filter((x) => x.src.includes(n.id)).forEach((x, i) => { if (i) users.append(", "); users.append(nodeLink(graph, x.id)); });
  info.append(el("tr", {}, el("td", {}, "inputs"), srcs), el("tr", {}, el("td", {}, "used by"), users));
  const parts = [el("h2", {}, n.name), info, el("h3", {}, "output in this step")];
  const t = step && step.nodes.get(n.id);
  if (!t) {
    const why = !step ? "no run yet" : ["kv_store", "kv_load"].includes(n.op) ? "no data: a KV region is not captured" : n.live === false ? "no data: dead node" : "no data for this node in this step";
    parts.push(el("p", { class: "nodata" }, why));
  } else {
    const st = el("table", { class: "stats" });
    rows(st, [
      ["min", fmt(t.stats.min)], ["max", fmt(t.stats.max)], ["mean", fmt(t.stats.mean)], ["rms", fmt(t.stats.rms)],
      ["NaN", String(t.stats.nan)], ["Inf", String(t.stats.inf)], ["values", `${t.n} (every ${t.stride}${t.stride === 1 ? "st" : "th"} sampled: ${t.values.length})`],
    ]);
    // The non-zero NaN / Inf counts in red.
    st.querySelectorAll("td").forEach((td) => {
      const value = td.nextSibling;
      if ((td.textContent === "NaN" || td.textContent === "Inf") && value && value.textContent !== "0") value.classList.add("bad");
    });
    parts.push(st, el("h3", {}, "histogram of the sampled values"), histogram(t.values, t.stats));
    parts.push(el("h3", {}, "first values"), el("p", { class: "values" }, t.values.slice(0, 12).map((v) => (v === null ? "NaN/Inf" : fmt(v))).join("  ")));
  }
  parts.push(el("h3", {}, "rms over the steps"), sparkline(n.name));
  if (step) parts.push(logitsTable(step));
  box.replaceChildren(...parts);
}

function logitsTable(step) {
  const wrap = el("div", {}, el("h3", {}, "next-token logits (top)"));
  if (!step.logits_top || !step.logits_top.length) {
    wrap.append(el("p", { class: "nodata" }, "not yet"));
    return wrap;
  }
  const t = el("table", { class: "logits" });
  for (const l of step.logits_top) t.append(el("tr", {}, el("td", {}, String(l.id)), el("td", {}, JSON.stringify(l.text)), el("td", {}, fmt(l.logit))));
  wrap.append(t);
  return wrap;
}

// ---- live events ----

function connect() {
  const es = new EventSource("/viz/events");
  const on = (name, f) => es.addEventListener(name, (e) => f(JSON.parse(e.data)));
  on("hello", (d) => {
    S.connected = true;
    S.model = d.model;
    $("model").textContent = d.model;
    if (d.busy && d.run !== null && S.run === null) {
      // Joined mid-run: its start was missed; show its trace when it ends.
      S.run = d.run;
      S.lagged = true;
      setStatus("running", "a run is in progress; its trace shows when it ends");
    }
  });
  on("run", (d) => {
    S.run = d.run;
    S.phases = [];
    S.flat = [];
    S.cur = -1;
    S.follow = true;
    S.lagged = false;
    S.nan = { count: 0, first: null };
    S.output = "";
    $("output").textContent = "";
    $("stop").disabled = false;
    setStatus("running", `running: ${d.prompt_ids.length} prompt tokens`);
  });
  on("phase", (d) => {
    if (d.run !== S.run) return;
    S.phases[d.phase] = { kind: d.kind, graph: d.graph, steps: [] };
  });
  on("step", (d) => {
    const p = d.run === S.run && S.phases[d.phase];
    if (!p) return;
    p.steps[d.step] = { n_past: d.n_past, input: d.input, token: d.token, text: d.text, logits_top: [], nodes: new Map() };
    reflatten();
    if (S.follow) {
      S.cur = S.flat.length - 1;
      paint();
    } else {
      const c = current();
      $("step-label").textContent = stepLabel(c.phase, c.step);
    }
  });
  on("node", (d) => {
    const p = d.run === S.run && S.phases[d.phase];
    const s = p && p.steps[d.step];
    if (!s) return;
    if (!(d.node.id < p.graph.nodes.length)) return;
    s.nodes.set(d.node.id, d.node);
    if (showing(d.phase, d.step)) {
      paintNode(d.node.id, s);
      if (S.selected === p.graph.nodes[d.node.id].name) showDetails();
    }
    if (bad(d.node)) {
      noteNan(d.phase, d.step, d.node);
      paintNanBanner();
    }
  });
  on("step_end", (d) => {
    const p = d.run === S.run && S.phases[d.phase];
    const s = p && p.steps[d.step];
    if (!s) return;
    s.logits_top = d.logits_top;
    if (showing(d.phase, d.step)) { paintBands(s); showDetails(); }
  });
  on("text", (d) => {
    if (d.run !== S.run) return;
    S.output += d.text;
    $("output").textContent = S.output;
  });
  on("done", async (d) => {
    if (d.run !== S.run) return;
    $("stop").disabled = true;
    S.follow = false;
    if (S.lagged) {
      // Some events were missed: the finished trace has everything.
      try { loadTrace(await fetchJson("/viz/trace"), "run"); } catch (e) { setStatus("error", e.message); return; }
    }
    setStatus("done", `done (${d.stop}): ${d.generated_ids.length} tokens, ${fmt(d.gen_tokens_per_s)} t/s`);
    paint();
  });
  on("run_error", async (d) => {
    if (d.run !== S.run) return;
    $("stop").disabled = true;
    // What ran up to the failure is in the run's trace.
    try { loadTrace(await fetchJson("/viz/trace"), "run"); } catch (e) { /* no trace: keep what arrived */ }
    setStatus("error", `error: ${d.message}`);
  });
  on("lagged", () => { S.lagged = true; });
  // The browser's own `error` event: the stream dropped (it reconnects by itself).
  es.onerror = () => {
    S.connected = false;
    if (S.run !== null && $("status").dataset.state === "running") {
      S.lagged = true;
      setStatus("running", "lost the event stream; reconnecting…");
    }
  };
}

async function startRun(ev) {
  ev.preventDefault();
  const body = { prompt: $("prompt").value, max_tokens: Number($("max-tokens").value), chat: $("chat").checked };
  try {
    setStatus("running", "starting…");
    await fetchJson("/viz/run", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  } catch (e) {
    setStatus("error", e.message);
  }
}

// ---- wiring ----

function init() {
  $("legend").replaceChildren(
    ...["cpu", "metal", "cuda"].map((b) => el("span", { style: `background: var(--${b})` }, BACKENDS[b])),
    el("span", { style: "border: 2px solid var(--nan)" }, "NaN/Inf"),
  );
  $("run-form").addEventListener("submit", startRun);
  $("stop").addEventListener("click", () => fetch("/viz/stop", { method: "POST" }));
  $("prev").addEventListener("click", () => goto(S.cur - 1));
  $("next").addEventListener("click", () => goto(S.cur + 1));
  $("step-range").addEventListener("input", (e) => goto(Number(e.target.value)));
  $("expand-all").addEventListener("click", () => { S.collapsed.clear(); applyCollapse(); });
  $("collapse-all").addEventListener("click", () => { S.bands.forEach((b) => S.collapsed.add(b.key)); applyCollapse(); });
  document.addEventListener("keydown", (e) => {
    // Inputs, lists and the slider handle their own keys.
    if (["INPUT", "SELECT", "TEXTAREA"].includes(e.target.tagName)) return;
    if (e.key === "ArrowLeft") goto(S.cur - 1);
    if (e.key === "ArrowRight") goto(S.cur + 1);
  });
  $("trace-file").addEventListener("change", async (e) => {
    const f = e.target.files[0];
    if (!f) return;
    try { loadTrace(JSON.parse(await f.text()), f.name); } catch (err) { setStatus("error", `${f.name}: ${err.message}`); }
  });
  $("samples").addEventListener("change", (e) => { if (e.target.value) openSample(e.target.value); });
  let resize = null;
  window.addEventListener("resize", () => {
    clearTimeout(resize);
    resize = setTimeout(() => { if (S.rendered) { draw(S.rendered); paint(); } }, 150);
  });
  connect();
  boot();
}

async function openSample(name) {
  try { loadTrace(await fetchJson(`/viz/samples/${encodeURIComponent(name)}`), name); } catch (e) { setStatus("error", e.message); }
}

async function boot() {
  try {
    const info = await fetchJson("/viz/info");
    $("model").textContent = info.model;
    $("max-tokens").max = info.max_tokens;
    $("chat").disabled = !info.chat;
    const samples = await fetchJson("/viz/samples");
    for (const n of samples.traces) $("samples").append(el("option", { value: n }, n));
    const want = new URLSearchParams(location.search).get("trace");
    if (want) return openSample(want);
    if (!info.busy) loadGraph(await fetchJson("/viz/graph"));
  } catch (e) {
    setStatus("error", e.message);
  }
}

init();
