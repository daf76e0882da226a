"""fastpop.bench.anatomy: kernels counted from a compiled program's HLO, loops by their trip
counts, a conditional by its larger branch (the floor: tests/test_floors.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from fastpop import population
from fastpop.bench import anatomy
from fastpop.population import UpdatePlan
from tests.helpers import random_buffers, sampler, stacked_hparams, tiny_agent

# Two kernels outside the loop (a fusion, a custom call), a loop of 3 trips whose body launches
# one fusion and a conditional (branches of 2 and 1 kernels), and views that launch nothing.
HLO = """HloModule m

%fused_a (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %m = f32[4]{0} multiply(%p, %p)
}

%big (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %f = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_a
  ROOT %c = f32[4]{0} copy(%f)
}

%small (y: f32[4]) -> f32[4] {
  %y = f32[4]{0} parameter(0)
  ROOT %f2 = f32[4]{0} fusion(%y), kind=kLoop, calls=%fused_a
}

%body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %v = f32[4]{0} get-tuple-element(%t), index=1
  %g = f32[4]{0} fusion(%v), kind=kLoop, calls=%fused_a
  %b = pred[] constant(true)
  %k = f32[4]{0} conditional(%b, %g, %g), branch_computations={%small, %big}
  ROOT %r = (s32[], f32[4]{0}) tuple(%i, %k)
}

%cond (t: (s32[], f32[4])) -> pred[] {
  %t = (s32[], f32[4]{0}) parameter(0)
  ROOT %lt = pred[] constant(true)
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %pre = f32[4]{0} fusion(%a), kind=kLoop, calls=%fused_a
  %gemm = f32[4]{0} custom-call(%pre), custom_call_target="__cublas$gemm"
  %z = s32[] constant(0)
  %init = (s32[], f32[4]{0}) tuple(%z, %gemm)
  %w = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%body, backend_config=TRIPS
  ROOT %out = f32[4]{0} get-tuple-element(%w), index=1
}
""".replace("TRIPS", '{"known_trip_count":{"n":"3"}}')


def test_kernels_are_counted_by_trip_count_and_larger_branch():
    # 2 outside + 3 trips x (1 fusion + max(1, 2) of the conditional's branches)
    assert anatomy.kernels_per_call(HLO) == 2 + 3 * (1 + 2)


def test_text_without_an_entry_is_refused():
    with pytest.raises(ValueError, match="no ENTRY computation"):
        anatomy.kernels_per_call("%f (x: f32[]) -> f32[] {\n}\n")


def test_a_compiled_scan_counts_each_step():
    """Each 3 more steps of a scan add the same kernels: the loop's trip count is read."""

    def kernels(steps: int) -> int:
        def program(x, w):
            step = lambda carry, _: (jnp.tanh(carry @ w) * 2.0 + 1.0, None)
            return jax.lax.scan(step, x, None, length=steps)[0].sum()

        args = (jnp.ones((4, 8)), jnp.ones((8, 8)))
        return anatomy.kernels_per_call(jax.jit(program).lower(*args).compile().as_text())

    three, six, nine = kernels(3), kernels(6), kernels(9)
    assert six - three == nine - six > 0


def test_an_accelerators_program_is_read_as_compiled_and_a_cpus_compiled_alike():
    """The vectorized executor's whole-population program (what an accelerator runs) is read
    without compiling again; a chunked CPU update has none, so the same program is compiled:
    both count the same kernels."""
    agent = tiny_agent("td3")
    spec, buffers = random_buffers("td3", 3)
    hparams = stacked_hparams(agent, 3)
    states = population.init_population(agent, jax.random.key(0), hparams)
    plan = UpdatePlan(agent, sampler(spec, agent.batch_size), 2)
    whole = population.vectorized(plan).update
    chunked = population.vectorized(plan, members_per_chunk=1).update
    assert hasattr(whole, "lower") and not hasattr(chunked, "lower")
    read = [
        anatomy.update_anatomy(plan, update, states, buffers, hparams, seconds_per_call=0.01)
        for update in (whole, chunked)
    ]
    assert read[0] == read[1] and read[0]["kernels_per_update_step"] >= 1
    assert read[0]["seconds_per_kernel"] == pytest.approx(
        0.01 / (2 * read[0]["kernels_per_update_step"])
    )


def test_an_unreadable_program_leaves_the_row_with_its_reason():
    class Unlowerable:
        def lower(self, *args):
            raise RuntimeError("no HLO here")

    read = anatomy.read_safely(None, Unlowerable(), None, None, None, 0.01)
    assert read == {"anatomy_error": "RuntimeError: no HLO here"}


def test_the_summary_tables_what_was_read_and_names_what_was_not():
    from fastpop.bench.gpu_report import anatomy_lines

    read = {"population": 80, "kernels_per_update_step": 120.0, "seconds_per_kernel": 8e-6}
    read |= {"seconds_per_update_step": 9.6e-4, "compute_floor_seconds": 1.1e-4}
    read |= {"floor_seconds": 2e-4, "times_floor": 4.8}
    lines = anatomy_lines([read, {"population": 256, "anatomy_error": "ValueError: odd HLO"}])
    assert "| 80 | 0.960 | 0.200 | 4.80 | 0.110 | - | - | 120 | 8.0 |" in lines
    assert lines[-1] == "- P=256: not read (ValueError: odd HLO)"
    assert anatomy_lines([{"population": 1, "impl": "sequential"}]) == []


def test_the_targets_judge_a_rows_first_measurement_not_a_levers_later_reference(tmp_path):
    from fastpop.bench.gpu_report import update_targets

    first = {"impl": "vectorized", "population": 80, "times_floor": 2.5, "floor_bound": "state"}
    lever_sweep = [
        first | {"times_floor": 4.0},  # the lever's own reference row, timed later
        {"impl": "vectorized+pallas-mlp", "population": 80, "times_floor": 1.5},
    ]
    record = {"algos": {"td3": {"rows_so_far": [first, *lever_sweep]}}}
    targets = {name: (shown, verdict) for name, shown, verdict in update_targets(tmp_path, record)}
    shown, verdict = targets["TD3 P=80: vectorized step / its floor <= 3x"]
    assert (shown, verdict) == ("2.50x (state)", "**met**")
