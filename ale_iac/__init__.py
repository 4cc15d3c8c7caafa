"""ale-iac: sandboxes for computer-use agents as declarative infrastructure on Pulumi."""

__version__ = "0.1.0"
