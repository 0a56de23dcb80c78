"use strict";
// The town map on a canvas: places as labelled buildings (closed ones dimmed), residents as
// figures that walk between them, a thinking indicator, speech bubbles. Drawing only: live.js
// and replay.js say what changed. Map coordinates are the places' x, y (0..100).
(function () {
  const KIND_COLORS = {
    kissaten: "#b07d56", cafe: "#d99a4e", bakery: "#e3b75f", bookshop: "#6f9a78",
    park: "#7dbb62", shrine: "#d2524a", station: "#7f86a0", izakaya: "#b8683a",
    sento: "#4f9ccc", home: "#bca58a",
  };
  const FIGURE_COLORS = ["#e4572e", "#2e86ab", "#a23b72", "#3bb273", "#f18f01", "#6a4c93",
    "#c73e1d", "#1b998b", "#ff5d8f", "#4361ee", "#8d6a9f", "#2a9d8f"];
  const WALK_MS = 1800;
  const SHIFT_MS = 500;
  const BUBBLE_MS = 8000;

  const ease = (t) => (t < 0.5 ? 2 * t * t : 1 - Math.pow(-2 * t + 2, 2) / 2);

  function wrap(ctx, text, maxWidth, maxLines) {
    const words = text.split(/\s+/);
    const lines = [];
    let line = "";
    for (const word of words) {
      const next = line ? line + " " + word : word;
      if (ctx.measureText(next).width > maxWidth && line) {
        lines.push(line);
        line = word;
        if (lines.length === maxLines) break;
      } else {
        line = next;
      }
    }
    if (lines.length < maxLines && line) lines.push(line);
    else if (line && lines.length === maxLines) lines[maxLines - 1] += "…";
    return lines;
  }

  class TownMap {
    constructor(canvas, { onSelect } = {}) {
      this.canvas = canvas;
      this.ctx = canvas.getContext("2d");
      this.onSelect = onSelect || (() => {});
      this.places = new Map(); // id -> place
      this.residents = new Map(); // id -> figure
      this.selectedId = null;
      // What the last frame drew, for the browser test and for debugging.
      this.stats = {
        placesDrawn: 0, residentsDrawn: 0, walking: 0, walksStarted: 0, thinkingDrawn: 0,
      };
      this.resize();
      new ResizeObserver(() => this.resize()).observe(canvas.parentElement);
      canvas.addEventListener("click", (e) => this.click(e));
      const frame = (now) => { this.draw(now); requestAnimationFrame(frame); };
      requestAnimationFrame(frame);
    }

    resize() {
      const box = this.canvas.parentElement.getBoundingClientRect();
      const dpr = window.devicePixelRatio || 1;
      this.width = Math.max(240, box.width);
      this.height = Math.max(240, box.height);
      this.canvas.width = Math.round(this.width * dpr);
      this.canvas.height = Math.round(this.height * dpr);
      this.canvas.style.width = this.width + "px";
      this.canvas.style.height = this.height + "px";
      this.ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      this.scale = Math.min(this.width, this.height) / 100;
      for (const figure of this.residents.values()) {
        const target = this.slotXY(figure);
        Object.assign(figure, { fromX: target.x, fromY: target.y, t0: 0, duration: 0 });
        figure.toX = target.x;
        figure.toY = target.y;
      }
    }

    // Map coordinates (0..100) to canvas pixels, keeping room for labels at the edges.
    toCanvas(x, y) {
      const padX = Math.max(44, this.width * 0.07);
      const padY = Math.max(30, this.height * 0.07);
      return {
        x: padX + (x / 100) * (this.width - 2 * padX),
        y: padY + (y / 100) * (this.height - 2 * padY - 18),
      };
    }

    buildingSize() {
      const w = Math.max(38, Math.min(70, this.width / 13));
      return { w, h: w * 0.62 };
    }

    setPlaces(places) {
      this.places = new Map(places.map((p) => [p.id, { ...p }]));
      this.layout(false);
    }

    setOpen(openIds) {
      const open = new Set(openIds);
      for (const place of this.places.values()) place.is_open = open.has(place.id);
    }

    setResidents(residents) {
      const known = this.residents;
      this.residents = new Map();
      for (const r of residents) {
        const old = known.get(r.id);
        this.residents.set(r.id, {
          ...(old || {}),
          id: r.id,
          name: r.name,
          placeId: r.place_id,
          thinking: !!r.thinking,
          color: FIGURE_COLORS[r.id % FIGURE_COLORS.length],
          bubble: old ? old.bubble : null,
        });
      }
      this.layout(false);
    }

    setThinking(id, thinking) {
      const figure = this.residents.get(id);
      if (figure) figure.thinking = thinking;
    }

    say(id, text) {
      const figure = this.residents.get(id);
      if (figure && text) figure.bubble = { text, t0: performance.now() };
    }

    moveResident(id, placeId) {
      const figure = this.residents.get(id);
      if (!figure || figure.placeId === placeId) return;
      figure.placeId = placeId;
      figure.walking = true;
      this.stats.walksStarted += 1;
      this.layout(true, id);
    }

    select(id) {
      this.selectedId = id;
    }

    // Where each figure stands: in a row under its place, in id order.
    slotXY(figure) {
      const place = this.places.get(figure.placeId);
      if (!place) return { x: this.width / 2, y: this.height / 2 };
      const here = [...this.residents.values()].filter((f) => f.placeId === figure.placeId);
      here.sort((a, b) => a.id - b.id);
      const index = here.indexOf(figure);
      figure.slot = index;
      const perRow = 4;
      // Wide enough that names two slots apart (same text line) do not run into each other.
      const spacing = Math.max(19, this.buildingSize().w / 2.6);
      const row = Math.floor(index / perRow);
      const inRow = Math.min(perRow, here.length - row * perRow);
      const col = index % perRow;
      const center = this.toCanvas(place.x, place.y);
      const { h } = this.buildingSize();
      return {
        x: center.x + (col - (inRow - 1) / 2) * spacing,
        y: center.y + h / 2 + 46 + row * 44, // room for three lines of names
      };
    }

    // New targets for everyone; a figure whose target changed walks (or shifts) there.
    layout(animate, walkerId) {
      const now = performance.now();
      for (const figure of this.residents.values()) {
        const target = this.slotXY(figure);
        if (!animate || figure.toX === undefined) {
          Object.assign(figure, { fromX: target.x, fromY: target.y, toX: target.x, toY: target.y });
          figure.t0 = now;
          figure.duration = 0;
          continue;
        }
        if (Math.abs(target.x - figure.toX) < 0.5 && Math.abs(target.y - figure.toY) < 0.5) continue;
        const current = this.position(figure, now);
        Object.assign(figure, { fromX: current.x, fromY: current.y, toX: target.x, toY: target.y });
        figure.t0 = now;
        figure.duration = figure.id === walkerId ? WALK_MS : SHIFT_MS;
      }
    }

    position(figure, now) {
      if (!figure.duration) return { x: figure.toX, y: figure.toY, moving: false };
      const t = Math.min(1, (now - figure.t0) / figure.duration);
      if (t >= 1) {
        figure.duration = 0;
        figure.walking = false;
        return { x: figure.toX, y: figure.toY, moving: false };
      }
      const k = ease(t);
      // A walk arcs a little, so paths that cross stay apart.
      const lift = figure.walking ? Math.sin(Math.PI * t) * 14 : 0;
      return {
        x: figure.fromX + (figure.toX - figure.fromX) * k,
        y: figure.fromY + (figure.toY - figure.fromY) * k - lift,
        moving: figure.walking,
      };
    }

    click(event) {
      const rect = this.canvas.getBoundingClientRect();
      const x = event.clientX - rect.left;
      const y = event.clientY - rect.top;
      let best = null;
      let bestDistance = 22;
      const now = performance.now();
      for (const figure of this.residents.values()) {
        const p = this.position(figure, now);
        const d = Math.hypot(p.x - x, p.y - 6 - y);
        if (d < bestDistance) { best = figure; bestDistance = d; }
      }
      if (best) {
        this.select(best.id);
        this.onSelect(best.id);
      }
    }

    draw(now) {
      const ctx = this.ctx;
      ctx.clearRect(0, 0, this.width, this.height);
      this.drawGround(ctx);
      let placesDrawn = 0;
      for (const place of this.places.values()) {
        this.drawPlace(ctx, place);
        placesDrawn += 1;
      }
      let walking = 0;
      const positions = [];
      for (const figure of this.residents.values()) {
        const p = this.position(figure, now);
        if (p.moving) walking += 1;
        positions.push([figure, p]);
      }
      positions.sort((a, b) => a[1].y - b[1].y);
      for (const [figure, p] of positions) this.drawFigure(ctx, figure, p, now);
      // Speech bubbles, then the thinking clouds on top: a neighbour's bubble never hides
      // that someone is thinking.
      for (const [figure, p] of positions) {
        if (!figure.thinking && figure.bubble) this.drawBubble(ctx, figure, p, now);
      }
      let thinkingDrawn = 0;
      for (const [figure, p] of positions) {
        if (!figure.thinking) continue;
        this.drawThinking(ctx, figure, p, now);
        thinkingDrawn += 1;
      }
      this.stats = {
        ...this.stats, placesDrawn, residentsDrawn: positions.length, walking, thinkingDrawn,
      };
    }

    drawGround(ctx) {
      ctx.fillStyle = "#e6edd3";
      ctx.fillRect(0, 0, this.width, this.height);
      // Streets: from every building down to the main street, and the main street itself.
      ctx.strokeStyle = "#f7f1de";
      ctx.lineCap = "round";
      ctx.lineWidth = Math.max(6, this.scale * 2.2);
      const main = this.toCanvas(0, 40).y;
      ctx.beginPath();
      ctx.moveTo(this.toCanvas(0, 0).x - 20, main);
      ctx.lineTo(this.toCanvas(100, 0).x + 20, main);
      for (const place of this.places.values()) {
        const c = this.toCanvas(place.x, place.y);
        ctx.moveTo(c.x, c.y);
        ctx.lineTo(c.x, main);
      }
      ctx.stroke();
    }

    drawPlace(ctx, place) {
      const c = this.toCanvas(place.x, place.y);
      const { w, h } = this.buildingSize();
      ctx.save();
      ctx.globalAlpha = place.is_open ? 1 : 0.35;
      const color = KIND_COLORS[place.kind] || "#999";
      if (place.kind === "park") {
        ctx.fillStyle = color;
        ctx.beginPath();
        ctx.ellipse(c.x, c.y, w * 0.75, h * 0.7, 0, 0, 2 * Math.PI);
        ctx.fill();
        ctx.fillStyle = "#4f8f3a";
        for (const [dx, dy] of [[-0.4, -0.2], [0.35, -0.25], [0.05, 0.25]]) {
          ctx.beginPath();
          ctx.arc(c.x + dx * w, c.y + dy * h, h * 0.2, 0, 2 * Math.PI);
          ctx.fill();
        }
      } else {
        // Walls, then a roof.
        ctx.fillStyle = "#fbf7ee";
        ctx.strokeStyle = "#6b5b4b";
        ctx.lineWidth = 1.2;
        ctx.fillRect(c.x - w / 2, c.y - h / 2, w, h);
        ctx.strokeRect(c.x - w / 2, c.y - h / 2, w, h);
        ctx.fillStyle = color;
        ctx.beginPath();
        ctx.moveTo(c.x - w / 2 - 4, c.y - h / 2 + 2);
        ctx.lineTo(c.x, c.y - h / 2 - h * 0.55);
        ctx.lineTo(c.x + w / 2 + 4, c.y - h / 2 + 2);
        ctx.closePath();
        ctx.fill();
        ctx.stroke();
        ctx.fillStyle = "#8a6a4a"; // door
        ctx.fillRect(c.x - w * 0.09, c.y + h / 2 - h * 0.45, w * 0.18, h * 0.45);
      }
      ctx.fillStyle = "#2f2a25";
      ctx.textAlign = "center";
      ctx.textBaseline = "top";
      ctx.font = `600 ${Math.round(Math.max(10, Math.min(13, w / 5)))}px system-ui, sans-serif`;
      ctx.fillText(place.name, c.x, c.y + h / 2 + 3);
      ctx.font = `${Math.round(Math.max(9, Math.min(11, w / 6)))}px system-ui, sans-serif`;
      ctx.fillStyle = "#6b625a";
      const sub = place.is_open ? place.name_ja || "" : `closed · ${place.hours || ""}`;
      ctx.fillText(sub, c.x, c.y + h / 2 + 17);
      ctx.restore();
    }

    drawFigure(ctx, figure, p, now) {
      const r = Math.max(4.5, Math.min(7, this.scale * 1.1));
      const selected = figure.id === this.selectedId;
      const step = p.moving ? Math.sin(now / 90) * r * 0.6 : 0;
      ctx.save();
      ctx.strokeStyle = figure.color;
      ctx.lineWidth = 2.2;
      ctx.lineCap = "round";
      ctx.beginPath(); // legs
      ctx.moveTo(p.x, p.y - r * 0.2);
      ctx.lineTo(p.x - r * 0.5 + step, p.y + r * 1.1);
      ctx.moveTo(p.x, p.y - r * 0.2);
      ctx.lineTo(p.x + r * 0.5 - step, p.y + r * 1.1);
      ctx.stroke();
      ctx.fillStyle = figure.color; // body
      ctx.beginPath();
      ctx.ellipse(p.x, p.y - r * 0.9, r * 0.65, r * 0.9, 0, 0, 2 * Math.PI);
      ctx.fill();
      ctx.fillStyle = "#f6d7b8"; // head
      ctx.beginPath();
      ctx.arc(p.x, p.y - r * 2.3, r * 0.62, 0, 2 * Math.PI);
      ctx.fill();
      if (selected) {
        ctx.strokeStyle = "#111";
        ctx.lineWidth = 1.5;
        ctx.beginPath();
        ctx.ellipse(p.x, p.y + r * 1.2, r * 1.4, r * 0.5, 0, 0, 2 * Math.PI);
        ctx.stroke();
      }
      // Names take turns on three lines, so neighbours in a row do not overwrite each other
      // even on a phone; a light halo keeps a name legible over a roof or a street.
      const stagger = p.moving ? 0 : (figure.slot % 3) * 10;
      const name = figure.name.split(" ")[0];
      const y = p.y + r * 1.3 + stagger;
      ctx.font = `${selected ? 700 : 500} 10px system-ui, sans-serif`;
      ctx.textAlign = "center";
      ctx.textBaseline = "top";
      ctx.lineJoin = "round";
      ctx.lineWidth = 3;
      ctx.strokeStyle = "rgba(255, 255, 255, 0.8)";
      ctx.strokeText(name, p.x, y);
      ctx.fillStyle = "#222";
      ctx.fillText(name, p.x, y);
      ctx.restore();
    }

    // A thought cloud over the head, its dots lighting up in turn, while a decision is out.
    drawThinking(ctx, figure, p, now) {
      const cx = p.x + 12;
      const y = p.y - 36;
      ctx.save();
      ctx.fillStyle = "rgba(255,255,255,0.97)";
      ctx.strokeStyle = figure.color;
      ctx.lineWidth = 1.6;
      ctx.beginPath();
      ctx.ellipse(cx, y, 19, 11, 0, 0, 2 * Math.PI);
      ctx.fill();
      ctx.stroke();
      for (const [dx, dy, r] of [[-10, 15, 3.2], [-14, 21, 2]]) { // the trail to the head
        ctx.beginPath();
        ctx.arc(cx + dx, y + dy, r, 0, 2 * Math.PI);
        ctx.fill();
        ctx.stroke();
      }
      for (let i = 0; i < 3; i++) {
        const on = Math.floor(now / 300) % 3 === i;
        ctx.fillStyle = on ? "#222" : "#b5b5b5";
        ctx.beginPath();
        ctx.arc(cx - 8 + i * 8, y, 2.6, 0, 2 * Math.PI);
        ctx.fill();
      }
      ctx.restore();
    }

    drawBubble(ctx, figure, p, now) {
      const age = now - figure.bubble.t0;
      if (age > BUBBLE_MS) { figure.bubble = null; return; }
      ctx.save();
      ctx.globalAlpha = age > BUBBLE_MS - 1000 ? (BUBBLE_MS - age) / 1000 : 1;
      ctx.font = "11px system-ui, sans-serif";
      const lines = wrap(ctx, figure.bubble.text, 120, 2);
      const width = Math.max(...lines.map((l) => ctx.measureText(l).width)) + 12;
      const height = lines.length * 13 + 8;
      let x = Math.min(Math.max(4, p.x - width / 2), this.width - width - 4);
      const y = Math.max(4, p.y - 26 - height);
      ctx.fillStyle = "rgba(255,255,255,0.96)";
      ctx.strokeStyle = figure.color;
      ctx.lineWidth = 1.4;
      ctx.beginPath();
      ctx.roundRect(x, y, width, height, 6);
      ctx.fill();
      ctx.stroke();
      ctx.beginPath(); // the tail, to the speaker
      ctx.moveTo(p.x - 4, y + height);
      ctx.lineTo(p.x, y + height + 7);
      ctx.lineTo(p.x + 4, y + height);
      ctx.fill();
      ctx.fillStyle = "#222";
      ctx.textAlign = "left";
      ctx.textBaseline = "top";
      lines.forEach((line, i) => ctx.fillText(line, x + 6, y + 4 + i * 13));
      ctx.restore();
    }
  }

  window.TownMap = TownMap;
})();
