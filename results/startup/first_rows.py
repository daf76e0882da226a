"""Seconds from starting the paper preset's 16 collectors to each one's first chunk of rows.

Only the collectors: this process builds the agent and the replay spec, starts `Workers` (the
collectors; the evaluator waits for their rows) and polls their rings until every collector has
sent a chunk, then stops them. The code measured is whatever `fastpop` PYTHONPATH gives, so an
older commit unpacked with `git archive` is measured the same way:

    PYTHONPATH=/tmp/fastpop-before python results/startup/first_rows.py before
    python results/startup/first_rows.py after

Everything heavy is imported inside `main`: a spawned collector runs this file again as its
main module when the code measured does not leave it out (310b758 and earlier did not).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "td3_pbt_halfcheetah.yaml"


def learner_template(collector, agent, config):
    """The shapes of what the learner publishes, from wherever the measured tree keeps them."""
    try:  # run/parts since 2026-11-29
        from fastpop.run.parts import config_policy_template

        return config_policy_template(agent, config)
    except ImportError:
        pass
    if hasattr(collector, "config_policy_template"):  # the template of the learner's hparams
        return collector.config_policy_template(agent, config)
    return collector.policy_template(agent, config.population.size)  # before: of a size


def main() -> None:
    import jax
    import numpy as np

    from fastpop import config as config_lib
    from fastpop.collect import collector
    from fastpop.collect.workers import Workers
    from fastpop.config.build import build_agent, build_env_spec, build_replay_spec

    config = config_lib.load_config(CONFIG, ["replay.capacity=30000"])
    env_spec = build_env_spec(config)
    agent = build_agent(config, env_spec)
    template = learner_template(collector, agent, config)
    zeros = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), template)
    replay_spec = build_replay_spec(config, env_spec)
    try:  # Workers take their ProcessParts since 0b4050d, the config before
        from fastpop.run.parts import process_parts

        given, policy = process_parts(config, env_spec), zeros
    except ImportError:  # and the policy's leaves
        given, policy = config, jax.tree.leaves(zeros)
    start, firsts = time.monotonic(), {}
    with Workers(given, policy, replay_spec, log=lambda *_: None) as workers:
        while not all(workers.delivered) and time.monotonic() - start < 300:
            workers.next_chunk()
            for index, delivered in enumerate(workers.delivered):
                firsts.setdefault(index, time.monotonic() - start) if delivered else None
            workers.check()
            time.sleep(0.005)
        stats = workers.stop()
    row = {
        "label": sys.argv[1] if len(sys.argv) > 1 else "",
        "collectors": len(firsts),
        "first_collector_s": round(min(firsts.values()), 2),
        "all_collectors_s": round(max(firsts.values()), 2),
        # absent before this stat existed (None)
        "jax_imported": sorted({str(s.get("jax_imported")) for s in stats.values()}),
    }
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
