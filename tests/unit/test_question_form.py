"""Unit tests: the form a pydantic answer model becomes (`form_of`) and what it refuses, each refusal
naming the field (or the model) and what is outside the form's subset."""

from __future__ import annotations

import enum
import re
import warnings
from typing import Annotated, Any, Literal

import pytest
from pydantic import AfterValidator, BaseModel, Field, create_model, field_validator, model_validator

from countersign.approval.question import (
    MAX_CHOICES,
    MAX_FIELDS,
    MAX_LIST_ITEMS,
    AnswerModelError,
    form_of,
)


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Size(enum.Enum):
    SMALL = 1
    LARGE = 2


class Weight(enum.Enum):
    LIGHT = 0.5
    HEAVY = 2.5


class Nothing(enum.Enum):
    pass


class Inner(BaseModel):
    account: str


def _model(name: str, **fields: Any) -> type[BaseModel]:
    return create_model(name, **fields)


class FieldChecked(BaseModel):
    account: str

    @field_validator("account")
    @classmethod
    def _upper(cls, value: str) -> str:
        return value.upper()


class ModelChecked(BaseModel):
    low: int
    high: int

    @model_validator(mode="after")
    def _ordered(self) -> ModelChecked:
        return self


MANY_CHOICES = Literal[tuple(f"c{i}" for i in range(MAX_CHOICES + 1))]  # type: ignore[valid-type]


@pytest.mark.parametrize(
    ("model", "problem"),
    [
        (_model("Empty"), "Empty has no fields to ask for"),
        (
            _model("Wide", **{f"f{i}": (int, ...) for i in range(MAX_FIELDS + 1)}),
            f"Wide has {MAX_FIELDS + 1} fields; a question asks at most {MAX_FIELDS}",
        ),
        (_model("Pick", colour=(MANY_CHOICES, ...)), f"Pick.colour: a choice needs 1 to {MAX_CHOICES} values, not 51"),
        (_model("Pick", colour=(Nothing, ...)), f"Pick.colour: a choice needs 1 to {MAX_CHOICES} values, not 0"),
        (_model("Grid", rows=(list[list[str]], ...)), "Grid.rows: a list of lists is outside the form's subset"),
        (_model("Flags", flags=(list[bool], ...)), "Flags.flags: a list of booleans is outside the form's subset"),
        (_model("Bag", extra=(dict[str, str], ...)), "Bag.extra: dict is outside the form's subset"),
        (_model("Outer", target=(Inner, ...)), "Outer.target: Inner is outside the form's subset"),
        (_model("Either", value=(str | int, ...)), "Either.value: str | int is outside the form's subset"),
        (_model("Heavy", weight=(Weight, ...)), "Heavy.weight: Weight is outside the form's subset"),
        (_model("Pair", pair=(tuple[int, int], ...)), "Pair.pair: tuple is outside the form's subset"),
        (FieldChecked, "FieldChecked.account: a validator the answer page cannot run"),
        (ModelChecked, "ModelChecked has a model validator the answer page cannot run"),
        (
            _model("Trimmed", note=(Annotated[str, AfterValidator(str.strip)], ...)),
            "Trimmed.note: AfterValidator",
        ),
        (_model("Round", count=(int, Field(multiple_of=5))), "Round.count: MultipleOf(multiple_of=5) is not a bound"),
        (_model("Strict", count=(int, Field(strict=True))), "Strict.count: Strict(strict=True) is not a bound"),
        (
            _model("Short", tags=(list[Annotated[str, Field(max_length=3)]], ...)),
            "Short.tags: Annotated types inside a field are outside the form's subset",
        ),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else None,
)
def test_a_model_outside_the_forms_subset_is_refused_naming_the_field_and_what_is_wrong(
    model: type[BaseModel], problem: str
) -> None:
    with pytest.raises(AnswerModelError, match="^" + re.escape(problem)):
        form_of(model)


def test_a_pydantic_v1_validator_is_refused_as_a_v2_one_is() -> None:
    from pydantic import root_validator, validator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydantic says they are deprecated: that is the point

        class OldField(BaseModel):
            account: str

            @validator("account")
            def _upper(cls, value: str) -> str:
                return value.upper()

        class OldRoot(BaseModel):
            account: str

            @root_validator(skip_on_failure=True)
            def _whole(cls, values: dict[str, Any]) -> dict[str, Any]:
                return values

    with pytest.raises(AnswerModelError, match=r"^OldField\.account: a validator the answer page cannot run"):
        form_of(OldField)
    with pytest.raises(AnswerModelError, match=r"^OldRoot has a model validator the answer page cannot run"):
        form_of(OldRoot)


def test_what_is_not_a_model_class_is_refused() -> None:
    with pytest.raises(AnswerModelError, match="must be a pydantic model class, not <class 'dict'>"):
        form_of(dict)  # type: ignore[arg-type]
    with pytest.raises(AnswerModelError, match="must be a pydantic model class, not Inner"):
        form_of(Inner(account="x"))  # type: ignore[arg-type]


def test_the_limits_themselves_are_inside_the_subset() -> None:
    wide = form_of(_model("Wide", **{f"f{i}": (int, ...) for i in range(MAX_FIELDS)}))
    assert len(wide) == MAX_FIELDS
    choices = tuple(f"c{i}" for i in range(MAX_CHOICES))
    [pick] = form_of(_model("Pick", colour=(Literal[choices], ...)))
    assert pick.choices == list(choices)
    [tags] = form_of(_model("Tags", tags=(list[str], Field(max_length=500))))
    assert tags.bounds["max_length"] == MAX_LIST_ITEMS, "a list asks at most MAX_LIST_ITEMS items"
