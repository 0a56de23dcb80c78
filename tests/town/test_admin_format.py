"""Floats rounded for people in the admin: three significant digits, the full value on hover."""

from __future__ import annotations

import math

import pytest

from town.admin_format import percent_html, rounded_html, significant


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (4.567891234, "4.57"),
        (0.0123456789, "0.0123"),
        (0.000100049, "0.000100"),
        (12.345, "12.3"),
        (123.45, "123"),
        (1234.5, "1,230"),
        (98765.4321, "98,800"),
        (9.996, "10.0"),  # rounding carries into a new digit: still three
        (0.9996, "1.00"),
        (-0.5, "-0.500"),
        (3.0, "3.00"),
        (0.0, "0"),
        (math.inf, "inf"),
        (None, "-"),
    ],
)
def test_significant_keeps_three_digits_without_e_notation(value, shown):
    assert significant(value) == shown


def test_rounded_html_puts_the_full_value_in_the_title():
    assert rounded_html(4.567891234) == '<span title="4.567891234">4.57</span>'
    assert rounded_html(None) == "-"
    assert rounded_html(0.5, suffix=" s", title="half") == '<span title="half">0.500 s</span>'


def test_percent_html_shows_the_counts_on_hover():
    assert percent_html(1800, 4000) == '<span title="1,800 / 4,000">45.0%</span>'
    assert percent_html(None, 1000) == '<span title="0 / 1,000">0%</span>'
    assert percent_html(1, 3) == '<span title="1 / 3">33.3%</span>'
    assert percent_html(5, None) == "-" and percent_html(0, 0) == "-"
