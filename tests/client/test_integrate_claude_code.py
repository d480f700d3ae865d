"""``capsulectl integrate claude-code`` on real files (docs/design.md §12): what it adds to
each scope's settings and MCP files, that a second run changes nothing, that
``--remove`` gives back exactly what was there, ``--dry-run``, and what it refuses.

Each test has its own HOME and working directory under tmp_path; the command runs
through ``main`` as the console script runs it.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from capsule_client.agents.claude_code_settings import is_our_hook, is_our_server
from capsule_client.cli.main import main

CLIENT_DIR = Path(__file__).parents[2] / "client"
EVENTS = {"SessionStart": 30, "UserPromptSubmit": 10, "PostToolUse": 10, "Stop": 10}


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of its own, and a project directory (the cwd) under tmp_path."""
    home = tmp_path / "home"
    project = tmp_path / "project"
    home.mkdir()
    project.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for variable in ("CAPSULED_SOCKET", "CAPSULE_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(variable, raising=False)  # the socket is the home's, whatever it is
    monkeypatch.chdir(project)
    return home


def integrate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["integrate", "claude-code", *args])
    out, err = capsys.readouterr()
    return code, out, err


def read(path: Path) -> Any:
    return json.loads(path.read_text())


def our_command() -> str:
    """The hooks' command when integrate runs inside this test (``python -m`` style)."""
    return shlex.join([sys.executable, "-m", "capsule_client.cli", "hook", "claude-code"])


def assert_hooks(settings: dict[str, Any]) -> None:
    """Every event has exactly one capsuled hook, as integrate writes it."""
    for event, timeout in EVENTS.items():
        ours = [
            (group, entry)
            for group in settings["hooks"][event]
            for entry in group["hooks"]
            if is_our_hook(entry)
        ]
        assert len(ours) == 1, event
        group, entry = ours[0]
        assert entry == {"type": "command", "command": our_command(), "timeout": timeout}
        assert group.get("matcher") == ("Bash|TaskStop" if event == "PostToolUse" else None)


def test_user_scope_adds_the_hooks_and_the_server_and_names_each_file(
    user: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = integrate(capsys)

    assert code == 0, err
    settings = user / ".claude" / "settings.json"
    state = user / ".claude.json"
    assert_hooks(read(settings))
    assert "mcpServers" not in read(settings)  # Claude Code never reads it there
    assert read(state)["mcpServers"]["capsuled"] == {
        "type": "stdio",
        "command": sys.executable,
        "args": ["-m", "capsule_client.cli", "mcp"],
        "env": {},
    }
    assert f"{settings}: added capsuled's hook for SessionStart, UserPromptSubmit, " in out
    assert f"{state}: registered the MCP server capsuled" in out
    for path in (settings, state):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600  # the user's own files


def test_a_second_run_changes_nothing_and_says_so(
    user: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    integrate(capsys)
    files = [user / ".claude" / "settings.json", user / ".claude.json"]
    before = [(path.stat().st_ino, path.read_bytes()) for path in files]

    code, out, _ = integrate(capsys)

    assert code == 0
    assert [(path.stat().st_ino, path.read_bytes()) for path in files] == before  # not rewritten
    assert out.count(": unchanged (capsuled's entries are there already") == 2


OTHERS: dict[str, Any] = {
    "permissions": {"allow": ["Bash(ls:*)"]},
    "hooks": {
        "PostToolUse": [
            {"matcher": "Edit", "hooks": [{"type": "command", "command": "fmt.sh"}]},
            {"matcher": "Bash|TaskStop", "hooks": [{"type": "command", "command": "audit"}]},
        ],
        "Notification": [{"hooks": [{"type": "command", "command": "notify-send hi"}]}],
    },
    "model": "opus",
}
STATE: dict[str, Any] = {
    "numStartups": 3,
    "mcpServers": {"other": {"type": "stdio", "command": "other-server", "args": [], "env": {}}},
    "projects": {"/somewhere": {"allowedTools": []}},
}


def test_everything_else_stays_and_remove_gives_back_exactly_what_was_there(
    user: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = user / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps(OTHERS))
    state = user / ".claude.json"
    state.write_text(json.dumps(STATE))

    assert integrate(capsys)[0] == 0
    added = read(settings)
    assert added["permissions"] == OTHERS["permissions"] and added["model"] == "opus"
    assert added["hooks"]["Notification"] == OTHERS["hooks"]["Notification"]
    assert added["hooks"]["PostToolUse"][:2] == OTHERS["hooks"]["PostToolUse"]  # theirs first
    assert_hooks(added)
    assert read(state)["mcpServers"]["other"] == STATE["mcpServers"]["other"]
    assert list(read(state)) == list(STATE)  # the order of the keys too

    code, out, _ = integrate(capsys, "--remove")

    assert code == 0
    assert read(settings) == OTHERS
    assert read(state) == STATE
    assert f"{settings}: removed capsuled's hook for SessionStart" in out
    assert f"{state}: removed the MCP server capsuled from mcpServers" in out
    code, out, _ = integrate(capsys, "--remove")
    assert out.count("unchanged (none of capsuled's entries are in it)") == 2


def test_remove_takes_out_the_containers_it_made(
    user: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    integrate(capsys)

    integrate(capsys, "--remove")

    assert read(user / ".claude" / "settings.json") == {}
    assert read(user / ".claude.json") == {}


def test_an_entry_of_another_capsulectl_is_updated_not_duplicated(
    user: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A capsulectl installed elsewhere before (pipx, a venv) wrote its own path."""
    old = "'/opt/old venv/bin/capsulectl' hook claude-code"
    settings = user / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(
        json.dumps({"hooks": {"Stop": [{"hooks": [{"type": "command", "command": old}]}]}})
    )
    (user / ".claude.json").write_text(
        json.dumps(
            {"mcpServers": {"capsuled": {"command": "/opt/old/capsulectl", "args": ["mcp"]}}}
        )
    )

    code, out, _ = integrate(capsys)

    assert code == 0
    assert_hooks(read(settings))
    assert old not in settings.read_text()
    assert "updated capsuled's hook for Stop" in out
    assert "updated the MCP server capsuled" in out
    assert read(user / ".claude.json")["mcpServers"]["capsuled"]["command"] == sys.executable


def test_a_server_named_capsuled_that_is_not_capsulectl_mcp_is_left_alone(
    user: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    theirs = {"command": "node", "args": ["capsuled.js"]}
    (user / ".claude.json").write_text(json.dumps({"mcpServers": {"capsuled": theirs}}))

    code, out, _ = integrate(capsys)
    assert code == 0
    assert read(user / ".claude.json")["mcpServers"]["capsuled"] == theirs
    assert "left mcpServers.capsuled as it is: it is not `capsulectl mcp`" in out

    integrate(capsys, "--remove")
    assert read(user / ".claude.json")["mcpServers"]["capsuled"] == theirs


def test_dry_run_shows_the_change_and_writes_nothing(
    user: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = integrate(capsys, "--dry-run")

    assert code == 0
    assert not (user / ".claude").exists() and not (user / ".claude.json").exists()
    assert f"{user / '.claude' / 'settings.json'}: not written (--dry-run): added" in out
    assert f'+            "command": {json.dumps(our_command())},' in out  # the diff
    integrate(capsys)
    code, out, _ = integrate(capsys, "--remove", "--dry-run")
    assert "not written (--dry-run): removed capsuled's hook" in out
    assert_hooks(read(user / ".claude" / "settings.json"))


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"hooks": {', "not valid JSON (Expecting property name"),
        ("[1, 2]", "holds a JSON list, not an object"),
        ('{"hooks": []}', "hooks is not an object"),
        ('{"hooks": {"Stop": {}}}', "hooks.Stop is not a list"),
        (b"\xff\xfe{}", "cannot be read"),
    ],
    ids=["truncated", "a-list", "hooks-a-list", "event-an-object", "not-utf8"],
)
def test_a_file_that_is_not_a_settings_object_is_refused_and_nothing_is_written(
    user: Path, capsys: pytest.CaptureFixture[str], text: str | bytes, said: str
) -> None:
    settings = user / ".claude" / "settings.json"
    settings.parent.mkdir()
    raw = text if isinstance(text, bytes) else text.encode()
    settings.write_bytes(raw)

    code, out, err = integrate(capsys)

    assert code == 1
    assert err.startswith(f"capsulectl integrate: {settings}: ") and said in err
    assert settings.read_bytes() == raw
    assert not (user / ".claude.json").exists()  # the other file neither
    assert out == ""


def test_the_other_file_refused_stops_both(user: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (user / ".claude.json").write_text('{"mcpServers": "none"}')

    code, _, err = integrate(capsys)

    assert code == 1 and "mcpServers is not an object" in err
    assert not (user / ".claude" / "settings.json").exists()


def test_an_empty_file_is_an_empty_object(user: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = user / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text("\n")

    assert integrate(capsys)[0] == 0
    assert_hooks(read(settings))


def test_the_mode_of_a_file_is_kept_and_a_link_is_followed(
    user: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dotfiles = user / "dotfiles"
    dotfiles.mkdir()
    target = dotfiles / "claude-settings.json"
    target.write_text(json.dumps({"model": "opus"}))
    target.chmod(0o640)
    (user / ".claude").mkdir()
    link = user / ".claude" / "settings.json"
    link.symlink_to(target)

    assert integrate(capsys)[0] == 0

    assert link.is_symlink() and link.resolve() == target
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert read(target)["model"] == "opus"
    assert_hooks(read(target))
    assert [p.name for p in dotfiles.iterdir()] == ["claude-settings.json"]  # no temp left


def test_project_scope_writes_the_directory_s_settings_and_mcp_json(
    user: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = Path.cwd()

    code, out, _ = integrate(capsys, "--scope", "project")

    assert code == 0
    assert_hooks(read(project / ".claude" / "settings.json"))
    assert read(project / ".mcp.json")["mcpServers"]["capsuled"]["args"][-1] == "mcp"
    assert stat.S_IMODE((project / ".mcp.json").stat().st_mode) == 0o644  # shared
    assert not (user / ".claude.json").exists() and not (user / ".claude").exists()
    assert "Note:" not in out


def test_project_scope_in_a_subdirectory_of_a_repository_says_where_it_is_read(
    user: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (Path.cwd() / ".git").mkdir()
    sub = Path.cwd() / "app"
    sub.mkdir()
    monkeypatch.chdir(sub)

    code, out, _ = integrate(capsys, "--scope", "project")

    assert code == 0
    assert_hooks(read(sub / ".claude" / "settings.json"))
    assert (
        f"Note: Claude Code reads {sub / '.claude' / 'settings.json'} only when started in {sub}"
        in out
    )


def test_local_scope_writes_at_the_repository_s_root_and_keys_the_server_by_it(
    user: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = Path.cwd()
    (root / ".git").mkdir()
    sub = root / "app"
    sub.mkdir()
    monkeypatch.chdir(sub)

    code, _, _ = integrate(capsys, "--scope", "local")

    assert code == 0
    assert_hooks(read(root / ".claude" / "settings.local.json"))
    state = read(user / ".claude.json")
    assert set(state["projects"]) == {str(root)}
    assert state["projects"][str(root)]["mcpServers"]["capsuled"]["args"][-1] == "mcp"
    integrate(capsys, "--scope", "local", "--remove")
    assert read(user / ".claude.json") == {}


def test_allow_terminate_is_written_into_the_server_s_arguments(
    user: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    integrate(capsys, "--allow-terminate")
    server = read(user / ".claude.json")["mcpServers"]["capsuled"]
    assert server["args"][-2:] == ["mcp", "--allow-terminate"] and is_our_server(server)

    code, out, _ = integrate(capsys)  # without it again: back to the read-only tools

    assert code == 0 and "updated the MCP server capsuled" in out
    assert read(user / ".claude.json")["mcpServers"]["capsuled"]["args"][-1] == "mcp"
    assert main(["integrate", "claude-code", "--remove", "--allow-terminate"]) == 2


def test_without_the_mcp_sdk_it_registers_the_hooks_and_says_how_to_add_the_server(
    user: Path,
) -> None:
    """An interpreter that finds nothing but the standard library and the checkout's client
    (integrate needs no more): no MCP SDK there."""
    script = (
        "import sys\n"
        "sys.path = [p for p in sys.path if 'site-packages' not in p]\n"
        f"sys.path.insert(0, {str(CLIENT_DIR)!r})\n"
        "from capsule_client.cli.main import main\n"
        "sys.exit(main(['integrate', 'claude-code']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", script],
        env={**os.environ, "HOME": str(user)},
        cwd=Path.cwd(),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    assert "The MCP server is not registered: the MCP SDK is not installed" in done.stdout
    assert "pipx inject capsuled mcp" in done.stdout
    assert (user / ".claude" / "settings.json").is_file()
    assert not (user / ".claude.json").exists()


def test_a_home_too_deep_for_a_socket_does_not_matter_to_integrate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """integrate connects to nothing: a default socket path too long for a Unix socket
    (a deep HOME) is no usage error for it."""
    home = tmp_path / ("deep" * 30) / "home"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    for variable in ("CAPSULED_SOCKET", "CAPSULE_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.chdir(tmp_path)

    code, _, err = integrate(capsys)

    assert code == 0, err
    assert_hooks(read(home / ".claude" / "settings.json"))
