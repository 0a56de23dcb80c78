"""models/logits_head.py: the compiled logits loop against F.linear, and when LogitsHead runs it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inference.engine.models import logits_head
from inference.engine.models.logits_head import MAX_COMPILED_ROWS, LogitsHead, compiled_logits


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    # Summed in another order than the BLAS: equal to float32 rounding, not bit for bit.
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8, 17, MAX_COMPILED_ROWS])
def test_the_loop_gives_f_linears_logits(rows):
    generator = torch.Generator().manual_seed(rows)
    # 1,001 vocabulary rows: not a multiple of the four the loop takes at a time.
    weight = torch.randn(1001, 37, generator=generator)
    h = torch.randn(rows, 37, generator=generator)
    _close(compiled_logits(h, weight), F.linear(h, weight))
    # A row of h that is a view (every other row of a larger batch) reads the same.
    wide = torch.randn(2 * rows, 37, generator=generator)
    _close(compiled_logits(wide[::2], weight), F.linear(wide[::2], weight))


def _head(compiled: bool) -> LogitsHead:
    head = LogitsHead(24, 203)
    with torch.no_grad():
        head.weight.copy_(torch.randn(203, 24, generator=torch.Generator().manual_seed(1)))
    head.compiled = compiled
    return head


def _counting(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = logits_head.compiled_logits

    def counted(h, weight):
        calls.append(h.shape[0])
        return real(h, weight)

    monkeypatch.setattr(logits_head, "compiled_logits", counted)
    return calls


def test_the_head_runs_the_loop_only_where_it_was_chosen_and_takes_the_rows(monkeypatch):
    calls = _counting(monkeypatch)
    h = torch.randn(MAX_COMPILED_ROWS + 1, 24)
    head, not_chosen = _head(True), _head(False)
    with torch.inference_mode():
        want = F.linear(h, head.weight)
        _close(not_chosen(h[:8]), want[:8])
        assert calls == []  # not chosen
        _close(head(h[:8]), want[:8])
        _close(head(h), want)  # past MAX_COMPILED_ROWS: F.linear
        _close(head(h[None, :8])[0], want[:8])  # not (rows, hidden): F.linear
    assert calls == [8]
    with torch.enable_grad():  # a gradient asked for: F.linear, which records it
        grad_h = h[:2].clone().requires_grad_()
        head(grad_h).sum().backward()
    assert calls == [8] and grad_h.grad is not None


def test_choose_times_both_and_says_which_it_kept(monkeypatch):
    calls = _counting(monkeypatch)
    head = _head(False)
    line = head.choose(rounds=2)
    assert calls, "the loop was timed"
    kept = "compiled loop" if head.compiled else "torch"
    assert line.startswith(f"logits head: {kept} (1 and 8 rows: loop ")
    assert head.choose(rounds=1).startswith("logits head:")
    # A loop that is always slower than F.linear is never kept.
    monkeypatch.setattr(logits_head, "CHOICE_MARGIN", 0.0)
    assert head.choose(rounds=1).startswith("logits head: torch (") and not head.compiled


def test_a_head_not_in_float32_keeps_torch():
    head = LogitsHead(8, 16).to(torch.bfloat16)
    assert head.choose() == "logits head: torch (not fp32 on the CPU)"
    assert not head.compiled
