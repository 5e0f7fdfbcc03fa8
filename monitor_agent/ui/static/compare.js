// The compare page: two or more runs overlaid on one set of axes per chart, aligned by
// step, one colour per run. The runs are the URL's `run` parameters (a link shares the
// view; smoothing and log scales ride along as on the run page).
"use strict";
(() => {
  const {api, el, notice} = MA;
  const COLORS = Charts.COLORS;
  const gib = v => (v == null ? v : v / 2 ** 30);
  // What is compared: a series field, or the evals' validation loss; `smooth` as on the
  // run page (a learning-rate schedule or memory is read as it is, not averaged).
  const CHARTS = [
    {id: "loss", title: "Training loss", field: "loss", smooth: true},
    {id: "val_loss", title: "Validation loss", evals: true},
    {id: "lr", title: "Learning rate", field: "lr"},
    {id: "grad", title: "Gradient norm", field: "grad_norm", smooth: true},
    {id: "update", title: "Update / param ratio", field: "update_ratio", smooth: true, log: true},
    {id: "speed", title: "Throughput (tokens/s)", field: "tokens_per_second", smooth: true},
    {id: "mfu", title: "Model FLOPs utilisation", field: "mfu", smooth: true},
    {id: "memory", title: "Memory allocated (GiB)", field: "mem_allocated", map: gib},
    {id: "steptime", title: "Step time (s)", field: "step_time", smooth: true},
  ];
  const USER_CHARTS = 12;
  for (const def of CHARTS) if (def.log) PlotView.state.defaults.add(def.id);
  const runIds = [...new Set(new URLSearchParams(location.search).getAll("run").filter(Boolean))];
  const S = {runIds, answers: {}, charts: {}};
  window.comparePage = S;  // for the browser tests and the curious

  // One run's points of a chart: its x (steps) and y, or null when it has none.
  function pointsOf(def, d) {
    if (def.evals) return {x: d.evals.steps, y: d.evals.val_loss};
    if (def.user) {
      const s = (d.user_scalars || {})[def.user];
      return s ? {x: s.steps, y: s.mean} : null;
    }
    const s = d.series[def.field];
    return s ? {x: d.steps, y: def.map ? s.mean.map(def.map) : s.mean} : null;
  }
  // Every run's points on the union of their steps (null where a run has no point there:
  // spanGaps draws each run's line through its own points).
  function aligned(def) {
    const per = S.runIds.map(r => [r, S.answers[r] && pointsOf(def, S.answers[r])])
      .filter(([, p]) => p && p.y.some(v => v !== null));
    const xs = [...new Set(per.flatMap(([, p]) => p.x))].sort((a, b) => a - b);
    const lines = per.map(([r, p]) => {
      const at = new Map(p.x.map((x, i) => [x, p.y[i]]));
      const colour = COLORS[S.runIds.indexOf(r) % COLORS.length];
      return {label: r, smooth: !!def.smooth, values: xs.map(x => at.get(x) ?? null),
              opts: {stroke: colour, width: 1.5, points: {show: def.evals ? xs.length <= 60 : false, size: 5}}};
    });
    return {x: xs, lines};
  }

  const plotWidth = () => {
    const track = parseFloat(getComputedStyle(document.getElementById("charts")).gridTemplateColumns);
    return Math.max(300, Math.round((track || document.body.clientWidth) - 26));
  };
  function cardFor(def) {
    let card = document.getElementById("chart-" + def.id);
    if (!card) {
      card = el("div", {class: "card", id: "chart-" + def.id, "data-chart": def.id},
        el("h2", {}, def.title), el("div", {class: "plot"}));
      document.getElementById("charts").append(card);
      PlotView.logToggle(card, def.id, draw);
    }
    return card;
  }
  function drawChart(def) {
    const built = aligned(def), card = cardFor(def);
    const lines = PlotView.apply(built.lines, def.id);
    if (!built.lines.length || !built.x.length) { card.style.display = "none"; return; }
    card.style.display = "";
    const log = PlotView.isLog(def.id);
    const key = lines.map(l => l.label).join("|") + (log ? "|log" : "");
    let u = S.charts[def.id];
    const data = [built.x, ...lines.map(l => l.values)];
    if (u && u._key === key) { u.setData(data); return; }
    if (u) u.destroy();
    u = new uPlot({
      width: plotWidth(), height: 240, axes: PlotView.axes(log),
      scales: {x: {time: false}, y: {distr: log ? 3 : 1}},
      cursor: {sync: {key: "compare"}},
      series: [{label: "step"}, ...lines.map(l => Object.assign({label: l.label, spanGaps: true}, l.opts))],
      legend: {live: true},
      hooks: {setScale: [(u_, key) => { if (key === "x") followZoom(u_); }]},
    }, data, card.querySelector(".plot"));
    u._key = key;
    const rows = u.root.querySelectorAll(".u-legend .u-series");
    lines.forEach((l, i) => { if (PlotView.hiddenInLegend(l.label) && rows[i + 1]) rows[i + 1].style.display = "none"; });
    S.charts[def.id] = u;
  }
  // A drag-zoom (or double-click reset) on one chart moves every chart to the same steps.
  let zooming = false;
  function followZoom(from) {
    if (zooming) return;
    zooming = true;
    const {min, max} = from.scales.x;
    try {
      for (const u of Object.values(S.charts)) if (u !== from) u.setScale("x", {min, max});
    } finally { zooming = false; }
  }
  function userDefs() {
    const names = [];
    for (const r of S.runIds) for (const n of Object.keys((S.answers[r] || {}).user_scalars || {}))
      if (!names.includes(n)) names.push(n);
    return names.slice(0, USER_CHARTS).map((n, i) => ({id: "user-" + i, title: "yours: " + n, user: n, smooth: true}));
  }
  function draw() {
    for (const def of [...CHARTS, ...userDefs()]) drawChart(def);
  }

  function without(run) {
    const q = new URLSearchParams(location.search);
    const keep = q.getAll("run").filter(r => r !== run);
    q.delete("run");
    return "/compare?" + new URLSearchParams([...keep.map(r => ["run", r]), ...q]);
  }
  function withRun(run) {
    const q = new URLSearchParams(location.search);
    q.append("run", run);
    return "/compare?" + q;
  }
  function renderChips() {
    document.getElementById("run-chips").replaceChildren(...S.runIds.map((r, i) => {
      const d = S.answers[r];
      return el("span", {class: "chip", "data-run": r},
        el("i", {style: `background:${COLORS[i % COLORS.length]}`}),
        el("a", {href: "/runs/" + encodeURIComponent(r)}, r),
        el("span", {class: "muted"}, d ? ` steps ${d.range[0]}–${d.range[1]}` : " no chart history"),
        el("a", {class: "remove", href: without(r), title: "remove from the comparison"}, "×"));
    }));
  }

  async function load() {
    if (S.runIds.length < 2) notice("Pick two or more runs: tick them on the runs page, or add one below.");
    try {
      const q = new URLSearchParams({points: Math.min(2000, plotWidth())});
      const got = await Promise.all(S.runIds.map(r => api(`/v1/runs/${encodeURIComponent(r)}/series?${q}`)
        .catch(e => { if (e.status === 404) return null; throw e; })));
      S.runIds.forEach((r, i) => { S.answers[r] = got[i]; });
      renderChips();
      draw();
      const missing = S.runIds.filter(r => !S.answers[r]);
      if (missing.length) notice(`No chart history for ${missing.join(", ")}.`);
      else if (S.runIds.length >= 2) notice("");
      document.body.dataset.loaded = "1";
    } catch (e) {
      notice(e.status === 401 ? "This sidecar requires the token for reads: enter it above."
        : "Cannot load: " + e.message, "error");
    }
  }

  const add = document.getElementById("add-run");
  const fill = async () => {
    if (add.options.length > 1) return;
    const runs = (await api("/v1/ui/runs")).runs.map(r => r.run_id).filter(r => !S.runIds.includes(r)).sort();
    add.append(...runs.map(r => el("option", {value: r}, r)));
  };
  add.addEventListener("focus", () => fill().catch(() => null));
  add.addEventListener("mousedown", () => fill().catch(() => null));
  add.addEventListener("change", () => { if (add.value) location.href = withRun(add.value); });
  PlotView.slider(document.getElementById("view-controls"), draw);
  addEventListener("resize", () => { for (const u of Object.values(S.charts)) u.setSize({width: plotWidth(), height: 240}); });
  document.title = "monitor-agent · compare " + S.runIds.join(" · ");
  MA.tokenBox(load);
  load();
})();
