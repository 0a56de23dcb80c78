"use strict";
// The town map: on a canvas, places as buildings (closed ones dimmed) and residents as figures
// that walk between them; over it (overlay.js) the places' names and the residents' speech
// bubbles and thought clouds, laid out so that no place's name covers a resident's name and
// no bubble hides a place's name or another bubble (layout.js). Each resident's last words
// stay up until its next decision: fresh for BUBBLE_MS, then quieter.
// Drawing only: live.js and replay.js say what changed. Map coordinates are the places' x, y
// (0..100).
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
  const BUBBLE_MS = 8000; // how long a resident's new words stand out before they go quiet
  const NAME_FONT_PX = 10;

  const ease = (t) => (t < 0.5 ? 2 * t * t : 1 - Math.pow(-2 * t + 2, 2) / 2);

  class TownMap {
    constructor(canvas, { onSelect } = {}) {
      this.canvas = canvas;
      this.ctx = canvas.getContext("2d");
      this.onSelect = onSelect || (() => {});
      this.places = new Map(); // id -> place
      this.residents = new Map(); // id -> figure
      this.selectedId = null;
      this.bubbleMs = BUBBLE_MS; // how long a bubble stays fresh (the browser test holds them)
      this.nameWidths = new Map(); // first name -> its width in the names' font
      this.overlay = new window.TownOverlay(canvas.parentElement);
      // What the last frame drew, for the browser test and for debugging.
      this.stats = {
        placesDrawn: 0, residentsDrawn: 0, walking: 0, walksStarted: 0, thinkingDrawn: 0,
        bubblesDrawn: 0, boxesLeftOut: 0,
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
      this.placeLabels();
      this.overlay.remeasure();
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
      this.placeLabels();
      this.layout(false);
    }

    setOpen(openIds) {
      const open = new Set(openIds);
      for (const place of this.places.values()) place.is_open = open.has(place.id);
      this.placeLabels();
    }

    // Each place's name (and Japanese name, or its hours when closed), near its building.
    placeLabels() {
      if (!this.overlay) return; // resize() from the constructor, before there is one
      const { w } = this.buildingSize();
      const labels = [...this.places.values()].map((place) => {
        const sub = place.is_open ? place.name_ja || "" : `closed · ${place.hours || ""}`;
        return { id: place.id, name: place.name, sub, open: place.is_open };
      });
      this.labelSizes = this.overlay.setLabels(labels, Math.round(Math.max(10, Math.min(13, w / 5))));
      this.arrangeLabels();
    }

    // The building's rectangle, roof included.
    buildingRect(place) {
      const c = this.toCanvas(place.x, place.y);
      const { w, h } = this.buildingSize();
      return { x: c.x - w / 2 - 4, y: c.y - h / 2 - h * 0.55, w: w + 8, h: h * 1.55 };
    }

    // Where the names go, given where everyone stands (or is walking to): no name over a
    // resident's name, nor over another name; under the building where there is room.
    arrangeLabels() {
      if (!this.labelSizes) return;
      const items = [];
      for (const place of this.places.values()) {
        const size = this.labelSizes.get(place.id);
        if (size) items.push({ id: place.id, ...size, building: this.buildingRect(place) });
      }
      const hard = [];
      const soft = [];
      for (const figure of this.residents.values()) {
        if (figure.toX === undefined) continue;
        const p = { x: figure.toX, y: figure.toY, moving: false };
        hard.push(this.nameRect(figure, p));
        soft.push({ ...this.figureBox(figure, p).rect, weight: 2 });
      }
      for (const place of this.places.values()) soft.push({ ...this.buildingRect(place), weight: 1 });
      const spots = window.TownLayout.placeLabels(items, {
        hard, soft, bounds: { w: this.width, h: this.height },
      });
      this.overlay.positionLabels(spots);
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
          said: old ? old.said : null,
        });
      }
      this.layout(false);
    }

    setThinking(id, thinking) {
      const figure = this.residents.get(id);
      if (figure) figure.thinking = thinking;
    }

    // The resident's newest words: up until its next ones (fresh for bubbleMs, then quiet).
    // The same words again (the tick applying what the resident had decided) are not new.
    say(id, text) {
      const figure = this.residents.get(id);
      if (!figure || !text || (figure.said && figure.said.text === String(text))) return;
      figure.said = { text: String(text), t0: performance.now() };
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
      this.arrangeLabels();
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
      const placed = this.overlay.sync(this.boxItems(positions, now), this.softObstacles(positions), {
        w: this.width, h: this.height,
      });
      let thinkingDrawn = 0;
      let bubblesDrawn = 0;
      for (const [figure, p] of positions) {
        const rect = placed.get(figure.id);
        if (!rect) continue;
        if (figure.thinking) thinkingDrawn += 1;
        else bubblesDrawn += 1;
        this.drawLeader(ctx, figure, p, rect);
      }
      this.stats = {
        ...this.stats, placesDrawn, residentsDrawn: positions.length, walking, thinkingDrawn,
        bubblesDrawn, boxesLeftOut: this.overlay.boxes.size - placed.size,
      };
    }

    // The figure's radius, the rectangle it covers (head to name) and the anchor its bubble
    // is placed around.
    figureBox(figure, p) {
      const r = this.figureRadius();
      const top = p.y - r * 3;
      const bottom = p.y + r * 1.3 + (p.moving ? 0 : (figure.slot % 3) * 10) + 11;
      return { r, anchor: { hx: p.x, top, bottom }, rect: { x: p.x - 14, y: top, w: 28, h: bottom - top } };
    }

    figureRadius() {
      return Math.max(4.5, Math.min(7, this.scale * 1.1));
    }

    // The box of the resident's first name under its feet, as drawFigure writes it (bold, the
    // wider of its two weights, with the halo), in map pixels.
    nameRect(figure, p) {
      const name = figure.name.split(" ")[0];
      let width = this.nameWidths.get(name);
      if (width === undefined) {
        this.ctx.save();
        this.ctx.font = `700 ${NAME_FONT_PX}px system-ui, sans-serif`;
        width = this.ctx.measureText(name).width;
        this.ctx.restore();
        this.nameWidths.set(name, width);
      }
      const y = p.y + this.figureRadius() * 1.3 + (p.moving ? 0 : (figure.slot % 3) * 10);
      return { x: p.x - width / 2 - 1.5, y: y - 1.5, w: width + 3, h: NAME_FONT_PX + 3 };
    }

    // What a bubble should rather not cover: the residents, then (given up first when room is
    // short) the buildings.
    softObstacles(positions) {
      const figures = positions.map(([figure, p]) => ({ ...this.figureBox(figure, p).rect, weight: 1 }));
      const buildings = [...this.places.values()].map((place) => ({ ...this.buildingRect(place), weight: 1 }));
      return [figures, buildings];
    }

    // Who has something to show, most important first: the selected resident, then whoever
    // is thinking (a decision is out), then the fresh words, newest first, then the quiet
    // ones. A thinking resident shows the cloud, not their last words.
    boxItems(positions, now) {
      const items = [];
      for (const [figure, p] of positions) {
        const base = { id: figure.id, color: figure.color, anchor: this.figureBox(figure, p).anchor };
        if (figure.thinking) {
          items.push({ ...base, kind: "thought", text: "", rank: 1, t0: 0 });
          continue;
        }
        if (!figure.said) continue;
        const quiet = now - figure.said.t0 > this.bubbleMs;
        items.push({
          ...base, kind: "bubble", text: figure.said.text, quiet, rank: quiet ? 3 : 2, t0: figure.said.t0,
        });
      }
      for (const item of items) if (item.id === this.selectedId) item.rank = 0;
      return items.sort((a, b) => a.rank - b.rank || b.t0 - a.t0 || a.id - b.id);
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
      ctx.restore();
    }

    drawFigure(ctx, figure, p, now) {
      const r = this.figureRadius();
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
      const name = figure.name.split(" ")[0];
      const y = this.nameRect(figure, p).y + 1.5;
      ctx.font = `${selected ? 700 : 500} ${NAME_FONT_PX}px system-ui, sans-serif`;
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

    // A line from the speaker's head to their bubble (dots up to a thought cloud), so a
    // bubble set aside for room still says whose it is.
    drawLeader(ctx, figure, p, rect) {
      const { anchor } = this.figureBox(figure, p);
      const hx = anchor.hx;
      const hy = anchor.top;
      const tx = Math.min(Math.max(hx, rect.x + 6), rect.x + rect.w - 6);
      const ty = Math.min(Math.max(hy, rect.y), rect.y + rect.h);
      if (Math.hypot(tx - hx, ty - hy) < 3) return;
      ctx.save();
      ctx.strokeStyle = figure.color;
      ctx.fillStyle = "#fff";
      if (figure.thinking) {
        ctx.lineWidth = 1.2;
        ctx.setLineDash([2, 4]);
        ctx.beginPath();
        ctx.moveTo(hx, hy);
        ctx.lineTo(tx, ty);
        ctx.stroke();
        ctx.setLineDash([]);
        const length = Math.hypot(tx - hx, ty - hy);
        for (const [along, radius] of [[5, 2], [12, 3]]) { // a cloud's trail near the head
          if (along + radius > length) break;
          const k = along / length;
          ctx.beginPath();
          ctx.arc(hx + (tx - hx) * k, hy + (ty - hy) * k, radius, 0, 2 * Math.PI);
          ctx.fill();
          ctx.stroke();
        }
      } else {
        ctx.lineWidth = 1.4;
        ctx.beginPath();
        ctx.moveTo(hx, hy);
        ctx.lineTo(tx, ty);
        ctx.stroke();
      }
      ctx.restore();
    }
  }

  window.TownMap = TownMap;
})();
