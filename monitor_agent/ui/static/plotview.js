// How a chart is viewed, shared by the run page and the compare page: TensorBoard's EMA
// smoothing (the raw line drawn faint behind), a log scale per chart, and axes whose
// labels fit. The choice lives in the URL (a shared link shows the same view); the
// smoothing is also remembered in localStorage for the next page opened.
"use strict";
const PlotView = (() => {
  const KEY = "monitor-agent-smoothing";
  const report = window.MONITOR_REPORT || null;
  const params = new URLSearchParams(location.search);
  const stored = () => { try { return localStorage.getItem(KEY); } catch (e) { return null; } };
  const clamp = w => Math.max(0, Math.min(0.99, Number.isFinite(w) ? w : 0));
  const state = {
    smooth: clamp(parseFloat(params.get("smooth") ?? stored() ?? "0")),
    // Charts drawn on a log scale; null until the user picks, then every chart's choice.
    log: params.has("log") ? new Set(params.get("log").split(",").filter(Boolean)) : null,
    defaults: new Set(),  // charts that open on a log scale (the pages register theirs)
  };

  function save() {
    if (report) return;  // a report file has no URL to keep a view in
    const q = new URLSearchParams(location.search);
    if (state.smooth > 0) q.set("smooth", String(state.smooth)); else q.delete("smooth");
    if (state.log) q.set("log", [...state.log].sort().join(",")); else q.delete("log");
    const query = q.toString();
    history.replaceState(null, "", location.pathname + (query ? "?" + query : ""));
    try { localStorage.setItem(KEY, String(state.smooth)); } catch (e) { /* private mode */ }
  }
  const isLog = id => state.log ? state.log.has(id) : state.defaults.has(id);
  function setLog(id, on) {
    if (!state.log) state.log = new Set(state.defaults);
    if (on) state.log.add(id); else state.log.delete(id);
    save();
  }

  // TensorBoard's smoothing: an EMA over the points drawn, debiased so the first points
  // are not pulled towards zero; a missing point keeps the average where it was.
  function ema(values, w) {
    let last = 0, n = 0;
    return values.map(v => {
      if (v === null || v === undefined || !Number.isFinite(v)) return null;
      n += 1;
      last = last * w + (1 - w) * v;
      return last / (1 - w ** n);
    });
  }
  const fade = c => (/^#[0-9a-f]{6}$/i.test(c) ? c + "40" : c);

  // The lines a chart draws in the current view: on a log scale values <= 0 have no place
  // (null, a gap); lines marked `smooth` become a faint raw line plus the smoothed one,
  // which takes the label (the raw one ends in " raw" and stays out of the legend).
  function apply(lines, id) {
    const log = isLog(id);
    const out = [];
    for (const l0 of lines) {
      const l = log ? Object.assign({}, l0, {values: l0.values.map(v => (v != null && v > 0 ? v : null))}) : l0;
      if (!(state.smooth > 0 && l.smooth)) { out.push(l); continue; }
      out.push(Object.assign({}, l, {label: l.label + " raw", smooth: false,
        opts: Object.assign({}, l.opts, {stroke: fade(l.opts.stroke), width: 1})}));
      out.push(Object.assign({}, l, {values: ema(l.values, state.smooth)}));
    }
    return out;
  }
  const hiddenInLegend = label => / (max|min|raw)$/.test(label);

  // Axes: labels from MA.ticks (short, distinct), the axis as wide as its widest label.
  const measure = document.createElement("canvas").getContext("2d");
  function axisSize(u, values) {
    if (!values) return 40;
    measure.font = "12px system-ui, -apple-system, \"Segoe UI\", sans-serif";
    const widest = Math.max(0, ...values.map(v => measure.measureText(v || "").width));
    return Math.ceil(widest) + 20;  // tick (10) + gap (5) + a margin
  }
  const linearTicks = (u, splits, ax, space, incr) => MA.ticks(splits, incr);
  const logTicks = (u, splits) => splits.map(v => (v == null ? "" : MA.compact(v, 2)));
  function axes(log, y2) {
    const out = [{values: linearTicks}, {size: axisSize, values: log ? logTicks : linearTicks}];
    if (y2) out.push({scale: y2, side: 1, size: axisSize, grid: {show: false}, values: linearTicks});
    return out;
  }

  // The page's smoothing slider.
  function slider(box, onChange) {
    const input = MA.el("input", {type: "range", min: "0", max: "0.99", step: "0.01",
      id: "smoothing", value: String(state.smooth), "aria-label": "smoothing"});
    const shown = MA.el("span", {id: "smoothing-value"}, state.smooth.toFixed(2));
    input.addEventListener("input", () => {
      state.smooth = clamp(parseFloat(input.value));
      shown.textContent = state.smooth.toFixed(2);
      save();
      onChange();
    });
    box.append(MA.el("label", {class: "smoothing", title: "EMA smoothing, as TensorBoard's: " +
      "the raw line stays drawn faint behind"}, "smoothing ", input, " ", shown));
  }
  // A chart card's own log-scale checkbox, in its title line.
  function logToggle(card, id, onChange) {
    if (card.querySelector(".log-toggle")) return;
    const box = MA.el("input", {type: "checkbox", "data-log": id});
    box.checked = isLog(id);
    box.addEventListener("change", () => { setLog(id, box.checked); onChange(); });
    card.querySelector("h2").append(MA.el("label", {class: "log-toggle"}, box, " log"));
  }

  return {state, isLog, apply, axes, ema, slider, logToggle, hiddenInLegend, save};
})();
