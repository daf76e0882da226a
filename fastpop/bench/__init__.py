"""Benchmarks behind `fastpop bench`: update.py (the update step: vectorized vs sequential),
torch_baseline.py (the sequential PyTorch baseline), pipeline.py (collection and learner
utilisation of a real run), checkpoint.py (checkpoint size and save / restore seconds);
commands.py holds the `fastpop bench` parsers. Importing this package imports nothing heavy.
"""
