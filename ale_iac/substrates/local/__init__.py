"""The ``local`` substrate: an image's rootfs run in Linux namespaces on this host (bubblewrap)."""
