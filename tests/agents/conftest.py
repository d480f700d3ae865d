"""Fixtures of the tests that drive the real Claude Code (tests/helpers/claude_code.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.claude_code import ClaudeCode, require_claude
from helpers.messages_api import MessagesAPI


@pytest.fixture
def claude(tmp_path: Path) -> Iterator[ClaudeCode]:
    """An offline Claude Code user under tmp_path, its model an empty script.

    The test scripts the model with ``claude.api.extend([...])``; whatever it
    leaves running is killed afterwards. Skipped where Claude Code is not installed.
    """
    binary = require_claude()
    with MessagesAPI() as api:
        user = ClaudeCode(tmp_path, api, binary)
        try:
            yield user
        finally:
            user.close()
