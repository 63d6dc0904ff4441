"""Lock names made from a call's arguments: the name templates of ``synchronized``
(no I/O).

A template is a :meth:`str.format` string whose fields name parameters of the
decorated function: ``"order:{order_id}"``, ``"account:{self.id}"``,
``"user:{user[id]}"``. A field may go on with attributes and indexes, and carry a
conversion (``!r``, ``!s``, ``!a``) and a format spec, as in :meth:`str.format`.

The rules:

- Every field starts with the name of a parameter of the function, checked against
  its signature when the function is decorated. Positional-only parameters count, and
  so do ``*args`` (a tuple: ``{args[0]}``) and ``**kwargs`` (a dict:
  ``{kwargs[user]}``); a keyword gathered by ``**kwargs`` is no parameter of its own.
  Numbered and automatic fields (``{0}``, ``{}``) are refused: a field names its
  parameter.
- At each call, the call's arguments are bound to the signature, defaults applied,
  and the template is filled from them. A call whose arguments do not bind raises
  ``TypeError``; a field that cannot be filled (a missing attribute or key, an index
  out of range) raises ``ValueError``. Either way nothing is locked and the function
  does not run.
- Literal braces are doubled (``{{`` and ``}}``), as in :meth:`str.format`. A template
  without fields is a constant name, and the function's signature is not read.
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable, Mapping
from typing import Any

from .keys import validate_name

#: a function that makes the lock name of one call from its arguments
Namer = Callable[[tuple[Any, ...], Mapping[str, Any]], str]

_FORMATTER = string.Formatter()
_CONVERSIONS = (None, "r", "s", "a")


class _Anything:
    """Stands for an argument while a field's attributes and indexes are checked."""

    def __getattr__(self, name: str) -> _Anything:
        return self

    def __getitem__(self, key: object) -> _Anything:
        return self


def describe(fn: Callable[..., Any]) -> str:
    """``fn`` as named in messages: ``module.qualname()``."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if not isinstance(name, str):
        return repr(fn)
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}()" if isinstance(module, str) else f"{name}()"


class NameTemplate:
    """A lock name template, parsed and checked on its own (see the module's rules).

    Raises ``TypeError`` for a template that is not a ``str`` and ``ValueError`` for one
    that :meth:`str.format` could never fill (unbalanced braces, a numbered or automatic
    field, a bad conversion, an empty attribute), or a constant name that is not a
    usable lock name."""

    def __init__(self, template: object) -> None:
        if not isinstance(template, str):
            raise TypeError(f"lock name must be a str, not {type(template).__name__}")
        self.template = template
        #: each field's text, and the parameter it starts with, in order
        self.fields: tuple[tuple[str, str], ...] = tuple(_fields(template, template, 0))
        #: the name itself when the template has no fields, else None
        self.constant: str | None = None
        if not self.fields:
            self.constant = validate_name(_FORMATTER.vformat(template, (), {}))

    def __repr__(self) -> str:
        return f"NameTemplate({self.template!r})"

    @property
    def parameters(self) -> tuple[str, ...]:
        """The parameters the template names, each once, in order of first use."""
        return tuple(dict.fromkeys(first for _field, first in self.fields))

    def bind(self, fn: Callable[..., Any]) -> Namer:
        """The namer of ``fn``'s calls: ``namer(args, kwargs)`` is the lock name of the
        call ``fn(*args, **kwargs)``.

        Raises ``ValueError`` when a field names no parameter of ``fn``, and
        ``TypeError`` when the template has fields and ``fn``'s signature cannot be
        read."""
        constant = self.constant
        if constant is not None:
            return lambda args, kwargs: constant
        what = describe(fn)
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"lock name template {self.template!r}: the signature of {what} cannot be"
                f" read ({error}), so its fields cannot be bound to arguments"
            ) from None
        params = signature.parameters
        for field, first in self.fields:
            if first not in params:
                raise ValueError(self._unknown(field, first, what, signature))
        return _Namer(self.template, signature, what)

    def _unknown(self, field: str, first: str, what: str, signature: inspect.Signature) -> str:
        params = signature.parameters
        names = ", ".join(params) or "none"
        message = (
            f"lock name template {self.template!r}: field {{{field}}} names {first!r}, which"
            f" is not a parameter of {what} (its parameters: {names})"
        )
        gather = [p.name for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
        if gather:
            message += (
                f"; a keyword argument gathered by **{gather[0]} is named {{{gather[0]}[{first}]}}"
            )
        return message


class _Namer:
    """Fills a template from one call's arguments, bound to the function's signature."""

    def __init__(self, template: str, signature: inspect.Signature, what: str) -> None:
        self._template = template
        self._signature = signature
        self._what = what

    def __call__(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{self._what}: {error}") from None
        bound.apply_defaults()
        try:
            name = _FORMATTER.vformat(self._template, (), bound.arguments)
        except (AttributeError, LookupError, ValueError) as error:
            raise ValueError(
                f"lock name template {self._template!r} of {self._what} cannot be filled"
                f" from this call's arguments: {type(error).__name__}: {error}"
            ) from error
        try:
            return validate_name(name)
        except ValueError as error:
            raise ValueError(
                f"lock name template {self._template!r} of {self._what} gave {name!r}"
                f" for this call: {error}"
            ) from None


def _fields(template: str, text: str, depth: int) -> list[tuple[str, str]]:
    """The fields of ``text`` (the template, or a format spec in it), checked."""
    try:
        parsed = list(_FORMATTER.parse(text))
    except ValueError as error:
        raise ValueError(f"lock name template {template!r} is malformed: {error}") from None
    fields: list[tuple[str, str]] = []
    for _literal, field, spec, conversion in parsed:
        if field is None:
            continue
        if depth > 1:
            raise ValueError(
                f"lock name template {template!r}: fields nest too deeply in a format spec"
            )
        first = _first(template, field)
        if conversion not in _CONVERSIONS:
            raise ValueError(
                f"lock name template {template!r}: field {{{field}}} has the unknown"
                f" conversion !{conversion} (use !r, !s or !a)"
            )
        fields.append((field, first))
        if spec:
            fields.extend(_fields(template, spec, depth + 1))
    return fields


def _first(template: str, field: str) -> str:
    """The parameter a field starts with; its attributes and indexes are checked here
    by the formatter's own parser."""
    end = min((i for i in (field.find("."), field.find("[")) if i >= 0), default=len(field))
    first = field[:end]
    if not first or first.isdigit():
        shown = f"{{{field}}}" if field else "{}"
        raise ValueError(
            f"lock name template {template!r}: field {shown} is positional; name the"
            " parameter instead, e.g. 'order:{order_id}'"
        )
    try:
        _FORMATTER.get_field(field, (), {first: _Anything()})
    except ValueError as error:
        raise ValueError(
            f"lock name template {template!r}: field {{{field}}} is malformed: {error}"
        ) from None
    return first
