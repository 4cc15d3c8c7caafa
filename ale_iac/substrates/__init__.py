"""Host substrates: the process-level drivers of sandboxes that run on this host (start, stop, list,
inspect), with no Pulumi. ``ale_iac.infra`` declares resources that call them; ``ale-iac gc``, the
image cache, tests and benchmarks use them directly.

Modules here import only the standard library, psutil (through ``ale_iac.procs``) and each other,
except where said: a local sandbox's supervisor lives as long as its sandbox, and every import is
memory per sandbox.
"""
