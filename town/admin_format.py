"""Numbers in the admin, rounded for people: three significant digits on the page, the full
value on hover (the title attribute). The raw JSON (a decision's metrics, the API) keeps every
digit."""

from __future__ import annotations

import math

from django.contrib import admin
from django.utils.html import format_html

SIGNIFICANT_DIGITS = 3


def significant(value: float | None, digits: int = SIGNIFICANT_DIGITS) -> str:
    """`value` to `digits` significant digits, thousands separated, never in e-notation:
    1234.5 → "1,230", 0.0123456 → "0.0123", 9.996 → "10.0"; None → "-"."""
    if value is None:
        return "-"
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    # Round in e-notation first: 9.996 becomes 10.0, whose exponent is one more.
    rounded = float(f"{value:.{digits - 1}e}")
    exponent = math.floor(math.log10(abs(rounded)))
    return f"{rounded:,.{max(digits - 1 - exponent, 0)}f}"


def rounded_html(value: float | None, *, suffix: str = "", title: str | None = None) -> str:
    """The rounded value in a span whose title holds the full one (or `title`)."""
    if value is None:
        return "-"
    full = repr(value) if title is None else title
    return format_html('<span title="{}">{}{}</span>', full, significant(value), suffix)


def percent_html(part: int | None, whole: int | None) -> str:
    """part / whole in percent, rounded, the two counts on hover; "-" without a whole."""
    if not whole:
        return "-"
    part = part or 0
    return rounded_html(100 * part / whole, suffix="%", title=f"{part:,} / {whole:,}")


def rounded_field(name: str, description: str | None = None):
    """A ModelAdmin display of the float field `name`, rounded (list_display, readonly fields)."""

    @admin.display(description=description or name.replace("_", " "), ordering=name)
    def display(model_admin, obj) -> str:
        return rounded_html(getattr(obj, name))

    return display
