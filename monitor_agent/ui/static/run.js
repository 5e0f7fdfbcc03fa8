// The run page (and the HTML report, which embeds the same answers): uPlot charts of the
// downsampled series, canvas heatmaps of the per-layer matrices, every finding a marker
// on the chart it concerns, alerts with acknowledge/silence, live polling.
"use strict";
(() => {
  const {api, el, fmt, duration, esc, tip, notice, report} = MA;
  const {CHARTS, CHART_OF} = Charts;
  for (const def of CHARTS) if (def.build && def.log) PlotView.state.defaults.add(def.id);
  const runId = report ? report.run_id : decodeURIComponent(location.pathname.replace(/^\/runs\//, ""));
  const base = "/v1/runs/" + encodeURIComponent(runId);
  const S = {rank: 0, view: null, series: null, findings: [], detail: null, charts: {}, heats: {},
             quantLayer: null, lastFindings: -1};
  window.runPage = S;  // for the browser tests and the curious

  // -- uPlot charts ---------------------------------------------------------------------

  function cardFor(def) {
    let card = document.getElementById("chart-" + def.id);
    if (!card) {
      card = el("div", {class: "card", id: "chart-" + def.id, "data-chart": def.id},
        el("h2", {}, def.title), el("div", {class: "plot"}));
      document.getElementById(def.box || "charts").append(card);
      if (def.build) PlotView.logToggle(card, def.id, redraw);
    }
    return card;
  }
  // A chart's plot width in CSS pixels, known before any chart exists (the grid's first
  // column): the server is asked for as many buckets as there are pixels, no more.
  const plotWidth = (box = "charts") => {
    const track = parseFloat(getComputedStyle(document.getElementById(box)).gridTemplateColumns);
    return Math.max(300, Math.round((track || document.body.clientWidth) - 26));
  };

  function drawChart(def, d) {
    const built = def.build(d);
    const lines = PlotView.apply(built.lines.filter(l => l.values.some(v => v !== null)), def.id);
    const card = cardFor(def);
    if (!lines.length || !built.x.length) {
      if (S.view && S.charts[def.id]) return;  // nothing in the zoomed range: keep the chart
      card.style.display = "none";
      return;
    }
    card.style.display = "";
    const data = [built.x, ...lines.map(l => l.values)];
    let u = S.charts[def.id];
    const log = PlotView.isLog(def.id);
    const key = lines.map(l => l.label).join("|") + (log ? "|log" : "");
    if (u && u._key !== key) { u.destroy(); u = null; }
    if (u) {
      u.setData(data, S.view === null);
      if (S.view) u.setScale("x", {min: S.view[0], max: S.view[1]});
      return;
    }
    const bands = [], hi = lines.findIndex(l => l.band === "hi");
    for (let i = 0; i < lines.length; i++) {
      if (lines[i].band === "lo") {
        const h = lines.slice(0, i).map(l => l.band).lastIndexOf("hi");
        if (h >= 0) bands.push({series: [h + 1, i + 1], fill: lines[i].fill});
      }
    }
    void hi;
    const axes = PlotView.axes(log, def.y2);
    const scales = {x: {time: false}, y: {distr: log ? 3 : 1}};
    if (BRANCHED[def.id]) scales.y.range = (u_, lo, hi) => branchRange(u_, def.id, lo, hi);
    if (def.y2) scales[def.y2] = {};
    u = new uPlot({
      width: plotWidth(def.box), height: def.box ? 160 : 220, scales, axes, bands,
      cursor: {sync: {key: "run-" + runId}, drag: {x: true, y: false, setScale: false}},
      // spanGaps: sparse series (update ratio every k steps, evals) are lines, not dots;
      // NaN/Inf steps are drawn as red ticks on the loss chart instead of a gap.
      series: [{label: "step"}, ...lines.map(l => Object.assign({label: l.label, spanGaps: true}, l.opts))],
      legend: {live: true},
      hooks: {setSelect: [onSelect], ready: [u_ => u_.over.addEventListener("dblclick", resetZoom)], draw: [u_ => placeMarkers(def.id, u_), ...(def.id === "loss" ? [drawNonfinite] : []), ...(def.id === "loss" || def.id === "grad" ? [drawSkipped] : []),
        ...(def.limits ? [drawLimits] : []), ...(BRANCHED[def.id] ? [u_ => drawBranches(u_, BRANCHED[def.id], def.id)] : [])]},
    }, data, card.querySelector(".plot"));
    u._key = key;
    u._box = def.box;
    // The min/max band edges are drawing aids: keep them out of the legend.
    const rows = u.root.querySelectorAll(".u-legend .u-series");
    lines.forEach((l, i) => { if (PlotView.hiddenInLegend(l.label) && rows[i + 1]) rows[i + 1].style.display = "none"; });
    if (S.view) u.setScale("x", {min: S.view[0], max: S.view[1]});
    S.charts[def.id] = u;
  }

  // Zoom is ours, not uPlot's: a drag selects a range (setSelect), a double click resets,
  // a finding zooms to its step. One view for every chart and heatmap, re-fetched at full
  // resolution for the range; a poll never moves it.
  function onSelect(u) {
    if (u.select.width < 3) return;
    const lo = u.posToVal(u.select.left, "x"), hi = u.posToVal(u.select.left + u.select.width, "x");
    u.setSelect({left: 0, top: 0, width: 0, height: 0}, false);
    zoomRange(lo, hi);
  }
  function zoomRange(lo, hi) {
    S.view = [lo, hi];
    for (const u of Object.values(S.charts)) u.setScale("x", {min: lo, max: hi});
    drawHeats();
    clearTimeout(S.refetch);
    S.refetch = setTimeout(refresh, 150);
  }
  function resetZoom() {
    S.view = null;
    for (const u of Object.values(S.charts)) u.setData(u.data, true);
    S.matricesAt = 0;
    refresh();
  }
  function zoomTo(step) {
    const [lo, hi] = S.series ? S.series.range : [0, step * 2];
    const half = Math.max(10, Math.round((hi - lo) * 0.03));
    zoomRange(step - half, step + half);
  }

  // -- finding markers ------------------------------------------------------------------

  function targetOf(f) {
    const want = CHART_OF[f.type] || "loss";
    const shown = id => { const c = document.getElementById("chart-" + id); return c && c.style.display !== "none"; };
    return shown(want) ? want : "loss";
  }
  function markerFor(f, box, n = 1) {
    const m = el("div", {class: "marker " + f.severity, "data-type": f.type, "data-step": f.step,
                         "data-count": n});
    m.addEventListener("mouseenter", e => tip(findingHtml(f) + more(n), e));
    m.addEventListener("mousemove", e => tip(findingHtml(f) + more(n), e));
    m.addEventListener("mouseleave", () => tip(null));
    m.addEventListener("click", () => zoomTo(f.step));
    box.append(m);
    return m;
  }
  // A finding's rank, where the run has several (rank 0 of a one-rank run says nothing);
  // a NaN page names the rank that broke first, a rank_outlier warning the sick rank.
  const rankOf = f => (f.rank || (S.nranks || 0) > 1 ? " · rank " + f.rank : "");
  function findingHtml(f) {
    const ev = Object.entries(f.evidence || {}).map(([k, v]) => `  ${esc(k)}: ${esc(typeof v === "number" ? fmt(v) : JSON.stringify(v))}`).join("\n");
    const tips = (f.suggestions || []).map(s => "  • " + esc(s)).join("\n");
    return `<b>${esc(f.type)}</b> · ${esc(f.severity)} · step ${f.step}${rankOf(f)}${f.layer ? " · " + esc(f.layer) : ""}\n` +
      `${esc(f.message)}${ev ? "\n\nevidence:\n" + ev : ""}${tips ? "\n\nwhat to try next:\n" + tips : ""}\n\n(click to zoom to step ${f.step})`;
  }
  function drawNonfinite(u) {
    const bad = (S.series && S.series.nonfinite_steps) || [];
    if (!bad.length) return;
    const ctx = u.ctx, {top, height} = u.bbox;
    ctx.save();
    ctx.fillStyle = "#b0002099";
    for (const step of bad) {
      const x = u.valToPos(step, "x", true);
      if (x >= u.bbox.left && x <= u.bbox.left + u.bbox.width) ctx.fillRect(x - 1, top, 2, height);
    }
    plotLabel(u, `NaN/Inf at ${bad.length} step(s)`, "#b00020", top + 4 * devicePixelRatio);
    ctx.restore();
  }
  // What a rollback abandoned (series.branches): the replaced steps as a faded dashed line
  // apart from the current history, a marker where the run went back ("rolled back to
  // step C") and an x where the branch was given up, held at the plot's edge when the
  // diverged values are above the current history's scale (which they do not stretch).
  const BRANCHED = {loss: "loss", grad: "grad_norm"};
  // The y range of a chart with abandoned branches: stretched to a branch's values when
  // they stay within ten current ranges (linear) or three decades (log) of it, so the
  // fault a rollback was for is on the scale; beyond that the current history would flatten
  // into a line, so the branch is drawn clipped, its peak labelled (drawBranches).
  const BRANCH_REACH = 10, BRANCH_DECADES = 3;
  function branchExtent(u, key, id) {
    const log = PlotView.isLog(id), {min, max} = u.scales.x;
    let lo = Infinity, hi = -Infinity, at = null;
    for (const b of (S.series && S.series.branches) || []) {
      b.steps.forEach((x, i) => {
        const y = b[key][i];
        if (y === null || !Number.isFinite(y) || (log && y <= 0)) return;
        if (min != null && (x < min || x > max)) return;
        lo = Math.min(lo, y);
        if (y > hi) { hi = y; at = x; }
      });
    }
    return {lo, hi, at};
  }
  function branchRange(u, id, lo, hi) {
    const log = PlotView.isLog(id), b = branchExtent(u, BRANCHED[id], id);
    if (Number.isFinite(b.hi)) {
      const reach = log ? hi * 10 ** BRANCH_DECADES : hi + BRANCH_REACH * Math.max(hi - lo, Math.abs(hi) * 0.1);
      if (b.hi > hi && b.hi <= reach) hi = b.hi;
      if (b.lo < lo && (log ? b.lo >= lo / 10 ** BRANCH_DECADES : b.lo >= lo - BRANCH_REACH * Math.max(hi - lo, 1e-12))) lo = b.lo;
    }
    return log ? uPlot.rangeLog(lo, hi, 10, true) : uPlot.rangeNum(lo, hi, 0.1, true);
  }
  function drawBranches(u, key, id) {
    const branches = (S.series && S.series.branches) || [];
    const ctx = u.ctx, dpr = devicePixelRatio, {left, top, width, height} = u.bbox;
    u.branchesShown = [];  // for the tests
    for (const b of branches) {
      const pts = b.steps.map((x, i) => [x, b[key][i]]).filter(([x, y]) => y !== null &&
        !(PlotView.isLog(id) && y <= 0));
      if (!pts.length) continue;
      const px = pts.map(([x, y]) => [u.valToPos(x, "x", true), u.valToPos(y, "y", true)]);
      ctx.save();
      ctx.beginPath(); ctx.rect(left, top, width, height); ctx.clip();
      ctx.strokeStyle = "#b0002088"; ctx.lineWidth = 1.5 * dpr; ctx.setLineDash([6 * dpr, 4 * dpr]);
      ctx.beginPath();
      px.forEach(([x, y], i) => i ? ctx.lineTo(x, y) : ctx.moveTo(x, y));
      ctx.stroke();
      const back = u.valToPos(b.rolled_back_to, "x", true);
      ctx.strokeStyle = "#555555aa"; ctx.lineWidth = dpr; ctx.setLineDash([2 * dpr, 3 * dpr]);
      ctx.beginPath(); ctx.moveTo(back, top); ctx.lineTo(back, top + height); ctx.stroke();
      const [ex, ey] = px[px.length - 1], yy = Math.min(Math.max(ey, top + 6 * dpr), top + height - 6 * dpr);
      ctx.setLineDash([]); ctx.strokeStyle = "#b00020"; ctx.lineWidth = 2 * dpr;
      const r = 4 * dpr;
      ctx.beginPath(); ctx.moveTo(ex - r, yy - r); ctx.lineTo(ex + r, yy + r);
      ctx.moveTo(ex - r, yy + r); ctx.lineTo(ex + r, yy - r); ctx.stroke();
      ctx.restore();
      const last = pts[pts.length - 1][0];
      if (back >= left && back <= left + width) {
        ctx.save();
        ctx.font = `${11 * dpr}px system-ui, sans-serif`;
        ctx.textBaseline = "top";
        ctx.textAlign = "left";  // uPlot's axes leave it as they drew their labels
        const text = `rolled back to step ${b.rolled_back_to}`;
        const w = ctx.measureText(text).width;
        const x = Math.min(back + 4 * dpr, left + width - w - 4 * dpr), y = top + height - 18 * dpr;
        ctx.fillStyle = "#ffffffcc"; ctx.fillRect(x - 2 * dpr, y - dpr, w + 4 * dpr, 14 * dpr);
        ctx.fillStyle = "#555"; ctx.fillText(text, x, y);
        ctx.restore();
      }
      u.branchesShown.push({attempt: b.attempt, rolled_back_to: b.rolled_back_to, last, points: pts.length});
    }
    // A branch beyond the scale (clipped): an arrow at its peak, with the value.
    const peak = branchExtent(u, key, id), ymax = u.scales.y.max;
    u.branchPeak = null;
    if (Number.isFinite(peak.hi) && ymax != null && peak.hi > ymax) {
      const x = Math.min(Math.max(u.valToPos(peak.at, "x", true), left + 6 * dpr), left + width - 6 * dpr);
      ctx.save();
      ctx.fillStyle = "#b00020";
      ctx.beginPath();  // an upward triangle on the top edge: "it goes on up there"
      ctx.moveTo(x - 5 * dpr, top + 8 * dpr); ctx.lineTo(x + 5 * dpr, top + 8 * dpr); ctx.lineTo(x, top);
      ctx.fill();
      ctx.restore();
      plotLabel(u, `abandoned peak ${MA.compact(peak.hi)} @ ${peak.at} ↑`, "#b00020",
                top + 36 * dpr);
      u.branchPeak = {value: peak.hi, step: peak.at};
    }
  }

  // A mark per step the client's step guard skipped (its optimizer update never happened).
  function drawSkipped(u) {
    const skipped = (S.series && S.series.skipped_steps) || [];
    u.skippedShown = 0;  // for the tests
    if (!skipped.length) return;
    const ctx = u.ctx, {top, height, left, width} = u.bbox, dpr = devicePixelRatio;
    ctx.save();
    ctx.fillStyle = "#d97706";
    for (const step of skipped) {
      const x = u.valToPos(step, "x", true);
      if (x < left || x > left + width) continue;
      u.skippedShown += 1;
      ctx.beginPath();  // a downward triangle on the top edge, a dotted line below it
      ctx.moveTo(x - 5 * dpr, top); ctx.lineTo(x + 5 * dpr, top); ctx.lineTo(x, top + 8 * dpr);
      ctx.fill();
      ctx.fillRect(x - 0.5 * dpr, top + 8 * dpr, dpr, height - 8 * dpr);
    }
    plotLabel(u, `step guard skipped ${skipped.length} step(s)`, "#b45309", top + 20 * dpr);
    ctx.restore();
  }
  // A label kept whole inside the plot area (canvas pixels), on a white backing.
  function plotLabel(u, text, colour, y) {
    const ctx = u.ctx, dpr = devicePixelRatio, {left, width, top, height} = u.bbox;
    ctx.save();
    ctx.font = `${11 * dpr}px system-ui, sans-serif`;
    ctx.textBaseline = "top";
    const w = ctx.measureText(text).width, h = 13 * dpr;
    const x = Math.max(left + 2 * dpr, left + width - w - 6 * dpr);
    const yy = Math.min(Math.max(y, top + 2 * dpr), top + height - h - 2 * dpr);
    ctx.fillStyle = "#ffffffcc";
    ctx.fillRect(x - 3 * dpr, yy - 1 * dpr, w + 6 * dpr, h);
    ctx.fillStyle = colour;
    ctx.fillText(text, x, yy);
    ctx.restore();
  }
  // The update-ratio detector's limits (series.update_limits), where the curve's own
  // y range reaches them: a dashed line, the side past it shaded, a label inside the plot.
  function drawLimits(u) {
    const limits = (S.series && S.series.update_limits) || [];
    const {min, max} = u.scales.y;
    if (limits.length !== 2 || min == null || max == null) return;
    const ctx = u.ctx, {left, top, width, height} = u.bbox, dpr = devicePixelRatio;
    u.limitsShown = limits.filter(limit => limit > min && limit < max);  // for the tests
    limits.forEach((limit, i) => {
      if (!(limit > min && limit < max)) return;
      const y = u.valToPos(limit, "y", true);
      ctx.save();
      ctx.fillStyle = "#b0002012";
      if (i === 1) ctx.fillRect(left, top, width, y - top); else ctx.fillRect(left, y, width, top + height - y);
      ctx.strokeStyle = "#b00020aa";
      ctx.setLineDash([5 * dpr, 4 * dpr]);
      ctx.lineWidth = dpr;
      ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + width, y); ctx.stroke();
      ctx.restore();
      plotLabel(u, `alert ${i ? "above" : "below"} ${MA.compact(limit)}`, "#b00020",
                i ? y - 16 * dpr : y + 3 * dpr);  // on the alerting side
    });
  }
  function visibleCharts() {
    return [...document.querySelectorAll("#charts .card")].filter(c => c.style.display !== "none").map(c => c.id).join();
  }
  // -- markers are capped like the charts' points: the server answers a chart one bucket
  // per pixel, and a chart draws at most one marker per MARK_PX pixels. A run with 10,000
  // findings or 20,000 checkpoints draws a few hundred marks, not one element per item (each
  // placed with a reflow: that froze a tab for ten minutes). Up to that many, every item has
  // its own mark; past it, each MARK_PX-wide slice shows the one that matters most (the most
  // severe finding, the earliest of those; the last clean checkpoint, else a suspect one)
  // and says how many others it stands for. --------------------------------------------
  const MARK_PX = 6;
  const MARK_RANK = {info: 0, warning: 1, error: 2, critical: 3};
  function thinMarks(items, xOf, lo, hi, width, better) {
    const inside = items.filter(it => it.step >= lo && it.step <= hi);
    const out = inside.map(it => ({item: it, x: xOf(it.step), n: 1 + (it.also || 0)}));
    if (out.length <= Math.max(1, Math.floor(width / MARK_PX))) return out;
    const slices = new Map();
    for (const mark of out) {
      const b = Math.floor(mark.x / MARK_PX), got = slices.get(b);
      if (!got) { slices.set(b, mark); continue; }
      if (better(mark.item, got.item)) { mark.n += got.n; slices.set(b, mark); } else got.n += mark.n;
    }
    return [...slices.values()];
  }
  const worseFinding = (a, b) => (MARK_RANK[a.severity] || 0) - (MARK_RANK[b.severity] || 0) > 0 ||
    (a.severity === b.severity && a.step < b.step);
  const more = n => n > 1 ? `\n\n(and ${n - 1} more near here: zoom in to see them)` : "";

  // -- checkpoint markers: the run's ledger (GET .../checkpoints?points=, thinned on the
  // server like a series), a small diamond per save on the loss chart's bottom edge (not a
  // line through the curve), green when clean, amber when suspect (the tooltip says why) ---
  function checkpointHtml(c, n) {
    return `<b>checkpoint</b> · step ${c.step} · <b>${esc(c.status)}</b>${c.tag ? " · " + esc(c.tag) : ""}\n` +
      `${esc(c.path)}${c.reason ? "\n\nsuspect: " + esc(c.reason) : "\n\nclean: safe to roll back to"}` +
      more(n).replace("more near", "more checkpoints near");
  }
  function betterCheckpoint(a, b) {
    const rank = c => S.lastClean && c.step === S.lastClean.step && c.path === S.lastClean.path ? 2 :
      c.status === "suspect" ? 1 : 0;
    return rank(a) > rank(b);
  }
  function placeCheckpoints(u) {
    const box = u.over, {min, max} = u.scales.x, width = box.clientWidth;
    const key = [S.ckptKey, min, max, width, box.clientHeight].join("|");
    if (box._ckptKey === key) return;
    box._ckptKey = key;
    box.querySelectorAll(".ckpt-mark").forEach(n => n.remove());
    const top = Math.max(box.clientHeight - 12, 0) + "px";  // read once: no reflow per mark
    const marks = thinMarks(S.ckpts || [], s => u.valToPos(s, "x"), min, max, width, betterCheckpoint);
    const frag = document.createDocumentFragment();
    for (const {item: c, x, n} of marks) {  // a short tick on the bottom edge: the curve stays clear
      const m = el("div", {class: "ckpt-mark " + c.status, "data-step": c.step, "data-status": c.status,
                           "data-count": n});
      m.addEventListener("mouseenter", e => tip(checkpointHtml(c, n), e));
      m.addEventListener("mousemove", e => tip(checkpointHtml(c, n), e));
      m.addEventListener("mouseleave", () => tip(null));
      m.style.left = x + "px";
      m.style.top = top;
      frag.append(m);
    }
    box.append(frag);
    u.ckptsShown = marks.length;  // for the tests
  }
  async function loadCheckpoints() {
    if (report) return;  // a static report has no ledger
    const q = new URLSearchParams({points: Math.max(1, Math.floor(plotWidth() / MARK_PX))});
    if (S.view) { q.set("start", Math.max(0, Math.floor(S.view[0]))); q.set("end", Math.ceil(S.view[1])); }
    const got = await api(`${base}/checkpoints?${q}`).catch(() => ({checkpoints: [], last_clean: null}));
    const ckpts = got.checkpoints;
    const key = JSON.stringify([got.last_clean, ckpts.map(c => [c.step, c.attempt, c.status, c.also])]);
    if (key !== S.ckptKey) { S.ckpts = ckpts; S.lastClean = got.last_clean; S.ckptKey = key; }
  }

  function findingMarks(id, box, xOf, lo, hi) {  // the capped marks of one chart's findings
    const marks = thinMarks(S.findings.filter(f => targetOf(f) === id), xOf, lo, hi, box.clientWidth,
                            worseFinding);
    box.querySelectorAll(".marker").forEach(n => n.remove());
    const frag = document.createDocumentFragment();
    const out = marks.map(({item: f, x, n}) => { const m = markerFor(f, frag, n); m.style.left = x + "px"; return m; });
    box.append(frag);
    return out;
  }
  function placeMarkers(id, u) {
    if (id === "loss") placeCheckpoints(u);
    const box = u.over, {min, max} = u.scales.x;
    const key = [S.findingsKey, visibleCharts(), min, max, box.clientWidth, box.clientHeight].join("/");
    if (box._marksKey === key) return;  // kept across redraws: a hover survives
    box._marksKey = key;
    const marks = findingMarks(id, box, s => u.valToPos(s, "x"), min, max);
    const height = box.clientHeight + "px";  // read once, then written: no reflow per mark
    for (const m of marks) m.style.height = height;
    u.marksShown = marks.length;  // for the tests
  }
  function placeHeatMarkers(id, heat) {
    const box = heat.box, [lo, hi] = heat.range;
    const key = [S.findingsKey, visibleCharts(), lo, hi, box.clientWidth, heat.canvas.clientHeight].join("/");
    if (box._marksKey === key) return;  // kept across redraws: a hover survives
    box._marksKey = key;
    const marks = findingMarks(id, box, s => heat.markLeft(s), lo, hi);
    const height = heat.canvas.clientHeight + "px";
    for (const m of marks) m.style.height = height;
  }

  // -- heatmaps and quantiles -----------------------------------------------------------

  const matrixCache = {};
  function decode(m) {  // values_f32: base64 of little-endian float32 (NaN: no value)
    let buf;
    if (Uint8Array.fromBase64) buf = Uint8Array.fromBase64(m.values_f32);  // native: no loop
    else {
      const bin = atob(m.values_f32);
      buf = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) buf[i] = bin.charCodeAt(i);
    }
    m.values = new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4);
    return m;
  }
  // Resolves to a function that installs the answers. The heatmaps are asked at once; the
  // quantiles once ``findings`` (the first load's, if any) say which layer to open on.
  async function fetchMatrices(findings) {
    const q = new URLSearchParams({points: Math.min(1500, plotWidth() + 26), rank: S.rank});
    if (S.view) { q.set("start", Math.floor(S.view[0])); q.set("end", Math.ceil(S.view[1])); }
    const quantilesPath = () => {
      const ql = new URLSearchParams(q);
      // Open on the layer the latest grad_distribution finding is about, if any.
      const about = S.findings.filter(f => f.type === "grad_distribution" && f.layer).pop();
      const layer = S.quantLayer || (about && about.layer) || (report && report.quantile_layers[0]);
      if (layer) ql.set("layer", layer);
      return `${base}/matrix/grad_quantiles?${ql}`;
    };
    const get = path => api(path).then(decode).catch(() => null);
    const wanted = CHARTS.filter(c => c.heat).map(c => c.heat);
    const got = await Promise.all([...wanted.map(stat => get(`${base}/matrix/${stat}?${q}`)),
                                   Promise.resolve(findings).catch(() => null).then(() => get(quantilesPath()))]);
    return () => [...wanted, "grad_quantiles"].forEach((stat, i) => { matrixCache[stat] = got[i]; });
  }
  function viewRange() {
    if (S.view) return S.view;
    return S.series && S.series.range ? S.series.range : [0, 1];
  }
  function drawHeats() {
    for (const def of CHARTS.filter(c => c.heat)) {
      const m = matrixCache[def.heat], card = cardFor(def);
      if (!m || !m.steps.length || !m.names.length) { card.style.display = "none"; continue; }
      card.style.display = "";
      let h = S.heats[def.id];
      if (!h) {
        const box = el("div", {class: "heat"});
        card.append(box);
        h = S.heats[def.id] = new Heatmap.Heat(box, {log: def.log, label: def.heat.replace(/_/g, " ")});
      }
      h.draw(m, viewRange());
      placeHeatMarkers(def.id, h);
    }
  }
  function drawQuantiles() {
    const def = CHARTS.find(c => c.quant), m = matrixCache.grad_quantiles, card = cardFor(def);
    if (!m || !m.steps.length) { card.style.display = "none"; return; }
    card.style.display = "";
    let pick = card.querySelector("select");
    if (!pick) {
      pick = el("select", {class: "chart-note"});
      pick.addEventListener("change", () => { S.quantLayer = pick.value; S.matricesAt = 0; refresh(); });
      card.querySelector("h2").after(pick);
    }
    const layers = report ? (report.quantile_layers || [m.layer]) : m.names;
    if (pick.options.length !== layers.length)
      pick.replaceChildren(...layers.map(n => el("option", {value: n}, n)));
    pick.value = m.layer;
    const n = m.steps.length;
    const row = i => Array.from(m.values.subarray(i * n, (i + 1) * n), v => Number.isFinite(v) ? v : null);
    const d = {steps: m.steps, series: {}};
    const names = ["min", "p1", "p25", "p50", "p75", "p95", "p99", "max"];
    names.forEach((k, i) => { d.series[k] = {mean: row(i), min: null, max: null}; });
    def.build = dd => ({x: dd.steps, lines: [
      {label: "max", values: dd.series.max.mean, opts: {stroke: "#8888", width: 1, dash: [2, 3]}},
      {label: "p99", values: dd.series.p99.mean, opts: {stroke: "#3c7fd855", width: 1}, band: "hi"},
      {label: "p1", values: dd.series.p1.mean, opts: {stroke: "#3c7fd855", width: 1}, band: "lo", fill: "#3c7fd822"},
      {label: "p75", values: dd.series.p75.mean, opts: {stroke: "#3c7fd8aa", width: 1}, band: "hi"},
      {label: "p25", values: dd.series.p25.mean, opts: {stroke: "#3c7fd8aa", width: 1}, band: "lo", fill: "#3c7fd855"},
      {label: "median", values: dd.series.p50.mean, opts: {stroke: "#1d2330", width: 1.5}},
      {label: "min", values: dd.series.min.mean, opts: {stroke: "#8888", width: 1, dash: [2, 3]}},
    ]});
    drawChart(def, d);
  }

  // -- facts, alerts, findings ------------------------------------------------------------

  function renderFacts(detail) {
    // A run no longer in the sidecar's memory has no live values: the last stored step.
    const stored = (S.series && S.series.latest) || {};
    const r = (detail.ranks || {})[String(S.rank)] || {loss_ema: stored.loss_ema,
      val_loss: S.series && S.series.evals.val_loss.filter(v => v !== null).pop()};
    const latest = r.latest || stored;
    // Where the run is in its lifecycle, when it says more than the status ("awaiting resume
    // from checkpoint step 300 ...", "stopping: ...").
    const phase = detail.phase && detail.phase !== detail.status ? " · " + detail.phase : "";
    document.getElementById("status").textContent = detail.status + phase + (detail.active ? "" : " (stored)");
    document.getElementById("status").className = "status status-" + detail.status;
    // On a node sidecar of a multi-node run: the run's pages and actions come from its leader.
    document.getElementById("leader").replaceChildren(...(detail.leader ? [
      "node sidecar of this run; ",
      el("a", {href: detail.leader + "/runs/" + encodeURIComponent(detail.run_id)}, "its leader"),
      " sees every rank"] : []));
    const verdict = document.getElementById("verdict");  // the run's verdict, in its header
    verdict.textContent = detail.verdict ? detail.verdict.words : "";
    verdict.className = detail.verdict ? "verdict verdict-" + detail.verdict.state : "verdict";
    const fact = (id, label, value, raw) => el("div", {}, el("b", {id, "data-value": raw === undefined ? "" : String(raw)}, value), el("span", {}, label));
    const step = [detail.last_step, stored.step].find(v => v != null && v >= 0) ?? null;
    // The last step's rate may be an eval or checkpoint step's: the header shows the median
    // of the recent steps (series.recent_tokens_per_second), the last one only without it.
    const tps = (S.series && S.series.recent_tokens_per_second) ?? latest.tokens_per_second;
    document.getElementById("facts").replaceChildren(
      fact("last-step", "last step", step == null ? "no steps yet" : String(step), step ?? ""),
      fact("latest-loss", "loss (latest)", fmt(latest.loss, 5), latest.loss),
      fact("loss-ema", "loss EMA", fmt(r.loss_ema, 5), r.loss_ema),
      fact("val-loss", "val loss", fmt(r.val_loss, 5), r.val_loss),
      fact("lr", "learning rate", latest.lr == null ? "–" : MA.compact(latest.lr), latest.lr),
      fact("grad-norm", "grad norm", fmt(latest.grad_norm, 4), latest.grad_norm),
      fact("tps", "tokens/s (median of recent steps)", tps == null ? "–" : MA.compact(tps), tps),
      // Without a plan there is no progress: say so, and how to give one, rather than "–".
      fact("progress", r.progress_ratio == null ? "progress: no total_steps (Monitor(total_steps=N))"
           : "progress" + (r.eta_seconds != null ? ` · ${duration(r.eta_seconds)} left` : ""),
           r.progress_ratio == null ? "no ETA" : Math.round(r.progress_ratio * 100) + "%", r.progress_ratio));
  }

  // Each rank's GPU (issue 34): its latest NVML reading (GET /v1/runs/{id}: ranks[r].gpu)
  // with its node and GPU from the rank's run record (read once; the report has no records,
  // and then shows the rank alone). A cell in red is one the gpu_health detector judges: a
  // throttle, uncorrectable ECC errors, a pending or failed remap, a PCIe link below its
  // maximum, XID events, a lost GPU.
  async function loadDevices() {
    if (S.devices) return;
    S.devices = {};
    try {
      const got = await api(`${base}/records?since_step=-1&kind=run&limit=1000`);
      for (const r of got.records || []) {
        const hw = r.hardware || {}, labels = r.labels || {};
        S.devices[String(r.rank || 0)] = {node: labels.node || labels.hostname || "",
          gpu: [hw.gpu_index != null ? "GPU " + hw.gpu_index : "", hw.device_name || "",
                hw.gpu_pci_bus_id ? "PCI " + hw.gpu_pci_bus_id : ""].filter(Boolean).join(" · ")};
      }
    } catch (e) { /* a report, or records not readable: ranks without their node */ }
  }

  function renderGpus(detail) {
    const ranks = Object.entries(detail.ranks || {}).filter(([, r]) => r.gpu && Object.keys(r.gpu).length);
    const card = document.getElementById("gpus-card");
    card.hidden = !ranks.length;
    if (card.hidden) return;
    const n = v => v == null ? "–" : String(Math.round(v * 100) / 100);
    const cell = (text, bad, key) => el("td", {class: bad ? "bad" : "", "data-key": key}, text);
    const head = ["rank", "node", "GPU", "temp °C", "power W", "SM clock MHz", "throttle",
      "ECC uncorrectable (volatile/life)", "ECC corrected", "remapped rows", "PCIe link", "XID"];
    const rows = ranks.map(([rank, r]) => {
      const g = r.gpu, who = (S.devices || {})[rank] || {};
      const throttle = [["throttle_thermal", "thermal"], ["throttle_power", "power"],
        ["throttle_hw_slowdown", "hw slowdown"]].filter(([k]) => g[k] > 0).map(([, w]) => w);
      const narrow = g.pcie_link_width < g.pcie_link_width_max, slowLink = g.pcie_link_gen < g.pcie_link_gen_max;
      const pending = g.remapped_rows_pending > 0 || g.retired_pages_pending > 0;
      return el("tr", {"data-rank": rank},
        el("td", {}, rank), el("td", {}, who.node || ""), el("td", {}, who.gpu || ""),
        cell(n(g.temperature_c), false, "temperature_c"),
        cell(`${n(g.power_w)} / ${n(g.power_limit_w)}`, false, "power_w"),
        cell(`${n(g.sm_clock_mhz)} / ${n(g.sm_clock_max_mhz)}`, throttle.length > 0, "sm_clock_mhz"),
        cell(g.gpu_lost > 0 ? "GPU LOST" : throttle.join(", ") || (g.throttle_reasons != null ? "none" : "–"),
             throttle.length > 0 || g.gpu_lost > 0, "throttle"),
        cell(`${n(g.ecc_uncorrected_volatile)} / ${n(g.ecc_uncorrected_aggregate)}`,
             g.ecc_uncorrected_volatile > 0, "ecc_uncorrected"),
        cell(`${n(g.ecc_corrected_volatile)} / ${n(g.ecc_corrected_aggregate)}`, false, "ecc_corrected"),
        cell(`${n(g.remapped_rows_uncorrectable)} unc. · ${n(g.remapped_rows_correctable)} corr.` +
             (pending ? " · reset pending" : "") + (g.remapped_rows_failure > 0 ? " · FAILED" : ""),
             pending || g.remapped_rows_failure > 0, "remapped_rows"),
        cell(g.pcie_link_gen == null ? "–" : `gen ${n(g.pcie_link_gen)}/${n(g.pcie_link_gen_max)} ` +
             `x${n(g.pcie_link_width)}/x${n(g.pcie_link_width_max)}`, narrow || (slowLink && g.utilization >= 0.5), "pcie"),
        cell(g.xid_count > 0 ? `${n(g.xid_count)} (last ${n(g.xid_last)})` : n(g.xid_count), g.xid_count > 0, "xid"));
    });
    document.getElementById("gpus").replaceChildren(
      el("thead", {}, el("tr", {}, ...head.map(h => el("th", {}, h)))), el("tbody", {}, ...rows));
  }

  function renderAttempts(attempts) {
    // Only a reused run id has more than one: each attempt's steps, what it was taken for,
    // and the earlier steps it replaced (kept, abandoned; GET .../records?attempt=N).
    const card = document.getElementById("attempts-card");
    card.hidden = attempts.length < 2;
    if (card.hidden) return;
    const range = (a, b) => a == null ? "–" : a === b ? String(a) : `${a}–${b}`;
    const kinds = {first: "first", resumed: "resumed from a checkpoint",
      restarted: "a new run reusing the id", pending: "starting"};
    // What a resume was (runs/lifecycle.py): a rollback plan applied, a relaunch after the
    // process died, or a resume after a clean end.
    const whys = {rollback: "rolled back (a rollback plan)", crash: "resumed after a crash",
      resume: "resumed from a checkpoint"};
    document.getElementById("attempts").replaceChildren(
      el("thead", {}, el("tr", {}, ...["attempt", "what", "steps", "replaced (abandoned)", ""].map(h => el("th", {}, h)))),
      el("tbody", {}, ...attempts.map(a => el("tr", {"data-attempt": String(a.number), "data-kind": a.kind},
        el("td", {}, String(a.number)), el("td", {}, whys[a.why] || kinds[a.kind] || a.kind),
        el("td", {}, range(a.first_step, a.last_step)),
        el("td", {}, a.superseded_from == null ? "" : "steps " + range(a.superseded_from, a.superseded_to) + " of earlier attempts"),
        el("td", {class: "muted"}, a.current ? "current" : "")))));
  }

  // -- goodput: where the run's wall-clock time went (GET .../goodput, runs/goodput.py) ----
  // A bar of productive time and each badput cause, proportional; a table of the causes
  // that cost anything; each incident (hang, restart, rollback) with its cost on the
  // timeline. A report (no ledger) hides the card.

  // Causes in the ledger's order (runs/goodput.py CAUSES), as people read them.
  const CAUSES = {
    startup: ["start-up", "#8e7cc3"], input: ["input (data loader)", "#e09b00"],
    checkpoint: ["checkpoints", "#3c7fd8"], eval: ["eval", "#5a9fd6"],
    hang_undetected: ["hang before detection", "#b00020"],
    hang_detected: ["hang after detection", "#e4572e"], restart: ["restarts", "#8d5a36"],
    rollback: ["rollback", "#c2185b"], resume: ["resumed work (done twice)", "#d0679c"],
    skipped: ["skipped steps", "#9e9d24"], loss_scale: ["loss-scale skips", "#c7b43a"],
    straggler_data: ["straggler: data loading", "#00897b"],
    straggler_compute: ["straggler: compute", "#26a69a"],
    straggler_collective: ["straggler: collective", "#4db6ac"],
    unaccounted: ["unaccounted", "#9aa1ae"],
  };
  const PRODUCTIVE = ["productive", "#2e9d5b"];
  // A straggler's cause names who it is ("straggler: data loading (rank 2 on gpu-1)").
  const causeOf = (k, g = S.goodput) => {
    const [label, colour] = CAUSES[k] || [k.replace(/_/g, " "), "#6b7385"];
    const who = k.startsWith("straggler_") && g && g.straggler ? ` (${g.straggler.who})` : "";
    return [label + who, colour];
  };
  const pct = v => (v * 100).toFixed(1) + "%";
  const secs = s => s < 100 ? s.toFixed(1) + " s" :
    `${Math.round(s).toLocaleString("en-US")} s (${duration(s)})`;
  const gpuHours = h => h === 0 ? "0" : h >= 100 ? Math.round(h).toLocaleString("en-US") :
    String(Number(h.toPrecision(3)));

  async function loadGoodput() {
    if (report) return;  // a static report has no ledger
    const g = await api(`${base}/goodput`).catch(() => null);
    const key = JSON.stringify(g);
    if (key === S.goodputKey) return;  // untouched: a hovered segment keeps its tooltip
    S.goodputKey = key;
    S.goodput = g;
    if (S.goodputTip) { tip(null); S.goodputTip = false; }  // its element is about to go
    renderGoodput(g);
    renderIncidents(g ? g.incidents : []);
  }

  // -- nodes: each node's verdict (GET .../nodes, runs/node_verdict.py) ----------------------
  async function loadNodes() {
    if (report) return;
    const got = await api(`${base}/nodes`).catch(() => null);
    const nodes = got ? got.nodes : [];
    const key = JSON.stringify(nodes);
    if (key === S.nodesKey) return;
    S.nodesKey = key;
    const card = document.getElementById("nodes-card");
    card.hidden = !nodes.length;
    if (card.hidden) return;
    document.getElementById("nodes").replaceChildren(
      el("thead", {}, el("tr", {}, ...["node", "ranks", "verdict", "cause", "why"].map(
        h => el("th", {}, h)))),
      el("tbody", {}, ...nodes.map(v => el("tr", {"data-node": v.node, "data-state": v.state},
        el("td", {}, v.node), el("td", {}, v.ranks.join(", ")),
        el("td", {class: "node-" + v.state}, v.state), el("td", {}, v.cause || ""),
        el("td", {}, v.state === "healthy" ? "" :
          `at step ${v.step}: ${v.why}` + (v.price ? ` (${priceWords(v.price)})` : ""))))));
  }

  const priceWords = p => `straggler tax ${secs(p.tax_seconds)} so far, ` +
    `${secs(p.tax_per_hour)} an hour, vs ${secs(p.restart_seconds)} a restart` +
    (p.restart_measured ? "" : " (default)") + (p.exclude_pays ? ": leaving it out pays" : "");

  function renderGoodput(g) {
    const card = document.getElementById("goodput-card");
    card.hidden = !g || !(g.wall_seconds > 0);
    if (card.hidden) return;
    const wall = g.wall_seconds, total = g.badput_seconds_total, lost = total * g.gpus / 3600;
    // What its ranks are: GPUs, or CPU processes for a CPU-only run (runs/goodput.py).
    const unit = g.device_words || {one: "GPU", many: "GPUs", hours: "GPU-hours"};
    const bad = Object.entries(g.badput_seconds).filter(([, v]) => v > 0);
    const ratio = document.getElementById("goodput-ratio");
    ratio.textContent = g.goodput_ratio == null ? "–" : pct(g.goodput_ratio);
    ratio.className = g.goodput_ratio == null ? "" : g.goodput_ratio >= 0.9 ? "good" :
      g.goodput_ratio >= 0.7 ? "fair" : "poor";
    document.getElementById("goodput-summary").textContent = g.summary;
    document.getElementById("goodput-totals").textContent =
      `${secs(wall)} wall-clock · ${g.gpus} ${g.gpus === 1 ? unit.one : unit.many} · ` +
      `${gpuHours(g.gpu_hours)} ${unit.hours}, ${gpuHours(lost)} lost`;
    // Every part with its share (flex-grow by seconds: proportional; a sliver stays visible).
    const parts = [["productive", PRODUCTIVE, g.productive_seconds, g.productive_gpu_hours],
      ...bad.map(([k, v]) => [k, causeOf(k, g), v, g.badput_gpu_hours[k] || 0])];
    const partHtml = (label, v, h) => `<b>${esc(label)}</b>\n${secs(v)} · ${pct(v / wall)} of ` +
      `wall-clock · ${gpuHours(h)} ${unit.hours}`;
    document.getElementById("goodput-bar").replaceChildren(...parts.filter(([, , v]) => v > 0).map(
      ([k, [label, colour], v, h]) => {
        const seg = el("div", {class: "seg", "data-cause": k, "data-seconds": String(v),
          "data-label": `${label} ${pct(v / wall)}`, "data-share": pct(v / wall),
          style: `flex: ${v} 1 0; background: ${colour}`});
        hoverTip(seg, () => partHtml(label, v, h));
        return seg;
      }));
    fitBarLabels();
    document.getElementById("goodput-legend").replaceChildren(...parts.map(([k, [label, colour], v]) =>
      el("span", {class: "chip", "data-cause": k}, el("i", {style: `background: ${colour}`}),
         `${label} ${pct(v / wall)}`)));
    const row = (k, label, colour, v, h, cls = "") => el("tr", {"data-cause": k, class: cls},
      el("td", {}, colour ? el("i", {class: "swatch", style: `background: ${colour}`}) : "", label),
      el("td", {class: "num"}, secs(v)), el("td", {class: "num"}, pct(v / wall)),
      el("td", {class: "num"}, gpuHours(h)));
    document.getElementById("goodput-table").replaceChildren(
      el("thead", {}, el("tr", {}, ...["badput cause", "seconds", "% of wall-clock", unit.hours].map(
        (h, i) => el("th", {class: i ? "num" : ""}, h)))),
      el("tbody", {}, ...(bad.length ? bad.map(([k, v]) => row(k, causeOf(k, g)[0], causeOf(k, g)[1], v,
          g.badput_gpu_hours[k] || 0)) :
        [el("tr", {}, el("td", {class: "empty", colspan: "4"}, "No badput: every second went to training."))])),
      el("tfoot", {}, row("total", "total badput", null, total, lost, "total"),
         row("productive", "productive", PRODUCTIVE[1], g.productive_seconds, g.productive_gpu_hours, "productive")));
  }

  function hoverTip(node, html) {
    const show = e => { S.goodputTip = true; tip(html(), e); };
    node.addEventListener("mouseenter", show);
    node.addEventListener("mousemove", show);
    node.addEventListener("mouseleave", () => { S.goodputTip = false; tip(null); });
  }

  // A segment says what it is where that fits ("restarts 31.6%"), else its share, else
  // nothing (the legend and the tooltip say it): never a clipped word.
  function fitBarLabels() {
    for (const seg of document.querySelectorAll("#goodput-bar .seg")) {
      for (const text of [seg.dataset.label, seg.dataset.share, ""]) {
        const words = el("span", {}, text);
        seg.replaceChildren(words);
        if (!text || words.getBoundingClientRect().width + 10 <= seg.clientWidth) break;
      }
    }
  }

  // The incidents on the timeline strip, newest last, each with what it cost ("this hang
  // cost 20 s x 2 GPUs = 0.011 GPU-hours"); a click zooms to its step.
  const INCIDENTS_SHOWN = 6;
  const INCIDENT_WHAT = {hang: "after step", restart: "resumed at step",
    resume: "resumed at step", rollback: "resumed at step"};
  function renderIncidents(incidents) {
    const box = document.getElementById("incidents");
    box.hidden = !incidents.length;
    const shown = incidents.slice(-INCIDENTS_SHOWN);
    const partsOf = i => Object.entries(i.detail || {}).filter(([, v]) => v > 0)
      .map(([k, v]) => `  ${esc(k.replace(/_/g, " "))}: ${secs(v)}`).join("\n");
    box.replaceChildren(el("span", {class: "muted label"}, "incidents"), ...shown.map(i => {
      const html = `<b>${esc(i.kind)}</b> · step ${i.step} · attempt ${i.attempt}` +
        `${i.open ? " · still going" : ""}\n${esc(i.words)}` +
        (partsOf(i) ? "\n\nof which:\n" + partsOf(i) : "") + `\n\n(click to zoom to step ${i.step})`;
      const item = el("div", {class: "incident", "data-kind": i.kind, "data-step": String(i.step),
          "data-seconds": String(i.seconds), onclick: () => zoomTo(i.step)},
        el("span", {class: "kind kind-" + i.kind}, i.kind),
        ` ${INCIDENT_WHAT[i.kind] || "at step"} ${i.step}`,
        i.attempt > 1 ? el("span", {class: "muted"}, ` (attempt ${i.attempt})`) : "", " · ",
        el("span", {class: "cost"}, i.words), i.open ? el("b", {class: "paged"}, " (still going)") : "");
      hoverTip(item, () => html);
      return item;
    }), ...(incidents.length > shown.length ?
      [el("span", {class: "muted"}, `+${incidents.length - shown.length} earlier`)] : []));
  }

  function renderAlerts(alerts) {
    const box = document.getElementById("alerts"), seen = JSON.stringify(alerts);
    if (seen === S.alertsSeen) return;  // untouched rows: a button stays under the pointer
    S.alertsSeen = seen;
    if (!alerts.length) { box.replaceChildren(el("div", {class: "empty"}, "No alerts for this run.")); return; }
    const rows = alerts.map(a => el("tr", {"data-fp": a.fingerprint, "data-state": a.state},
      el("td", {}, el("span", {class: "sev sev-" + a.severity}, a.severity)),
      el("td", {}, a.alertname),
      el("td", {class: "state-" + a.state}, a.state + (a.silenced ? " · silenced" : "") +
         (a.acked_by !== null && a.acked_at ? ` · acked by ${a.acked_by || "someone"}` : "")),
      el("td", {class: "msg"}, a.summary,  // and what was grouped under this page
         a.related_summary ? el("div", {class: "muted related"}, a.related_summary) : ""),
      // The latest finding's step (last_step is where the history stands for it: after a
      // rollback, the checkpoint's step).
      el("td", {}, (a.step ?? a.last_step) == null ? "" : "step " + (a.step ?? a.last_step)),
      el("td", {}, a.state === "resolved" ? "" : el("span", {},
        el("button", {class: "btn ack", onclick: () => act(`/v1/alerts/${a.fingerprint}/ack`, {by: "web UI"}, "acknowledged")}, "acknowledge"), " ",
        el("button", {class: "btn silence", onclick: () => act("/v1/silences", {run_id: runId, type: a.type, duration_seconds: 3600, comment: "from the run page", created_by: "web UI"}, "silenced for 1 h")}, "silence 1 h")))));
    box.replaceChildren(el("table", {}, el("thead", {}, el("tr", {}, ...["severity", "alert", "state", "summary", "step", ""].map(h => el("th", {}, h)))), el("tbody", {}, ...rows)));
  }
  function say(text, kind = "") {  // an action's outcome stays up a while, polls or not
    S.said = {text, kind, until: Date.now() + 8000};
    notice(text, kind);
  }
  async function act(path, body, done) {
    try {
      await api(path, {method: "POST", body});
      say(done);
      refresh();
    } catch (e) {
      say(e.status === 401 ? "Refused: this sidecar needs its bearer token for that. Enter it above."
        : `Failed (${e.status}): ${e.message}`, "error");
    }
  }

  // A lasting condition (NaN from some step on) is reported again and again: the list
  // shows one row per episode, with its step range and count. Detectors repeat a finding
  // of a condition still present every `repeat_every_steps` (series answer), so findings
  // of one kind (type, layer, rank) no further apart than that are one episode; a longer
  // silence means the condition went away in between. Half an interval of slack: a
  // condition seen only on sparse records (layer statistics every 25 steps) is re-reported
  // up to a record late.
  function episodes(findings) {
    const gap = 1.5 * ((S.series && S.series.repeat_every_steps) || 100);
    const open = new Map(), out = [];
    for (const f of [...findings].sort((a, b) => a.step - b.step)) {
      const kind = `${f.type}|${f.layer || ""}|${f.rank || 0}`, ep = open.get(kind);
      if (ep && f.step - ep.last <= gap) {
        ep.last = f.step; ep.count += 1;
        if (SEVERITY.indexOf(f.severity) > SEVERITY.indexOf(ep.f.severity)) ep.f = Object.assign({}, f, {step: ep.first});
        continue;
      }
      const fresh = {f, first: f.step, last: f.step, count: 1};
      open.set(kind, fresh);
      out.push(fresh);
    }
    return out;
  }
  // Where a straggler's step goes next to the other ranks' (medians of the finding's
  // window): data loading, own compute, the wait in the gradient all-reduce.
  const BREAKDOWN = [["data", "data loading"], ["compute", "compute"], ["sync_wait", "all-reduce wait"]];
  function breakdownTable(f) {
    const ev = f.evidence || {};
    const cols = BREAKDOWN.filter(([k]) => typeof ev[k + "_time"] === "number");
    if (!cols.length) return "";
    const ms = v => typeof v === "number" ? `${fmt(v * 1000, 3)} ms` : "–";
    const cause = ev.cause === "collective" ? "sync_wait" : ev.cause;
    const row = (who, prefix) => el("tr", {}, el("th", {}, who),
      ...cols.map(([k]) => el("td", {class: k === cause ? "cause" : ""}, ms(ev[prefix + k + "_time"]))));
    return el("table", {class: "breakdown"},
      el("thead", {}, el("tr", {}, el("th", {}, ""), ...cols.map(([, label]) => el("th", {}, label)))),
      el("tbody", {}, row(`rank ${f.rank}`, ""), row("other ranks (median)", "others_")));
  }
  const SEVERITY = ["info", "warning", "error", "critical"];
  // A hang (detectors/hang.py): per rank, from the episode's latest finding, the last
  // completed step and what it is doing, so "one rank is stuck or gone, the rest wait in
  // all_reduce" reads at a glance. Text nodes only: frames are the client's data.
  function hangTable(first, lastStep) {
    const f = S.findings.filter(g => g.type === "hang" && g.step <= lastStep).pop() || first;
    const ranks = Object.entries((f.evidence || {}).ranks || {});
    if (!ranks.length) return "";
    const head = el("tr", {}, ...["rank", "state", "last step", "stuck", "phase", "where"].map(h => el("th", {}, h)));
    const rows = ranks.map(([r, v]) => el("tr", {"data-state": v.state},
      el("td", {}, r), el("td", {}, v.state), el("td", {}, String(v.last_step)),
      el("td", {}, v.stuck_seconds != null ? fmt(v.stuck_seconds) + " s" :
        v.silent_seconds != null ? `silent ${fmt(v.silent_seconds)} s` : ""),
      el("td", {}, v.phase || ""),
      el("td", {}, v.stuck_in ? v.stuck_in + (v.called_from ? ` ← ${v.called_from}` : "") :
        v.state === "gone" ? "process gone: no hang report" : "")));
    return el("table", {class: "hang-ranks"}, head, ...rows);
  }
  function renderFindings() {
    const eps = episodes(S.findings);
    // Findings about steps a later attempt replaced (a rollback's abandoned branch): listed
    // after the current history's, marked, so the fault a rollback was for stays in sight.
    const gone = episodes(S.abandoned || []).map(e => Object.assign(e, {abandoned: true}));
    document.getElementById("findings-count").textContent =
      `(${eps.length} episode${eps.length === 1 ? "" : "s"}, ${S.findings.length} finding${S.findings.length === 1 ? "" : "s"}` +
      (gone.length ? `; ${gone.length} on abandoned steps)` : ")");
    const rows = [...eps, ...gone].map(({f, first, last, count, abandoned}) => el("tr", {
        class: "episode" + (abandoned ? " abandoned" : ""), "data-type": f.type, "data-count": count,
        onclick: () => (count > 1 ? zoomRange(first - 5, last + 5) : zoomTo(first))},
      el("td", {}, (first === last ? "step " + first : `steps ${first}–${last}`),
        abandoned ? el("div", {class: "muted"}, "abandoned (rolled back)") : ""),
      el("td", {}, count > 1 ? el("span", {class: "count"}, count + "×") : ""),
      el("td", {}, el("span", {class: "sev sev-" + f.severity}, f.severity)),
      el("td", {"data-rank": f.rank}, f.type + rankOf(f)), el("td", {class: "msg"}, f.message + (f.layer ? ` (${f.layer})` : ""),
        ...(f.type === "straggler" ? [breakdownTable(f)] : []),
        ...(f.type === "hang" ? [hangTable(f, last)] : []))));
    document.querySelector("#findings tbody").replaceChildren(...(rows.length ? rows :
      [el("tr", {}, el("td", {class: "empty"}, "No findings: nothing looked wrong."))]));
  }


  // -- the run at a glance: verdict and timeline, config ----------------------------------

  // The first finding of each kind in step order, the kinds that paged marked, e.g.
  // "lr_jump at step 300 → divergence at step 309 (paged)". The run JSON's `verdict`
  // (when the sidecar gives one) leads the strip.
  const TIMELINE_KINDS = 8;
  function renderTimeline(detail) {
    const firsts = new Map();
    for (const f of [...S.findings].sort((a, b) => a.step - b.step))
      if (!firsts.has(f.type)) firsts.set(f.type, f);
    // What a rollback abandoned, after the current history: the fault it was for.
    for (const f of [...(S.abandoned || [])].sort((a, b) => a.step - b.step))
      if (!firsts.has("abandoned " + f.type)) firsts.set("abandoned " + f.type, Object.assign({}, f, {abandoned: true}));
    // Paged: an alert of the kind woke someone (its rule's route is "page", and it went
    // out): a warning posted to chat is not "paged".
    const paged = new Set((detail.alerts || []).filter(a => a.paged).map(a => a.type));
    const verdict = typeof detail.verdict === "string" ? detail.verdict : detail.verdict &&
      (detail.verdict.summary || detail.verdict.text || detail.verdict.message || null);
    const key = JSON.stringify([[...firsts.values()].map(f => [f.type, f.step]), [...paged], verdict]);
    if (key === S.timelineKey) return;
    S.timelineKey = key;
    const items = [...firsts.values()];
    const shown = items.slice(0, TIMELINE_KINDS).map((f, i) => el("span", {class: "event", "data-type": f.type,
        title: f.message, onclick: () => zoomTo(f.step)},
      i ? el("span", {class: "arrow"}, " → ") : "",
      el("span", {class: "sev sev-" + f.severity}, f.type.replace(/_/g, " ")),
      ` at step ${f.step}`, f.abandoned ? el("span", {class: "muted"}, " (abandoned: rolled back)") : "",
      paged.has(f.type) ? el("b", {class: "paged"}, " (paged)") : ""));
    const more = items.length > TIMELINE_KINDS ? [el("span", {class: "muted"}, ` +${items.length - TIMELINE_KINDS} more kinds`)] : [];
    document.getElementById("timeline").replaceChildren(
      ...(verdict ? [el("div", {class: "verdict", id: "verdict"}, verdict)] : []),
      el("div", {class: "events"}, ...(shown.length ? [...shown, ...more] :
        [el("span", {class: "muted"}, "No findings so far: nothing looked wrong.")])));
  }

  // The run record's config, model and hardware maps, flattened to dotted keys; long lists
  // (a model's layer order) shortened. Text only: every value goes in as a text node.
  const LIST_SHOWN = 6;
  function flatten(obj, prefix = "", out = []) {
    for (const [k, v] of Object.entries(obj || {})) {
      const key = prefix ? prefix + "." + k : k;
      if (v && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length) flatten(v, key, out);
      else if (Array.isArray(v)) out.push([key, v.slice(0, LIST_SHOWN).map(x => typeof x === "object" ? JSON.stringify(x) : String(x)).join(", ") +
        (v.length > LIST_SHOWN ? ` … (${v.length} in all)` : "")]);
      else out.push([key, typeof v === "object" && v !== null ? JSON.stringify(v) : String(v)]);
    }
    return out;
  }
  function renderConfig(detail) {
    const run = detail.run || {};
    const key = JSON.stringify([run.config, run.model, run.hardware]);
    if (key === S.configKey) return;
    S.configKey = key;
    const card = document.getElementById("config-card");
    const groups = ["config", "model", "hardware"].map(g => [g, flatten(run[g])]).filter(([, rows]) => rows.length);
    card.style.display = groups.length ? "" : "none";
    const first = groups.length ? groups[0][1].slice(0, 5).map(([k, v]) => `${k}=${v}`).join(" · ") : "";
    document.getElementById("config-summary").textContent = first;
    document.getElementById("config").replaceChildren(...groups.map(([g, rows]) => el("div", {class: "config-group", "data-group": g},
      el("h3", {}, g + ` (${rows.length})`),
      el("table", {}, el("tbody", {}, ...rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))))))));
  }

  // -- the script's own scalars -------------------------------------------------------------

  function drawUserCharts(d) {
    const names = Object.keys(d.user_scalars || {});
    const all = d.user_names || [];
    const card = document.getElementById("user-card");
    card.style.display = all.length ? "" : "none";  // shown first: the charts take its width
    S.userDefs = names.map((n, i) => (S.userDefs || []).find(u => u.user === n) || Charts.userChart(n, i));
    for (const def of S.userDefs) drawChart(def, d);
    const rest = all.filter(n => !names.includes(n));
    document.getElementById("user-more").textContent = rest.length ?
      `${rest.length} more not charted: ${rest.slice(0, 20).join(", ")}${rest.length > 20 ? ", …" : ""}` : "";
  }

  // Everything drawn again from the answers in hand (a view control changed).
  function redraw() {
    if (!S.series) return;
    for (const def of CHARTS.filter(c => c.build && !c.quant)) drawChart(def, S.series);
    drawUserCharts(S.series);
    drawQuantiles();
  }

  // "add run": the compare page with this run and the one picked, the view carried along.
  async function fillAddRun(sel) {
    if (sel.options.length > 1) return;
    const runs = (await api("/v1/ui/runs")).runs.map(r => r.run_id).filter(r => r !== runId).sort();
    sel.append(...runs.map(r => el("option", {value: r}, r)));
  }
  function compareWith(other) {
    const q = new URLSearchParams(location.search);
    q.delete("run");
    const to = new URLSearchParams([["run", runId], ["run", other], ...q]);
    location.href = "/compare?" + to;
  }

  // -- loading ----------------------------------------------------------------------------

  async function refresh() {
    if (S.busy) return;
    S.busy = true;
    try {
      const q = new URLSearchParams({points: Math.min(2000, plotWidth()), rank: S.rank});
      if (S.view) { q.set("start", Math.max(0, Math.floor(S.view[0]))); q.set("end", Math.ceil(S.view[1])); }
      // The matrices (heatmaps, quantiles) are fetched alongside, every few seconds.
      const due = report ? !S.matricesAt : Date.now() - (S.matricesAt || 0) > 4000 ||
        S.view !== S.matricesView;
      if (due) { S.matricesAt = Date.now(); S.matricesView = S.view; }
      // Every read at once: a round trip each in turn cost more than any one of them.
      const first = S.lastFindings < 0 ? loadFindings(-1) : null;  // the quantiles' layer
      const matrices = due ? fetchMatrices(first) : null;
      const ckpts = due || S.ckptKey === undefined ? loadCheckpoints() : null;  // thinned: with the matrices
      const ledgers = Promise.all([loadGoodput(), loadNodes()]);
      // Each answer drawn as it comes: the charts while the server still builds the
      // heatmaps, and those (on the series' step range) once both are in.
      const seriesDrawn = api(`${base}/series?${q}`).catch(e => { if (e.status === 404) return null; throw e; })
        .then(series => { if (series) drawSeries(series); });
      const heatsDrawn = matrices && Promise.all([matrices, seriesDrawn]).then(([install]) => {
        install();
        drawHeats();
        drawQuantiles();
      });
      if (heatsDrawn) heatsDrawn.catch(() => null);  // its failure is the series' own, below
      const [detail] = await Promise.all([api(base), seriesDrawn, first, ckpts, ledgers]);
      S.detail = detail;
      const total = Object.values((detail.findings || {}).by_type || {}).reduce((a, b) => a + b, 0);
      if (total !== S.lastFindings) await loadFindings(total);
      renderFacts(detail);
      renderTimeline(detail);
      renderConfig(detail);
      renderAttempts(detail.attempts || []);
      if (Object.values(detail.ranks || {}).some(r => r.gpu)) await loadDevices();
      renderGpus(detail);
      renderAlerts(detail.alerts || []);
      await heatsDrawn;
      for (const [id, u] of Object.entries(S.charts)) placeMarkers(id, u);
      for (const [id, h] of Object.entries(S.heats)) if (h.m) placeHeatMarkers(id, h);  // findings come late
      document.getElementById("live").textContent = report ? `backtest report of ${report.trace}` :
        (detail.active ? "● live" : "stored run") + " · updated " + new Date().toLocaleTimeString();
      if (S.said && S.said.until > Date.now()) notice(S.said.text, S.said.kind);
      else notice("");
      document.body.dataset.loaded = "1";
    } catch (e) {
      notice(e.status === 401 ? "This sidecar requires the token for reads: enter it above." :
        e.status === 404 ? `No run ${runId} here.` : "Cannot load: " + e.message, "error");
    } finally { S.busy = false; }
  }

  function drawSeries(series) {
    S.everBucketed = Charts.state.bucketed = S.everBucketed || series.bucketed;
    if (!S.view || !S.series) S.series = series;
    else S.series = Object.assign({}, series, {range: S.series.range});
    renderRanks(series.ranks);
    for (const def of CHARTS.filter(c => c.build && !c.quant)) drawChart(def, series);
    drawUserCharts(S.series);
    if (S.episodeGap !== S.series.repeat_every_steps) { S.episodeGap = S.series.repeat_every_steps; renderFindings(); }
  }

  async function loadFindings(total) {
    const [current, all] = await Promise.all([api(`${base}/findings?limit=10000&current=true`),
                                              api(`${base}/findings?limit=10000`)]);
    S.findings = current.findings;
    const key = f => JSON.stringify([f.attempt, f.type, f.step, f.rank, f.layer, f.message]);
    const kept = new Set(S.findings.map(key));
    S.abandoned = all.findings.filter(f => !kept.has(key(f)));
    S.lastFindings = total < 0 ? S.findings.length : total;
    S.findingsKey = (S.findingsKey || 0) + 1;
    renderFindings();
  }

  function renderRanks(ranks) {
    if (S.nranks !== ranks.length) { S.nranks = ranks.length; renderFindings(); }
    const sel = document.getElementById("rank");
    if (sel.options.length !== ranks.length) {
      sel.replaceChildren(...ranks.map(r => el("option", {value: r}, String(r))));
      sel.value = S.rank;
    }
    sel.parentElement.style.display = ranks.length > 1 ? "" : "none";
  }

  document.getElementById("run-id").textContent = runId;
  document.title = "monitor-agent · " + runId;
  document.getElementById("rank").addEventListener("change", e => { S.rank = +e.target.value; S.matricesAt = 0; refresh(); });
  document.getElementById("reset-zoom").addEventListener("click", resetZoom);
  if (report) document.getElementById("alerts-card").style.display = "none";
  PlotView.slider(document.getElementById("view-controls"), redraw);
  const addRun = document.getElementById("add-run");
  if (report) addRun.style.display = "none";
  addRun.addEventListener("focus", () => fillAddRun(addRun).catch(() => null));
  addRun.addEventListener("mousedown", () => fillAddRun(addRun).catch(() => null));
  addRun.addEventListener("change", () => { if (addRun.value) compareWith(addRun.value); });
  addEventListener("resize", () => {
    for (const u of Object.values(S.charts)) u.setSize({width: plotWidth(u._box), height: u._box ? 160 : 220});
    drawHeats();
    fitBarLabels();
  });
  MA.tokenBox(refresh);
  refresh();
  if (!report) setInterval(refresh, 1000);
})();
