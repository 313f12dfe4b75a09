"""Ray Tune: search spaces and the federation trainable."""
