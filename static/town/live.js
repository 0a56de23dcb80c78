"use strict";
// The live run page: a snapshot, then every event over the run's WebSocket, in seq order, each
// applied once. On a drop it reconnects with ?after=<last seq>, so nothing is missed or doubled;
// an event out of order (it cannot happen with our consumer; belt and braces) forces the same.
// window.townView exposes the state for the browser test and for debugging.
(function () {
  const config = window.TOWN_CONFIG;
  const panel = window.TownPanel;
  const view = {
    seq: 0,
    hasSnapshot: false,
    run: null,
    places: new Map(),
    residents: new Map(),
    selectedId: null,
    appliedSeqs: [],
    snapshots: 0,
    duplicates: 0,
    connects: 0,
    closes: [], // {code, seq} of every socket that closed, for the test and for debugging
    gaps: 0, // events that came out of order (never, with our consumer)
    thinkingEvents: 0,
    answeredEvents: 0,
    held: false,
    ws: null,
  };
  window.townView = view;
  const map = new window.TownMap(document.getElementById("town-map"), { onSelect: select });
  view.map = map;

  let retryMs = 500;

  function connect() {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const query = view.hasSnapshot ? `?after=${view.seq}` : "";
    const ws = new WebSocket(`${proto}//${location.host}/ws/runs/${config.runId}/${query}`);
    view.ws = ws;
    view.connects += 1;
    panel.setConnection("connecting");
    ws.onopen = () => { panel.setConnection("open"); retryMs = 500; };
    ws.onmessage = (message) => handle(ws, JSON.parse(message.data));
    ws.onclose = (event) => {
      view.closes.push({ code: event.code, seq: view.seq, dropped: view.held });
      if (view.ws !== ws) return;
      view.ws = null;
      panel.setConnection("closed");
      if (event.code === 4403) return panel.note("Not allowed to watch this run: log in first.");
      if (event.code === 4404) return panel.note("This run does not exist (any more).");
      if (!view.held) {
        setTimeout(connect, retryMs);
        retryMs = Math.min(10000, retryMs * 2);
      }
    };
  }

  // Drop the socket and stay away until resume(): what a flaky network does.
  view.drop = () => { view.held = true; if (view.ws) view.ws.close(); };
  view.resume = () => { view.held = false; if (!view.ws) connect(); };

  function handle(ws, message) {
    if (message.type === "snapshot") return applySnapshot(message);
    if (message.type === "error") return panel.note(message.message);
    if (message.type !== "event") return;
    if (message.seq <= view.seq) { view.duplicates += 1; return; }
    if (message.seq !== view.seq + 1) { view.gaps += 1; ws.close(); return; } // resync
    applyEvent(message);
    view.seq = message.seq;
    view.appliedSeqs.push(message.seq);
  }

  function applySnapshot(s) {
    view.snapshots += 1;
    view.hasSnapshot = true;
    view.seq = s.seq;
    view.run = s.run;
    view.places = new Map(s.places.map((p) => [p.id, p]));
    const residents = s.residents.map((r) => ({ ...panel.residentView(r), latest: r.latest_decision }));
    view.residents = new Map(residents.map((r) => [r.id, r]));
    map.setPlaces(s.places);
    map.setResidents(residents);
    for (const r of residents) if (r.latest && !r.thinking) map.say(r.id, panel.saidText(r.latest));
    panel.feedReset(s.feed.map((e) => ({ d: e.data, seq: e.seq })));
    panel.renderStats({
      status: s.run.status, numTicksDone: s.run.num_ticks_done, clock: s.clock, summary: s.summary,
    });
    showControls(s.run.status);
    renderLatest();
    panel.note("");
    if (view.selectedId === null && s.residents.length) select(s.residents[0].id);
    else refreshSelected();
  }

  function applyEvent({ kind, data, seq }) {
    // A decision event carries the decision as the REST API gives it (its resident: an id).
    const residentId = kind.startsWith("decision.") ? data.resident : data.resident_id;
    const resident = view.residents.get(residentId);
    switch (kind) {
      case "run.state":
        view.run = { ...view.run, ...data };
        panel.renderStats({ status: data.status, numTicksDone: data.num_ticks_done });
        showControls(data.status);
        break;
      case "decision.started":
        view.thinkingEvents += 1;
        if (resident) resident.thinking = true;
        map.setThinking(residentId, true);
        renderLatest();
        if (residentId === view.selectedId) refreshSelected();
        break;
      // The resident has decided (answered, before the tick applies it), then the tick has
      // applied it: the same words on the map and one line in the feed, updated. A fallback
      // (the town could not carry the answer out) is not the resident's words.
      case "decision.answered":
      case "decision.applied":
        if (kind === "decision.answered") view.answeredEvents += 1;
        if (resident) Object.assign(resident, { thinking: false, latest: data });
        map.setThinking(residentId, false);
        map.say(residentId, panel.saidText(data));
        panel.feedAdd(data, seq);
        renderLatest();
        if (residentId === view.selectedId) refreshSelected();
        break;
      case "resident.moved":
        if (resident) resident.place_id = data.to_place_id;
        map.moveResident(data.resident_id, data.to_place_id);
        break;
      case "tick.advanced":
        map.setOpen(data.open_place_ids);
        for (const place of view.places.values()) {
          place.is_open = data.open_place_ids.includes(place.id);
        }
        for (const state of data.residents) {
          const r = view.residents.get(state.id);
          if (r) Object.assign(r, { money: state.money, hunger: state.hunger, energy: state.energy });
        }
        panel.renderStats({
          numTicksDone: data.num_ticks_done, clock: data.clock, summary: data.summary,
        });
        refreshSelected();
        break;
      default:
        break; // a kind this page does not show
    }
  }

  async function select(id) {
    view.selectedId = id;
    map.select(id);
    renderLatest();
    await refreshSelected();
  }

  function renderLatest() {
    panel.renderLatest([...view.residents.values()], view.selectedId);
  }

  function showControls(status) {
    if (config.controlStatuses) panel.showControls(status, config.controlStatuses);
  }

  const latest = document.getElementById("latest");
  latest.addEventListener("click", (event) => {
    const item = event.target.closest("[data-resident-id]");
    if (item) select(Number(item.dataset.residentId));
  });

  async function refreshSelected() {
    const id = view.selectedId;
    if (id === null) return;
    const response = await fetch(config.residentUrl.replace(/\/0\/$/, `/${id}/`));
    if (!response.ok || view.selectedId !== id) return;
    const detail = panel.residentView(await response.json());
    const local = view.residents.get(id);
    detail.thinking = local ? local.thinking : false;
    const place = view.places.get(detail.place_id);
    panel.renderResident(detail, place ? place.name : detail.place_name);
  }

  const controls = document.getElementById("controls");
  if (controls) {
    const csrf = controls.querySelector("[name=csrfmiddlewaretoken]").value;
    controls.addEventListener("click", async (event) => {
      const name = event.target.dataset && event.target.dataset.control;
      if (!name) return;
      const response = await fetch(config.controlUrl.replace("CONTROL", name), {
        method: "POST",
        headers: { "X-CSRFToken": csrf },
      });
      const body = await response.json().catch(() => ({}));
      panel.note(response.ok ? "" : body.error || `${name} failed (${response.status})`);
    });
  }

  connect();
})();
