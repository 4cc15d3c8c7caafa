"""Entry point of the ale-iac policy pack (``pulumi preview --policy-pack policy``).

The policies are defined, documented and tested in ``ale_iac.infra.policy``; this file only serves them.
"""

import sys
from pathlib import Path

# Works from a checkout even when the pack's virtualenv lacks an installed ale-iac.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ale_iac.infra.policy import serve

serve()
