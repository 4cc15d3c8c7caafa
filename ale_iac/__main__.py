"""``python -m ale_iac`` is the ``ale-iac`` command (used to spawn bridges from any interpreter)."""

from ale_iac.cli import main

main()
