// What each chart of the run page draws, from one /series answer: its lines, bands and
// scales. Finding types map to the chart they are drawn on. No DOM here: run.js draws.
"use strict";
const Charts = (() => {
  const state = {bucketed: false};  // once bucketed, always min/max bands: no chart rebuilds
  const COLORS = ["#3c7fd8", "#e4572e", "#2e9d5b", "#8e44ad", "#e09b00", "#17a2b8", "#d63384",
                  "#6c757d", "#795548", "#20c997"];
  // Which chart each finding type is drawn on (anything else: the loss chart).
  const CHART_OF = {
    nan_inf: "loss", loss_spike: "loss", divergence: "loss", plateau: "loss", overfitting: "loss",
    loss_scale_collapse: "loss", grad_explosion: "grad", grad_vanishing: "grad",
    clip_saturation: "grad", update_ratio_high: "update", update_ratio_low: "update",
    throughput_drop: "speed", stalled: "speed", lr_jump: "lr", straggler: "steptime", input_bound: "steptime", memory_pressure: "memory",
    dead_layer: "heat_grad", gain_drift: "heat_grad", grad_distribution: "quantiles",
    activation_blowup: "heat_act", dead_units: "heat_zero", category_divergence: "category",
  };

  // -- data shaping ---------------------------------------------------------------------

  const has = s => s && s.mean.some(v => v !== null);
  function lineSeries(S_, name, label, color, extra = {}, smooth = true) {
    // mean line (smoothed when the view asks: PlotView); when bucketed, the bucket's
    // min..max as a faint band around it
    const s = S_.series[name];
    if (!has(s)) return [];
    const out = [{label, smooth, values: s.mean, opts: Object.assign({stroke: color, width: 1.5}, extra)}];
    if (state.bucketed || s.min) {  // stable series set: zooming never rebuilds a chart
      // The band on its line's scale. A `scale: undefined` key would override uPlot's
      // default "y" and put the band on a hidden scale of its own: drawn to its own
      // range, a spike clipped at the top while the axis showed the mean's range.
      const edge = () => Object.assign({stroke: color + "00", width: 0}, extra.scale ? {scale: extra.scale} : {});
      out.push({label: label + " max", values: s.max || s.mean, opts: edge(), band: "hi"});
      out.push({label: label + " min", values: s.min || s.mean, opts: edge(), band: "lo", fill: color + "22"});
    }
    return out;
  }
  function joinX(xa, ya, xb, yb) {
    // merge eval points (their own steps) into the step axis; nulls where one has no value
    const xs = [...new Set([...xa, ...xb])].sort((a, b) => a - b), ia = new Map(xa.map((x, i) => [x, i]));
    const ib = new Map(xb.map((x, i) => [x, i]));
    return [xs, ya.map(col => xs.map(x => ia.has(x) ? col[ia.get(x)] : null)),
            yb.map(col => xs.map(x => ib.has(x) ? col[ib.get(x)] : null))];
  }

  const CHARTS = [
    {id: "loss", title: "Loss · EMA · validation loss", build: d => {
      const lines = [...lineSeries(d, "loss", "loss", COLORS[0]),
                     ...lineSeries(d, "loss_ema", "loss EMA", COLORS[1], {width: 2}, false)];
      if (!d.evals.steps.length || !d.evals.val_loss.some(v => v !== null)) return {x: d.steps, lines};
      const [xs, [..._a], [val]] = joinX(d.steps, [], d.evals.steps, [d.evals.val_loss]);
      const idx = new Map(d.steps.map((x, i) => [x, i]));
      lines.forEach(l => { l.values = xs.map(x => idx.has(x) ? l.values[idx.get(x)] : null); });
      lines.push({label: "val loss", values: val, opts: {stroke: COLORS[2], width: 2, spanGaps: true,
                  points: {show: d.evals.steps.length <= 60, size: 5}}});
      return {x: xs, lines, spanGaps: true};
    }},
    {id: "grad", title: "Gradient norm · clip threshold", build: d => ({x: d.steps, lines: [
      ...lineSeries(d, "grad_norm", "grad norm", COLORS[0]),
      ...lineSeries(d, "clip_threshold", "clip threshold", COLORS[1], {dash: [6, 4]}, false)]})},
    {id: "lr", title: "Learning rate", build: d => ({x: d.steps, lines: lineSeries(d, "lr", "lr", COLORS[3], {}, false)})},
    // The detector's hard limits, not a phase band: it fires only outside them, and a
    // band the healthy curve sits outside of for a whole run says nothing. They are drawn
    // over the plot (run.js, drawLimits) only where they fall inside the curve's own range.
    {id: "update", title: "Update / param ratio (alert limits shown when in range)", log: true, limits: true,
      build: d => ({x: d.steps, lines: lineSeries(d, "update_ratio", "update ratio", COLORS[0])})},
    // Two charts, not two scales on one: on a shared plot one curve hides the other.
    {id: "speed", title: "Throughput (tokens/s)", build: d => ({x: d.steps, lines:
      lineSeries(d, "tokens_per_second", "tokens/s", COLORS[0])})},
    {id: "mfu", title: "Model FLOPs utilisation", build: d => ({x: d.steps, lines:
      lineSeries(d, "mfu", "MFU", COLORS[1])})},
    {id: "memory", title: "Memory (GiB)", build: d => {
      const gib = l => Object.assign(l, {values: l.values.map(v => v == null ? v : v / 2 ** 30)});
      return {x: d.steps, lines: [...lineSeries(d, "mem_allocated", "allocated", COLORS[0], {}, false),
        ...lineSeries(d, "mem_reserved", "reserved", COLORS[1], {}, false),
        ...lineSeries(d, "mem_peak", "peak allocated", COLORS[2], {dash: [4, 3]}, false)].map(gib)};
    }},
    {id: "steptime", title: "Step time per rank (s, slowest in bucket)", build: d => ({
      x: d.rank_step_time.steps,
      lines: Object.entries(d.rank_step_time.ranks).map(([r, v], i) => ({label: "rank " + r, values: v,
        opts: {stroke: COLORS[i % COLORS.length], width: 1.2}}))})},
    {id: "heat_grad", title: "Gradient norm per layer (layers × steps, model order)", heat: "grad_norm", log: true},
    {id: "heat_update", title: "Update ratio per layer", heat: "update_ratio", log: true},
    {id: "quantiles", title: "Gradient quantiles", quant: true},
    {id: "heat_act", title: "Activation max |x| per module", heat: "act_max_abs", log: true},
    {id: "heat_zero", title: "Activation zero fraction per module", heat: "act_zero_frac", log: false},
    {id: "category", title: "Eval loss per category", build: d => ({x: d.evals.steps,
      lines: Object.entries(d.evals.categories).map(([n, v], i) => ({label: n, values: v,
        opts: {stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true,
               points: {show: d.evals.steps.length <= 60, size: 4}}}))})},
  ];

  // One small chart per scalar the script logged itself (series.user_scalars), on its
  // own steps: an eval metric has a point per eval, not per step.
  function userChart(name, i) {
    return {id: "user-" + i, title: name, user: name, box: "user-charts", build: d => {
      const s = d.user_scalars[name];
      if (!s) return {x: [], lines: []};
      const lines = lineSeries({series: {v: s}}, "v", name, COLORS[i % COLORS.length]);
      lines.forEach(l => { l.opts.points = {show: s.steps.length <= 60, size: 4}; });
      return {x: s.steps, lines};
    }};
  }

  return {COLORS, CHART_OF, CHARTS, state, userChart};
})();
