// The run page (and the HTML report, which embeds the same answers): uPlot charts of the
// downsampled series, canvas heatmaps of the per-layer matrices, every finding a marker
// on the chart it concerns, alerts with acknowledge/silence, live polling.
"use strict";
(() => {
  const {api, el, fmt, duration, esc, tip, notice, report} = MA;
  const {CHARTS, CHART_OF} = Charts;
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
      document.getElementById("charts").append(card);
    }
    return card;
  }
  // A chart's plot width in CSS pixels, known before any chart exists (the grid's first
  // column): the server is asked for as many buckets as there are pixels, no more.
  const plotWidth = () => {
    const track = parseFloat(getComputedStyle(document.getElementById("charts")).gridTemplateColumns);
    return Math.max(300, Math.round((track || document.body.clientWidth) - 26));
  };

  function drawChart(def, d) {
    const built = def.build(d);
    const lines = built.lines.filter(l => l.values.some(v => v !== null));
    const card = cardFor(def);
    if (!lines.length || !built.x.length) {
      if (S.view && S.charts[def.id]) return;  // nothing in the zoomed range: keep the chart
      card.style.display = "none";
      return;
    }
    card.style.display = "";
    const data = [built.x, ...lines.map(l => l.values)];
    let u = S.charts[def.id];
    const key = lines.map(l => l.label).join("|");
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
    const yfmt = (u_, vals) => vals.map(v => v == null ? "" : fmt(v, 3));  // null: unlabelled log tick
    const axes = [{}, {size: 64, values: yfmt}];
    const scales = {x: {time: false}};
    if (def.log) scales.y = {distr: 3};
    if (def.y2) { scales[def.y2] = {}; axes.push({scale: def.y2, side: 1, size: 50, grid: {show: false}, values: yfmt}); }
    u = new uPlot({
      width: plotWidth(), height: 220, scales, axes, bands,
      cursor: {sync: {key: "run-" + runId}, drag: {x: true, y: false, setScale: false}},
      // spanGaps: sparse series (update ratio every k steps, evals) are lines, not dots;
      // NaN/Inf steps are drawn as red ticks on the loss chart instead of a gap.
      series: [{label: "step"}, ...lines.map(l => Object.assign({label: l.label, spanGaps: true}, l.opts))],
      legend: {live: true},
      hooks: {setSelect: [onSelect], ready: [u_ => u_.over.addEventListener("dblclick", resetZoom)], draw: [u_ => placeMarkers(def.id, u_), ...(def.id === "loss" ? [drawNonfinite] : [])]},
    }, data, card.querySelector(".plot"));
    u._key = key;
    // The min/max band edges are drawing aids: keep them out of the legend.
    const rows = u.root.querySelectorAll(".u-legend .u-series");
    lines.forEach((l, i) => { if (/ (max|min)$/.test(l.label) && rows[i + 1]) rows[i + 1].style.display = "none"; });
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
  function markerFor(f, box) {
    const m = el("div", {class: "marker " + f.severity, "data-type": f.type, "data-step": f.step});
    m.addEventListener("mouseenter", e => tip(findingHtml(f), e));
    m.addEventListener("mousemove", e => tip(findingHtml(f), e));
    m.addEventListener("mouseleave", () => tip(null));
    m.addEventListener("click", () => zoomTo(f.step));
    box.append(m);
    return m;
  }
  function findingHtml(f) {
    const ev = Object.entries(f.evidence || {}).map(([k, v]) => `  ${esc(k)}: ${esc(typeof v === "number" ? fmt(v) : JSON.stringify(v))}`).join("\n");
    const tips = (f.suggestions || []).map(s => "  • " + esc(s)).join("\n");
    return `<b>${esc(f.type)}</b> · ${esc(f.severity)} · step ${f.step}${f.rank ? " · rank " + f.rank : ""}${f.layer ? " · " + esc(f.layer) : ""}\n` +
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
    ctx.fillStyle = "#b00020";
    ctx.font = `${11 * devicePixelRatio}px system-ui`;
    ctx.fillText(`NaN/Inf at ${bad.length} step(s)`, u.bbox.left + 6, top + 14 * devicePixelRatio);
    ctx.restore();
  }
  function visibleCharts() {
    return [...document.querySelectorAll("#charts .card")].filter(c => c.style.display !== "none").map(c => c.id).join();
  }
  function placeMarkers(id, u) {
    const box = u.over;
    let marks = box._marks;
    const key = S.findingsKey + "/" + visibleCharts();
    if (!marks || marks.key !== key) {
      box.querySelectorAll(".marker").forEach(n => n.remove());
      marks = box._marks = S.findings.filter(f => targetOf(f) === id).map(f => [f, markerFor(f, box)]);
      marks.key = key;
    }
    const {min, max} = u.scales.x;
    for (const [f, m] of marks) {
      const off = f.step < min || f.step > max;
      m.classList.toggle("hidden", off);
      m.style.left = u.valToPos(f.step, "x") + "px";
      m.style.height = box.clientHeight + "px";
    }
  }
  function placeHeatMarkers(id, heat) {
    const box = heat.box, key = S.findingsKey + "/" + visibleCharts();
    if (!box._marks || box._marks.key !== key) {  // kept across redraws: a hover survives
      box.querySelectorAll(".marker").forEach(n => n.remove());
      box._marks = S.findings.filter(g => targetOf(g) === id).map(f => [f, markerFor(f, box)]);
      box._marks.key = key;
    }
    const [lo, hi] = heat.range;
    for (const [f, m] of box._marks) {
      m.classList.toggle("hidden", f.step < lo || f.step > hi);
      m.style.left = heat.xpos(f.step) + "px";
      m.style.height = heat.canvas.clientHeight + "px";
    }
  }

  // -- heatmaps and quantiles -----------------------------------------------------------

  const matrixCache = {};
  function decode(m) {  // values_f32: base64 of little-endian float32 (NaN: no value)
    const bin = atob(m.values_f32), buf = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) buf[i] = bin.charCodeAt(i);
    m.values = new Float32Array(buf.buffer);
    return m;
  }
  async function fetchMatrices() {  // resolves to a function that installs the answers
    const q = new URLSearchParams({points: Math.min(1500, plotWidth() + 26), rank: S.rank});
    if (S.view) { q.set("start", Math.floor(S.view[0])); q.set("end", Math.ceil(S.view[1])); }
    const ql = new URLSearchParams(q);
    // Open on the layer the latest grad_distribution finding is about, if any.
    const about = S.findings.filter(f => f.type === "grad_distribution" && f.layer).pop();
    const layer = S.quantLayer || (about && about.layer) || (report && report.quantile_layers[0]);
    if (layer) ql.set("layer", layer);
    const wanted = [...CHARTS.filter(c => c.heat).map(c => [c.heat, `${base}/matrix/${c.heat}?${q}`]),
                    ["grad_quantiles", `${base}/matrix/grad_quantiles?${ql}`]];
    const got = await Promise.all(wanted.map(([, path]) => api(path).then(decode).catch(() => null)));
    return () => wanted.forEach(([stat], i) => { matrixCache[stat] = got[i]; });
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
    document.getElementById("status").textContent = detail.status + (detail.active ? "" : " (stored)");
    document.getElementById("status").className = "status status-" + detail.status;
    const verdict = document.getElementById("verdict");  // the run's verdict, in its header
    verdict.textContent = detail.verdict ? detail.verdict.words : "";
    verdict.className = detail.verdict ? "verdict verdict-" + detail.verdict.state : "verdict";
    const fact = (id, label, value, raw) => el("div", {}, el("b", {id, "data-value": raw === undefined ? "" : String(raw)}, value), el("span", {}, label));
    const step = detail.last_step ?? stored.step ?? null;
    document.getElementById("facts").replaceChildren(
      fact("last-step", "last step", step == null ? "–" : String(step), step),
      fact("latest-loss", "loss (latest)", fmt(latest.loss, 5), latest.loss),
      fact("loss-ema", "loss EMA", fmt(r.loss_ema, 5), r.loss_ema),
      fact("val-loss", "val loss", fmt(r.val_loss, 5), r.val_loss),
      fact("lr", "learning rate", fmt(latest.lr, 3), latest.lr),
      fact("grad-norm", "grad norm", fmt(latest.grad_norm, 4), latest.grad_norm),
      fact("tps", "tokens/s", fmt(latest.tokens_per_second, 4), latest.tokens_per_second),
      fact("progress", "progress" + (r.eta_seconds != null ? ` · ${duration(r.eta_seconds)} left` : ""),
           r.progress_ratio == null ? "–" : Math.round(r.progress_ratio * 100) + "%", r.progress_ratio));
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
      el("td", {}, a.last_step == null ? "" : "step " + a.last_step),
      el("td", {}, a.state === "resolved" ? "" : el("span", {},
        el("button", {class: "btn ack", onclick: () => act(`/v1/alerts/${a.fingerprint}/ack`, {by: "web UI"}, "acknowledged")}, "acknowledge"), " ",
        el("button", {class: "btn silence", onclick: () => act("/v1/silences", {run_id: runId, type: a.type, duration_seconds: 3600, comment: "from the run page", created_by: "web UI"}, "silenced for 1 h")}, "silence 1 h")))));
    box.replaceChildren(el("table", {}, el("thead", {}, el("tr", {}, ...["severity", "alert", "state", "summary", "last", ""].map(h => el("th", {}, h)))), el("tbody", {}, ...rows)));
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

  function renderFindings() {
    document.getElementById("findings-count").textContent = `(${S.findings.length})`;
    const rows = [...S.findings].sort((a, b) => a.step - b.step).map(f => el("tr", {onclick: () => zoomTo(f.step)},
      el("td", {}, "step " + f.step), el("td", {}, el("span", {class: "sev sev-" + f.severity}, f.severity)),
      el("td", {}, f.type), el("td", {class: "msg"}, f.message + (f.layer ? ` (${f.layer})` : ""))));
    document.querySelector("#findings tbody").replaceChildren(...(rows.length ? rows :
      [el("tr", {}, el("td", {class: "empty"}, "No findings: nothing looked wrong."))]));
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
      if (S.lastFindings < 0) await loadFindings(-1);  // the quantiles open on a finding's layer
      const matrices = due ? fetchMatrices() : null;
      const [detail, series] = await Promise.all([api(base), api(`${base}/series?${q}`).catch(e => {
        if (e.status === 404) return null; throw e; })]);
      S.detail = detail;
      const total = Object.values((detail.findings || {}).by_type || {}).reduce((a, b) => a + b, 0);
      if (total !== S.lastFindings) await loadFindings(total);
      if (series) {
        S.everBucketed = Charts.state.bucketed = S.everBucketed || series.bucketed;
        if (!S.view || !S.series) S.series = series;
        else S.series = Object.assign({}, series, {range: S.series.range});
        renderRanks(series.ranks);
        for (const def of CHARTS.filter(c => c.build && !c.quant)) drawChart(def, series);
      }
      renderFacts(detail);
      renderAlerts(detail.alerts || []);
      if (matrices) {
        (await matrices)();
        drawHeats();
        drawQuantiles();
      }
      for (const [id, u] of Object.entries(S.charts)) placeMarkers(id, u);
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

  async function loadFindings(total) {
    S.findings = (await api(`${base}/findings?limit=10000`)).findings;
    S.lastFindings = total < 0 ? S.findings.length : total;
    S.findingsKey = (S.findingsKey || 0) + 1;
    renderFindings();
  }

  function renderRanks(ranks) {
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
  addEventListener("resize", () => {
    for (const u of Object.values(S.charts)) u.setSize({width: plotWidth(), height: 220});
    drawHeats();
  });
  MA.tokenBox(refresh);
  refresh();
  if (!report) setInterval(refresh, 1000);
})();
