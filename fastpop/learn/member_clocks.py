"""Each member's own clocks beside the run's: its version (how often a strategy step changed its
state or hparams) and the trial it runs (halving's fresh trials: since when, counted in the env
steps its own policy collected).

A fresh trial's clock starts with the first rows its own policy collected, not when the
strategy decides: in process mode the collectors still send rows the stopped trial's policy
collected (in their rings, or stepped before the new policy reached them). A collector stamps
each chunk with the trial (`epochs`) each of its env slots acted for; a member's rows count as
its trial's once every slot of the member is stamped with its current trial, and until then they
are taken out of its buffer again (`Learner.insert`). Device mode makes the rows in the program
that inserts them: its next chunk is the trial's, its lanes restarted (`restarting`).
"""

from __future__ import annotations

import numpy as np

from fastpop.strategies.base import Evaluation

PENDING = -1  # `starts` of a trial whose first own rows have not come in yet


class MemberClocks:
    """Plain numbers per member, saved in checkpoints (`saved` / `restore`)."""

    def __init__(self, size: int):
        self.versions = np.zeros(size, np.int64)  # strategy steps that changed the member
        self.epochs = np.zeros(size, np.int64)  # fresh trials started in the member's slot
        self.starts = np.zeros(size, np.int64)  # member env steps when its trial's own rows
        # began to go in (PENDING: not yet)

    def trial_steps(self, inserted: int) -> np.ndarray:
        """(P,) env steps per member of the current trial's own rows inserted so far."""
        return np.where(self.starts >= 0, inserted - self.starts, 0)

    def restarting(self) -> np.ndarray:
        """(P,) bool: members whose trial has started and has no rows of its own yet."""
        return self.starts == PENDING

    def own_rows(self, lane_epochs: np.ndarray | None) -> np.ndarray:
        """(P,) bool: the chunk's rows of the member were all collected for its current trial.
        `lane_epochs`: per lane (member-major), the trial its collector acted for; None: rows
        made for the current trials (device mode, a run in this process)."""
        if lane_epochs is None:
            return np.ones(len(self.epochs), bool)
        per_member = np.asarray(lane_epochs).reshape(len(self.epochs), -1)
        return np.all(per_member == self.epochs[:, None], axis=1)

    def record_rows(self, own: np.ndarray, inserted_before: int) -> np.ndarray:
        """A chunk went in (`inserted_before`: member env steps before it): a waiting trial
        whose own rows these are starts its clock there. Returns (P,) bool: the members whose
        rows in it belong to a stopped trial (to take out of their buffers again)."""
        begins = self.restarting() & own
        self.starts[begins] = inserted_before
        return ~own

    def changed(self, members: np.ndarray) -> None:
        """A strategy step changed these members' state or hparams."""
        self.versions += np.asarray(members, bool)

    def start_trials(self, fresh: np.ndarray) -> None:
        """These members start fresh trials: their clocks wait for the trials' own rows."""
        fresh = np.asarray(fresh, bool)
        self.epochs += fresh
        self.starts[fresh] = PENDING

    def published(self, inserted: int) -> tuple[np.ndarray, np.ndarray]:
        """What collectors act by: per member the trial (int32) and its env steps so far (a
        restarted collector resumes the trial's exploration schedule there)."""
        return self.epochs.astype(np.int32), self.trial_steps(inserted).astype(np.int32)

    def saved(self) -> dict:
        return {name: getattr(self, name).tolist() for name in ("versions", "epochs", "starts")}

    def restore(self, data: dict) -> None:
        for name, values in data.items():
            setattr(self, name, np.asarray(values, np.int64))


def snapshot_facts(clocks: MemberClocks, inserted: int, updates: int) -> dict:
    """Plain data of what each member is now, as an evaluation snapshot keeps it: its version,
    its trial's env steps, and the update calls per member so far."""
    return {
        "versions": clocks.versions.tolist(),
        "trial_steps": clocks.trial_steps(inserted).tolist(),
        "updates": updates,
    }


def evaluation_fields(facts: dict) -> dict:
    """`snapshot_facts` as the `Evaluation` fields they fill (versions, trial_steps, updates)."""
    return {
        "versions": np.asarray(facts["versions"], np.int64),
        "trial_steps": np.asarray(facts["trial_steps"], np.int64),
        "updates": facts["updates"],
    }


def completed(evaluation: Evaluation, finite, hparams: list[dict], now: dict) -> Evaluation:
    """`evaluation` with every field it leaves None taken from the members as they are `now`
    (`snapshot_facts`; a round evaluated where they stand), their versions now, and whether
    each is still exactly the evaluated policy (same version, no update since)."""
    given = {"finite": finite, "hparams": hparams, **evaluation_fields(now)}
    fill = {name: value for name, value in given.items() if getattr(evaluation, name) is None}
    evaluation = evaluation._replace(**fill, versions_now=np.asarray(now["versions"]))
    unchanged = evaluation.same_line & (evaluation.updates == now["updates"])
    return evaluation._replace(as_evaluated=unchanged)
