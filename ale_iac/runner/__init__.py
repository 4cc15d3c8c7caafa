"""The runner: experiments, tasks, the unit lifecycle, run records, results, gc."""
