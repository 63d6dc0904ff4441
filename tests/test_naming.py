"""The core of the ``synchronized`` decorators, without servers: name templates bound to
a function's arguments, the options' checks, the decoration-time errors, and the
types a strict mypy sees."""

from __future__ import annotations

import functools
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import redreentrant
import redreentrant.asyncio
import redreentrant.errors
from redreentrant._core.decorators import Synchronized
from redreentrant._core.naming import NameTemplate


def name_of(template: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    return NameTemplate(template).bind(fn)(args, kwargs)


# -- filling a template from a call's arguments ------------------------------------------


def test_a_field_takes_the_argument_however_it_was_passed_and_defaults_apply() -> None:
    def settle(order_id: int, region: str = "eu", *, rush: bool = False) -> None: ...

    template = "order:{region}:{order_id}:{rush}"
    assert name_of(template, settle, 42) == "order:eu:42:False"
    assert name_of(template, settle, 42, "us") == "order:us:42:False"
    assert name_of(template, settle, order_id=7, rush=True) == "order:eu:7:True"
    assert name_of(template, settle, region="ap", order_id=1) == "order:ap:1:False"


def test_attribute_index_conversion_and_format_spec_fields() -> None:
    def ship(order: Any, items: list[str], meta: dict[str, Any]) -> None: ...

    order = SimpleNamespace(id=42, customer=SimpleNamespace(name="Ada"))
    args = (order, ["a", "b"], {"zone": "z1", 3: "three", "width": 4})
    assert name_of("o:{order.id}", ship, *args) == "o:42"
    assert name_of("c:{order.customer.name!r}", ship, *args) == "c:'Ada'"
    assert name_of("i:{items[1]}", ship, *args) == "i:b"
    assert name_of("m:{meta[zone]}:{meta[3]}", ship, *args) == "m:z1:three"
    assert name_of("n:{order.id:06d}", ship, *args) == "n:000042"
    assert name_of("w:{order.id:>{meta[width]}}", ship, *args) == "w:  42"  # nested spec


def test_positional_only_var_positional_and_var_keyword_parameters() -> None:
    def job(kind: str, /, *args: Any, **kwargs: Any) -> None: ...

    assert name_of("{kind}:{args[0]}:{kwargs[user]}", job, "k", 1, 2, user="u") == "k:1:u"
    assert name_of("{kind}:{args}:{kwargs}", job, "k") == "k:():{}"


def test_methods_name_self_and_a_template_without_fields_is_a_constant() -> None:
    class Account:
        def __init__(self, number: int) -> None:
            self.number = number

        def withdraw(self, amount: int) -> None: ...

    acct = Account(7)
    assert name_of("account:{self.number}", Account.withdraw, acct, 10) == "account:7"
    assert NameTemplate("a{{b}}c").constant == "a{b}c"

    # A constant name never reads the signature, nor binds the arguments.
    namer = NameTemplate("nightly").bind(print)
    assert namer((1, 2, 3), {"odd": True}) == "nightly"
    assert NameTemplate("x:{a}").parameters == ("a",)
    assert NameTemplate("{a}{b.c}{a[0]}").parameters == ("a", "b")


def test_a_decorated_function_keeps_its_signature_for_the_template() -> None:
    def inner(order_id: int, step: str = "pay") -> None: ...

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> None: ...

    assert name_of("{order_id}:{step}", wrapper, 5) == "5:pay"


# -- errors at call time: nothing locked, the function does not run ----------------------


def test_arguments_that_do_not_bind_or_fill_are_errors_of_the_call() -> None:
    def ship(order: Any, items: list[str], meta: dict[str, Any]) -> None: ...

    namer = NameTemplate("{order.id}:{items[2]}:{meta[k]}").bind(ship)
    with pytest.raises(TypeError, match=r"ship\(\): missing a required argument: 'meta'"):
        namer((SimpleNamespace(id=1), []), {})
    with pytest.raises(TypeError, match="unexpected keyword"):
        namer((SimpleNamespace(id=1), [], {}), {"other": 1})
    for args, error in (
        ((object(), ["a"] * 3, {"k": 1}), "AttributeError"),
        ((SimpleNamespace(id=1), ["a"], {"k": 1}), "IndexError"),
        ((SimpleNamespace(id=1), ["a"] * 3, {}), "KeyError"),
    ):
        with pytest.raises(ValueError, match=f"cannot be filled .*: {error}"):
            namer(args, {})

    def named(label: str) -> None: ...

    with pytest.raises(ValueError, match="gave '' for this call: lock name must not be empty"):
        NameTemplate("{label}").bind(named)(("",), {})


# -- errors at decoration time ----------------------------------------------------------


def test_a_field_that_names_no_parameter_is_an_error_when_decorating() -> None:
    def settle(order_id: int, region: str = "eu") -> None: ...

    with pytest.raises(ValueError) as caught:
        NameTemplate("order:{orderid}").bind(settle)
    message = str(caught.value)
    assert "{orderid}" in message and "'orderid'" in message and "settle()" in message
    assert "its parameters: order_id, region" in message

    def gathered(**options: Any) -> None: ...

    with pytest.raises(ValueError, match=r"gathered by \*\*options is named \{options\[user\]\}"):
        NameTemplate("u:{user.id}").bind(gathered)
    with pytest.raises(TypeError, match=r"signature .* cannot be read"):
        NameTemplate("x:{a}").bind(type)  # a builtin without a signature


@pytest.mark.parametrize(
    ("template", "error", "match"),
    [
        ("order:{", ValueError, "malformed"),
        ("order:}", ValueError, "malformed"),
        ("order:{}", ValueError, r"field \{\} is positional"),
        ("order:{0}", ValueError, r"field \{0\} is positional"),
        ("order:{0.id}", ValueError, "positional"),
        ("order:{.id}", ValueError, "positional"),
        ("order:{a.}", ValueError, "malformed: Empty attribute"),
        ("order:{a[0}", ValueError, "malformed"),
        ("order:{a[0]}{a[}", ValueError, "malformed"),
        ("order:{a[0]x}", ValueError, "malformed: Only '.' or '\\['"),
        ("order:{a!x}", ValueError, "unknown conversion !x"),
        ("order:{a:{b:{c}}}", ValueError, "nest too deeply"),
        ("", ValueError, "must not be empty"),
        ("\udc80", ValueError, "UTF-8"),
        (b"order", TypeError, "must be a str, not bytes"),
        (None, TypeError, "must be a str, not NoneType"),
    ],
)
def test_templates_that_could_never_be_filled_are_refused(
    template: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        NameTemplate(template)


def check(name: object = "x", **options: object) -> Synchronized:
    given: dict[str, object] = {"kind": "lock", "blocking": True, "timeout": -1, "lease": None}
    given.update(options)
    return Synchronized.check(name, **given)  # type: ignore[arg-type]


def test_the_options_are_checked_when_synchronized_is_called() -> None:
    options = check("order:{id}", kind="fair", timeout=2, lease=10)
    assert (options.kind, options.blocking, options.timeout, options.lease) == (
        "fair",
        True,
        2.0,
        10.0,
    )
    assert check(kind="read").kind == "read" and check(blocking=False).blocking is False
    for bad, error, match in [
        ({"kind": "mutex"}, ValueError, "kind must be one of 'lock', 'fair', 'read', 'write'"),
        ({"kind": None}, TypeError, "kind must be a str"),
        ({"blocking": 0}, TypeError, "blocking must be True or False"),
        ({"blocking": False, "timeout": 1}, ValueError, "non-blocking"),
        ({"timeout": -2}, ValueError, "timeout"),
        ({"timeout": float("nan")}, ValueError, "NaN"),
        ({"timeout": "5"}, TypeError, "timeout must be a number"),
        ({"lease": 0}, ValueError, "lease must be > 0"),
        ({"lease": float("inf")}, ValueError, "lease"),
        ({"lease": True}, TypeError, "lease must be a number"),
    ]:
        with pytest.raises(error, match=match):
            check(**bad)
    with pytest.raises(TypeError, match=r"write @mgr.synchronized\('name'\)"):
        check(lambda: None)  # @mgr.synchronized without a name


def test_each_flavour_refuses_the_functions_it_cannot_hold_a_lock_around() -> None:
    options = check()

    async def coroutine() -> None: ...

    def generator() -> Any:
        yield 1

    async def agenerator() -> Any:
        yield 1

    def plain() -> None: ...

    with pytest.raises(TypeError, match=r"coroutine function .*coroutine\(\).*asyncio"):
        options.target(coroutine, coroutine=False)
    with pytest.raises(TypeError, match=r"'async def' functions.*plain"):
        options.target(plain, coroutine=True)
    for flavour in (False, True):
        for fn in (generator, agenerator):
            with pytest.raises(TypeError, match="generator function"):
                options.target(fn, coroutine=flavour)
        with pytest.raises(TypeError, match="put @classmethod above"):
            options.target(classmethod(plain), coroutine=flavour)
        with pytest.raises(TypeError, match="put @staticmethod above"):
            options.target(staticmethod(plain), coroutine=flavour)
        with pytest.raises(TypeError, match="decorates functions, not int"):
            options.target(3, coroutine=flavour)
    assert "partial" in options.target(functools.partial(coroutine), coroutine=True).what


def test_lock_timeout_error_is_a_timeout_error_that_pickles() -> None:
    error = redreentrant.LockTimeoutError("order:1", 2.5, "jobs.settle() did not run")
    assert str(error) == "lock 'order:1' was not obtained within 2.5 s: jobs.settle() did not run"
    assert isinstance(error, redreentrant.LockError) and isinstance(error, TimeoutError)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error)
    assert (copy.name, copy.timeout, copy.detail) == ("order:1", 2.5, error.detail)
    assert (
        redreentrant.errors.LockTimeoutError
        is redreentrant.asyncio.LockTimeoutError
        is redreentrant.LockTimeoutError
    )


# -- what mypy --strict sees -------------------------------------------------------------

TYPED = """
from __future__ import annotations

from typing_extensions import assert_type

import redreentrant
import redreentrant.asyncio

mgr = redreentrant.LockManager(["redis://127.0.0.1:1"])
amgr = redreentrant.asyncio.LockManager(["redis://127.0.0.1:1"])
flag = bool(len("x"))


@mgr.synchronized("order:{order_id}", timeout=5)
def settle(order_id: int, *, note: str = "") -> str:
    return note


@mgr.synchronized("nightly", blocking=False)
def nightly(day: str) -> int:
    return 1


@mgr.synchronized("maybe", blocking=flag, kind="write", lease=3)
def maybe() -> int:
    return 1


@amgr.synchronized("order:{order_id}")
async def asettle(order_id: int) -> str:
    return ""


@amgr.synchronized("anightly", blocking=False)
async def anightly() -> int:
    return 1


assert_type(settle(1, note="x"), str)
assert_type(nightly("mon"), int | None)
assert_type(maybe(), int | None)


async def main() -> None:
    assert_type(await asettle(1), str)
    assert_type(await anightly(), int | None)
"""

MISTAKES = """
settle("1")
nightly()
mgr.synchronized("x", kind="mutex")
amgr.synchronized("x")(settle)
"""


def test_strict_mypy_keeps_the_decorated_functions_types(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    good = tmp_path / "good.py"
    good.write_text(textwrap.dedent(TYPED))
    bad = tmp_path / "bad.py"
    bad.write_text(textwrap.dedent(TYPED) + MISTAKES)
    command = [sys.executable, "-m", "mypy", "--strict", "--no-incremental"]
    command += ["--python-version", "3.10", "--config-file", ""]
    ok = subprocess.run([*command, str(good)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    found = subprocess.run([*command, str(bad)], capture_output=True, text=True, timeout=120)
    first = TYPED.count("\n") + 2
    lines = {int(line.split(":")[1]) for line in found.stdout.splitlines() if ": error:" in line}
    assert lines == set(range(first, first + 4)), found.stdout
