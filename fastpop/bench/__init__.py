"""Benchmarks behind `fastpop bench`: update.py (the update step; its implementations and
levers in levers.py), torch_baseline.py, torch_func.py and torch_variants.py (the PyTorch
baselines: eager, compiled, vmapped), pipeline.py (collection and learner
utilisation of a real run), checkpoint.py (checkpoint size and save / restore seconds);
commands.py holds the `fastpop bench` parsers. Importing this package imports nothing heavy.
"""
