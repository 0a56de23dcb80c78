"use strict";
// Where the places' names, the speech bubbles and the thought clouds go: pure geometry, no DOM,
// no canvas. The names first (placeLabels, at the end): each under its building unless a
// resident's name is there, then over the roof or to a side. Then the boxes (placeBoxes):
//
// Each box is tried at candidate spots around its resident's head — above, to the sides,
// below, then the same directions farther out — and takes the first spot, within the map,
// that overlaps no place label and no box placed before it. Boxes are placed in the order
// given (most important first). One that finds no spot is tried again ahead of the others it
// came after (a box hemmed in by its neighbours' choices often has room when it chooses
// first); one that still finds none is left out (hidden), so a crowded phone screen shows the
// selected and the newest ones, never a pile. Covering residents' figures or buildings is
// allowed only when every free spot would: it costs (by each obstacle's weight), it is not
// refused.
(function () {
  const GAP = 6; // between a box and what it avoids
  const RINGS = [0, 22, 46, 74, 106]; // how much farther out each round of candidates goes
  const REACH = 120; // the farthest a box may sit from its resident's head
  const RETRIES = 3; // layouts tried again with the boxes left out moved up

  // Rectangles are {x, y, w, h} in map (canvas CSS pixel) coordinates.
  function overlaps(a, b, pad = 0) {
    return a.x < b.x + b.w + pad && b.x < a.x + a.w + pad
      && a.y < b.y + b.h + pad && b.y < a.y + a.h + pad;
  }

  // The candidate spots for a w×h box, for a figure whose head top is at (hx, top) and whose
  // feet (with the name under them) end at `bottom`: nearest first, above preferred.
  function candidates(w, h, { hx, top, bottom }) {
    const spots = [];
    for (const d of RINGS) {
      const above = top - GAP - h - d;
      const below = bottom + GAP + d;
      const middle = (top + bottom) / 2 - h / 2;
      spots.push(
        { x: hx - w / 2, y: above, side: "above" },
        { x: hx - 14 - d, y: above, side: "above" },
        { x: hx - w + 14 + d, y: above, side: "above" },
        { x: hx + 10 + d, y: middle, side: "right" },
        { x: hx - 10 - w - d, y: middle, side: "left" },
        { x: hx + 10 + d, y: above, side: "above" },
        { x: hx - 10 - w - d, y: above, side: "above" },
        { x: hx + 10 + d, y: middle - h - GAP, side: "right" },
        { x: hx - 10 - w - d, y: middle - h - GAP, side: "left" },
        { x: hx + 10 + d, y: middle + h + GAP, side: "right" },
        { x: hx - 10 - w - d, y: middle + h + GAP, side: "left" },
        { x: hx - w / 2, y: below, side: "below" },
        { x: hx + 10 + d, y: below, side: "below" },
        { x: hx - 10 - w - d, y: below, side: "below" },
      );
    }
    return spots;
  }

  // Distance from a rectangle to a point (0 inside it).
  function distance(r, x, y) {
    return Math.hypot(Math.max(r.x - x, 0, x - r.x - r.w), Math.max(r.y - y, 0, y - r.y - r.h));
  }

  // A spot pulled inside the map; null when the box cannot fit at all.
  function clamp(spot, w, h, bounds) {
    if (w > bounds.w - 2 * GAP || h > bounds.h - 2 * GAP) return null;
    return {
      ...spot,
      x: Math.min(Math.max(GAP, spot.x), bounds.w - w - GAP),
      y: Math.min(Math.max(GAP, spot.y), bounds.h - h - GAP),
    };
  }

  // One greedy pass: each box, in order, takes the cheapest free candidate (the first free
  // one that covers nothing soft, else the least costly).
  function placeGreedy(items, labels, soft, bounds) {
    const placed = [];
    const result = new Map();
    for (const item of items) {
      const { w, h } = item;
      const blocked = (r) => labels.some((l) => overlaps(r, l, GAP)) || placed.some((p) => overlaps(r, p, GAP));
      const cost = (r) => soft.reduce((sum, s) => sum + (overlaps(r, s) ? s.weight : 0), 0);
      let best = null;
      let bestCost = Infinity;
      const spots = candidates(w, h, item.anchor).map((spot, index) => ({ ...spot, index }));
      if (item.previous !== undefined && spots[item.previous]) spots.unshift(spots[item.previous]);
      for (const spot of spots) {
        const at = clamp(spot, w, h, bounds);
        if (!at) break;
        const rect = { ...at, w, h };
        if (distance(rect, item.anchor.hx, item.anchor.top) > REACH || blocked(rect)) continue;
        const c = cost(rect);
        if (c < bestCost) { best = rect; bestCost = c; }
        if (c === 0) break;
      }
      if (best) {
        placed.push(best);
        result.set(item.id, best);
      }
    }
    return result;
  }

  /**
   * items: [{id, w, h, anchor: {hx, top, bottom}, previous}] in priority order; `previous` is
   *   the candidate the box took last frame, tried first so that boxes do not hop about.
   * labels: rectangles no box may overlap.
   * soft: lists of rectangles with a weight, which a box keeps clear of if it can, the most
   *   expendable list last (e.g. [figures, buildings]): when keeping clear of all of them would
   *   leave a box out, the last list is given up first, and so on.
   * bounds: {w, h} of the map.
   * Returns Map id -> {x, y, w, h, side, index}; an item missing from it has no room.
   */
  function placeBoxes(items, { labels, soft, bounds }) {
    const placeInOrder = (order) => {
      let best = null;
      for (let keep = soft.length; keep >= 0; keep--) {
        const result = placeGreedy(order, labels, soft.slice(0, keep).flat(), bounds);
        if (!best || result.size > best.size) best = result;
        if (best.size === order.length) break;
      }
      return best;
    };
    let best = placeInOrder(items);
    let order = items;
    for (let round = 0; round < RETRIES && best.size < items.length; round++) {
      // The boxes left out move up, right behind the first (the selected resident's, which
      // keeps its place); the rest keep their order.
      const [first, ...rest] = order;
      const left = rest.filter((item) => !best.has(item.id));
      order = [first, ...left, ...rest.filter((item) => best.has(item.id))];
      const result = placeInOrder(order);
      if (result.size > best.size && (result.has(first.id) || !best.has(first.id))) best = result;
    }
    return best;
  }

  // The spots a place's name may take around its building (b: the building's rectangle),
  // nearest first: under it (where a reader looks first), over the roof, to either side, then
  // the same a little farther out.
  function labelCandidates(w, h, b) {
    const cx = b.x + b.w / 2;
    const middle = b.y + b.h / 2 - h / 2;
    const spots = [];
    for (const d of [0, 14, 28]) {
      spots.push(
        { x: cx - w / 2, y: b.y + b.h + 3 + d },
        { x: cx - w / 2, y: b.y - 3 - h - d },
        { x: b.x + b.w + 3 + d, y: middle },
        { x: b.x - 3 - w - d, y: middle },
        { x: cx + d, y: b.y + b.h + 3 },
        { x: cx - w - d, y: b.y + b.h + 3 },
      );
    }
    return spots;
  }

  /**
   * Where the places' names go. items: [{id, w, h, building: rect}]; hard: rectangles no name
   * may cover if any spot avoids them (the residents' names); soft: rectangles it would rather
   * not cover (figures, other buildings), each with a weight. Names are placed in the order
   * given, each avoiding the ones before. Each takes its first spot (labelCandidates) inside
   * the map that covers nothing; else the one that covers least, a hard rectangle costing as
   * much as a hundred soft ones. Returns Map id -> {x, y, w, h}.
   */
  function placeLabels(items, { hard, soft, bounds }) {
    const placed = [];
    const result = new Map();
    for (const item of items) {
      const { w, h } = item;
      let best = null;
      let bestCost = Infinity;
      for (const spot of labelCandidates(w, h, item.building)) {
        const rect = {
          x: Math.min(Math.max(2, spot.x), bounds.w - w - 2),
          y: Math.min(Math.max(2, spot.y), bounds.h - h - 2),
          w,
          h,
        };
        let cost = 0;
        for (const r of hard) if (overlaps(rect, r, 1)) cost += 100;
        for (const r of placed) if (overlaps(rect, r, 2)) cost += 100;
        for (const r of soft) if (overlaps(rect, r)) cost += r.weight;
        if (cost < bestCost) { best = rect; bestCost = cost; }
        if (cost === 0) break;
      }
      placed.push(best);
      result.set(item.id, best);
    }
    return result;
  }

  window.TownLayout = { placeBoxes, placeLabels, overlaps };
})();
