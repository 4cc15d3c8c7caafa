"""The ``docker`` host substrate: one container of the desktop image per unit, on the local Docker engine."""
