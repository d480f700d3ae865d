"""The MCP SDK stays an optional extra (docs/design.md §11): only ``capsulectl mcp`` loads it."""

from __future__ import annotations

import importlib.metadata
import pkgutil
import re
import subprocess
import sys

import capsule_client

#: Prints which of the SDK's packages (and its pydantic) the code before it loaded.
LOADED = (
    "print(sorted({m.split('.')[0] for m in sys.modules} & {'mcp', 'mcp_types', 'pydantic'}))\n"
)


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_the_extra_names_the_sdk() -> None:
    requires = importlib.metadata.requires("capsuled") or []
    assert any(re.match(r"mcp\b.*>=\s*2\.3.*extra == .mcp.", r) for r in requires), requires


def test_no_module_of_the_client_library_but_the_mcp_ones_imports_the_sdk() -> None:
    modules = [
        info.name
        for info in pkgutil.walk_packages(capsule_client.__path__, "capsule_client.")
        if not info.name.startswith("capsule_client.mcp") and not info.name.endswith("__main__")
    ]
    assert "capsule_client.cli.main" in modules and "capsule_client.client" in modules
    code = f"import importlib, sys\nfor name in {modules!r}: importlib.import_module(name)\n"
    done = run(code + LOADED)
    assert done.stdout.strip() == "[]", done.stderr
    # The check can fail: the server's module does load them.
    done = run("import sys, capsule_client.mcp.server\n" + LOADED)
    assert done.stdout.strip() == "['mcp', 'mcp_types', 'pydantic']", done.stderr


def test_other_commands_do_not_load_the_sdk() -> None:
    code = (
        "import sys\n"
        "from capsule_client.cli.main import main\n"
        "for argv in (['--help'], ['mcp', '--help'], ['--socket', '/nonexistent/s', 'sessions']):\n"
        "    main(argv)\n" + LOADED
    )
    done = run(code)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stderr


def test_without_the_extra_capsulectl_mcp_says_how_to_install_it_and_exits_2() -> None:
    # ``None`` in sys.modules: ``import mcp`` fails as it does where mcp is not installed.
    code = (
        "import sys\n"
        "sys.modules['mcp'] = None\n"
        "from capsule_client.cli.main import main\n"
        "sys.exit(main(['mcp', '--allow-terminate']))\n"
    )
    done = run(code)
    assert done.returncode == 2, done.stderr
    assert "`capsulectl mcp` needs the MCP SDK" in done.stderr
    # capsuled is installed from a checkout or a wheel, not from an index: no
    # `pip install 'capsuled[mcp]'`, which would fail (tests/packaging try each way).
    assert "pipx inject capsuled mcp" in done.stderr
    assert "pipx install --force '.[mcp]'" in done.stderr
    assert "pip install -e '.[mcp]'" in done.stderr
    assert "capsuled[mcp]" not in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
