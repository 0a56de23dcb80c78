"""`python -m benchmarks v4-step` and the GPU benchmark's V4 section, on this machine's CPU with
the tiny V4 model's shape packed (FP8 linears, FP4 experts): the bytes a step reads are counted
from the router's own choices, grow with the sequences in flight, and the JSON carries them."""

from __future__ import annotations

import json

import pytest

from benchmarks.__main__ import build_parser, main
from benchmarks.lib.gpu_v4 import run_v4_section, v4_table
from benchmarks.v4_step import checkpoint_config

TINY = checkpoint_config("tiny")
# One routed expert of the tiny model packed FP4: gate/up (2 · 64, 128) and down (128, 64),
# half a byte a weight and an e8m0 byte per 32 inputs.
EXPERT_BYTES = 3 * 64 * 128 // 2 + 3 * 64 * 128 // 32


def test_cli_parses_the_mode_and_its_options() -> None:
    argv = ["v4-step", "--size", "tiny", "--layers", "2", "--in-flight", "1,2", "--device",
            "cpu", "--json-out", "out.json"]  # fmt: skip
    args = build_parser().parse_args(argv)
    assert args.main.__module__ == "benchmarks.v4_step"
    assert (args.size, args.layers, args.in_flight, args.json_out) == ("tiny", 2, "1,2", "out.json")
    assert checkpoint_config("mid", 2)["layer_types"] == checkpoint_config("mid")["layer_types"][:2]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--in-flight", "2,4"], "starts at 1"),
        (["--in-flight", "1,x"], "comma-separated"),
        (["--size", "tiny", "--layers", "7"], "--layers must be in"),
    ],
)
def test_cli_refuses_bad_options(argv, message, capsys) -> None:
    assert main(["v4-step", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cpu_step_bytes_grow_with_in_flight_and_the_json_has_them(tmp_path, capsys) -> None:
    out = tmp_path / "v4.json"
    argv = ["v4-step", "--size", "tiny", "--checkpoint", str(tmp_path / "ckpt"), "--in-flight",
            "1,2", "--prompt-tokens", "32", "--steps", "4", "--json-out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| 2 |" in printed and "bytes(n)/bytes(1)" in printed
    data = json.loads(out.read_text())
    assert {"command", "machine", "checkpoint", "rows", "bound", "holds"} <= data.keys()
    one, two = data["rows"]
    fields = {"in_flight", "step_s", "bytes", "tokens_per_s", "gb_per_s", "step_ratio",
              "bytes_ratio", "quotient", "holds", "distinct_experts_per_layer"}  # fmt: skip
    assert fields <= one.keys()
    assert (one["in_flight"], two["in_flight"]) == (1, 2)
    assert one["num_steps"] == two["num_steps"] == 3  # 4 decode steps, each timed to the next
    # One token picks top_k distinct experts in every MoE layer, hash-routed ones included.
    num_layers, top_k = TINY["num_hidden_layers"], TINY["num_experts_per_tok"]
    assert one["distinct_experts_per_layer"] == top_k
    assert one["expert_bytes"] == num_layers * top_k * EXPERT_BYTES
    assert top_k <= two["distinct_experts_per_layer"] <= 2 * top_k
    assert two["bytes"] > one["bytes"] and two["state_bytes"] > one["state_bytes"]
    assert two["bytes_ratio"] == pytest.approx(two["bytes"] / one["bytes"])
    assert one["step_s"] > 0 and one["quotient"] == 1.0
    # The checkpoint is reused, and refused where it is not the shape asked for.
    assert main([*argv[:5], "--layers", "2"]) == 2
    assert "holds another checkpoint" in capsys.readouterr().err


def test_gpu_v4_section_runs_on_the_cpu() -> None:
    result = run_v4_section("cpu", quick=True, size="tiny", in_flight=(1, 2), prompt_tokens=32)
    assert [row.in_flight for row in result.rows] == [1, 2]
    assert result.prefill_tokens_per_s > 0
    text = v4_table(result, copy_gbs=None, device_name="cpu")
    assert "| 16 |" not in text and "| 2 |" in text and "prefill, one 32-token prompt" in text
