"""Collector side of training: shared-memory channels, collector and evaluator processes.

Modules here run in processes started with the `spawn` method and never initialise an accelerator.
"""
