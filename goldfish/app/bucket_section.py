"""Typed per-bucket results of one model: summary.json's "buckets" entry of a comparison with repetition buckets.

`ModelBuckets` is one model's entry (goldfish.app.buckets.bucket_results builds it): the prefix/suffix split, the
extraction table per bucket (`BucketStats`: exact match as k of n with its Clopper-Pearson interval, the other
measures' means with their bootstrap intervals), the same table per prefix length of the fixed-prefix sweep and for
beam search's output, membership inference per bucket (`BucketMembership`, each attack's `AttackScore`), the
lm-extraction-benchmark recall (`FieldRecall`) and Pythia's 32/32 score (`PythiaScores`).

Every type keeps `keys`, the keys its JSON object had in their order (None: every key, in the order written today),
so `to_json` gives back a file's entry exactly, of any age; `from_json` refuses a key it does not know rather than
drop it on writing back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from eval.buckets import EXACT_MATCH_K
from eval.metrics import AUC, AUC_CI, EXACT_MATCH, INTERVAL_SUFFIX, TPR_AT_FPR, TPR_AT_FPR_CI, interval_key
from goldfish.app.results import Interval, JsonValue, ordered_json


def refuse_unknown(entry: Mapping[str, JsonValue], known: Iterable[str], what: str) -> None:
    """ValueError when `entry` has a key outside `known` (reading it would drop the key on writing back)."""
    unknown = set(entry) - set(known)
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)} in {what}")


_STATS_KEYS = ("repeats", "n", EXACT_MATCH, EXACT_MATCH_K, interval_key(EXACT_MATCH))


@dataclass(frozen=True)
class BucketStats:
    """One bucket of an extraction table (eval.buckets.bucket_extraction): k of the bucket's n targets extracted
    exactly, the rate k/n with its 95% Clopper-Pearson interval, and per further measure (RougeL, match fraction,
    suffix log-likelihood: those the rows carried) the mean over the bucket's targets with its 95% bootstrap interval
    (None: no resamples)."""

    repeats: int  # copies trained on (0: the held-out targets)
    n: int
    k: int
    rate: float
    rate_ci: Interval
    means: dict[str, float | None]  # measure -> mean over the bucket's targets
    intervals: dict[str, Interval]  # measure -> its bootstrap interval
    keys: tuple[str, ...] | None = None

    def interval(self, metric: str) -> Interval:
        """A measure's interval: the Clopper-Pearson one for exact match, the bootstrap one otherwise (None: none)."""
        return self.rate_ci if metric == EXACT_MATCH else self.intervals.get(metric)

    def to_json(self) -> dict[str, JsonValue]:
        values: dict[str, JsonValue] = {
            "repeats": self.repeats,
            "n": self.n,
            EXACT_MATCH: self.rate,
            EXACT_MATCH_K: self.k,
            interval_key(EXACT_MATCH): self.rate_ci,  # type: ignore[dict-item]
        }
        for name, mean in self.means.items():
            values[name] = mean
            if name in self.intervals:
                values[interval_key(name)] = self.intervals[name]  # type: ignore[assignment]
        return ordered_json(values, self.keys)

    @classmethod
    def from_json(cls, entry: Mapping[str, JsonValue]) -> BucketStats:
        """An entry as bucket_extraction writes it: every key besides the count's is a measure or its interval."""
        e: dict = dict(entry)  # JSON values under the keys bucket_extraction gives them
        names = [key for key in e if key not in _STATS_KEYS and not key.endswith(INTERVAL_SUFFIX)]
        refuse_unknown(e, [*_STATS_KEYS, *names, *map(interval_key, names)], "a bucket's extraction entry")
        return cls(
            repeats=e["repeats"],
            n=e["n"],
            k=e[EXACT_MATCH_K],
            rate=e[EXACT_MATCH],
            rate_ci=e.get(interval_key(EXACT_MATCH)),
            means={name: e[name] for name in names},
            intervals={name: e[interval_key(name)] for name in names if interval_key(name) in e},
            keys=tuple(e),
        )


@dataclass(frozen=True)
class AttackScore:
    """One membership attack at one bucket (eval.buckets.bucket_membership): its AUC and TPR at the target FPR with
    the bucket's targets as members and bucket 0's as non-members, each with its 95% bootstrap interval, and how many
    members and non-members carried the attack's score."""

    auc: float
    auc_ci: Interval
    tpr_at_fpr: float
    tpr_at_fpr_ci: Interval
    n_members: int
    n_nonmembers: int
    keys: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, JsonValue]:
        values: dict[str, JsonValue] = {
            AUC: self.auc,
            AUC_CI: self.auc_ci,  # type: ignore[dict-item]
            TPR_AT_FPR: self.tpr_at_fpr,
            TPR_AT_FPR_CI: self.tpr_at_fpr_ci,  # type: ignore[dict-item]
            "n_members": self.n_members,
            "n_nonmembers": self.n_nonmembers,
        }
        return ordered_json(values, self.keys)

    @classmethod
    def from_json(cls, entry: Mapping[str, JsonValue]) -> AttackScore:
        e: dict = dict(entry)
        refuse_unknown(e, (AUC, AUC_CI, TPR_AT_FPR, TPR_AT_FPR_CI, "n_members", "n_nonmembers"), "an attack's entry")
        return cls(
            auc=e[AUC],
            auc_ci=e.get(AUC_CI),
            tpr_at_fpr=e[TPR_AT_FPR],
            tpr_at_fpr_ci=e.get(TPR_AT_FPR_CI),
            n_members=e["n_members"],
            n_nonmembers=e["n_nonmembers"],
            keys=tuple(e),
        )


@dataclass(frozen=True)
class BucketMembership:
    """Membership inference at one bucket: its targets as members against the bucket-0 targets, per attack."""

    repeats: int
    n_members: int
    n_nonmembers: int
    target_fpr: float
    attacks: dict[str, AttackScore]  # attack name (eval.membership.ATTACKS) -> its scores

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "repeats": self.repeats,
            "n_members": self.n_members,
            "n_nonmembers": self.n_nonmembers,
            "target_fpr": self.target_fpr,
            "attacks": {name: score.to_json() for name, score in self.attacks.items()},
        }

    @classmethod
    def from_json(cls, entry: Mapping[str, JsonValue]) -> BucketMembership:
        e: dict = dict(entry)
        refuse_unknown(e, ("repeats", "n_members", "n_nonmembers", "target_fpr", "attacks"), "a bucket's membership")
        return cls(
            repeats=e["repeats"],
            n_members=e["n_members"],
            n_nonmembers=e["n_nonmembers"],
            target_fpr=e["target_fpr"],
            attacks={name: AttackScore.from_json(score) for name, score in e["attacks"].items()},
        )


_RECALL_KEYS = ("recall", "n_correct", "n_guesses_read", "n_incorrect", "n_targets")


@dataclass(frozen=True)
class FieldRecall:
    """lm-extraction-benchmark's recall at one budget of incorrect guesses (eval.field_scores.recall_at_incorrect):
    the share of the trained targets found, the targets found, the guesses read and the budget."""

    recall: float
    n_correct: int
    n_guesses_read: int
    n_incorrect: int
    n_targets: int

    def to_json(self) -> dict[str, JsonValue]:
        return {key: getattr(self, key) for key in _RECALL_KEYS}

    @classmethod
    def from_json(cls, entry: Mapping[str, JsonValue]) -> FieldRecall:
        refuse_unknown(entry, _RECALL_KEYS, "a recall entry")
        return cls(**{key: entry[key] for key in _RECALL_KEYS})  # type: ignore[arg-type]


@dataclass(frozen=True)
class PythiaBucket:
    """Pythia's 32/32 memorization score at one bucket: the mean share of the 32 suffix tokens greedy decoding gets
    right, and the share of targets with all 32."""

    repeats: int
    n: int
    score: float
    memorized: float

    def to_json(self) -> dict[str, JsonValue]:
        return {"repeats": self.repeats, "n": self.n, "score": self.score, "memorized": self.memorized}

    @classmethod
    def from_json(cls, entry: Mapping[str, JsonValue]) -> PythiaBucket:
        e: dict = dict(entry)
        refuse_unknown(e, ("repeats", "n", "score", "memorized"), "a Pythia score entry")
        return cls(repeats=e["repeats"], n=e["n"], score=e["score"], memorized=e["memorized"])


@dataclass(frozen=True)
class PythiaScores:
    """Pythia's memorization score per bucket, on its split ("32/32")."""

    split: str
    table: list[PythiaBucket]

    def to_json(self) -> dict[str, JsonValue]:
        return {"split": self.split, "table": [entry.to_json() for entry in self.table]}

    @classmethod
    def from_json(cls, entry: Mapping[str, JsonValue]) -> PythiaScores:
        e: dict = dict(entry)
        refuse_unknown(e, ("split", "table"), "the Pythia scores")
        return cls(split=e["split"], table=[PythiaBucket.from_json(t) for t in e["table"]])


@dataclass(frozen=True)
class BucketSplit:
    """How the targets were split for extraction: the prefix given (None: every token before the suffix) and the
    suffix scored, in tokens, the same for every bucket."""

    prefix_len: int | None
    suffix_len: int

    def to_json(self) -> dict[str, JsonValue]:
        return {"prefix_len": self.prefix_len, "suffix_len": self.suffix_len}

    @classmethod
    def from_json(cls, entry: Mapping[str, JsonValue]) -> BucketSplit:
        e: dict = dict(entry)
        refuse_unknown(e, ("prefix_len", "suffix_len"), "the split")
        return cls(prefix_len=e["prefix_len"], suffix_len=e["suffix_len"])


# A model's entry's keys in the order bucket_results writes them ("beam" only with beam rows).
MODEL_KEYS = ("split", "extraction", "prefix_length", "beam", "membership", "recall_at_incorrect", "pythia")


@dataclass(frozen=True)
class ModelBuckets:
    """One model's per-bucket results (summary.json's buckets[label]); bucket tables are sorted by copies."""

    split: BucketSplit
    extraction: list[BucketStats]  # greedy extraction of the trained and held-out targets
    prefix_length: dict[str, list[BucketStats]]  # prefix length P (as a string) -> the table of the suffix after P
    membership: list[BucketMembership]  # [] without member and non-member rows
    recall_at_incorrect: dict[str, FieldRecall]  # budget of incorrect guesses (as a string) -> recall; {}: none
    pythia: PythiaScores | None = None  # None: extraction did not use the 32/32 split
    beam: list[BucketStats] | None = None  # beam search's output (--beams); None: no beam rows
    keys: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, JsonValue]:
        values: dict[str, JsonValue] = {
            "split": self.split.to_json(),
            "extraction": [entry.to_json() for entry in self.extraction],
            "prefix_length": {p: [entry.to_json() for entry in table] for p, table in self.prefix_length.items()},
            "beam": None if self.beam is None else [entry.to_json() for entry in self.beam],
            "membership": [entry.to_json() for entry in self.membership],
            "recall_at_incorrect": {budget: r.to_json() for budget, r in self.recall_at_incorrect.items()},
            "pythia": None if self.pythia is None else self.pythia.to_json(),
        }
        if self.beam is None and self.keys is None:
            del values["beam"]
        return ordered_json(values, self.keys)

    @classmethod
    def from_json(cls, entry: Mapping[str, JsonValue]) -> ModelBuckets:
        e: dict = dict(entry)  # JSON values under the keys bucket_results gives them
        refuse_unknown(e, MODEL_KEYS, "a model's buckets")
        pythia, beam = e.get("pythia"), e.get("beam")
        return cls(
            split=BucketSplit.from_json(e["split"]),
            extraction=[BucketStats.from_json(b) for b in e["extraction"]],
            prefix_length={p: [BucketStats.from_json(b) for b in t] for p, t in e["prefix_length"].items()},
            membership=[BucketMembership.from_json(m) for m in e["membership"]],
            recall_at_incorrect={n: FieldRecall.from_json(r) for n, r in e["recall_at_incorrect"].items()},
            pythia=None if pythia is None else PythiaScores.from_json(pythia),
            beam=None if beam is None else [BucketStats.from_json(b) for b in beam],
            keys=tuple(e),
        )

    def bucket(self, repeats: int) -> BucketStats | None:
        """The extraction entry of one bucket (None: no target of that bucket)."""
        return next((entry for entry in self.extraction if entry.repeats == repeats), None)
