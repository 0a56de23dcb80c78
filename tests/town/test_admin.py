"""The admin: every list with its filters and search, a decision's prompt shown readably with
token counts, a run's charts (data and, in Debian's chromium, drawn), and the compare action.

Screenshots: `POKOMACHI_SCREENSHOT_DIR=docs .venv/bin/pytest tests/town/test_admin.py -k chromium`
writes docs/admin-run-charts.png and docs/admin-compare.png (and the lists and a run's page at
1280 px wide, admin-*-1280.png).
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.core.management import call_command

from tests.town.browser_fixtures import CHROMIUM, CHROMIUM_ARGS, needs_chromium
from town import services
from town.models import Decision, Run
from town.simulation import InlineSend, tick_run

from .factories import small_town_factory

D = Decision.Status


def _answered_run(town, layout: str, cached: list[int]) -> Run:
    """A run whose first tick's decisions carry metrics as a worker stores them."""
    run = services.run_create(town=town, nodes=["local"], layout=layout)
    tick = services.tick_begin(run=run)
    for i, (decision, num_cached) in enumerate(
        zip(tick.decisions.order_by("id"), cached, strict=False)
    ):
        Decision.objects.filter(pk=decision.pk).update(
            status=D.COMPUTED,
            num_prompt_tokens=1000,
            num_cached_tokens=num_cached,
            num_output_tokens=30,
            lost_tokens={"block_alignment": 7} if num_cached else {},
            prefill_s=2.0 - num_cached / 1000,
            queue_s=0.5,
            decode_s=1.0,
            app_e2e_s=4.0 - num_cached / 1000 + i,
            engine_e2e_s=3.5,
            dispatched_at=tick.started_at,
            computed_at=tick.started_at,
        )
    return run


@pytest.mark.parametrize(
    "path",
    [
        "/admin/town/town/",
        "/admin/town/place/?kind__exact=cafe&q=Cafe",
        "/admin/town/resident/?q=Aki",
        "/admin/town/residentstate/",
        "/admin/town/memory/",
        "/admin/town/run/?status__exact=created&layout__exact=shared_head",
        "/admin/town/tick/?status__exact=deciding",
        "/admin/town/decision/?valid__isnull=True&node=local&status__exact=computed",
        "/admin/town/decision/?q=Aki",
    ],
)
def test_every_list_with_filters_and_search(admin_client, db, path):
    town = small_town_factory()
    _answered_run(town, "shared_head", [0, 500])
    response = admin_client.get(path)
    assert response.status_code == 200, path
    assert "errornote" not in response.content.decode()


def test_decision_list_shows_metrics_and_filters_by_run_and_resident(admin_client, db):
    town = small_town_factory()
    run = _answered_run(town, "shared_head", [0, 500])
    other = _answered_run(town, "naive", [0, 0])
    aki = town.residents.get(name="Aki")
    page = admin_client.get(f"/admin/town/decision/?run__id__exact={run.pk}").content.decode()
    assert "50.0%" in page  # the cache hit column: 500 of 1000
    assert f"?run__id__exact={other.pk}" in page  # the run filter lists both runs
    only_aki = admin_client.get(
        f"/admin/town/decision/?run__id__exact={run.pk}&resident__id__exact={aki.pk}"
    ).content.decode()
    assert "1 decision" in only_aki


def test_decision_page_shows_shared_head_and_tail_apart_with_token_counts(
    admin_client, db, smollm2_tokenizer
):
    town = small_town_factory()
    run = _answered_run(town, "shared_head", [0, 500])
    decision = run.decisions.order_by("id")[1]
    page = admin_client.get(f"/admin/town/decision/{decision.pk}/change/").content.decode()
    head = decision.messages[:2]  # the two system messages with "cache": True
    head_tokens = len(smollm2_tokenizer.apply_chat_template(head, add_generation_prompt=False))
    total = len(smollm2_tokenizer.apply_chat_template(decision.messages))
    assert f"shared head · 2 messages · {head_tokens:,} tokens" in page
    assert f"per-resident tail · 1 messages · {total - head_tokens:,} tokens" in page
    assert f"{total:,} tokens in all (the engine counted 1000)" in page
    assert page.index("pk-head") < page.index("pk-tail")
    assert "Aki" in page.split("pk-part pk-tail")[1] or "Ben" in page.split("pk-part pk-tail")[1]
    # Read-only: a decision is a record, not a form.
    assert 'name="raw_output"' not in page and 'name="num_cached_tokens"' not in page
    assert admin_client.get("/admin/town/decision/add/").status_code == 403


def test_a_residents_own_cached_head_is_not_part_of_the_shared_head(
    admin_client, db, smollm2_tokenizer
):
    town = small_town_factory()
    run = _answered_run(town, "shared_then_resident_head", [0])
    decision = run.decisions.order_by("id")[0]
    page = admin_client.get(f"/admin/town/decision/{decision.pk}/change/").content.decode()
    head = decision.messages[:1]  # the rules and places; the resident's own head comes after
    head_tokens = len(smollm2_tokenizer.apply_chat_template(head, add_generation_prompt=False))
    assert f"shared head · 1 messages · {head_tokens:,} tokens" in page
    tail = page.split("pk-part pk-tail")[1]
    assert "per-resident tail · 2 messages" in page
    assert "cache breakpoint (this resident&#x27;s own)" in tail


def test_naive_prompt_says_there_is_no_shared_head(admin_client, db):
    town = small_town_factory()
    run = _answered_run(town, "naive", [0])
    decision = run.decisions.order_by("id")[0]
    page = admin_client.get(f"/admin/town/decision/{decision.pk}/change/").content.decode()
    assert "no shared head (no cache breakpoint)" in page and "per-resident tail" in page


def test_run_page_carries_summary_and_chart_data(admin_client, db):
    town = small_town_factory()
    run = _answered_run(town, "shared_head", [0, 500, 500, 800])
    page = admin_client.get(f"/admin/town/run/{run.pk}/change/").content.decode()
    assert "45.00%" in page  # token cache hit rate: 1800 / 4000
    for canvas in ["latency", "tokens", "hit-rate", "lost"]:
        assert f'id="pk-chart-{canvas}"' in page
    assert "vendor/chartjs/chart.umd.min.js" in page
    assert (Path(settings.BASE_DIR) / "static/vendor/chartjs/chart.umd.min.js").is_file()
    raw = re.search(r'id="pk-run-chart-data"[^>]*>(.*?)</script>', page, re.S).group(1)
    data = json.loads(raw)
    assert [d["cached_tokens"] for d in data["decisions"]] == [0, 500, 500, 800]
    assert [d["e2e_s"] for d in data["decisions"]] == [4.0, 4.5, 5.5, 6.2]
    assert data["ticks"] == [{"tick": 0, "hit_rate": 0.45}]
    assert data["lost"] == {"block_alignment": 21}


def test_compare_action_puts_runs_side_by_side_with_the_differences(admin_client, db):
    town = small_town_factory()
    naive = _answered_run(town, "naive", [0, 0, 0, 0])
    shared = _answered_run(town, "shared_head", [500, 500, 500, 500])
    response = admin_client.post(
        "/admin/town/run/",
        {"action": "compare_runs", "_selected_action": [naive.pk, shared.pk]},
    )
    assert response.status_code == 302
    assert response["Location"].endswith(f"/admin/town/run/compare/?ids={naive.pk},{shared.pk}")
    page = admin_client.get(response["Location"]).content.decode()
    table = page.split('id="pk-compare-table"')[1].split("</table>")[0]
    cells = [re.sub(r"<[^>]+>", " ", c).split() for c in re.findall(r"<tr>(.*?)</tr>", table, re.S)]
    rows = {" ".join(c[: c.index(next(x for x in c if x[0].isdigit()))]): c for c in cells[1:]}
    assert rows["token cache hit rate"][-3:] == ["50.00%", "+50.00", "pt"]
    assert rows["prefill, mean (s)"][-2:] == ["1.5", "-25.0%"]  # 2.0 → 1.5 s
    assert rows["end-to-end, median (s)"][-2:] == ["5", "-9.1%"]  # 5.5 → 5.0 s
    assert rows["prompt tokens, mean"][-2:] == ["1,000", "±0%"]
    assert "shared_head" in page and "naive" in page


def test_compare_needs_two_runs(admin_client, db):
    town = small_town_factory()
    run = _answered_run(town, "naive", [0])
    response = admin_client.post(
        "/admin/town/run/", {"action": "compare_runs", "_selected_action": [run.pk]}, follow=True
    )
    assert "Pick two or more runs to compare." in response.content.decode()
    bad = admin_client.get("/admin/town/run/compare/?ids=1,x", follow=True).content.decode()
    assert "give two or more existing run ids" in bad


def test_run_control_actions_report_refusals(admin_client, db):
    town = small_town_factory()
    run = services.run_create(town=town, nodes=["local"])
    admin_client.post("/admin/town/run/", {"action": "start_runs", "_selected_action": [run.pk]})
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    page = admin_client.post(
        "/admin/town/run/", {"action": "start_runs", "_selected_action": [run.pk]}, follow=True
    ).content.decode()
    assert "annot start run" in page and "it is running" in page


def _ticks_inline(run: Run, num_ticks: int) -> None:
    send = InlineSend(max_workers=run.concurrency)
    try:
        for _ in range(num_ticks):
            tick_run(run_id=run.pk, send=send, owner="test", poll_s=0.05)
    finally:
        send.shutdown()


@needs_chromium
def test_charts_and_compare_table_drawn_in_chromium(live_server, admin_user, tmp_path):
    """Two real runs of a tick each (the tiny model, computed in this process), then the run
    page and the compare page in chromium: every chart canvas has drawn something."""
    from playwright.sync_api import sync_playwright

    from town.demo import demo_town_create

    town = demo_town_create(seed=0)
    runs = []
    for layout in ["naive", "shared_head"]:
        # All ten residents' decisions of a tick in one batch: one wave of decode steps a tick,
        # not three (the charts draw the same series either way).
        run = services.run_create(town=town, nodes=["local"], layout=layout, concurrency=10)
        services.run_start(run=run)
        _ticks_inline(run, 1)
        runs.append(run)
    out_dir = Path(os.environ.get("POKOMACHI_SCREENSHOT_DIR") or tmp_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{live_server.url}/admin/login/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", "password")
        page.click("input[type=submit]")
        page.goto(f"{live_server.url}/admin/town/run/{runs[1].pk}/change/")
        page.wait_for_function("document.querySelectorAll('canvas').length === 4")
        drawn = page.evaluate(
            """() => [...document.querySelectorAll('.pk-charts canvas')].map((c) => {
                const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
                return n; })"""
        )
        assert all(n > 500 for n in drawn), drawn
        page.locator("#pk-run-charts").screenshot(path=str(out_dir / "admin-run-charts.png"))
        ids = ",".join(str(r.pk) for r in runs)
        page.goto(f"{live_server.url}/admin/town/run/compare/?ids={ids}")
        assert "pt" in page.inner_text("#pk-compare-table")
        page.locator("#content").screenshot(path=str(out_dir / "admin-compare.png"))
        # The lists fit a 1280 px wide screen: neither the page nor the list's own box (the
        # admin's .results, which scrolls sideways rather than widen the page) scrolls.
        page.set_viewport_size({"width": 1280, "height": 900})
        for name, path in [("runs", "run"), ("decisions", "decision")]:
            page.goto(f"{live_server.url}/admin/town/{path}/")
            widths = page.evaluate(
                """() => { const r = document.querySelector('#changelist .results');
                           return [document.documentElement.scrollWidth, r.scrollWidth,
                                   r.clientWidth]; }"""
            )
            page.screenshot(path=str(out_dir / f"admin-{name}-1280.png"))
            assert widths[0] <= 1280 and widths[1] <= widths[2], (name, widths)
        page.goto(f"{live_server.url}/admin/town/run/{runs[1].pk}/change/")
        page.screenshot(path=str(out_dir / "admin-run-page-1280.png"))
        browser.close()
    assert (out_dir / "admin-run-charts.png").stat().st_size > 10_000


def test_run_list_shows_each_runs_hit_rate_from_one_query(
    admin_client, db, django_assert_max_num_queries
):
    town = small_town_factory()
    _answered_run(town, "naive", [0, 0])
    _answered_run(town, "shared_head", [500, 300])
    with django_assert_max_num_queries(12):  # the same however many runs and decisions
        page = admin_client.get("/admin/town/run/").content.decode()
    assert "40.0%" in page and "0.0%" in page


def _control_forms(page: str) -> list[str]:
    return re.findall(r'action="/admin/town/run/\d+/control/(\w+)/"', page)


def test_a_created_run_is_editable_and_offers_start_step_stop(admin_client, db):
    run = services.run_create(town=small_town_factory(), nodes=["local"])
    page = admin_client.get(f"/admin/town/run/{run.pk}/change/").content.decode()
    assert 'name="layout"' in page and 'name="_save"' in page
    assert 'name="routing"' in page and 'id="pk-run-nodes"' in page  # its nodes, up or down
    assert _control_forms(page) == ["start", "step", "stop"]
    form = {"town": run.town_id, "layout": "naive", "model": run.model, "nodes": '["local"]'}
    form |= {"routing": "round_robin"}
    form |= {"concurrency": 2, "seed": 0, "diary_chars": 0, "temperature": 0.0, "max_tokens": 99}
    form |= {"start_minutes": 420, "minutes_per_tick": 60, "decision_timeout_s": 60.0}
    form |= {"quality": "{}"}
    response = admin_client.post(f"/admin/town/run/{run.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()
    run.refresh_from_db()
    assert (run.layout, run.concurrency, run.max_tokens) == ("naive", 2, 99)
    assert run.routing == "round_robin"


def test_a_started_run_is_read_only_and_its_buttons_call_the_services(admin_client, db):
    run = services.run_create(town=small_town_factory(), nodes=["local"], concurrency=3)
    response = admin_client.post(f"/admin/town/run/{run.pk}/control/start/", follow=True)
    page = response.content.decode()
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and f"Run {run.pk}: start → running" in page
    # Shown, not editable: no inputs, no save button; the settings still read.
    assert 'name="concurrency"' not in page and 'name="_save"' not in page
    assert '<div class="readonly">3</div>' in page
    assert _control_forms(page) == ["pause", "stop"]
    assert 'name="csrfmiddlewaretoken"' in page.split('id="pk-run-controls"')[1]
    edit = admin_client.post(f"/admin/town/run/{run.pk}/change/", {"concurrency": 9})
    assert edit.status_code == 403
    admin_client.post(f"/admin/town/run/{run.pk}/control/pause/")
    run.refresh_from_db()
    assert run.status == Run.Status.PAUSED
    page = admin_client.get(f"/admin/town/run/{run.pk}/change/").content.decode()
    assert _control_forms(page) == ["resume", "step", "stop"]
    admin_client.post(f"/admin/town/run/{run.pk}/control/step/")
    run.refresh_from_db()
    assert (run.status, run.num_steps_pending) == (Run.Status.PAUSED, 1)


def test_run_buttons_refuse_clearly(admin_client, django_user_model, client, db):
    run = services.run_create(town=small_town_factory(), nodes=["local"])
    services.run_stop(run=run)
    url = f"/admin/town/run/{run.pk}/control"
    assert admin_client.get(f"{url}/resume/").status_code == 405  # POST only
    page = admin_client.post(f"{url}/pause/", follow=True).content.decode()
    assert f"Cannot pause run {run.pk}: it is stopped" in page
    page = admin_client.post(f"{url}/explode/", follow=True).content.decode()
    assert "Unknown control &#x27;explode&#x27;; use start, pause, resume, step, stop" in page
    page = admin_client.post("/admin/town/run/999999/control/start/", follow=True)
    assert "No run with id &#x27;999999&#x27;" in page.content.decode()
    run.refresh_from_db()
    assert run.status == Run.Status.STOPPED
    # Staff who may only look at runs get no buttons, and the URL refuses them.
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_run"))
    client.force_login(viewer)
    page = client.get(f"/admin/town/run/{run.pk}/change/").content.decode()
    assert _control_forms(page) == [] and "needs the change permission" in page
    assert client.post(f"{url}/resume/").status_code == 403


def test_run_page_puts_controls_and_charts_before_the_form(admin_client, db):
    run = _answered_run(small_town_factory(), "shared_head", [0, 500])
    page = admin_client.get(f"/admin/town/run/{run.pk}/change/").content.decode()
    order = [page.index(mark) for mark in ['id="pk-run-controls"', 'id="pk-run-charts"']]
    assert order == sorted(order) and order[-1] < page.index('id="run_form"')


def test_memories_are_memories_and_the_models_need_no_migration(admin_client, db):
    page = admin_client.get("/admin/town/").content.decode()
    assert "Memories" in page and "Memorys" not in page
    call_command("makemigrations", "town", "--check", "--dry-run", stdout=io.StringIO())


def test_a_decisions_title_says_the_ticks_index_not_its_id(admin_client, db):
    town = small_town_factory()
    _answered_run(town, "naive", [0])
    run = _answered_run(town, "shared_head", [0])  # its tick 0 is the second tick row
    decision = run.decisions.order_by("id")[0]
    assert decision.tick.index == 0 and decision.tick_id != 0
    page = admin_client.get(f"/admin/town/decision/{decision.pk}/change/").content.decode()
    assert f"decision {decision.pk} (Aki @ tick 0: computed)" in page
    assert str(decision) == f"decision {decision.pk} (Aki @ tick 0: computed)"


def test_floats_are_rounded_with_the_full_value_on_hover(admin_client, db):
    run = _answered_run(small_town_factory(), "shared_head", [333])
    decision = run.decisions.get(num_prompt_tokens__isnull=False)
    Decision.objects.filter(pk=decision.pk).update(app_e2e_s=4.567891234, prefill_s=0.0123456789)
    listed = admin_client.get(f"/admin/town/decision/?run__id__exact={run.pk}").content.decode()
    assert '<span title="4.567891234">4.57</span>' in listed
    assert '<span title="333 / 1,000">33.3%</span>' in listed
    page = admin_client.get(f"/admin/town/decision/{decision.pk}/change/").content.decode()
    assert '<span title="0.0123456789">0.0123</span>' in page
    assert '<span title="4.567891234">4.57</span>' in page
    runs = admin_client.get("/admin/town/run/").content.decode()
    assert '<span title="333 / 1,000">33.3%</span>' in runs


def test_compare_warns_of_runs_of_different_lengths_and_takes_a_baseline(admin_client, db):
    town = small_town_factory()
    naive = _answered_run(town, "naive", [0, 0, 0, 0])
    shared = _answered_run(town, "shared_head", [500, 500, 500, 500])
    url = f"/admin/town/run/compare/?ids={naive.pk},{shared.pk}"
    page = admin_client.get(url).content.decode()
    assert 'id="pk-length-warning"' not in page
    assert f'<option value="{naive.pk}" selected>' in page

    Run.objects.filter(pk=shared.pk).update(num_ticks_done=3)
    page = admin_client.get(f"{url}&baseline={shared.pk}").content.decode()
    warning = page.split('id="pk-length-warning">')[1].split("</p>")[0]
    assert f"run {naive.pk}: 0, run {shared.pk}: 3" in warning
    assert f'<option value="{shared.pk}" selected>' in page
    table = page.split('id="pk-compare-table"')[1]
    assert table.index(f"run {shared.pk}</a>") < table.index(f"run {naive.pk}</a>")
    assert "-50.00 pt" in table  # naive against shared_head now

    for bad in ["abc", "999999"]:
        response = admin_client.get(f"{url}&baseline={bad}")
        assert response.status_code == 200
        page = response.content.decode()
        assert f"Baseline=&#x27;{bad}&#x27; is not one of the compared runs" in page
        assert f"Comparing against run {naive.pk}." in page and "+50.00 pt" in page


def test_run_page_and_compare_show_the_decision_quality_once_measured(admin_client, db):
    town = small_town_factory()
    measured = _answered_run(town, "shared_head", [0, 500])
    other = _answered_run(town, "naive", [0, 0])
    page = admin_client.get(f"/admin/town/run/{measured.pk}/change/").content.decode()
    assert f"manage.py town_quality --run {measured.pk}" in page  # not measured yet
    Decision.objects.filter(run=measured).update(
        status=D.APPLIED, action="stay", target="Home", valid=True, reason="I am comfy here."
    )
    call_command("town_quality", "--run", str(measured.pk), stdout=io.StringIO())
    page = admin_client.get(f"/admin/town/run/{measured.pk}/change/").content.decode()
    quality = page.split('id="pk-run-quality"')[1].split("</fieldset>")[0]
    assert "echo rate" in quality and "0.0%" in quality
    assert "sampled decisions" in quality and "I am comfy here." in quality
    url = f"/admin/town/run/compare/?ids={measured.pk},{other.pk}"
    table = admin_client.get(url).content.decode().split('id="pk-quality-table"')[1]
    row = re.search(r"<tr><td>distinct actions</td><td>(.*?)</td><td>(.*?)</td>", table)
    assert row.group(1).startswith("1 ") and row.group(2) == "-"  # the naive run: not measured


def test_a_decisions_page_shows_its_cached_tokens_by_kv_tier(admin_client, db):
    run = _answered_run(small_town_factory(), "shared_head", [800])
    decision = run.decisions.get(num_prompt_tokens__isnull=False)
    metrics = {"num_cached_tokens_host": 96, "num_cached_tokens_disk": 640, "kv_load_s": 0.0421}
    Decision.objects.filter(pk=decision.pk).update(metrics=metrics)
    page = admin_client.get(f"/admin/town/decision/{decision.pk}/change/").content.decode()
    assert "Cached by tier" in page
    assert "device pool 64 · host memory 96 · disk 640 (waited 0.042 s for them)" in page


def test_decision_page_says_which_weights_the_engine_ran(admin_client, db):
    run = _answered_run(small_town_factory(), "shared_head", [0])
    decision = run.decisions.order_by("id")[0]
    Decision.objects.filter(pk=decision.pk).update(metrics={"weights": "int4"})
    page = admin_client.get(f"/admin/town/decision/{decision.pk}/change/").content.decode()
    assert '<div class="readonly">int4</div>' in page  # its own field, not only the JSON
    Decision.objects.filter(pk=decision.pk).update(
        metrics={"weights": "int4", "kv_cache_dtype": "bfloat16"}
    )
    page = admin_client.get(f"/admin/town/decision/{decision.pk}/change/").content.decode()
    assert '<div class="readonly">int4 · KV cache bfloat16</div>' in page
