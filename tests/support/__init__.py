"""Shared fixtures and helpers of the tests (no tests here).

* ``fixtures``: the pytest plugin (loaded by tests/conftest.py) with the real-sandbox fixtures:
  ``desktop_image``, ``local_sandbox``, ``sandbox_factory``, ``computer_server_endpoint``.
* ``preconditions``: what the ``needs_root``, ``image``, ``engine`` and ``sandbox`` markers need of the
  host, for the skip-or-fail hook in tests/conftest.py.
* ``sandbox``: talking to a computer-server (``Endpoint``, ``wait_for_status``, ``cmd``, ``run``).
* ``desktop``: shell snippets that drive and inspect a sandbox's desktop from the inside.
* ``bridges``: MCP client sessions with ``ale-iac mcp vm|cua`` and the tools-seed checks.
* ``engine``: a dynamic resource for engine tests (importable: the Pulumi provider process unpickles it).
* ``cloud``: routes, mocks and the fixed clock of the cloud tests under Pulumi mocks.
* ``seccomp``: one probe per seccomp rule family and the script that makes it.
* ``tasks`` and ``agents``: trivial task folders, presets and misbehaving deployers for the runner tests.
"""
