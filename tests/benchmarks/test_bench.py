"""The benchmark's own parts: the workload generator, the decision check, the summaries and
ratios, and the CLI end to end on the tiny random model (a few seconds)."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from benchmarks import town
from benchmarks.__main__ import main
from benchmarks.lib.baseline_transformers import run_transformers
from benchmarks.lib.floor import Floor, decode_target_line, workload_counts
from benchmarks.lib.report import format_table, ratios, summarize, to_json
from benchmarks.lib.results import RequestRecord, RunResult
from benchmarks.lib.workload import (
    ACTIONS,
    DECISION_MAX_TOKENS,
    REASON_MAX_CHARS,
    build_workload,
    candidate_place_names,
    decision_schema,
    is_valid_decision,
)

SMALL = dict(num_requests=3, head_tokens=500, prompt_token_range=(620, 800))


def test_workload_is_deterministic_from_the_seed(tokenizer) -> None:
    first = build_workload(tokenizer, seed=7, **SMALL)
    assert build_workload(tokenizer, seed=7, **SMALL) == first
    assert build_workload(tokenizer, seed=8, **SMALL).requests != first.requests


def test_workload_shares_a_head_of_the_asked_size(tokenizer) -> None:
    workload = build_workload(tokenizer, seed=1, **SMALL)
    systems = {request[0]["content"] for request in workload.requests}
    assert len(systems) == 1
    assert [request[1]["role"] for request in workload.requests] == ["user"] * 3
    assert 450 <= workload.num_head_tokens <= 500
    assert workload.num_shared_prefix_tokens >= workload.num_head_tokens
    for request, count in zip(workload.requests, workload.prompt_token_counts, strict=True):
        assert count == len(tokenizer.apply_chat_template(request))
        assert 620 <= count <= 800 + 120  # the last memory may overshoot a little
    targets = workload.schema["properties"]["target"]["enum"]
    assert all(f"| {name} |" in workload.requests[0][0]["content"] for name in targets)


def test_default_workload_has_the_town_shape(tokenizer) -> None:
    workload = build_workload(tokenizer, seed=0)
    assert len(workload.requests) == 8
    assert 1100 <= workload.num_head_tokens <= 1200
    assert all(1500 <= n <= 2600 for n in workload.prompt_token_counts)


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        (dict(num_requests=0), "num_requests"),
        (dict(head_tokens=300), "too small"),
        (dict(head_tokens=1200, prompt_token_range=(1250, 2000)), "prompt_token_range"),
        (dict(head_tokens=1200, prompt_token_range=(2000, 1500)), "prompt_token_range"),
        (dict(head_tokens=50_000, prompt_token_range=(60_000, 60_000)), "too large"),
    ],
)
def test_workload_rejects_impossible_sizes(tokenizer, sizes, message) -> None:
    with pytest.raises(ValueError, match=message):
        build_workload(tokenizer, **sizes)


def test_is_valid_decision_checks_every_constraint() -> None:
    schema = decision_schema(["Kamome Cafe", "Hoshi Park"])
    ok = {"action": "go_to", "target": "Hoshi Park", "reason": "A walk in the park before lunch, "
          "while the sun is still out."}  # fmt: skip
    assert is_valid_decision(json.dumps(ok), schema)
    bad = [
        '{"action": "go_to", "target": "Hoshi Park", "reason": "cut',
        json.dumps({**ok, "action": "fly"}),
        json.dumps({**ok, "target": "Tokyo Tower"}),
        json.dumps({**ok, "reason": "x" * 101}),
        json.dumps({**ok, "reason": "Too short."}),
        json.dumps({**ok, "reason": ok["reason"].replace("lunch", "12:00")}),
        json.dumps({**ok, "mood": "happy"}),
        json.dumps({"action": "go_to", "target": "Hoshi Park"}),
        json.dumps({**ok, "reason": 3}),
        json.dumps([ok]),
    ]
    assert [is_valid_decision(text, schema) for text in bad] == [False] * len(bad)


def _record(prompt, cached, output, prefill, decode, text="") -> RequestRecord:
    return RequestRecord(
        num_prompt_tokens=prompt,
        num_cached_tokens=cached,
        num_output_tokens=output,
        queue_s=0.5,
        prefill_s=prefill,
        decode_s=decode,
        e2e_s=0.5 + prefill + decode,
        text=text,
        finish_reason="stop",
    )


def _runs() -> list[RunResult]:
    schema = decision_schema(["Hoshi Park"])
    valid = json.dumps({"action": "stay", "target": "Hoshi Park", "reason": "r" * 60})
    cached = [_record(2000, 1184, 11, 1.0, 2.0, valid), _record(1000, 0, 21, 3.0, 4.0, "{")]
    uncached = [_record(2000, 0, 11, 5.0, 2.0, valid), _record(1000, 0, 21, 5.0, 4.0, valid)]
    no_schema = [_record(2000, 1184, 11, 1.0, 1.0), _record(1000, 0, 21, 3.0, 2.0)]
    baseline = [_record(2000, 0, 11, 9.0, 3.0)]
    return [
        RunResult("cached", "on", cached, wall_s=30.0, schema=schema),
        RunResult("uncached", "off", uncached, wall_s=60.0, schema=schema),
        RunResult("no_schema", "free", no_schema, wall_s=20.0, schema=None),
        RunResult("transformers", "hf", baseline, wall_s=60.0, schema=None, notes=["no schema"]),
    ]


def test_summary_numbers() -> None:
    summary = summarize(_runs()[0])
    assert summary.requests_per_min == pytest.approx(4.0)
    assert summary.token_cache_hit_rate == pytest.approx(1184 / 3000)
    assert summary.mean_cached_tokens == pytest.approx(592)
    assert summary.mean_prefill_s == pytest.approx(2.0)
    assert summary.mean_decode_s == pytest.approx(3.0)
    assert summary.median_e2e_s == pytest.approx((3.5 + 7.5) / 2)
    assert summary.output_tokens_per_s == pytest.approx(32 / 30)
    assert summary.decode_s_per_token == pytest.approx(6.0 / 30)  # 10 + 20 steps after the first
    assert summary.num_valid_json == 1
    assert summarize(_runs()[2]).num_valid_json is None


def test_ratios_against_the_targets() -> None:
    summaries = {run.name: summarize(run) for run in _runs()}
    by_name = {r.name: r for r in ratios(summaries)}
    assert by_name["engine_vs_transformers_requests_per_min"].value == pytest.approx(4.0)
    assert by_name["engine_vs_transformers_requests_per_min"].passed is False
    assert by_name["prefill_cached_over_uncached"].value == pytest.approx(0.4)
    assert by_name["prefill_cached_over_uncached"].passed is True
    assert by_name["decode_per_token_schema_over_no_schema"].value == pytest.approx(2.0)
    assert by_name["decode_per_token_schema_over_no_schema"].passed is False
    del summaries["transformers"]
    skipped = {r.name: r for r in ratios(summaries)}["engine_vs_transformers_requests_per_min"]
    assert skipped.value is None and skipped.passed is None


def test_table_and_json_carry_every_run() -> None:
    runs = _runs()
    summaries = {run.name: summarize(run) for run in runs}
    table = format_table(runs, summaries)
    assert table.splitlines()[0] == "| metric | cached | uncached | no_schema | transformers |"
    assert "| completed requests/min | 4.00 | 2.00 | 6.00 | 1.00 |" in table
    assert "| valid JSON outputs | 1/2 | 2/2 | n/a (no schema) | n/a (no schema) |" in table
    assert "prefill_cached_over_uncached: 0.400 (target ≤ 0.4) PASS" in table
    assert "- transformers: no schema" in table
    data = json.loads(to_json({"seed": 3}, runs, summaries))
    assert data["seed"] == 3
    assert list(data["runs"]) == ["cached", "uncached", "no_schema", "transformers"]
    assert data["runs"]["cached"]["num_valid_json"] == 1
    assert data["ratios"]["engine_vs_transformers_requests_per_min"]["passed"] is False


def test_baseline_refuses_random_weights(tokenizer) -> None:
    workload = build_workload(tokenizer, seed=0, **SMALL)
    with pytest.raises(ValueError, match="--skip-baseline"):
        run_transformers(
            workload, model="smollm2-tiny-random", num_requests=1, output_token_counts=[4]
        )


def test_cli_runs_the_engine_and_prints_json(capsys) -> None:
    argv = ["town", "--model", "smollm2-tiny-random", "--requests", "3", "--concurrency", "2",
            "--head-tokens", "500", "--prompt-tokens", "620-800", "--runs", "cached",
            "--json"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    run = data["runs"]["cached"]
    assert run["num_requests"] == 3
    assert run["num_valid_json"] == 3  # the schema holds even for random weights
    assert run["mean_prompt_tokens"] == pytest.approx(sum(data["workload"]["prompt_tokens"]) / 3)
    # Two in flight at once, three requests: at least the third reuses the shared head.
    assert run["mean_cached_tokens"] > 0
    assert run["engine_stats"]["prefix_cache_hits"] == round(run["mean_cached_tokens"] * 3)
    assert data["machine"]["nproc"] >= 1


def test_cli_ngram_run_matches_the_cached_run_and_reports_its_drafts(capsys) -> None:
    argv = ["town", "--model", "smollm2-tiny-random", "--requests", "2", "--concurrency", "2",
            "--head-tokens", "500", "--prompt-tokens", "620-700", "--runs", "cached,ngram",
            "--json"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    ngram, cached = data["runs"]["ngram"], data["runs"]["cached"]
    assert ngram["notes"] == ["outputs identical to cached's: 2/2"]
    assert ngram["mean_output_tokens"] == cached["mean_output_tokens"]
    assert cached["spec_acceptance_rate"] is None
    stats = ngram["engine_stats"]
    if stats["num_spec_verifications"]:  # random weights: drafts only where outputs repeat
        assert ngram["spec_tokens_per_step"] >= 1
    assert data["ratios"]["ngram_requests_per_min_over_cached"]["value"] > 0


def test_cli_rejects_unknown_runs(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["town", "--runs", "cached,fastest"])
    assert "unknown ['fastest']" in capsys.readouterr().err


def test_max_tokens_default_fits_the_longest_decision(tokenizer) -> None:
    worst = max(
        len(tokenizer.encode(f'{{"action":"{a}","target":"{t}","reason":"'))
        for a in ACTIONS
        for t in candidate_place_names()
    )
    # The reason: at most one token per character; then `"}` and EOS.
    assert worst + REASON_MAX_CHARS + 3 <= DECISION_MAX_TOKENS


def test_cli_retention_sweep_reuses_the_exact_head_down_to_each_grid(capsys) -> None:
    argv = ["retention-sweep", "--model", "gemma3-tiny-random", "--requests", "3",
            "--concurrency", "2", "--head-tokens", "600", "--retention-interval",
            "512,dense,prompt-end", "--max-tokens", "4", "--json"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    sweep = data["retention_sweep"]
    assert list(sweep) == ["off", "512", "dense", "prompt-end"]
    assert data["workload"]["shared_prefix_tokens"] == 600
    # After the first request: 600 shared tokens = 37 whole blocks (592) + 8 (alignment).
    expected = {"off": (0, 0, 0), "512": (512, 80, 8), "dense": (592, 0, 8),
                "prompt-end": (0, 592, 8)}  # fmt: skip
    for label, (reused, retention, alignment) in expected.items():
        run = sweep[label]
        if label == "off":
            assert run["reused"] == 0 and run["checkpoint_memory_mib"] == 0
            continue
        assert (run["reused"], run["lost_to_retention"]) == (reused, retention), label
        assert run["lost_to_alignment"] == alignment
        assert run["checkpoint_memory_mib"] > 0
        for m in run["per_request"]:
            lost = m["num_lost_to_retention"] + m["num_lost_to_alignment"]
            lost += m["num_lost_to_eviction"] + m["num_cold_tokens"]
            assert m["num_cached_tokens"] + lost == m["num_prompt_tokens"]


def test_cli_rejects_a_bad_retention_interval(capsys) -> None:
    assert main(["retention-sweep", "--retention-interval", "2048,often"]) == 2
    assert "'often' is not a number of tokens" in capsys.readouterr().err
    argv = ["retention-sweep", "--model", "gemma3-tiny-random", "--requests", "2",
            "--head-tokens", "600", "--retention-interval", "1000"]  # fmt: skip
    assert main(argv) == 2
    assert "multiple of block_size" in capsys.readouterr().err


def test_cli_exact_reuse_sweep_reuses_the_whole_head_at_every_interval(capsys) -> None:
    argv = ["retention-sweep", "--model", "gemma3-tiny-random", "--requests", "3",
            "--concurrency", "2", "--head-tokens", "600", "--retention-interval", "512,prompt-end",
            "--exact-reuse", "--max-tokens", "4", "--json"]  # fmt: skip
    assert main(argv) == 0
    sweep = json.loads(capsys.readouterr().out)["retention_sweep"]
    for label in ("512", "prompt-end"):
        assert (sweep[label]["reused"], sweep[label]["lost_to_retention"]) == (600, 0), label
        assert sweep[label]["lost_to_alignment"] == 0


def test_cli_fanout_computes_the_shared_head_once(capsys) -> None:
    argv = ["fanout", "--model", "gemma3-tiny-random", "--requests", "4", "--head-tokens",
            "400", "--tail-tokens", "20", "--max-tokens", "2", "--retention-interval", "4096",
            "--json"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    on, off = data["fanout"]["runs"]
    assert on["enable_shared_prefill"] and not off["enable_shared_prefill"]
    assert on["num_prefill_tokens"] == 400 + 4 * 20
    assert off["num_prefill_tokens"] > on["num_prefill_tokens"]
    assert sorted(on["reused"]) == [0, 400, 400, 400]
    assert data["fanout"]["ttft_ratio_off_over_on"] > 0


def test_workload_counts_compute_the_head_once_and_batch_the_decode_steps() -> None:
    counts = workload_counts([150, 130], [0, 100], 100, num_sampled_tokens=2 + 9, concurrency=4)
    assert counts.num_new_tokens == 100 + 50 + 30
    # The head over itself (causal), each tail over the head and over itself (causal).
    assert counts.num_pairs == 100 * 100 / 2 + (50 * 100 + 50 * 50 / 2) + (30 * 100 + 30 * 30 / 2)
    assert counts.num_decode_steps == 3  # 9 tokens after the two first ones, 4 a step
    assert counts.keys_per_step == 100 + 4 * 40
    assert counts.uncached_tokens == 280
    assert counts.uncached_pairs == 150 * 150 / 2 + 130 * 130 / 2


def test_workload_counts_reuse_a_prompt_tick_2_repeats() -> None:
    # Tick 2 asks the same resident again: its prompt starts with 140 of tick 1's 150 tokens.
    counts = workload_counts([150, 160], [0, 140], 100, num_sampled_tokens=2, concurrency=4)
    assert counts.num_new_tokens == 150 + 20
    assert counts.num_pairs == 150 * 150 / 2 + (20 * 140 + 20 * 20 / 2)


def test_two_tick_workload_reuses_each_residents_own_head_on_tick_2(tokenizer) -> None:
    workload = build_workload(tokenizer, num_requests=4, head_tokens=500,
                              prompt_token_range=(900, 1000), ticks=2)  # fmt: skip
    counts, reused = workload.prompt_token_counts, workload.prompt_reused_tokens
    # Tick 1: the first prompt is all new, the second resident reuses about the shared head.
    assert reused[0] == 0
    assert workload.num_shared_prefix_tokens <= reused[1] < workload.num_shared_prefix_tokens + 20
    # Tick 2: each resident's prompt starts with its tick-1 prompt's own head (hundreds of
    # tokens past the shared one), and its tick's own tail is new.
    for r, n in zip(reused[2:], counts[2:], strict=True):
        assert reused[1] + 100 < r < n


def test_floor_is_timed_once_the_engine_thread_has_ended(monkeypatch, capsys) -> None:
    # Timed beside a live engine thread, the floor's torch ops share the CPUs with a second
    # OpenMP team and read slower than they are.
    real, threads_seen = town.measure_floor, []
    before = set(threading.enumerate())  # other tests' engines (tokenizer) may be alive

    def measure_floor(*args, **kwargs):
        threads_seen.append([t.name for t in threading.enumerate() if t not in before])
        return real(*args, **kwargs)

    monkeypatch.setattr(town, "measure_floor", measure_floor)
    argv = ["town", "--model", "smollm2-tiny-random", "--requests", "2", "--concurrency", "2",
            "--head-tokens", "500", "--prompt-tokens", "620-700", "--runs", "cached"]  # fmt: skip
    assert main(argv) == 0
    assert "compute floor (no engine reaches it):" in capsys.readouterr().out
    assert len(threads_seen) == 1 and "llm-engine-loop" not in threads_seen[0]


def test_cli_prints_the_compute_floor_next_to_the_cached_run(capsys) -> None:
    argv = ["town", "--model", "smollm2-tiny-random", "--requests", "2", "--concurrency", "2",
            "--head-tokens", "500", "--prompt-tokens", "620-700", "--runs", "cached"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "compute floor (no engine reaches it):" in out
    assert "engine (cached) at " in out
    assert main([*argv, "--json"]) == 0
    floor = json.loads(capsys.readouterr().out)["compute_floor"]
    parts = floor["prefill_linear_s"] + floor["prefill_attention_s"] + floor["decode_s"]
    assert floor["total_s"] == pytest.approx(parts) and parts > 0
    assert floor["requests_per_min"] == pytest.approx(2 * 60 / parts)
    # Caching saves prefill work (the head is computed once), never adds any.
    assert 0 < floor["prefill_cached_over_uncached"] < 1


def test_two_tick_workload_repeats_each_residents_own_head(tokenizer) -> None:
    workload = build_workload(tokenizer, seed=3, ticks=2, **{**SMALL, "num_requests": 4})
    assert len(workload.requests) == 4
    tick1, tick2 = workload.requests[:2], workload.requests[2:]
    for first, second in zip(tick1, tick2, strict=True):
        a, b = first[1]["content"], second[1]["content"]
        head = a[: a.index("\n## Now")]
        assert b.startswith(head) and a != b  # the resident's head repeats, the tail does not
        assert first[0] == second[0]  # and the shared system head
    assert tick1[0][1]["content"][:40] != tick1[1][1]["content"][:40]  # two residents
    with pytest.raises(ValueError, match="ticks"):
        build_workload(tokenizer, ticks=2, **{**SMALL, "num_requests": 3})


def test_llamacpp_run_refuses_random_weights(tokenizer) -> None:
    from benchmarks.lib.baseline_llamacpp import run_llamacpp

    workload = build_workload(tokenizer, seed=0, **SMALL)
    with pytest.raises(ValueError, match="real weights"):
        run_llamacpp(
            workload,
            model="smollm2-tiny-random",
            tokenizer=tokenizer,
            output_token_counts=[4] * 3,
        )


def test_cli_two_ticks_with_quantized_weights_reports_the_format(capsys) -> None:
    argv = ["town", "--model", "smollm2-tiny-random", "--requests", "4", "--concurrency", "2",
            "--head-tokens", "500", "--prompt-tokens", "620-700", "--runs", "cached",
            "--ticks", "2", "--weights", "int8,fp32", "--prefill-chunk-while-decoding", "64",
            "--json"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workload"]["ticks"] == 2 and data["workload"]["weights"] == "int8,fp32"
    assert data["runs"]["cached"]["num_valid_json"] == 4
    assert data["runs"]["cached_fp32"]["num_valid_json"] == 4
    assert data["ratios"]["cached_over_cached_fp32_requests_per_min"]["value"] > 0
    floor = data["compute_floor"]
    assert floor["decode_weights_s"] > 0 and floor["decode_keys_s"] > 0
    parts = floor["decode_weights_s"] + floor["decode_keys_s"]
    assert floor["decode_step_s"] == pytest.approx(parts)


def test_decode_target_line_says_what_the_floor_leaves_a_step() -> None:
    floor = Floor(1.0, 1.0, 1.0, 8, decode_weights_s=0.0153, decode_keys_s=0.0116)
    line = decode_target_line(floor, 0.0140)
    assert "llama.cpp's 14.0 ms a token" in line
    assert "allows a step of 28.0 ms: the floor leaves 1.1 ms (4%) for the rest" in line
    short = decode_target_line(floor, 0.0120)  # a floor above what the target allows
    assert "allows a step of 24.0 ms: the floor is 2.9 ms (12%) over it" in short


def test_cli_kv_cache_dtypes_and_decode_alone_are_reported(capsys) -> None:
    argv = ["town", "--model", "smollm2-tiny-random", "--requests", "4", "--concurrency", "2",
            "--head-tokens", "500", "--prompt-tokens", "620-700", "--runs", "cached",
            "--kv-cache-dtype", "bfloat16,float32", "--json"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workload"]["kv_cache_dtype"] == "bfloat16,float32"
    assert data["runs"]["cached"]["engine_stats"]["kv_cache_dtype"] == "bfloat16"
    assert data["runs"]["cached_kv_float32"]["engine_stats"]["kv_cache_dtype"] == "float32"
    for run in ("cached", "cached_kv_float32"):  # decode alone, 2 in flight and 1
        assert data["runs"][run]["steady_decode_s_per_token"] > 0
        assert data["runs"][run]["steady_decode_single_s_per_token"] > 0
    # llama.cpp did not run: the ratios against it are skipped, not made up.
    steady = data["ratios"]["engine_steady_per_request_decode_vs_llamacpp"]
    assert steady["value"] is None and steady["passed"] is None


def test_steady_decode_ratios_divide_llamacpps_decode_by_the_engines_step() -> None:
    runs = _runs()
    steady = dataclasses.replace(runs[0], steady_decode_s_per_token=0.04)
    llamacpp = dataclasses.replace(runs[3], name="llamacpp")
    summaries = {run.name: summarize(run) for run in (steady, llamacpp)}
    by_name = {r.name: r for r in ratios(summaries, concurrency=4)}
    per_request = summaries["llamacpp"].decode_s_per_token / 0.04
    assert by_name["engine_steady_per_request_decode_vs_llamacpp"].value == pytest.approx(
        per_request
    )
    aggregate = by_name["engine_steady_aggregate_decode_vs_llamacpp_single_stream"]
    assert aggregate.value == pytest.approx(4 * per_request)


def test_steady_decode_cli_prints_both_rates(capsys) -> None:
    argv = ["--model", "smollm2-tiny-random", "--tokens", "3", "--concurrency", "2",
            "--kv-cache-dtype", "bfloat16"]  # fmt: skip
    assert main(["steady-decode", *argv]) == 0
    line = capsys.readouterr().out
    assert "bfloat16 KV cache" in line and "at 2 in flight" in line and "ms at 1" in line
