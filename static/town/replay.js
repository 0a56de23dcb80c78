"use strict";
// A past run, watched again from its stored decisions: frame i is the town as tick i began
// (each resident's state as its prompt saw it) with the decisions of tick i; stepping to the
// next frame walks everyone to where those decisions took them.
// window.townReplay exposes the state for the tests.
(function () {
  const config = window.TOWN_CONFIG;
  const panel = window.TownPanel;
  const map = new window.TownMap(document.getElementById("town-map"), { onSelect: select });
  const slider = document.getElementById("frame");
  const label = document.getElementById("frame-label");
  const playButton = document.getElementById("play");
  const replay = { data: null, frame: -1, selectedId: null, playing: null, map, latest: new Map() };
  window.townReplay = replay;
  const FRAME_MS = 2500;

  function residentAt(frame, id) {
    const profile = replay.data.residents.find((r) => r.id === id);
    const state = frame.states[String(id)] || {};
    const decisions = [];
    for (const f of replay.data.frames) {
      if (f.tick_index > frame.tick_index) break;
      for (const d of f.decisions) if (d.resident === id) decisions.unshift(d);
    }
    // Memories made before this frame's tick (a background one has no tick).
    const memories = (replay.data.memories[String(id)] || [])
      .filter((m) => m.tick_index === null || m.tick_index < frame.tick_index)
      .slice(0, 8)
      .map((m) => m.text);
    return { ...profile, ...state, memories, decisions: decisions.slice(0, 5) };
  }

  function show(index, animate) {
    const frames = replay.data.frames;
    index = Math.max(0, Math.min(frames.length - 1, index));
    const frame = frames[index];
    const step = animate && index === replay.frame + 1;
    replay.frame = index;
    slider.value = index;
    const last = index === frames.length - 1;
    label.textContent = last ? `after tick ${frame.tick_index - 1}` : `tick ${frame.tick_index}`;
    map.setOpen(frame.open_place_ids);
    for (const [id, state] of Object.entries(frame.states)) {
      if (step) map.moveResident(Number(id), state.place_id);
    }
    if (!step) {
      map.setResidents(replay.data.residents.map((r) => ({
        ...r, place_id: (frame.states[String(r.id)] || {}).place_id ?? r.home,
      })));
    }
    for (const d of frame.decisions) map.say(d.resident, panel.saidText(d));
    const done = frames.slice(0, index).flatMap((f) => f.decisions);
    const shown = [...done, ...frame.decisions];
    panel.feedReset(shown.map((d) => ({ d, seq: null })).slice(-60));
    replay.latest = new Map(shown.map((d) => [d.resident, d])); // the newest of each wins
    renderLatest();
    panel.renderStats({ numTicksDone: frame.tick_index, clock: frame.clock, summary: summarize(done) });
    if (replay.selectedId !== null) renderSelected();
  }

  function summarize(decisions) {
    const answered = decisions.filter((d) => d.num_prompt_tokens !== null);
    const prompt = answered.reduce((a, d) => a + d.num_prompt_tokens, 0);
    const cached = answered.reduce((a, d) => a + (d.num_cached_tokens || 0), 0);
    const latencies = answered.map((d) => d.app_e2e_s).filter((x) => x !== null).sort((a, b) => a - b);
    const mid = Math.floor(latencies.length / 2);
    const median = !latencies.length ? 0
      : latencies.length % 2 ? latencies[mid] : (latencies[mid - 1] + latencies[mid]) / 2;
    return {
      num_decisions: answered.length,
      token_cache_hit_rate: prompt ? cached / prompt : 0,
      median_e2e_s: median,
    };
  }

  function select(id) {
    replay.selectedId = id;
    map.select(id);
    renderLatest();
    renderSelected();
  }

  function renderLatest() {
    const residents = replay.data.residents.map((r) => ({ ...r, latest: replay.latest.get(r.id) }));
    panel.renderLatest(residents, replay.selectedId);
  }

  document.getElementById("latest").addEventListener("click", (event) => {
    const item = event.target.closest("[data-resident-id]");
    if (item) select(Number(item.dataset.residentId));
  });

  function renderSelected() {
    const frame = replay.data.frames[replay.frame];
    const r = residentAt(frame, replay.selectedId);
    const place = replay.data.places.find((p) => p.id === r.place_id);
    panel.renderResident(r, place ? place.name : "?");
  }

  function play() {
    if (replay.playing) {
      clearInterval(replay.playing);
      replay.playing = null;
      playButton.textContent = "play";
      return;
    }
    if (replay.frame >= replay.data.frames.length - 1) show(0, false);
    playButton.textContent = "pause";
    replay.playing = setInterval(() => {
      if (replay.frame >= replay.data.frames.length - 1) return play();
      show(replay.frame + 1, true);
    }, FRAME_MS);
  }

  replay.show = show;
  slider.addEventListener("input", () => show(Number(slider.value), false));
  playButton.addEventListener("click", play);

  fetch(config.replayUrl)
    .then((response) => response.json())
    .then((data) => {
      replay.data = data;
      map.setPlaces(data.places);
      slider.max = data.frames.length - 1;
      panel.renderStats({ status: data.run.status });
      panel.setConnection("replay");
      if (data.residents.length) replay.selectedId = data.residents[0].id;
      show(0, false);
      if (replay.selectedId !== null) select(replay.selectedId);
    });
})();
