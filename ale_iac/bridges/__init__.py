"""The two MCP bridges over a sandbox's computer-server: ``vm`` (shell, files, clipboard, PTY sessions) and
``cua`` (mouse, keyboard, screen). Each module exposes ``build_server(client_factory)``; ``ale-iac mcp vm|cua``
runs them over stdio or streamable HTTP. Nothing is imported here, so starting one bridge loads only its own
module.
"""
