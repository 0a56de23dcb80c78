"use strict";
// The side panel and header: the selected resident, the decision feed (each decision as soon as
// it is answered, then as applied), everyone's latest decision, the run's live numbers, the
// staff's buttons. Plain DOM; every text goes in through textContent.
(function () {
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.className = value;
      else node.setAttribute(key, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  const seconds = (s) => (s === null || s === undefined ? "–" : `${Number(s).toFixed(2)} s`);
  const tokens = (d) =>
    d.num_prompt_tokens === null || d.num_prompt_tokens === undefined
      ? "no answer"
      : `${d.num_cached_tokens ?? 0}/${d.num_prompt_tokens} cached · ${d.num_output_tokens ?? 0} out`;

  // A decision the town could not carry out: code kept the resident where they were (a
  // fallback), which is never shown as the model's choice.
  const isFallback = (d) => d.valid === false;

  function actionText(d) {
    if (isFallback(d)) return "stays put (fallback)";
    if (!d.action) return `(${d.status.replace("_", " ")})`;
    return d.target ? `${d.action} → ${d.target}` : d.action;
  }

  // Answered, not applied yet: the tick applies every answer together when the last is in.
  const isDecided = (d) => d.status === "computed";

  // What the resident says on the map: its reason; the same words as the feed's.
  function saidText(d) {
    if (isFallback(d) || !d.action) return "(stays put)";
    return d.reason || `${d.action} ${d.target}`;
  }

  function errorText(d) {
    return isFallback(d) && d.action ? `the model chose ${d.action} → ${d.target}: ${d.error}` : d.error;
  }

  function renderStats({ status, numTicksDone, clock, summary }) {
    if (status !== undefined) {
      const node = $("stat-status");
      node.textContent = status;
      node.className = `status status-${status}`;
    }
    if (numTicksDone !== undefined) $("stat-tick").textContent = numTicksDone;
    if (clock) $("stat-clock").textContent = `day ${clock.day} ${clock.hhmm} ${clock.phase}`;
    if (summary) {
      $("stat-hit").textContent = `${(100 * summary.token_cache_hit_rate).toFixed(1)}%`;
      $("stat-median").textContent = summary.num_decisions ? seconds(summary.median_e2e_s) : "–";
    }
  }

  function setConnection(state) {
    const node = $("stat-conn");
    if (!node) return;
    node.className = `stat conn conn-${state}`;
    node.title = `WebSocket: ${state}`;
  }

  function feedItem(d, seq) {
    const decided = isDecided(d);
    const item = el(
      "li",
      {
        class: `feed-item${d.valid === false ? " invalid" : ""}${decided ? " decided" : ""}`,
        "data-seq": seq ?? "",
      },
      el("div", { class: "feed-head" },
        el("b", {}, d.resident_name), " ",
        el("span", { class: "act" }, decided ? `has decided: ${actionText(d)}` : actionText(d)),
        el("span", { class: "tick" }, `tick ${d.tick_index}`)),
      d.reason ? el("div", { class: "reason" }, `“${d.reason}”`) : null,
      d.error ? el("div", { class: "error" }, errorText(d)) : null,
      el("div", { class: "nums" }, `${tokens(d)} · ${seconds(d.app_e2e_s)}`,
        decided ? " · applied when the tick's last answer is in" : ""),
    );
    item.dataset.residentId = d.resident;
    if (d.id !== undefined) item.dataset.decisionId = d.id;
    return item;
  }

  // "Waiting for the first tick…" while the feed is empty.
  function feedEmptyNote() {
    $("feed-empty").hidden = $("feed").children.length > 0;
  }

  // One line per decision: a decision answered earlier is updated where it is when the tick
  // applies it; a new one goes on top.
  function feedPut(feed, d, seq) {
    const item = feedItem(d, seq);
    const old = d.id === undefined ? null : feed.querySelector(`[data-decision-id="${d.id}"]`);
    if (old) old.replaceWith(item);
    else feed.prepend(item);
  }

  function feedAdd(d, seq, max = 60) {
    const feed = $("feed");
    feedPut(feed, d, seq);
    while (feed.children.length > max) feed.lastChild.remove();
    feedEmptyNote();
  }

  function feedReset(items) {
    const feed = $("feed");
    feed.replaceChildren();
    for (const { d, seq } of items) feedPut(feed, d, seq);
    feedEmptyNote();
  }

  // Everyone's latest decision, one line each, until their next: what the map's bubbles say,
  // readable here when a phone's map has no room for them all. residents: [{id, name,
  // thinking, latest}] in the town's order; a click on a line selects that resident.
  function renderLatest(residents, selectedId) {
    const list = $("latest");
    if (!list) return;
    list.replaceChildren(...residents.map((r) => {
      const d = r.latest;
      const what = r.thinking ? "thinking…" : d ? actionText(d) : "no decision yet";
      const item = el("li", { class: `latest-item${r.id === selectedId ? " selected" : ""}` },
        el("div", { class: "feed-head" },
          el("b", {}, r.name.split(" ")[0]), " ", el("span", { class: "act" }, what),
          d ? el("span", { class: "tick" }, `tick ${d.tick_index}`) : null),
        d && d.reason ? el("div", { class: "reason" }, `“${d.reason}”`) : null);
      item.dataset.residentId = r.id;
      return item;
    }));
  }

  // The staff's buttons: only those the run's status allows (statuses: control -> the
  // statuses it acts on, the server's rule: services.run_control_statuses).
  function showControls(status, statuses) {
    for (const button of document.querySelectorAll("#controls [data-control]")) {
      button.hidden = !(statuses[button.dataset.control] || []).includes(status);
    }
  }

  function bar(label, value, max, cls) {
    return el("div", { class: "bar-row" },
      el("span", { class: "bar-label" }, label),
      el("span", { class: "bar" }, el("span", { class: `bar-fill ${cls}`, style: `width:${Math.max(0, Math.min(100, (100 * value) / max))}%` })),
      el("span", { class: "bar-value" }, value));
  }

  function renderResident(r, placeName) {
    const box = $("resident-detail");
    const decisions = (r.decisions || []).map((d) =>
      el("li", {}, el("span", { class: "act" }, `tick ${d.tick_index}: ${actionText(d)}`),
        d.reason ? el("div", { class: "reason" }, `“${d.reason}”`) : null,
        d.error ? el("div", { class: "error" }, errorText(d)) : null,
        el("div", { class: "nums" }, `${tokens(d)} · ${seconds(d.app_e2e_s)}`)));
    box.replaceChildren(
      el("div", { class: "who" }, el("b", {}, r.name), ` ${r.age}, ${r.occupation}`),
      el("div", { class: "where" }, `at ${placeName}`, r.thinking ? " · thinking…" : ""),
      r.personality ? el("div", { class: "personality" }, r.personality) : null,
      el("div", { class: "bars" },
        bar("hunger", r.hunger, 100, "hunger"), bar("energy", r.energy, 100, "energy"),
        el("div", { class: "bar-row" }, el("span", { class: "bar-label" }, "money"),
          el("span", { class: "money" }, `¥${r.money}`))),
      el("div", { class: "likes" }, "likes: ", (r.likes || []).join(", ")),
      r.memories ? el("details", { open: "" }, el("summary", {}, "memories"),
        el("ul", { class: "memories" }, ...r.memories.map((m) => el("li", {}, m)))) : null,
      r.decisions ? el("details", { open: "" }, el("summary", {}, "last decisions"),
        el("ul", { class: "decisions" }, ...decisions)) : null,
    );
    box.dataset.residentId = r.id;
  }

  // A resident as the REST API gives it, its state in the run (`state`, null before any)
  // spread on top: what this page draws and updates.
  function residentView(r) {
    const state = r.state;
    if (!state) return { ...r, place_id: r.home };
    return {
      ...r, place_id: state.place, place_name: state.place_name,
      money: state.money, hunger: state.hunger, energy: state.energy,
    };
  }

  function note(text) {
    const node = $("map-note");
    node.hidden = !text;
    node.textContent = text || "";
  }

  // The feed panel's two tabs: every decision as it comes, or everyone's latest.
  function tabsInit() {
    const tabs = [...document.querySelectorAll("#feed-panel [role=tab]")];
    for (const tab of tabs) {
      tab.addEventListener("click", () => {
        for (const other of tabs) {
          other.setAttribute("aria-selected", String(other === tab));
          $(other.getAttribute("aria-controls")).hidden = other !== tab;
        }
      });
    }
  }
  tabsInit();

  window.TownPanel = {
    renderStats, setConnection, feedAdd, feedReset, renderResident, residentView, note,
    renderLatest, saidText, showControls,
  };
})();
