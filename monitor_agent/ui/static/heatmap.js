// A layers x steps heatmap on a canvas: one row per layer in model order, one column per
// step bucket, colour on a log scale (or linear for fractions), NaN drawn grey.
"use strict";
const Heatmap = (() => {
  // viridis, 9 stops
  const STOPS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
    [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]];
  function colour(t) {
    const x = Math.max(0, Math.min(1, t)) * (STOPS.length - 1), i = Math.min(Math.floor(x), STOPS.length - 2);
    const f = x - i, a = STOPS[i], b = STOPS[i + 1];
    return [a[0] + (b[0] - a[0]) * f, a[1] + (b[1] - a[1]) * f, a[2] + (b[2] - a[2]) * f];
  }
  const ROW_PX = 12, MAX_LABELLED = 30, LEVELS = 1024;
  const word = (r, g, b) => ((255 << 24) | (Math.round(b) << 16) | (Math.round(g) << 8) | Math.round(r)) >>> 0;
  const NO_VALUE = word(233, 235, 239);  // grey: no value (little-endian RGBA, as ImageData)
  let lutMemo = null;
  const palette = () => lutMemo || (lutMemo = Uint32Array.from({length: LEVELS}, (_, i) =>
    word(...colour(i / (LEVELS - 1)))));
  // rows x cols -> rows x width (width < cols), each cell the max of the columns it covers
  // (NaN: none had a value).
  function maxPerPixel(vals, rows, cols, width) {
    const out = new Float32Array(rows * width).fill(NaN);
    for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) {
      const v = vals[r * cols + c], o = r * width + Math.floor(c * width / cols);
      if (v === v && !(out[o] >= v)) out[o] = v;
    }
    return out;
  }
  function quantile(sorted, q) { return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]; }

  class Heat {
    constructor(box, {log = true, label = "value"} = {}) {
      this.box = box; this.log = log; this.label = label;
      // Row names in a gutter left of the canvas: every row when they fit at ROW_PX, else
      // every k-th (the hover names any row).
      this.names = box.appendChild(MA.el("div", {class: "rows"}));
      this.canvas = box.appendChild(document.createElement("canvas"));
      this.legend = box.appendChild(MA.el("div", {class: "legend"}));
      this.m = null;
      this.canvas.addEventListener("mousemove", e => this.hover(e));
      this.canvas.addEventListener("mouseleave", () => MA.tip(null));
    }
    markLeft(step) {  // CSS pixels within the box (past the row names)
      return this.canvas.offsetLeft + this.xpos(step);
    }
    xpos(step) {   // CSS pixels within the canvas
      const [lo, hi] = this.range;
      return (step - lo) / Math.max(1, hi - lo) * this.canvas.clientWidth;
    }
    draw(m, range) {
      this.m = m; this.range = range;
      const rows = m.stat === "grad_quantiles" ? 0 : m.names.length, cols = m.steps.length;
      // Up to MAX_LABELLED rows each get a line of text; more rows share the 360 px.
      const height = rows && rows <= MAX_LABELLED ? Math.max(120, rows * ROW_PX) : Math.max(120, Math.min(360, rows * 4));
      const width = this.canvas.clientWidth || this.box.clientWidth;
      const dpr = window.devicePixelRatio || 1;
      this.canvas.width = Math.round(width * dpr); this.canvas.height = Math.round(height * dpr);
      this.canvas.style.height = height + "px";
      const ctx = this.canvas.getContext("2d");
      ctx.fillStyle = "#e9ebef"; ctx.fillRect(0, 0, this.canvas.width, this.canvas.height);
      this.labelRows(rows ? m.names : [], height);
      if (!rows || !cols) { this.legend.textContent = "not recorded"; return; }
      // Log or linear values once (a typed array: no per-cell boxing), NaN where none.
      const src = m.values, n = src.length, vals = new Float32Array(n);
      for (let i = 0; i < n; i++) {
        const v = src[i];
        vals[i] = v == null ? NaN : this.log ? (v > 0 ? Math.log10(v) : NaN) : v;
      }
      // The colour range from a sample of at most ~20k cells: sorting 150 x 1000 costs more
      // than drawing them, and the 2nd/98th percentiles barely move.
      // A typed array's own numeric sort: a comparator function sorting 20k cells cost more
      // than all the rest of the drawing.
      const every = Math.max(1, Math.floor(n / 20000)), sample = new Float32Array(Math.ceil(n / every));
      let kept = 0;
      for (let i = 0; i < n; i += every) if (Number.isFinite(vals[i])) sample[kept++] = vals[i];
      const finite = sample.subarray(0, kept).sort();
      this.lo = finite.length ? quantile(finite, 0.02) : 0;
      this.hi = finite.length ? quantile(finite, 0.98) : 1;
      if (this.hi <= this.lo) this.hi = this.lo + 1;
      // Every cell through a 1024-entry palette written as one 32-bit word (RGBA in memory
      // order): a colour per cell without an array per cell. 1024 levels are finer than
      // the eye tells apart on a 9-stop scale.
      const step = cols > 1 ? (m.steps[cols - 1] - m.steps[0]) / (cols - 1) : 1;
      const x0 = this.xpos(m.steps[0] - step / 2) * dpr, x1 = this.xpos(m.steps[cols - 1] + step / 2) * dpr;
      // More buckets than device pixels (the canvas is narrower than a chart, or zoomed
      // out): the max of the buckets each pixel covers, as the server made each bucket, so
      // a one-step spike keeps its pixel rather than fall between the ones a scaled draw picks.
      const drawn = Math.min(cols, Math.max(1, Math.round(x1 - x0)));
      const cells = drawn < cols ? maxPerPixel(vals, rows, cols, drawn) : vals;
      const img = new ImageData(drawn, rows), px = new Uint32Array(img.data.buffer);
      const lut = palette(), span = (LEVELS - 1) / (this.hi - this.lo), lo = this.lo;
      for (let i = 0; i < rows * drawn; i++) {
        const v = cells[i];
        px[i] = v === v ? lut[Math.max(0, Math.min(LEVELS - 1, Math.round((v - lo) * span)))] : NO_VALUE;
      }
      const off = document.createElement("canvas");
      off.width = drawn; off.height = rows; off.getContext("2d").putImageData(img, 0, 0);
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(off, x0, 0, Math.max(1, x1 - x0), this.canvas.height);
      const show = v => MA.fmt(this.log ? 10 ** v : v, 3);
      this.legend.replaceChildren(
        MA.el("span", {}, `steps ${Math.round(this.range[0])}–${Math.round(this.range[1])} · ${rows} rows in model order` +
          (this.every > 1 ? `, every ${this.every}th named (hover for any)` : "")),
        MA.el("span", {}, `${this.label}: ${show(this.lo)} `, MA.el("span", {
          style: "display:inline-block;width:80px;height:8px;background:linear-gradient(90deg," +
            [0, .25, .5, .75, 1].map(t => `rgb(${colour(t).map(Math.round)})`).join(",") + ")"}), ` ${show(this.hi)}`));
    }
    labelRows(names, height) {
      const key = names.length + "/" + height + "/" + names[0] + "/" + names[names.length - 1];
      if (this.namesKey === key) return;
      this.namesKey = key;
      const rowH = names.length ? height / names.length : height;
      this.every = Math.max(1, Math.ceil(ROW_PX / rowH));
      this.names.style.height = height + "px";
      this.names.replaceChildren(...names.flatMap((n, i) => i % this.every ? [] : [MA.el("div", {
        class: "row-name", title: n, style: `top:${(i + 0.5) * rowH}px`}, n)]));
    }
    hover(e) {
      const m = this.m;
      if (!m || !m.steps.length || !m.names.length) return;
      const rect = this.canvas.getBoundingClientRect();
      const [lo, hi] = this.range, step = lo + (e.clientX - rect.left) / rect.width * (hi - lo);
      let c = 0;
      for (let i = 0; i < m.steps.length; i++) if (Math.abs(m.steps[i] - step) < Math.abs(m.steps[c] - step)) c = i;
      const r = Math.min(m.names.length - 1, Math.floor((e.clientY - rect.top) / rect.height * m.names.length));
      const v = m.values[r * m.steps.length + c];
      MA.tip(`<b>${MA.esc(m.names[r])}</b>\nstep ≈ ${m.steps[c]}\n${this.label}: ${MA.fmt(v)}`, e);
    }
  }
  return {Heat};
})();
