"""population.seeds: every configuration (grid combination, prior draw, or the config itself)
trained by several members that differ only by their seeds, recorded in members.json."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop import strategies
from fastpop.commands.cli import main
from fastpop.run.inprocess import train_in_process
from fastpop.run.parts import build_learner
from tests.helpers import train_here
from tests.runs import FAST, TD3_PENDULUM

SMALL = ["agent.hidden_sizes=[8,8]", "agent.batch_size=4", "replay.capacity=256"]
SMALL += ["replay.min_size=4"]
GRID = "population.grid={actor_lr: [1.0e-4, 1.0e-3]}"
PRIOR = "population.priors={actor_lr: {log_uniform: [1.0e-4, 1.0e-3]}}"


def load(*overrides: str) -> config_lib.Config:
    return config_lib.load_config(None, [*SMALL, *overrides])


def indices(config) -> list[tuple[int, int]]:
    indices = strategies.member_configurations(config.population)
    return [(m["config_index"], m["seed_index"]) for m in indices]


@pytest.mark.parametrize(
    "overrides,size,seeds",
    [
        ([], 4, 4),  # no grid, no priors: the default 4 members are seeds of the one config
        (["population.seeds=3"], 3, 3),  # the size follows
        ([GRID, "population.seeds=3"], 6, 3),
        ([GRID, "population.size=6"], 6, 3),  # a grid repeated: its repeats are the seeds
        ([GRID], 2, 1),
        ([PRIOR], 4, 1),  # priors without seeds: every member its own draw
        ([PRIOR, "population.seeds=2"], 4, 2),  # 2 draws x 2 seeds
        ([PRIOR, GRID.replace("actor_lr", "discount").replace("1.0e-4, 1.0e-3", "0.9, 0.99"),
          "population.seeds=2", "population.size=8"], 8, 2),  # 2 combinations x 2 draws x 2
        (["strategy=branch_merge"], 4, 1),  # members that interact are not seeds
    ],
)  # fmt: skip
def test_size_and_seeds_are_resolved_and_round_trip(overrides, size, seeds):
    config = load(*overrides)
    assert (config.population.size, config.population.seeds) == (size, seeds)
    assert indices(config) == [divmod(m, seeds) for m in range(size)]
    assert config_lib.config_from_dict(config_lib.config_to_dict(config)) == config


@pytest.mark.parametrize(
    "overrides,message",
    [
        ([GRID, "population.size=4", "population.seeds=3"],
         "population.size: must be the grid's 2 combinations x population.seeds (3) = 6, got 4; "
         "set population.size=6 or leave it out (it follows)"),
        (["population.size=4", "population.seeds=3"],
         "population.size: must be 1 configuration x population.seeds (3) = 3, got 4"),
        ([PRIOR, "population.seeds=3"],
         "population.size: must be a multiple of 1 configuration x population.seeds (3) = 3"),
        (["population.seeds=0"], "population.seeds: must be >= 1, got 0"),
        (["strategy=branch_merge", "population.seeds=2"],
         "population.seeds: repeats configurations whose members never interact (independent, "
         "schedule); the members of strategy branch_merge interact"),
        (["population.size=5", GRID], "must be a multiple of the grid's 2 combinations"),
    ],
)  # fmt: skip
def test_a_size_that_does_not_fit_the_seeds_is_refused(overrides, message):
    with pytest.raises(config_lib.ConfigError) as error:
        load(*overrides)
    assert message in str(error.value)


def test_bad_seeds_exit_2_naming_the_field(capsys, tmp_path):
    code = main(["train", "--out", str(tmp_path / "run"), "--set", "population.seeds=two"])
    assert code == 2
    assert "population.seeds: expected an integer, got 'two'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_seeds_of_one_configuration_share_its_draws_and_configurations_differ():
    config = load(PRIOR, "population.size=6", "population.seeds=3")
    rates = [o["actor_lr"] for o in config_lib.member_overrides(config)]
    assert rates[0] == rates[1] == rates[2] != rates[3] == rates[4] == rates[5]
    one_seed = config_lib.member_overrides(load(PRIOR, "population.size=2"))
    assert [rates[0], rates[3]] == [o["actor_lr"] for o in one_seed]  # the same two draws


def test_two_seeds_of_one_configuration_differ_in_init_and_experience():
    config = load(
        GRID,
        "population.seeds=2",
        "train.total_env_steps=256",
        "collect.warmup_steps=128",
        "eval.interval=256",
        "eval.episodes=1",
        "collect.chunk_len=16",
        "train.updates_per_call=4",
    )
    learner = build_learner(config)
    hparams = learner.all_member_hparams()
    assert hparams[0] == hparams[1] != hparams[2] == hparams[3]
    weights = [
        np.asarray(leaf)
        for leaf in jax.tree.leaves(learner.training.release(learner.states))
        # (members, inputs, outputs) and not all zeros (optimizer moments): network weights
        if np.asarray(leaf).ndim == 3 and np.asarray(leaf).any()
    ]
    assert weights and all(not np.array_equal(w[0], w[1]) for w in weights)  # config 0's seeds
    result = train_in_process(config)
    first_episodes = [returns[0] for returns in result.episode_returns]
    assert len(set(first_episodes)) == 4  # every member's environment is seeded apart
    (_, evaluation), *_ = result.evaluations
    assert evaluation[0] != evaluation[1]


def test_train_records_each_members_configuration_and_seed(tmp_path, capsys):
    # trained in this process: what is checked is the run's files, not the command's exit
    train_here(
        tmp_path,
        TD3_PENDULUM,
        *FAST,
        GRID,
        "population.seeds=2",
        "population.size=4",
        "train.total_env_steps=768",
        "eval.interval=384",
    )
    run = tmp_path / "run"
    members = json.loads((run / "members.json").read_text())["members"]
    assert [(m["member"], m["config_index"], m["seed_index"]) for m in members] == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)
    ]  # fmt: skip
    assert [m["hparams"]["actor_lr"] for m in members] == pytest.approx([1e-4, 1e-4, 1e-3, 1e-3])
    assert main(["plot", "--aggregate", str(run), "--table", "--minutes", "60"]) == 0
    table = capsys.readouterr().out
    assert "| config 0: actor_lr=0.0001 | 60 | 2 | ran " in table
    assert (run / "performance_profile.png").stat().st_size > 0
