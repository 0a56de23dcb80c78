"use strict";
// What is written over the map, as DOM elements above the canvas: the places' names, and the
// residents' speech bubbles and thought clouds. Text in the DOM stays sharp and selectable,
// and the browser test can measure every box. Where the boxes go is layout.js's job; map.js
// says, each frame, who has something to show.
(function () {
  const { placeBoxes } = window.TownLayout;

  function el(tag, className, text) {
    const node = document.createElement(tag);
    node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  class MapOverlay {
    constructor(container) {
      this.root = el("div", "map-overlay");
      container.append(this.root);
      this.labels = new Map(); // place id -> label element
      this.labelRects = [];
      this.boxes = new Map(); // resident id -> {node, kind, text, w, h, previous}
    }

    // Places' names. labels: [{id, name, sub, open}]; fontPx follows the buildings' size.
    // Returns Map id -> {w, h}, each label's size, for the map to find it a spot
    // (placeLabels).
    setLabels(labels, fontPx) {
      this.root.style.setProperty("--label-px", `${fontPx}px`);
      const keep = new Set(labels.map((l) => l.id));
      for (const [id, node] of this.labels) if (!keep.has(id)) { node.remove(); this.labels.delete(id); }
      const sizes = new Map();
      for (const label of labels) {
        let node = this.labels.get(label.id);
        if (!node) {
          node = el("div", "place-label");
          node.append(el("b"), el("span"));
          this.root.append(node);
          this.labels.set(label.id, node);
        }
        node.dataset.placeId = label.id;
        node.classList.toggle("closed", !label.open);
        node.firstChild.textContent = label.name;
        node.lastChild.textContent = label.sub;
      }
      for (const [id, node] of this.labels) {
        sizes.set(id, { w: Math.ceil(node.offsetWidth), h: Math.ceil(node.offsetHeight) });
      }
      return sizes;
    }

    // Each label's top left corner, in map pixels: spots = Map id -> {x, y}.
    positionLabels(spots) {
      for (const [id, node] of this.labels) {
        const at = spots.get(id);
        if (!at) continue;
        node.style.left = `${Math.round(at.x)}px`;
        node.style.top = `${Math.round(at.y)}px`;
      }
      this.measureLabels();
    }

    // The labels' rectangles, in map pixels; read once per change, not every frame.
    measureLabels() {
      const origin = this.root.getBoundingClientRect();
      this.labelRects = [...this.labels.values()].map((node) => {
        const r = node.getBoundingClientRect();
        return { x: r.left - origin.left, y: r.top - origin.top, w: r.width, h: r.height };
      });
    }

    // Sizes change with the screen (phones get smaller text): measure every box again.
    remeasure() {
      this.measureLabels();
      for (const box of this.boxes.values()) this.measure(box);
    }

    measure(box) {
      box.node.hidden = false;
      const r = box.node.getBoundingClientRect();
      box.w = r.width;
      box.h = r.height;
    }

    // The element for a resident's bubble or cloud, made (and measured) when what it says
    // changes.
    boxFor({ id, kind, text, color }) {
      let box = this.boxes.get(id);
      if (box && box.kind === kind && box.text === text) return box;
      if (!box) {
        box = { node: el("div", ""), previous: undefined };
        this.root.append(box.node);
        this.boxes.set(id, box);
      }
      Object.assign(box, { kind, text });
      box.node.className = kind === "thought" ? "thought" : "bubble";
      box.node.dataset.residentId = id;
      box.node.style.setProperty("--figure", color);
      if (kind === "thought") {
        box.node.replaceChildren(el("i"), el("i"), el("i")); // the dots, lit in turn by CSS
        box.node.setAttribute("aria-label", "thinking");
      } else {
        box.node.replaceChildren(el("span", "", text)); // the span clamps it (town.css)
        box.node.removeAttribute("aria-label");
      }
      this.measure(box);
      return box;
    }

    /**
     * Show this frame's boxes. items: [{id, kind: "bubble"|"thought", text, color, quiet,
     * anchor}] most important first (see layout.js for anchor); soft: lists of rectangles
     * to keep clear if possible (layout.js); bounds: {w, h}. Returns Map id -> the rectangle
     * each box got.
     */
    sync(items, soft, bounds) {
      const wanted = new Set(items.map((i) => i.id));
      for (const [id, box] of this.boxes) if (!wanted.has(id)) { box.node.remove(); this.boxes.delete(id); }
      const layoutItems = items.map((item) => {
        const box = this.boxFor(item);
        return { id: item.id, w: box.w, h: box.h, anchor: item.anchor, previous: box.previous };
      });
      const placed = placeBoxes(layoutItems, { labels: this.labelRects, soft, bounds });
      for (const item of items) {
        const box = this.boxes.get(item.id);
        const at = placed.get(item.id);
        if (box.node.hidden !== !at) box.node.hidden = !at;
        box.previous = at ? at.index : undefined;
        if (!at) continue;
        const transform = `translate(${Math.round(at.x)}px, ${Math.round(at.y)}px)`;
        if (box.node.style.transform !== transform) box.node.style.transform = transform;
        // Words said a while ago stay, quieter (town.css), until the resident's next ones.
        if ((box.node.dataset.quiet === "1") !== !!item.quiet) {
          if (item.quiet) box.node.dataset.quiet = "1";
          else delete box.node.dataset.quiet;
        }
      }
      return placed;
    }
  }

  window.TownOverlay = MapOverlay;
})();
