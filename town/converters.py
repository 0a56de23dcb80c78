"""URL converters: `<id:...>`, an id of at most 18 digits (a BigAutoField's range), so a longer
number in a page, API or WebSocket URL is a 404 and never an overflow in the database lookup."""

from __future__ import annotations

from django.urls import register_converter
from django.urls.converters import get_converters

from town.api.fields import ID_REGEX


class IdConverter:
    regex = ID_REGEX

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


def register() -> None:
    if "id" not in get_converters():
        register_converter(IdConverter, "id")
