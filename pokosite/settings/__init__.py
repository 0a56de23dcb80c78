"""Settings modules: base (local development, the default), production, test (pytest)."""
