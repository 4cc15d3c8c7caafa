"""The running side: SandboxHandles read from stack outputs, the computer-server client, readiness.

Nothing here creates infrastructure; it only talks to endpoints that stack outputs name.
"""
