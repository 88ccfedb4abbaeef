"""rlfleet._util.values: the one int check and the one JSON-object parser."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet._util.values import check_int, json_object
from rlfleet.errors import ConfigError


@pytest.mark.parametrize("value", [1, 7, np.int64(3)])
def test_ints_at_or_above_the_minimum_pass_and_come_back_as_int(value: object) -> None:
    assert check_int("n", value) == int(value)  # type: ignore[call-overload]
    assert type(check_int("n", value)) is int


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "n must be an int >= 1, got 0"),
        (True, "n must be an int >= 1, got True"),  # a bool is not a count
        (2.0, "n must be an int >= 1, got 2.0"),
        ("3", "n must be an int >= 1, got '3'"),
        (11, "n must be an int <= 10, got 11"),
    ],
)
def test_other_values_are_refused_with_name_and_value(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_int("n", value, maximum=10)


def test_the_minimum_may_be_zero() -> None:
    assert check_int("seed", 0, minimum=0) == 0


def test_json_objects_parse_and_empty_text_is_an_empty_object() -> None:
    assert json_object('{"a": 1, "b": [2]}', "kwargs") == {"a": 1, "b": [2]}
    assert json_object("", "kwargs") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", r"EnvUpdate.kwargs_json is not valid JSON \(.*\): '\{not json'"),
        ("[1, 2]", "EnvUpdate.kwargs_json must be a JSON object"),
        ("[" * 100_000, "EnvUpdate.kwargs_json (nests too deeply|is not valid JSON)"),
    ],
)
def test_json_that_is_not_an_object_is_refused_naming_where(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        json_object(text, "EnvUpdate.kwargs_json")
