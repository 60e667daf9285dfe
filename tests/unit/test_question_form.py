"""Unit tests: the form a pydantic answer model becomes (`form_of`), what it refuses and why, and an
answer's way back: its JSON as form values (`form_values`), checked against the frozen form
(`parse_answer`) into the model's JSON, each bad value named with its field and nothing returned;
and the page's form for whole numbers and enums, rendered in process."""

from __future__ import annotations

import enum
import re
import warnings
from html.parser import HTMLParser
from typing import Annotated, Any, Literal

import pytest
from pydantic import AfterValidator, BaseModel, Field, create_model, field_validator, model_validator
from support.records import approval_record

from countersign.approval.edits import EditRejected
from countersign.approval.question import (
    MAX_CHOICES,
    MAX_FIELDS,
    MAX_LIST_ITEMS,
    QUESTION_TOOL,
    AnswerModelError,
    form_of,
    form_values,
    parse_answer,
)
from countersign.web import wording
from countersign.web.views import page


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


class Everything(BaseModel):
    account: str = Field(min_length=3)
    note: str | None = None
    signature: str = "n/a"
    count: int = Field(ge=0)
    ratio: float
    urgent: bool
    notify: bool = True
    draft: Literal["short", "long"]
    colour: Colour
    size: Size = Size.LARGE
    tags: list[str] = Field(default_factory=list, max_length=3)
    counts: list[int] = Field(default_factory=list)
    sizes: list[Size] = Field(default_factory=list)
    limit: int | None = None


FULL = Everything(
    account="DE89-3704\nsecond line",
    note="call first",
    signature="Ops",
    count=7,
    ratio=0.25,
    urgent=True,
    notify=False,
    draft="long",
    colour=Colour.BLUE,
    size=Size.SMALL,
    tags=["vip\nrepeat", "  spaced  ", "x"],
    counts=[1, -2],
    sizes=[Size.LARGE, Size.SMALL],
    limit=0,
)


@pytest.mark.parametrize(
    "answer",
    [
        FULL,
        Everything(account="abc", count=0, ratio=-1.5, urgent=False, draft="short", colour=Colour.RED),
        FULL.model_copy(update={"tags": ["a", "b", "c"], "counts": list(range(MAX_LIST_ITEMS))}),
    ],
    ids=["every-field-given", "defaults-left", "lists-at-their-limits"],
)
def test_an_answer_sent_as_json_comes_back_as_the_same_typed_answer(answer: Everything) -> None:
    sent = answer.model_dump(mode="json")
    got = parse_answer(form_of(Everything), form_values(sent))
    assert got == sent
    assert Everything.model_validate(got) == answer


def test_a_list_sent_as_a_json_array_keeps_each_item_whole() -> None:
    values = form_values({"tags": ["vip\nrepeat", "second"]})
    got = parse_answer(form_of(_model("Tagged", tags=(list[str], ...))), values)
    assert got == {"tags": ["vip\nrepeat", "second"]}


def test_the_pages_list_is_one_item_a_line_blank_lines_left_out() -> None:
    fields = form_of(Everything)
    typed = {"account": "abc", "count": "1", "ratio": "1", "urgent": "", "draft": "short", "colour": "red"}
    got = parse_answer(fields, {**typed, "tags": " vip \n\nrepeat\r\n", "counts": "3\n4", "sizes": "2\n1"})
    assert (got["tags"], got["counts"], got["sizes"]) == (["vip", "repeat"], [3, 4], [2, 1])


REQUIRED = {"account": "abc", "count": "1", "ratio": "1", "urgent": "", "draft": "short", "colour": "red"}
"""The page's values for Everything's required fields, every optional one left empty or out."""


@pytest.mark.parametrize("empty", ["", "   ", None], ids=["empty", "blank", "left-out"])
def test_an_optional_field_left_empty_is_the_models_default(empty: str | None) -> None:
    optional = ("note", "signature", "size", "tags", "counts", "sizes", "limit")
    values = REQUIRED if empty is None else {**REQUIRED, **dict.fromkeys(optional, empty)}
    got = parse_answer(form_of(Everything), values)
    defaults: dict[str, object] = {
        "note": None,
        "signature": "n/a",
        "size": 2,
        "tags": [],
        "counts": [],
        "sizes": [],
        "limit": None,
    }
    assert {name: got[name] for name in optional} == defaults
    assert got["notify"] is True, "a checkbox left out (not sent at all) is its default"


def test_an_unticked_box_is_false_and_a_required_box_left_out_is_unanswered() -> None:
    fields = form_of(Everything)
    assert parse_answer(fields, {**REQUIRED, "notify": ""})["notify"] is False
    assert parse_answer(fields, {**REQUIRED, "urgent": "on"})["urgent"] is True
    with pytest.raises(EditRejected, match=r"^Urgent: an answer is required$"):
        parse_answer(fields, {k: v for k, v in REQUIRED.items() if k != "urgent"})


@pytest.mark.parametrize("empty", ["", "  "])
def test_a_required_text_left_empty_is_refused_unless_the_model_allows_the_empty_text(empty: str) -> None:
    with pytest.raises(EditRejected, match=r"^Account: an answer is required$"):
        parse_answer(form_of(Everything), {**REQUIRED, "account": empty})
    with pytest.raises(EditRejected, match=r"^Note: an answer is required$"):
        parse_answer(form_of(_model("Plain", note=(str, ...))), {"note": empty})
    assert parse_answer(form_of(_model("Blank", note=(str, Field(min_length=0)))), {"note": empty}) == {"note": empty}


@pytest.mark.parametrize(
    ("changed", "problem"),
    [
        ({"count": "seven"}, "count: Input should be a valid integer"),
        ({"count": "-1"}, "count: Input should be greater than or equal to 0"),
        ({"ratio": "a quarter"}, "ratio: Input should be a valid number"),
        ({"account": "ab"}, "account: String should have at least 3 characters"),
        ({"urgent": "maybe"}, "Urgent: tick the box or leave it empty"),
        ({"draft": "poem"}, "Draft: 'poem' is not one of the choices (short, long)"),
        ({"colour": "green"}, "Colour: 'green' is not one of the choices (red, blue)"),
        ({"size": "3"}, "Size: '3' is not one of the choices (1, 2)"),
        ({"sizes": "1\n3"}, "Sizes: '3' is not one of the choices (1, 2)"),
        ({"tags": "a\nb\nc\nd"}, "tags: List should have at most 3 items after validation, not 4"),
        ({"tags": '["a", "b", "c", "d"]'}, "tags: List should have at most 3 items after validation, not 4"),
        ({"tags": '["a", {"b": 1}]'}, 'Tags: each item must be a text or a number, not {"b": 1}'),
        ({"counts": "1\ntwo"}, "counts.1: Input should be a valid integer"),
        ({"colour": ""}, "Colour: an answer is required"),
        (
            {"colour": "green", "draft": "poem"},
            "Draft: 'poem' is not one of the choices (short, long); Colour: 'green'",
        ),
        (
            {"count": "x", "ratio": "y"},
            "count: Input should be a valid integer, unable to parse string as an integer; ratio:",
        ),
        ({"shoe_size": "44"}, "the question has no field shoe_size"),
    ],
)
def test_a_bad_value_is_named_with_its_field_and_nothing_is_returned(changed: dict[str, str], problem: str) -> None:
    fields = form_of(Everything)
    assert parse_answer(fields, REQUIRED)["count"] == 1, "the values without the change are an answer"
    with pytest.raises(EditRejected) as refused:
        parse_answer(fields, {**REQUIRED, **changed})
    assert problem in str(refused.value)


def test_a_list_item_beyond_the_list_limit_sent_as_json_is_refused() -> None:
    fields = form_of(_model("Counts", counts=(list[int], ...)))
    within = list(range(MAX_LIST_ITEMS))
    assert parse_answer(fields, form_values({"counts": within})) == {"counts": within}
    with pytest.raises(EditRejected, match=f"counts: List should have at most {MAX_LIST_ITEMS} items"):
        parse_answer(fields, form_values({"counts": [*within, 0]}))


def test_a_value_that_only_looks_like_a_json_array_is_read_one_item_a_line() -> None:
    fields = form_of(_model("Tagged", tags=(list[str], ...)))
    assert parse_answer(fields, {"tags": "[draft]\n[final"}) == {"tags": ["[draft]", "[final"]}
    deep = "[" * 100_000
    assert parse_answer(fields, {"tags": deep}) == {"tags": [deep]}, "nesting past the parser's depth is text"


class _Controls(HTMLParser):
    """The form's controls as the browser reads them: each input and textarea, by its name."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.controls: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("input", "textarea"):
            self.controls.append({"tag": tag, **dict(attrs)})


class Sizing(BaseModel):
    count: int = Field(ge=1)
    size: Size = Size.LARGE
    colour: Colour


def test_the_page_asks_for_a_whole_number_with_a_number_pad_and_an_enum_as_its_choices() -> None:
    fields = form_of(Sizing)
    record = approval_record(
        tool=QUESTION_TOOL,
        kind="question",
        args={"question": "How many?", "fields": [f.model_dump(mode="json") for f in fields], "default": None},
    )
    response = page(
        "question.html",
        record=record,
        question="How many?",
        fields=fields,
        default=None,
        values={},
        problem=None,
        reason="",
        approver="a@example.com",
        goal="",
        csrf="c" * 20,
        deadline=wording.deadline(record.deadline, record.requested_at),
        requested=wording.moment(record.requested_at),
        fingerprint=record.digest[:12],
    )
    parsed = _Controls()
    parsed.feed(bytes(response.body).decode())
    controls = [c for c in parsed.controls if str(c.get("name", "")).startswith("edit.")]
    [count] = [c for c in controls if c["name"] == "edit.count"]
    assert (count["tag"], count.get("inputmode"), "required" in count) == ("input", "numeric", True)
    size = [c for c in controls if c["name"] == "edit.size"]
    assert [(c["type"], c["value"], "checked" in c, "required" in c) for c in size] == [
        ("radio", "1", False, False),
        ("radio", "2", True, False),
    ], "an int enum's values, its default chosen, none required"
    colour = [c for c in controls if c["name"] == "edit.colour"]
    assert [(c["type"], c["value"], "checked" in c, "required" in c) for c in colour] == [
        ("radio", "red", False, True),
        ("radio", "blue", False, True),
    ], "a str enum's values, none chosen, required"
