"""Reports of runs: a run read back from its record, rendered as static HTML you open from disk.

``load_run(RUN_DIR)`` reads a run record (finished or still in progress) into a :class:`RunView`;
``write_report(run, out_dir)`` writes ``out_dir/index.html`` plus ``out_dir/assets/`` (one page per
unit, the plots as SVG, the screenshots). It reads nothing but the record, which the runner has
already redacted, and the pages load nothing from the network.
"""

from ale_iac.report.model import RunView, UnitView, load_run
from ale_iac.report.render import write_report

__all__ = ["RunView", "UnitView", "load_run", "write_report"]
