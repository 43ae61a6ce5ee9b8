"""The checks every user JSON document passes: no control characters, bounded nesting."""

from __future__ import annotations

from typing import Any

from shardlab.user_json import MAX_JSON_DEPTH, codepoint, json_problem, path_text, readable


def _nested(levels: int) -> Any:
    inner: Any = []
    for _ in range(levels - 1):
        inner = [inner]
    return inner


def test_clean_documents_pass() -> None:
    assert json_problem({"name": "llama3-8b (layers=4)", "n": [1, 2.5, None, True]}) is None
    assert json_problem("plain") is None
    assert json_problem(5) is None
    assert json_problem(_nested(MAX_JSON_DEPTH)) is None


def test_the_first_control_character_is_named_where_it_is() -> None:
    problem = json_problem({"a": "ok", "b": [{"c": "x"}, {"d": "y\x00z"}], "e": "\x01"})
    assert problem is not None
    assert (problem.kind, problem.path) == ("control_character", ("b", 1, "d"))
    assert problem.message == (
        "'y\\x00z' contains the control character U+0000; control characters are not allowed"
    )
    assert path_text(problem.path) == "b.1.d"


def test_keys_are_checked_and_shown_quoted() -> None:
    problem = json_problem({"options": {"passes": {"dp\x7f": True}}})
    assert problem is not None and problem.path == ("options", "passes")
    assert problem.message.startswith("the key 'dp\\x7f' contains the control character U+007F")
    assert path_text(("meta", "a b", 3)) == "meta.'a b'.3"


def test_free_text_may_hold_tab_newline_and_return_only() -> None:
    text = "line one\n\tline two\r\n"
    assert json_problem({"body": text}, free_text={"body"}) is None
    assert json_problem({"title": text}, free_text={"body"}) is not None
    assert json_problem({"x": {"body": text}}, free_text={"body"}) is not None  # top level only
    problem = json_problem({"body": "bell\x07"}, free_text={"body"})
    assert problem is not None and "only tab, newline and carriage return" in problem.message
    assert [codepoint(c) for c in "\x00\x1f\x7f"] == ["U+0000", "U+001F", "U+007F"]


def test_nesting_past_the_limit_is_refused_without_recursion() -> None:
    problem = json_problem(_nested(MAX_JSON_DEPTH + 1))
    assert problem is not None and problem.kind == "too_deep"
    assert problem.message == f"nested too deeply (more than {MAX_JSON_DEPTH} levels)"
    assert json_problem(_nested(100_000)) is not None  # far past Python's recursion limit


def test_lone_surrogates_in_values_and_keys_are_named_where_they_are() -> None:
    problem = json_problem({"config": {"_name_or_path": "x\ud800"}})
    assert problem is not None and problem.kind == "invalid_unicode"
    assert problem.path == ("config", "_name_or_path")
    assert problem.message == (
        "'x\\ud800' is not valid Unicode: it holds the lone surrogate U+D800, which no UTF-8 "
        "text can"
    )
    key = json_problem({"config": {"\udfff": 1}})
    assert key is not None and key.path == ("config",) and "the key '\\udfff'" in key.message
    assert json_problem({"emoji": "\U0001f600", "text": "\u2603"}) is None  # pairs are text


def test_numbers_json_cannot_hold_are_named_where_they_are() -> None:
    cases = {
        float("nan"): "NaN is not a number JSON can hold",
        float("inf"): "Infinity is not a number JSON can hold",
        float("-inf"): "-Infinity is not a number JSON can hold",
        10**400: "an integer of 401 digits is out of range",
        -(2**63): "an integer of 19 digits is out of range",
    }
    for number, message in cases.items():
        problem = json_problem({"budgets": [1, {"x": number}]})
        assert problem is not None and problem.path == ("budgets", 1, "x"), number
        assert problem.message.startswith(message), problem.message
    assert json_problem({"n": [2**63 - 1, -(2**63) + 1, 1e308, True]}) is None


def test_readable_puts_replacement_and_null_where_json_cannot_go() -> None:
    stored = {"a\ud800": ["x\udfff", float("nan"), 10**400, 2, "ok"], "b": {"c": 1.5}}
    assert readable(stored) == {"a\ufffd": ["x\ufffd", None, None, 2, "ok"], "b": {"c": 1.5}}
    clean = {"a": [1, 2.5, "b"]}
    assert readable(clean) is clean  # nothing to change: the same object, no copy
