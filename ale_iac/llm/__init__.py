"""Model access for agents: the per-run model gateway (the real API key stays on the host; each unit's
agent gets a token of its own) and the scripted model server (a stand-in for the vendors' APIs in tests
and dry runs). See docs/models.md."""
