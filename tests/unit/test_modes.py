"""Modes are Literal types defined once (issue 45): the mask strategies, the dedup modes and duplicate policies, and
the chat roles each have one alias whose values are the command line's choices and which the settings fields carry."""

from __future__ import annotations

import typing

from data.chat import ROLES, Message, Role
from data.dedup import DEDUP_MODES, DUPLICATE_POLICIES, DedupConfig, DedupMode, DuplicatePolicy
from goldfish.app.config import DataSpec, MaskSpec
from goldfish.collator import GoldfishCollator
from goldfish.masks import drop_mask
from goldfish.strategies import STRATEGIES, WINDOW_STRATEGIES, Strategy


def test_the_choices_are_the_literal_values() -> None:
    assert STRATEGIES == typing.get_args(Strategy) and set(WINDOW_STRATEGIES) <= set(STRATEGIES)
    assert DEDUP_MODES == typing.get_args(DedupMode) == ("off", "exact", "near")
    assert DUPLICATE_POLICIES == typing.get_args(DuplicatePolicy) == ("drop", "repeat")
    assert ROLES == typing.get_args(Role)


def test_settings_and_library_fields_carry_the_aliases() -> None:
    hints = typing.get_type_hints
    assert hints(MaskSpec)["strategy"] == Strategy | None
    assert hints(DataSpec)["dedup"] == DedupMode and hints(DataSpec)["duplicates"] == DuplicatePolicy
    assert hints(DedupConfig)["mode"] == DedupMode and hints(DedupConfig)["duplicates"] == DuplicatePolicy
    assert hints(Message)["role"] == Role
    assert hints(drop_mask)["strategy"] == Strategy
    assert hints(GoldfishCollator.__init__)["strategy"] == Strategy | None


def test_report_to_is_one_literal() -> None:
    from goldfish.app.config import Runtime
    from goldfish.app.tracking import REPORT_TO, ReportTo

    assert REPORT_TO == typing.get_args(ReportTo) == ("none", "tensorboard")
    assert typing.get_type_hints(Runtime)["report_to"] == ReportTo


def test_train_config_settings_are_literals_of_their_choices() -> None:
    from engine.spec import PIPE_SCHEDULES, PRECISIONS, PipeSchedule, Precision, RowsLayout
    from engine.training.config import LR_SCHEDULES, OPTIMIZERS, LrSchedule, Optimizer, TrainConfig
    from goldfish.app.options import TRAINING

    assert OPTIMIZERS == typing.get_args(Optimizer) == ("adamw", "sgd")
    assert LR_SCHEDULES == typing.get_args(LrSchedule) == ("constant", "cosine")
    assert set(typing.get_args(Precision)) == set(PRECISIONS)  # what check_precision validates
    assert set(typing.get_args(PipeSchedule)) == set(PIPE_SCHEDULES)  # what PipeConfig validates
    aliases = {
        "optimizer": Optimizer,
        "schedule": LrSchedule,
        "precision": Precision,
        "rows": RowsLayout,
        "pipe_schedule": PipeSchedule,
    }
    hints = typing.get_type_hints(TrainConfig)
    choices = {option.field: option.choices for option in TRAINING.options if option.choices}
    for field, alias in aliases.items():
        assert hints[field] == alias, field
        assert set(choices[field]) == set(typing.get_args(alias)), field  # the command line offers the same values
