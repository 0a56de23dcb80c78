"""The API's JSON parser: DRF's, strict (NaN and Infinity are not JSON), and a body nested too
deep for Python's parser (a RecursionError, a 500 in DRF's own) is a 400 that says so."""

from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class BoundedJSONParser(JSONParser):
    strict = True

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply") from None
