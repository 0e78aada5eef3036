"""Compiling a run for a machine it does not run on: `aot` (XLA memory analysis of the
epoch's programs for abstract weights on a target mesh)."""
