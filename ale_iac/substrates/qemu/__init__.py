"""The ``qemu`` substrate: one QEMU guest per unit from a cached qcow2 base (``ale_iac/substrates/qemu``)."""
