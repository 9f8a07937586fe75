// attnserve's attention explorer: /attention's pooled grid as a heatmap, zoom into exact
// weights, a token's attention over the text, and each layer's rank collapse along the four
// paths of /rank_collapse. Plain browser
// JavaScript, no build step and nothing loaded from elsewhere.
"use strict";

// Overview maps ask for this many cells a side; a window of at most this many tokens is exact.
const MAX_CELLS = 256;
// The colour scale spans this many decades below the map's largest weight (as the PNG does).
const DECADES = 4;
// viridis, the stops src/attnserve/service/rendering.py uses.
const VIRIDIS = [[68, 1, 84], [72, 40, 120], [62, 74, 137], [49, 104, 142], [38, 130, 142],
  [31, 158, 137], [53, 183, 121], [109, 205, 89], [180, 222, 44], [253, 231, 37]];
const MARGIN = 96; // room for token labels left of and above the map
const LABEL_PX = 10; // a cell at least this tall gets its token written beside it

const $ = (id) => document.getElementById(id);
const state = { config: null, info: null, key: sessionStorage.getItem("attnserve-key") || "", text: "", answer: null, window: {} };

function color(scaled) {
  const pos = Math.min(1, Math.max(0, scaled)) * (VIRIDIS.length - 1);
  const lo = Math.floor(pos), hi = Math.min(lo + 1, VIRIDIS.length - 1), f = pos - lo;
  return VIRIDIS[lo].map((c, i) => Math.round(c * (1 - f) + VIRIDIS[hi][i] * f));
}

function logScale(top) {
  // weight -> 0..1 on a log scale DECADES below `top`
  const floor = top * 10 ** -DECADES;
  return (w) => (top <= 0 ? 0 : (Math.log10(Math.max(w, floor)) - Math.log10(floor)) / DECADES);
}

function setStatus(text, error = false) {
  const el = $("status");
  el.textContent = text;
  el.className = error ? "error" : "";
}

class ApiError extends Error {}

// The server's own time (x-total-time, ms) for the last answer api() read.
let lastServerMs = null;

async function api(base, path, body) {
  const headers = {};
  if (state.key) headers.authorization = `Bearer ${state.key}`;
  if (body !== undefined) headers["content-type"] = "application/json";
  const response = await fetch(base + path, { method: body === undefined ? "GET" : "POST", headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const err = await response.json();
      const text = typeof err.error === "string" ? err.error : err.error && err.error.message;
      message = `${response.status}: ${text || JSON.stringify(err)}`;
    } catch (e) { /* not JSON */ }
    if (response.status === 401) $("key-box").hidden = false;
    throw new ApiError(message);
  }
  lastServerMs = Number(response.headers.get("x-total-time"));
  return response.json();
}

function request(extra) {
  const head = $("head").value;
  return { inputs: state.text, layer: Number($("layer").value), head: head === "mean" ? null : Number(head), truncate: true, ...extra };
}

function label(token) {
  return token.length > 12 ? token.slice(0, 11) + "…" : token;
}

// One heatmap on a canvas: draws a grid answer, its axes and labels, answers hover and
// (when zoomable) drag-to-zoom and click.
class MapView {
  constructor(canvas, { colorbar = null, tooltip = null, onZoom = null, onPick = null } = {}) {
    Object.assign(this, { canvas, colorbar, tooltip, onZoom, onPick, answer: null, drag: null });
    canvas.addEventListener("mousemove", (e) => this.hover(e));
    canvas.addEventListener("mouseleave", () => { if (this.tooltip) this.tooltip.hidden = true; this.drag = null; });
    canvas.addEventListener("mousedown", (e) => { this.drag = this.cellAt(e); });
    canvas.addEventListener("mouseup", (e) => this.release(e));
  }

  get side() { return this.canvas.width - MARGIN; }

  draw(answer) {
    this.answer = answer;
    const grid = answer.grid, rows = grid.length, cols = rows ? grid[0].length : 0;
    const ctx = this.canvas.getContext("2d");
    ctx.clearRect(0, 0, this.canvas.width, this.canvas.height);
    let top = 0;
    for (const row of grid) for (const w of row) if (w > top) top = w;
    const scale = logScale(top);
    const image = ctx.createImageData(cols, rows);
    for (let i = 0; i < rows; i++) {
      for (let j = 0; j < cols; j++) {
        const [r, g, b] = color(scale(grid[i][j]));
        const o = 4 * (i * cols + j);
        image.data[o] = r; image.data[o + 1] = g; image.data[o + 2] = b; image.data[o + 3] = 255;
      }
    }
    // Square cells: the longer side of the window fills the map.
    this.px = this.side / Math.max(rows, cols);
    const off = document.createElement("canvas");
    off.width = cols; off.height = rows;
    off.getContext("2d").putImageData(image, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, MARGIN, MARGIN, cols * this.px, rows * this.px);
    this.drawAxes(ctx, rows, cols);
    if (this.colorbar) this.drawColorbar(top);
    this.canvas.dataset.ready = String(Number(this.canvas.dataset.ready || 0) + 1);
  }

  drawAxes(ctx, rows, cols) {
    const a = this.answer, cell = a.cell_tokens, [q0] = a.query_range, [k0] = a.key_range;
    ctx.fillStyle = "#222";
    ctx.font = "11px ui-monospace, monospace";
    if (cell === 1 && this.px >= LABEL_PX) {
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      for (let i = 0; i < rows; i++) ctx.fillText(label(a.tokens[q0 + i]), MARGIN - 4, MARGIN + (i + 0.5) * this.px);
      ctx.save();
      ctx.textAlign = "left";
      for (let j = 0; j < cols; j++) {
        ctx.setTransform(1, 0, 0, 1, MARGIN + (j + 0.5) * this.px, MARGIN - 4);
        ctx.rotate(-Math.PI / 2);
        ctx.fillText(label(a.tokens[k0 + j]), 0, 0);
      }
      ctx.restore();
    } else {
      // Token indices at about every 64 px.
      const every = Math.max(1, Math.ceil(64 / this.px));
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      for (let i = 0; i < rows; i += every) ctx.fillText(String(q0 + i * cell), MARGIN - 4, MARGIN + (i + 0.5) * this.px);
      ctx.textAlign = "center"; ctx.textBaseline = "bottom";
      for (let j = 0; j < cols; j += every) ctx.fillText(String(k0 + j * cell), MARGIN + (j + 0.5) * this.px, MARGIN - 4);
    }
    ctx.textAlign = "left"; ctx.textBaseline = "top";
    ctx.font = "bold 12px system-ui, sans-serif";
    const caption = `${a.variant}, layer ${a.layer} (${a.layer_variant}), ${a.head === null ? "mean over heads" : `head ${a.head}`}: ${a.n_tokens} tokens`;
    ctx.fillText(caption, 4, 2);
    const after = 16 + ctx.measureText(caption).width;
    ctx.font = "11px ui-monospace, monospace";
    ctx.fillStyle = "#777";
    ctx.fillText("keys →", Math.max(MARGIN, after), 3);
    ctx.save();
    ctx.setTransform(1, 0, 0, 1, 2, MARGIN + 90);
    ctx.rotate(-Math.PI / 2);
    ctx.fillText("← queries", 0, 0);
    ctx.restore();
  }

  drawColorbar(top) {
    const cb = this.colorbar, ctx = cb.getContext("2d"), h = this.side, x = 8, w = 16;
    ctx.clearRect(0, 0, cb.width, cb.height);
    for (let y = 0; y < h; y++) {
      const [r, g, b] = color(1 - y / (h - 1));
      ctx.fillStyle = `rgb(${r},${g},${b})`;
      ctx.fillRect(x, MARGIN + y, w, 1);
    }
    ctx.fillStyle = "#222"; ctx.font = "11px ui-monospace, monospace"; ctx.textBaseline = "middle"; ctx.textAlign = "left";
    for (let d = 0; d <= DECADES; d++) {
      const y = MARGIN + (d / DECADES) * (h - 1);
      ctx.fillRect(x + w, y, 4, 1);
      ctx.fillText(top > 0 ? (top * 10 ** -d).toExponential(1) : "0", x + w + 6, y);
    }
    ctx.textBaseline = "bottom";
    ctx.fillText("weight", x, MARGIN - 18);
    ctx.fillText("(log)", x, MARGIN - 5);
  }

  cellAt(e) {
    if (!this.answer) return null;
    const r = this.canvas.getBoundingClientRect();
    const x = (e.clientX - r.left) * (this.canvas.width / r.width) - MARGIN;
    const y = (e.clientY - r.top) * (this.canvas.height / r.height) - MARGIN;
    const i = Math.floor(y / this.px), j = Math.floor(x / this.px);
    const grid = this.answer.grid;
    if (x < 0 || y < 0 || i >= grid.length || j >= grid[0].length) return null;
    return { i, j, x: e.clientX - r.left, y: e.clientY - r.top };
  }

  // [first, last] token indices of row-cell i (queries) or column-cell j (keys)
  span(index, range) {
    const cell = this.answer.cell_tokens, first = range[0] + index * cell;
    return [first, Math.min(range[1], first + cell) - 1];
  }

  describe(indices) {
    const t = this.answer.tokens, [a, b] = indices;
    return a === b ? `${a} ${JSON.stringify(t[a])}` : `${a}–${b} (${JSON.stringify(t[a])} … ${JSON.stringify(t[b])})`;
  }

  hover(e) {
    const c = this.cellAt(e);
    if (!this.tooltip) return;
    if (!c) { this.tooltip.hidden = true; return; }
    const q = this.span(c.i, this.answer.query_range), k = this.span(c.j, this.answer.key_range);
    const w = this.answer.grid[c.i][c.j];
    const what = this.answer.cell_tokens === 1 ? "weight" : "mean weight of these queries on these keys";
    this.tooltip.textContent = `query ${this.describe(q)}\nkey   ${this.describe(k)}\n${what} ${w.toPrecision(4)}`;
    this.tooltip.hidden = false;
    this.tooltip.style.left = `${c.x + 14}px`;
    this.tooltip.style.top = `${c.y + 14}px`;
  }

  release(e) {
    const start = this.drag, end = this.cellAt(e);
    this.drag = null;
    if (!start || !end) return;
    if (start.i === end.i && start.j === end.j) {
      if (this.onPick) this.onPick(this.span(start.i, this.answer.query_range)[0]);
      return;
    }
    if (!this.onZoom) return;
    const [i0, i1] = [Math.min(start.i, end.i), Math.max(start.i, end.i)];
    const [j0, j1] = [Math.min(start.j, end.j), Math.max(start.j, end.j)];
    this.onZoom([this.span(i0, this.answer.query_range)[0], this.span(i1, this.answer.query_range)[1] + 1],
                [this.span(j0, this.answer.key_range)[0], this.span(j1, this.answer.key_range)[1] + 1]);
  }
}

// The four paths of "Attention is not all you need" (Dong et al. 2021) through the same
// weights, as /rank_collapse names them, with their colours and legend labels.
const PATHS = [
  ["model", "#31688e", "model"],
  ["attention_only", "#b00020", "attention only"],
  ["attention_skip", "#35b779", "attention + skip"],
  ["attention_mlp", "#e08214", "attention + MLP"],
];
const RATIO_FLOOR = 1e-8; // float32 noise: ratios below it are drawn on the floor

// Rank collapse on a log scale: one curve per path of a /rank_collapse answer (x: the
// embeddings' output, then each layer's), or the model curve alone (`ratios`, one per layer)
// when the server has no collapse graph. `current`: the layer the map shows.
function drawRankCollapse(svg, { collapse = null, ratios = null, current = null } = {}) {
  const W = Number(svg.getAttribute("width")), H = Number(svg.getAttribute("height")), ns = "http://www.w3.org/2000/svg";
  const left = 44, right = 10, top = 10, bottom = 62;
  svg.replaceChildren();
  const curves = collapse
    ? PATHS.filter(([path]) => path in collapse.paths).map(([path, colour, name]) => ({ path, colour, name, values: [collapse.embeddings, ...collapse.paths[path]] }))
    : [{ path: "model", colour: PATHS[0][1], name: "model", values: [null, ...ratios] }];
  const all = curves.flatMap((c) => c.values).filter((v) => v !== null);
  const hi = Math.max(0, Math.ceil(Math.log10(Math.max(...all, RATIO_FLOOR)))), lo = Math.min(hi - 1, Math.floor(Math.log10(Math.max(Math.min(...all), RATIO_FLOOR))));
  const depth = curves[0].values.length - 1;
  const x = (i) => left + (i * (W - left - right)) / depth;
  const y = (v) => top + ((hi - Math.log10(Math.max(v, RATIO_FLOOR))) * (H - top - bottom)) / (hi - lo);
  const add = (tag, attrs, text, parent = svg) => {
    const el = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    if (text !== undefined) el.textContent = text;
    parent.appendChild(el);
    return el;
  };
  add("line", { x1: left, y1: H - bottom, x2: W - right, y2: H - bottom, stroke: "#999" });
  add("line", { x1: left, y1: top, x2: left, y2: H - bottom, stroke: "#999" });
  const every = Math.max(1, Math.ceil((hi - lo) / 6));
  for (let d = lo; d <= hi; d += every) {
    add("line", { x1: left, y1: y(10 ** d), x2: W - right, y2: y(10 ** d), stroke: "#eee" });
    add("text", { x: left - 4, y: y(10 ** d) + 3, "text-anchor": "end", "font-size": 9 }, `1e${d}`);
  }
  for (let i = 0; i <= depth; i++) add("text", { x: x(i), y: H - bottom + 12, "text-anchor": "middle", "font-size": 9 }, i === 0 ? "in" : String(i - 1));
  add("text", { x: (left + W - right) / 2, y: H - bottom + 24, "text-anchor": "middle", "font-size": 10 }, "layer (in: the embeddings)");
  for (const c of curves) {
    const points = c.values.map((v, i) => (v === null ? null : `${x(i)},${y(v)}`)).filter(Boolean).join(" ");
    add("polyline", { points, fill: "none", stroke: c.colour, "stroke-width": 2, "data-path": c.path });
  }
  // The model curve's layers as points, the map's layer marked; hover gives every path's value.
  curves[0].values.slice(1).forEach((v, l) => {
    const dot = add("circle", { cx: x(l + 1), cy: y(v), r: l === current ? 5 : 3, class: l === current ? "current" : "" });
    add("title", {}, [`layer ${l}`, ...curves.map((c) => `${c.name}: ${c.values[l + 1].toExponential(2)}`)].join("\n"), dot);
  });
  curves.forEach((c, i) => {
    const lx = left + (i % 2) * 130, ly = H - 20 + Math.floor(i / 2) * 13;
    add("line", { x1: lx, y1: ly - 3, x2: lx + 14, y2: ly - 3, stroke: c.colour, "stroke-width": 2 });
    add("text", { x: lx + 18, y: ly, "font-size": 10 }, c.name);
  });
  svg.dataset.ready = String(Number(svg.dataset.ready || 0) + 1);
}

// /rank_collapse of `text` from server `base` (all four paths), asked once per server and text.
const collapseCache = new Map();
function rankCollapse(base, text) {
  const key = `${base}\u0000${text}`;
  if (!collapseCache.has(key)) {
    const answer = api(base, "/rank_collapse", { inputs: text, truncate: true });
    answer.catch(() => collapseCache.delete(key)); // a failure is asked again next time
    collapseCache.set(key, answer);
  }
  return collapseCache.get(key);
}

// The four paths for a map `answer` from server `base` (its /info as `info`): {collapse, note}.
// A text past the server's rank_collapse_max_length is followed over its first tokens (cut at a
// token's character offset, a few tokens short of the limit); an export without the collapse
// graph, or a refusal, leaves collapse null and the note says why.
async function collapseFor(base, info, answer) {
  const limit = info.rank_collapse_max_length || 0;
  if (!limit) return { collapse: null, note: "This server's export has no collapse graph: the model's curve only." };
  let text = state.text, note = "";
  if (answer.n_tokens > limit) {
    text = text.slice(0, answer.offsets[Math.max(1, limit - 4)][1]);
    note = `The four paths over the text's first ${limit - 4} tokens (this server follows them for up to ${limit}).`;
  }
  try {
    return { collapse: await rankCollapse(base, text), note };
  } catch (e) {
    return { collapse: null, note: `The model's curve only: ${e.message}` };
  }
}

// The main view's curves: the four paths where the server gives them, else the map answer's
// model curve, with a note saying why.
async function showCollapse(answer) {
  const { collapse, note } = await collapseFor("", state.info, answer);
  if (state.answer !== answer) return; // another map was asked for meanwhile
  state.collapse = collapse;
  $("rank-note").textContent = note;
  drawRankCollapse($("rank"), collapse ? { collapse, current: answer.layer } : { ratios: answer.rank_collapse, current: answer.layer });
}

// The text with one span per token, placed by the answer's character offsets.
function drawText(answer) {
  const box = $("text"), text = state.text, frag = document.createDocumentFragment();
  let at = 0;
  answer.tokens.forEach((token, i) => {
    const [start, stop] = answer.offsets[i];
    const span = document.createElement("span");
    span.className = "tok";
    span.dataset.i = String(i);
    if (stop > start) {
      if (start > at) frag.appendChild(document.createTextNode(text.slice(at, start)));
      span.textContent = text.slice(start, stop);
      at = Math.max(at, stop);
    } else {
      span.classList.add("special");
      span.textContent = token;
    }
    frag.appendChild(span);
  });
  box.replaceChildren(frag);
  state.spans = Array.from(box.querySelectorAll(".tok"));
}

async function pick(query) {
  // One query's whole row, exact: a one-row window of the sparse map.
  const started = performance.now();
  try {
    const row = await api("", "/attention", request({ format: "sparse", query_range: [query, query + 1] }));
    const top = Math.max(1e-12, ...row.values);
    for (const span of state.spans) { span.style.backgroundColor = ""; span.classList.remove("hl", "selected"); span.title = ""; }
    row.cols.forEach((col, idx) => {
      const span = state.spans[col], w = row.values[idx];
      span.style.backgroundColor = `rgba(253, 174, 97, ${Math.min(1, w / top).toFixed(3)})`;
      span.classList.add("hl");
      span.title = `weight ${w.toPrecision(4)}`;
    });
    const chosen = state.spans[query];
    chosen.classList.add("selected");
    chosen.scrollIntoView({ block: "nearest" });
    $("selected").textContent = `: what token ${query} ${JSON.stringify(row.tokens[query])} attends to at layer ${row.layer} (${row.cols.length} keys, ${(performance.now() - started).toFixed(0)} ms)`;
  } catch (e) {
    setStatus(e.message, true);
  }
}

const main = new MapView($("map"), {
  colorbar: $("colorbar"),
  tooltip: $("tooltip"),
  onZoom: (queries, keys) => show({ query_range: queries, key_range: keys }),
  onPick: (query) => pick(query),
});
$("text").addEventListener("click", (e) => {
  const span = e.target.closest(".tok");
  if (span) pick(Number(span.dataset.i));
});

async function show(window = {}) {
  state.window = window;
  state.text = $("input").value;
  if (!state.text.trim()) { setStatus("Paste a text or pick a sample first.", true); return; }
  const started = performance.now();
  setStatus("computing the map…");
  $("map").dataset.busy = "1";
  try {
    const answer = await api("", "/attention", request({ format: "grid", max_cells: MAX_CELLS, ...window }));
    const serverMs = lastServerMs, received = performance.now();
    const firstNew = !state.answer || state.answer.n_tokens !== answer.n_tokens || !window.query_range;
    state.answer = answer;
    main.draw(answer);
    showCollapse(answer); // its own request: the map does not wait for it
    if (firstNew) drawText(answer);
    const ms = performance.now() - started;
    // Timings the browser test reads: click to drawn, the server's part, the page's own part.
    Object.assign($("map").dataset, { ms: ms.toFixed(1), serverMs: serverMs.toFixed(1), drawMs: (performance.now() - received).toFixed(1) });
    $("zoom-out").disabled = !window.query_range;
    const [q0, q1] = answer.query_range, [k0, k1] = answer.key_range;
    const where = window.query_range ? `, queries ${q0}–${q1 - 1} x keys ${k0}–${k1 - 1}` : "";
    const exact = answer.cell_tokens === 1 ? "exact weights" : `${answer.cell_tokens} x ${answer.cell_tokens} tokens a cell`;
    // Texts go with truncate: true, so one longer than the server's max_length is cut there.
    const cut = state.info && answer.n_tokens >= state.info.max_length ? ` (the server's max_length: a longer text is cut there)` : "";
    setStatus(`${answer.variant}, layer ${answer.layer} (${answer.layer_variant}), head ${answer.head ?? "mean"}: ${answer.n_tokens} tokens${cut}${where}, ${exact} (${ms.toFixed(0)} ms)`);
    if (state.config.peers.length && $("compare").checked && !window.query_range) await comparePeers();
  } catch (e) {
    setStatus(e.message, true);
  } finally {
    delete $("map").dataset.busy;
  }
}

async function comparePeers() {
  const box = $("peers");
  box.replaceChildren();
  // Every server of a deployment lists all of them; this one is the main map already.
  const others = state.config.peers.filter((base) => new URL(base).origin !== location.origin);
  await Promise.all(others.map(async (base) => {
    const panel = document.createElement("div");
    panel.className = "peer";
    const title = document.createElement("h3");
    title.textContent = base;
    const canvas = document.createElement("canvas");
    canvas.width = canvas.height = 360;
    const curves = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    curves.setAttribute("width", "360");
    curves.setAttribute("height", "200");
    curves.setAttribute("class", "rank");
    panel.append(title, canvas, curves);
    box.appendChild(panel);
    try {
      const info = await api(base, "/info");
      title.textContent = `${info.variant} ${JSON.stringify(info.parameters)} (${base})`;
      const answer = await api(base, "/attention", request({ format: "grid", max_cells: 128 }));
      new MapView(canvas).draw(answer);
      const { collapse, note } = await collapseFor(base, info, answer);
      drawRankCollapse(curves, collapse ? { collapse, current: answer.layer } : { ratios: answer.rank_collapse, current: answer.layer });
      if (note) panel.appendChild(Object.assign(document.createElement("p"), { className: "muted", textContent: note }));
    } catch (e) {
      title.textContent = `${base}: ${e.message}`;
    }
  }));
}

async function loadInfo() {
  const info = await api("", "/info");
  state.info = info;
  $("variant").textContent = `${info.variant} ${JSON.stringify(info.parameters)}, max_length ${info.max_length}`;
  $("layer").replaceChildren(...Array.from({ length: info.num_layers }, (_, l) => new Option(String(l), String(l))));
  $("head").replaceChildren(new Option("mean", "mean"), ...Array.from({ length: info.num_heads }, (_, h) => new Option(String(h), String(h))));
  $("key-box").hidden = !state.config.auth;
  setStatus("Ready: paste a text or pick a sample, then Show.");
}

async function loadSamples() {
  const response = await fetch("/explorer/samples.json");
  const { samples } = await response.json();
  state.samples = samples;
  for (const [i, s] of samples.entries()) $("sample").appendChild(new Option(`${s.id}: ${s.title} (${s.text.length} chars)`, String(i)));
}

async function start() {
  state.config = await (await fetch("/explorer/config.json")).json();
  $("compare-box").hidden = state.config.peers.length === 0;
  $("api-key").value = state.key;
  $("key-save").addEventListener("click", async () => {
    state.key = $("api-key").value.trim();
    sessionStorage.setItem("attnserve-key", state.key);
    try { await loadInfo(); } catch (e) { setStatus(e.message, true); }
  });
  $("sample").addEventListener("change", () => {
    const s = state.samples[Number($("sample").value)];
    if (s) $("input").value = s.text;
  });
  $("show").addEventListener("click", () => show());
  // Another layer or head keeps the window in view.
  $("layer").addEventListener("change", () => { if (state.answer) show(state.window); });
  $("head").addEventListener("change", () => { if (state.answer) show(state.window); });
  $("zoom-out").addEventListener("click", () => show());
  await loadSamples();
  if (state.config.auth && !state.key) {
    $("key-box").hidden = false;
    setStatus("This server needs an API key: enter it above.");
    $("api-key").focus();
    return;
  }
  try { await loadInfo(); } catch (e) { setStatus(e.message, true); }
}

start();
