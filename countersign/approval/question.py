"""A question with a typed answer: the form a pydantic answer model becomes, and the answer checked.

`countersign.approval.calls.ask_person` is the public call built on these.

Guarantee: only a model inside the form's subset (text, whole numbers, numbers, booleans, enums or
Literals as choices, and short lists of those; at most `MAX_FIELDS` fields, `MAX_CHOICES` choices,
`MAX_LIST_ITEMS` items, no nested models and no validators the page could not run) becomes a form;
anything else is refused when asked, with `AnswerModelError`. The form's fields are frozen into the
question's record, and an answer decides only if it validates against them on the server (pydantic,
with the model's own bounds): `parse_answer` returns the answer's JSON or raises `EditRejected` with
what is wrong, deciding nothing. Pure: no clock, no I/O, the same answer on every replay.
"""

from __future__ import annotations

import enum
import json
import types
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, Field, ValidationError, create_model
from pydantic.fields import FieldInfo
from restate import TerminalError

from countersign.approval.edits import EditRejected
from countersign.exceptions import CountersignError
from countersign.tools.registry import validation_message

QUESTION_TOOL = "question"
"""The `tool` of a question's approval record (and of its entry in a run's history)."""

MAX_FIELDS = 20
MAX_CHOICES = 50
MAX_LIST_ITEMS = 20
MAX_TEXT = 2000
"""The longest text answer (a text field with no shorter `max_length` of its own gets this one)."""
_SHORT_TEXT = 200
"""Text fields allowed longer than this get a text area, others one line."""

FieldKind = Literal["text", "integer", "number", "boolean", "choice", "list"]
ItemKind = Literal["text", "integer", "number", "choice"]
Scalar = str | int | float
_TRUE = {"on", "true", "yes", "1"}
_FALSE = {"", "off", "false", "no", "0"}
_NOT_GIVEN = object()
"""A field's value when it was left empty: the answer leaves it out, so it gets the model's default."""
_BOUNDS = {
    annotated_types.Ge: "ge",
    annotated_types.Gt: "gt",
    annotated_types.Le: "le",
    annotated_types.Lt: "lt",
    annotated_types.MinLen: "min_length",
    annotated_types.MaxLen: "max_length",
}


class AnswerModelError(CountersignError, TerminalError):
    """An answer model outside the form's subset (a nested model, a dict, a validator the page cannot
    run, too many fields or choices). Also a Restate `TerminalError` (400), so a handler that asks with
    one fails once, with this message, instead of being retried."""

    def __init__(self, message: str) -> None:
        CountersignError.__init__(self, message)
        TerminalError.__init__(self, message, 400)


class QuestionField(BaseModel):
    """One field of a question's form, frozen into its record (the page renders it, the server checks it)."""

    name: str
    label: str
    help: str = ""
    kind: FieldKind
    item: ItemKind | None = None
    """For a list: what each item is."""
    choices: list[Scalar] = Field(default_factory=list)
    """For a choice (or a list of choices): the values one may pick, in order."""
    required: bool = True
    default: Any = None
    bounds: dict[str, Scalar] = Field(default_factory=dict)
    """pydantic's names: ge, gt, le, lt, min_length, max_length, pattern."""

    @property
    def multiline(self) -> bool:
        longest = self.bounds.get("max_length", MAX_TEXT)
        return self.kind == "list" or (self.kind == "text" and isinstance(longest, int) and longest > _SHORT_TEXT)


def form_of(model: type[BaseModel]) -> list[QuestionField]:
    """The form for `model`, or AnswerModelError saying what is outside the subset."""
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise AnswerModelError(f"answer_model must be a pydantic model class, not {model!r:.80}")
    name = model.__name__
    decorators = model.__pydantic_decorators__
    checked = ", ".join(
        sorted(
            {f for d in decorators.field_validators.values() for f in d.info.fields}
            | {f for d in decorators.validators.values() for f in d.info.fields}
        )
    )
    if checked:
        raise AnswerModelError(f"{name}.{checked}: a validator the answer page cannot run; use field bounds instead")
    if decorators.model_validators or decorators.root_validators:
        raise AnswerModelError(f"{name} has a model validator the answer page cannot run; use field bounds instead")
    if not model.model_fields:
        raise AnswerModelError(f"{name} has no fields to ask for")
    if len(model.model_fields) > MAX_FIELDS:
        raise AnswerModelError(f"{name} has {len(model.model_fields)} fields; a question asks at most {MAX_FIELDS}")
    return [_field(name, field_name, info) for field_name, info in model.model_fields.items()]


def _field(model: str, name: str, info: FieldInfo) -> QuestionField:
    where = f"{model}.{name}"
    annotation, optional = _unwrap_optional(info.annotation)
    bounds = _bounds(where, info.metadata)
    kind, item, choices = _kind(where, annotation)
    if kind == "text":
        bounds["max_length"] = min(int(bounds.get("max_length", MAX_TEXT)), MAX_TEXT)
    if kind == "list":
        bounds["max_length"] = min(int(bounds.get("max_length", MAX_LIST_ITEMS)), MAX_LIST_ITEMS)
    required = info.is_required()
    default = None if required else _plain(info.get_default(call_default_factory=True))
    return QuestionField(
        name=name,
        label=info.title or name.replace("_", " ").capitalize(),
        help=info.description or "",
        kind=kind,
        item=item,
        choices=choices,
        required=required and not optional,
        default=default,
        bounds=bounds,
    )


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    if get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return members[0], True
    return annotation, False


def _bounds(where: str, metadata: list[Any]) -> dict[str, Scalar]:
    bounds: dict[str, Scalar] = {}
    for item in metadata:
        known = next((key for cls, key in _BOUNDS.items() if isinstance(item, cls)), None)
        if known is not None:
            bounds[known] = getattr(item, known)
        elif (pattern := getattr(item, "pattern", None)) is not None and isinstance(pattern, str):
            bounds["pattern"] = pattern
        else:
            raise AnswerModelError(f"{where}: {item!r:.80} is not a bound the answer page can check")
    return bounds


def _kind(where: str, annotation: Any) -> tuple[FieldKind, ItemKind | None, list[Scalar]]:
    if get_origin(annotation) is Annotated:
        raise AnswerModelError(f"{where}: Annotated types inside a field are outside the form's subset")
    if annotation is bool:
        return "boolean", None, []
    if get_origin(annotation) is list:
        [inner] = get_args(annotation) or [Any]
        kind, _, items = _kind(where, inner)
        if kind == "list" or kind == "boolean":
            raise AnswerModelError(f"{where}: a list of {kind}s is outside the form's subset")
        return "list", kind, items
    if annotation is str:
        return "text", None, []
    if annotation is int:
        return "integer", None, []
    if annotation is float:
        return "number", None, []
    offered = _choices(annotation)
    if offered is not None:
        if not offered or len(offered) > MAX_CHOICES:
            raise AnswerModelError(f"{where}: a choice needs 1 to {MAX_CHOICES} values, not {len(offered)}")
        return "choice", None, offered
    raise AnswerModelError(
        f"{where}: {getattr(annotation, '__name__', annotation)!s:.60} is outside the form's subset "
        "(text, int, float, bool, an enum or Literal, a short list of those)"
    )


def _choices(annotation: Any) -> list[Scalar] | None:
    values: list[Any]
    if get_origin(annotation) is Literal:
        values = list(get_args(annotation))
    elif isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = [member.value for member in annotation]
    else:
        return None
    if all(isinstance(v, str | int) and not isinstance(v, bool) for v in values):
        return values
    return None


def _plain(value: Any) -> Any:
    """A default as JSON (an enum by its value)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _python_type(kind: FieldKind | ItemKind, choices: list[Scalar], item: ItemKind | None = None) -> Any:
    match kind:
        case "text":
            return str
        case "integer":
            return int
        case "number":
            return float
        case "boolean":
            return bool
        case "choice":
            return Literal[tuple(choices)]
        case "list":
            assert item is not None
            return list[_python_type(item, choices)]  # type: ignore[misc]


def _checker(fields: list[QuestionField]) -> type[BaseModel]:
    """A pydantic model of exactly the frozen fields and their bounds (the server's check)."""
    spec: dict[str, Any] = {}
    for f in fields:
        wanted = _python_type(f.kind, f.choices, f.item)
        if not f.required:
            wanted = wanted | None
        bounds: dict[str, Any] = dict(f.bounds)
        spec[f.name] = (wanted, Field(... if f.required else f.default, **bounds))
    return create_model("Answer", __config__={"extra": "forbid", "strict": False}, **spec)


def from_form(fields: list[QuestionField], values: Mapping[str, str]) -> dict[str, Any]:
    """An answer's JSON from a form's text values (a list as `_list_items` reads it; a checkbox sends
    `on`, or its hidden empty value for false); EditRejected naming each value of the wrong shape.

    A field left empty (or left out) is not given: an optional field is then left out of the answer,
    so it gets the model's default (`None` for an `X | None`), never `""`. A required field not given
    is refused as unanswered, except a list (its items are then none, which its own `min_length` may
    refuse) and a text whose model allows the empty text (`min_length=0`), sent as `""`."""
    by_name = {f.name: f for f in fields}
    if unknown := sorted(set(values) - set(by_name)):
        raise EditRejected(f"the question has no field {', '.join(unknown)[:200]}")
    answer: dict[str, Any] = {}
    problems: list[str] = []
    for f in fields:
        try:
            given = _given(f, values.get(f.name))
        except EditRejected as exc:
            problems.append(str(exc))
            continue
        if given is not _NOT_GIVEN:
            answer[f.name] = given
    if problems:
        raise EditRejected("; ".join(problems))
    return answer


def _given(f: QuestionField, raw: str | None) -> Any:
    """One field's answer from its form value (`_NOT_GIVEN` for the model's default), as `from_form` says."""
    if raw is None or (raw.strip() == "" and f.kind != "boolean"):
        if not f.required:
            return _NOT_GIVEN
        if f.kind == "list":
            return []
        if f.kind == "text" and raw is not None and f.bounds.get("min_length") == 0:
            return raw
        raise EditRejected(f"{f.label}: an answer is required")
    if f.kind == "boolean":
        if raw.strip().lower() not in _TRUE | _FALSE:
            raise EditRejected(f"{f.label}: tick the box or leave it empty")
        return raw.strip().lower() in _TRUE
    if f.kind == "list":
        return [_one(f, item) for item in _list_items(f, raw)]
    return _one(f, raw if f.kind == "text" else raw.strip())


def _list_items(f: QuestionField, raw: str) -> list[str]:
    """A list's items from its form value: a JSON array (how `form_values` writes a list, so that an
    item sent as JSON keeps its line breaks), or else one item a line (the page's text area)."""
    try:
        items = json.loads(raw) if raw.lstrip().startswith("[") else None
    except (ValueError, RecursionError):  # not JSON, or nested past what it parses
        items = None
    if not isinstance(items, list):
        return [line.strip() for line in raw.splitlines() if line.strip()]
    if bad := [i for i in items if not isinstance(i, str | int | float) or isinstance(i, bool)]:
        raise EditRejected(f"{f.label}: each item must be a text or a number, not {json.dumps(bad[0])[:40]}")
    return [str(i) for i in items]


def _one(f: QuestionField, raw: str) -> Any:
    if not f.choices:
        return raw
    match = next((c for c in f.choices if str(c) == raw.strip()), None)
    if match is None:
        shown = ", ".join(str(c) for c in f.choices[:10])
        raise EditRejected(f"{f.label}: {raw.strip()[:40]!r} is not one of the choices ({shown})")
    return match


def form_values(answer: Mapping[str, Any]) -> dict[str, str]:
    """The form's text values of a JSON answer (true is a ticked box, a list a JSON array, its items
    whole; null is left out), so that an answer given as JSON takes the form's path and checks."""
    values: dict[str, str] = {}
    for name, value in answer.items():
        if value is None:
            continue
        if isinstance(value, bool):
            values[name] = "on" if value else ""
        elif isinstance(value, list):
            values[name] = json.dumps(value)
        else:
            values[name] = str(value)
    return values


def parse_answer(fields: list[QuestionField], values: Mapping[str, str]) -> dict[str, Any]:
    """The answer's JSON, checked against the frozen fields and their bounds; EditRejected (deciding
    nothing) with what is wrong otherwise."""
    answer = from_form(fields, values)
    try:
        return _checker(fields).model_validate(answer).model_dump(mode="json")
    except ValidationError as exc:
        raise EditRejected(f"the answer is not valid: {validation_message(exc)}") from None


def answer_of(args: Mapping[str, Any], edits: Mapping[str, Any] | None, *, defaulted: bool) -> dict[str, Any]:
    """A question's answer as the code that asked gets it, from its record's `args`: the declared
    default when the deadline answered it (`defaulted`), else `edits` (the form's values, or the typed
    answer a settled record keeps) checked against the frozen fields; EditRejected if they do not fit."""
    if defaulted:  # checked when it was asked
        return dict(args.get("default") or {})
    return parse_answer(fields_of(args), form_values(edits or {}))


def fields_of(args: Mapping[str, Any]) -> list[QuestionField]:
    """The frozen fields of a question's record `args`."""
    return [QuestionField.model_validate(f) for f in args.get("fields", [])]
