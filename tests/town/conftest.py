"""Fixtures for the town's tests.

demo_town -> Town           the seeded demo town (seed 0), on the test database.
smollm2_tokenizer -> Tokenizer   the real SmolLM2 tokenizer and chat template, from the bundled
                            GGUF (no model weights loaded); session-wide.
web_server, browser         daphne serving the site, and Debian's chromium: see
                            tests/town/browser_fixtures.py.
"""

from __future__ import annotations

import pytest

from tests.town.browser_fixtures import (  # noqa: F401 (fixtures)
    _module_web_server,
    browser,
    web_server,
)
from town.demo import demo_town_create


@pytest.fixture
def demo_town(db):
    return demo_town_create(seed=0)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from inference.engine.loading.gguf_file import open_gguf, read_metadata
    from inference.engine.loading.model_files import gguf_path_for
    from inference.engine.loading.tokenizer import Tokenizer

    path = gguf_path_for("smollm2-135m-instruct")
    return Tokenizer.from_gguf_metadata(read_metadata(open_gguf(path)))
