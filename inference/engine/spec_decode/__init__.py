"""Speculative decoding: drafters that propose a decoding request's next tokens, and the
greedy verification that keeps the longest prefix the model itself would have produced.

The step (scheduler and runner) is described once, in verify.py.
"""
