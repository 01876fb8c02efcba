from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _private_db(tmp_path, monkeypatch):
    """Never touch the user's database from a test."""
    monkeypatch.setenv("STORMDROP_DB", os.fspath(tmp_path / "default.db"))
