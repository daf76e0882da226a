"""Trackers beside the run's files: TensorBoard's HParams view and an offline W&B run, each read
back from what it wrote (event files; the offline run's .wandb transaction log and tables)."""

from __future__ import annotations

import json
import math
import struct
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop.commands import cli
from fastpop.run import run_files, trackers
from fastpop.run.metrics import MetricsWriter
from fastpop.run.run_files import MEMBERS_FILE, read_jsonl
from tests.dependencies import require

REPO = Path(__file__).resolve().parents[1]
HPARAMS = [{"actor_lr": 1e-3, "discount": 0.99}, {"actor_lr": 3e-4, "discount": 0.98}]
HPARAMS.append({"actor_lr": 1e-4, "discount": 0.97})
RETURNS = [[-900.0, -500.0, -300.0], [-800.0, math.nan, -200.0]]  # round -> member


def write_members(run_dir: Path) -> None:
    members = [{"member": m, "config_index": m, "seed_index": 0, "hparams": h}
               for m, h in enumerate(HPARAMS)]  # fmt: skip
    (run_dir / MEMBERS_FILE).write_text(json.dumps({"strategy": "pbt", "members": members}))


def round_rows(index: int, hparams=HPARAMS) -> list[dict]:
    return [
        {"wall_time": 10.0 * (index + 1), "env_steps": 3000 * (index + 1),
         "member_env_steps": 1000 * (index + 1), "updates": 500 * (index + 1), "member": m,
         "return_mean": RETURNS[index][m], "return_std": 5.0, "episodes": 2, "hparams": h}
        for m, h in enumerate(hparams)
    ]  # fmt: skip


# Member 2 continues from member 1 with a new learning rate after the first round.
EXPLOIT = {"wall_time": 11.0, "env_steps": 3000, "strategy": "pbt", "kind": "exploit",
           "target": 2, "source": 1, "target_fitness": -300.0, "source_fitness": -500.0,
           "old_hparams": HPARAMS[2],
           "new_hparams": {"actor_lr": 6e-4, "discount": 0.98}}  # fmt: skip
FINAL_HPARAMS = [HPARAMS[0], HPARAMS[1], EXPLOIT["new_hparams"]]


# --- TensorBoard HParams, read back from the event files ---


def tfrecords(path: Path) -> list[bytes]:
    """The records of a TFRecord file: length, its CRC, data, the data's CRC."""
    data, records, position = path.read_bytes(), [], 0
    while position < len(data):
        (length,) = struct.unpack("<Q", data[position : position + 8])
        records.append(data[position + 12 : position + 12 + length])
        position += 12 + length + 4
    return records


def read_session(directory: Path) -> tuple[dict, dict]:
    """(hparams of the session's start info, scalars by tag) of one HParams session."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

    (path,) = directory.glob("events.out.tfevents.*")
    hparams, scalars = {}, {}
    for record in tfrecords(path):
        for value in Event.FromString(record).summary.value:
            if value.metadata.plugin_data.plugin_name == "hparams":
                plugin = HParamsPluginData.FromString(value.metadata.plugin_data.content)
                for name, item in plugin.session_start_info.hparams.items():
                    hparams[name] = getattr(item, item.WhichOneof("kind"))
            elif value.HasField("simple_value"):
                scalars[value.tag] = value.simple_value
    return hparams, scalars


def test_hparams_view_has_one_session_per_member(tmp_path):
    require("tensorboardX")
    write_members(tmp_path)
    for attempt in range(2):  # a resumed run rewrites the sessions when it stops again
        hparams_tracker = trackers.HParamsSessions(tmp_path)
        with MetricsWriter(tmp_path, tensorboard=True, trackers=[hparams_tracker]) as writer:
            if attempt == 0:
                writer.log_evaluation(round_rows(0))
                writer.log_lineage([EXPLOIT])
            else:
                writer.log_evaluation(round_rows(1, FINAL_HPARAMS))
    sessions = sorted(p.name for p in (tmp_path / trackers.HPARAMS_DIR).iterdir())
    assert sessions == ["member_0", "member_1", "member_2"]
    for member, initial in enumerate(HPARAMS):
        hparams, scalars = read_session(tmp_path / trackers.HPARAMS_DIR / f"member_{member}")
        expected = {"member": member, "config_index": member, "seed_index": 0}
        expected |= {k: pytest.approx(v) for k, v in initial.items()}
        # PBT changed member 2's hparams, so every session also has the final ones.
        expected |= {f"final_{k}": pytest.approx(v) for k, v in FINAL_HPARAMS[member].items()}
        assert hparams == expected
        final, best = (
            RETURNS[1][member],
            max(r[member] for r in RETURNS if not math.isnan(r[member])),
        )
        assert scalars["hparam/best_return"] == pytest.approx(best)
        if math.isnan(final):
            assert math.isnan(scalars["hparam/final_return"])
        else:
            assert scalars["hparam/final_return"] == pytest.approx(final)


def test_hparams_without_changes_has_no_final_columns(tmp_path):
    require("tensorboardX")
    # Hparams come off the device as float32: the view shows their shortest spelling.
    float32 = [{k: float(np.float32(v)) for k, v in h.items()} for h in HPARAMS]
    assert float32[1]["actor_lr"] != 3e-4
    with MetricsWriter(tmp_path, tensorboard=False) as writer:  # no members.json either
        writer.log_evaluation(round_rows(0, float32))
    trackers.write_hparams_sessions(tmp_path)
    hparams, _ = read_session(tmp_path / trackers.HPARAMS_DIR / "member_1")
    assert hparams == {"member": 1, "actor_lr": 3e-4, "discount": 0.98}


class Failing:
    def __init__(self):
        self.calls = 0

    def log_evaluation(self, rows):
        self.calls += 1
        raise ConnectionError("tracker down")

    def close(self, failed):
        pass


def test_a_failing_tracker_is_dropped_and_the_files_stay_whole(tmp_path):
    failing = Failing()
    with MetricsWriter(tmp_path, tensorboard=False, trackers=[failing]) as writer:
        with pytest.warns(UserWarning, match="Failing failed and is dropped"):
            writer.log_evaluation(round_rows(0))
        writer.log_evaluation(round_rows(1))
    assert failing.calls == 1
    assert len(run_files.read_metrics(tmp_path)) == 6
    (event,) = read_jsonl(tmp_path / run_files.EVENTS_FILE)
    assert event["kind"] == "tracker_failed" and "tracker down" in event["error"]


# --- W&B: config, the missing package, an offline run read back from its files ---


def test_wandb_config_is_validated():
    assert config_lib.load_config(None).log.wandb is None
    log = config_lib.load_config(None, ["log.wandb=offline", "log.wandb_entity=lab"]).log
    assert (log.wandb, log.wandb_project, log.wandb_entity) == ("offline", "fastpop", "lab")
    with pytest.raises(config_lib.ConfigError, match=r"log\.wandb: must be one of online, offline"):
        config_lib.load_config(None, ["log.wandb=cloud"])
    with pytest.raises(config_lib.ConfigError, match=r"log\.wandb_project: expected a string"):
        config_lib.load_config(None, ["log.wandb_project=[a]"])


@pytest.mark.parametrize(
    ("overrides", "hide_wandb", "message"),
    [
        (["log.wandb=offline"], True, "needs the wandb package, which is not installed; "
         "pip install -e '.[wandb]'"),
        (["log.wandb=offline", "log.wandb_project=a/b"], False, "log.wandb_project: must be"),
    ],
    ids=["not-installed", "bad-project"],
)  # fmt: skip
def test_wandb_problems_exit_2_before_anything_starts(
    tmp_path, monkeypatch, capsys, overrides, hide_wandb, message
):
    if hide_wandb:
        monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    else:
        require("wandb")
    run_dir = tmp_path / "run"
    sets = [arg for override in overrides for arg in ("--set", override)]
    code = cli.main(
        ["train", str(REPO / "configs/td3_pendulum_cpu.yaml"), *sets, "--out", str(run_dir)]
    )
    assert code == 2
    assert message in capsys.readouterr().err
    assert not run_dir.exists()


def read_transaction_log(path: Path) -> list:
    """The records of a W&B transaction log (LevelDB log format: a 7-byte file header, then
    32 KiB blocks of records: checksum, length, type (full, first, middle, last), data), up to
    the first record its writer has not finished (the log is read while W&B's service writes)."""
    from wandb.proto.wandb_internal_pb2 import Record

    data, position, records, pieces = path.read_bytes(), 7, [], b""
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:  # a block's tail too short for a header is padding
            position += 32768 - position % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0 or position + 7 + length > len(data):  # the end, or a record being written
            break
        pieces = (b"" if kind in (1, 2) else pieces) + data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            records.append(Record.FromString(pieces))
    return records


def wandb_records(run_dir: Path, attempt: int) -> tuple[Path, list]:
    """(files directory, records) of the `attempt`-th offline W&B run in run_dir, once its
    service has written the exit record (it flushes the log shortly after `finish` returns)."""
    directory = sorted((run_dir / "wandb").glob("offline-run-*"))[attempt]
    (path,) = directory.glob("run-*.wandb")
    deadline = time.monotonic() + 30
    while True:
        records = read_transaction_log(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return directory / "files", records
        assert time.monotonic() < deadline, f"{path}: no exit record after 30 s"
        time.sleep(0.05)


def items(updates) -> dict:
    """History or summary items by name ("members/path" for a nested key), values decoded."""
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in updates}


def history(records) -> list[dict]:
    return [items(r.history.item) for r in records if r.WhichOneof("record_type") == "history"]


def test_wandb_offline_run_mirrors_the_population(tmp_path, monkeypatch):
    require("wandb")
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    config = config_lib.load_config(None, ["log.wandb=offline", "log.tensorboard=false", "name=wb"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_members(run_dir)
    with MetricsWriter(run_dir, tensorboard=False) as writer:  # before W&B was enabled
        writer.log_evaluation(round_rows(0))
    with MetricsWriter(
        run_dir, tensorboard=False, trackers=trackers.open_trackers(config, run_dir)
    ) as writer:
        writer.log_lineage([EXPLOIT])
        writer.log_scalars(4500, {"learner/critic_loss": 0.25})
    run_id = json.loads((run_dir / trackers.WANDB_FILE).read_text())["id"]

    files, records = wandb_records(run_dir, 0)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.run_id == run_id and run.project == "fastpop" and run.display_name == "wb"
    logged = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert logged["population"]["size"] == 4 and logged["log"]["wandb"] == "offline"
    rows = history(records)
    # The round logged before W&B was enabled was sent first, per member against env_steps.
    assert rows[0]["env_steps"] == 3000 and rows[0]["wall_time"] == 10.0
    for member in range(3):
        assert rows[0][f"member_{member}/return_mean"] == RETURNS[0][member]
        assert rows[0][f"member_{member}/hparams/actor_lr"] == pytest.approx(
            HPARAMS[member]["actor_lr"]
        )
    assert rows[0]["population/best_return"] == -300.0
    assert rows[1]["env_steps"] == 3000 and rows[1]["member_2/lineage/source"] == 1.0
    assert rows[1]["member_2/lineage/hparams/actor_lr"] == pytest.approx(6e-4)
    assert rows[2]["env_steps"] == 4500 and rows[2]["learner/critic_loss"] == 0.25
    tables = rows[3]
    assert tables["members/_type"] == "table-file" and tables["lineage/nrows"] == 1
    members = json.loads((files / tables["members/path"]).read_text())
    by_member = {row[members["columns"].index("member")]: row for row in members["data"]}
    column = members["columns"].index
    assert by_member[2][column("actor_lr")] == pytest.approx(1e-4)
    assert "final_actor_lr" not in members["columns"]  # no evaluation since the exploit yet
    assert [by_member[m][column("final_return")] for m in range(3)] == RETURNS[0]
    lineage = json.loads((files / tables["lineage/path"]).read_text())
    assert dict(zip(lineage["columns"], lineage["data"][0], strict=True))["source"] == 1
    summary = {}
    for record in records:
        if record.WhichOneof("record_type") == "summary":
            summary |= items(record.summary.update)
    assert summary["best_member"] == 2 and summary["best_return"] == -300.0
    (exit_record,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert exit_record.exit_code == 0

    # A resume continues the same W&B run with only what it logs; an error marks it failed.
    with pytest.raises(RuntimeError, match="learner crashed"):  # noqa: SIM117
        with MetricsWriter(
            run_dir, tensorboard=False, trackers=trackers.open_trackers(config, run_dir)
        ) as writer:
            writer.log_evaluation(round_rows(1, FINAL_HPARAMS))
            raise RuntimeError("learner crashed")
    files, records = wandb_records(run_dir, 1)
    assert [r.run.run_id for r in records if r.WhichOneof("record_type") == "run"] == [run_id]
    rows = history(records)
    assert rows[0]["env_steps"] == 6000 and rows[0]["member_2/return_mean"] == -200.0
    assert "member_1/return_mean" not in rows[0]  # NaN: not a point
    members = json.loads((files / rows[1]["members/path"]).read_text())
    final_lr = members["data"][2][members["columns"].index("final_actor_lr")]
    assert final_lr == pytest.approx(6e-4)  # PBT changed it
    assert [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"] == [1]


def test_wandb_that_cannot_start_leaves_the_run_to_its_files(tmp_path, monkeypatch):
    wandb = require("wandb")

    def no_api_key(**settings):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", no_api_key)
    config = config_lib.load_config(None, ["log.wandb=online", "log.tensorboard=false"])
    with pytest.warns(UserWarning, match="W&B could not start.*No API key configured"):
        assert trackers.open_trackers(config, tmp_path) == []
    assert not (tmp_path / trackers.WANDB_FILE).exists()  # a resume starts (and fills) one
