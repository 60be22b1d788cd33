"""Limits: human-readable values, presets, merge, typo rejection, the wire form, Monty's form."""

import json

import pytest
from pydantic import ValidationError

from runtime.quantities import parse_duration, parse_size
from runtime.scripts import Limits, LimitsError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16mb", 16 * 1024**2),
        ("1.5GB", int(1.5 * 1024**3)),
        ("512kb", 512 * 1024),
        ("4096", 4096),
        (4096, 4096),
        ("2 MiB", 2 * 1024**2),
        ("100b", 100),
    ],
)
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2s", 2.0), ("500ms", 0.5), ("1.5m", 90.0), (3, 3.0), ("0.25", 0.25), ("250 ms", 0.25)],
)
def test_durations(text, expected):
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["16zb", "-1mb", "0", "fast", True, [1]])
def test_bad_sizes(bad):
    with pytest.raises(LimitsError):
        parse_size(bad)


def test_presets_match_the_issue():
    s, d, p = Limits.strict(), Limits.default(), Limits.permissive()
    assert (s.max_memory, s.max_duration, s.max_recursion) == (8 * 1024**2, 0.5, 120)
    assert (d.max_memory, d.max_duration, d.max_recursion) == (16 * 1024**2, 2.0, 200)
    assert (p.max_memory, p.max_duration, p.max_recursion) == (64 * 1024**2, 10.0, 400)
    assert s.max_suspensions and s.max_output and d.max_output and p.max_output


def test_frozen():
    with pytest.raises(ValidationError):
        Limits.strict().max_memory = 1  # type: ignore[misc]


def test_merge_overrides_only_set_fields_and_returns_a_new_object():
    base = Limits.default()
    merged = base.merge(Limits(max_duration="5s"))
    assert merged is not base
    assert merged.max_duration == 5.0
    assert merged.max_memory == base.max_memory
    assert base.max_duration == 2.0  # unchanged
    assert base.merge(None) is base


def test_typo_is_rejected_with_allowed_keys_and_did_you_mean():
    with pytest.raises(ValidationError) as info:
        Limits(max_mmeory="16mb")  # type: ignore[call-arg]
    assert "did you mean 'max_memory'" in str(info.value)
    with pytest.raises(LimitsError) as info2:
        Limits.resolve({"max_mmeory": "16mb"})
    message = str(info2.value)
    assert "max_mmeory" in message and "did you mean 'max_memory'" in message
    for key in ("max_memory", "max_duration", "max_recursion", "max_suspensions", "max_output"):
        assert key in message


def test_resolve_accepts_every_spec_form():
    assert Limits.resolve(None) == Limits.default()
    assert Limits.resolve("strict") == Limits.strict()
    assert Limits.resolve({"max_duration": "5s"}).max_duration == 5.0
    assert Limits.resolve('{"max_memory": "32mb"}').max_memory == 32 * 1024**2
    lim = Limits(max_recursion=50)
    assert Limits.resolve(lim) is lim
    with pytest.raises(LimitsError, match="did you mean 'strict'"):
        Limits.resolve("stritc")
    with pytest.raises(LimitsError, match="does not parse"):
        Limits.resolve("{nope")


def test_round_trips_through_json_for_the_wire():
    lim = Limits.strict().merge(Limits(max_output="1kb"))
    wire = json.dumps(lim.to_dict())
    back = Limits.model_validate(json.loads(wire))
    assert back == lim
    assert Limits.resolve(json.loads(wire)) == lim
    assert lim.to_dict() == lim.model_dump(exclude_none=True)


def test_to_monty_always_sets_memory_and_duration():
    monty = Limits(max_recursion=10).to_monty()
    assert monty["max_memory"] == Limits.default().max_memory
    assert monty["max_feed_duration_secs"] == Limits.default().max_duration
    assert monty["max_recursion_depth"] == 10
    assert set(monty) == {
        "max_memory",
        "max_feed_duration_secs",
        "max_total_sleep_secs",
        "max_recursion_depth",
        "max_suspensions",
    }


def test_describe():
    assert Limits.strict().describe().startswith("memory 8 MB, duration 500 ms, recursion 120")


def test_validated_limits_are_cached_once_for_resolve_merge_and_effective():
    """One cache: every job of a tool carries the same limits dict, so a worker validates it once."""
    job = {"max_duration": 0.25, "max_memory": 4 * 1024**2}
    first = Limits.resolve(job)
    assert Limits.resolve(dict(reversed(list(job.items())))) is first  # same fields, same object
    assert Limits.resolve(json.dumps(job)) is first
    base = Limits.strict()
    assert base.merge(first) is base.merge(first)
    assert first.effective() is first.effective()
    assert first.effective() is Limits.default().merge(first)  # effective is a merge through the same cache
    assert (first.effective().max_duration, first.effective().max_recursion) == (0.25, 200)


def test_the_cache_never_answers_for_a_different_or_invalid_spec():
    assert Limits.resolve({"max_recursion": 1}).max_recursion == 1
    with pytest.raises(LimitsError):  # True == 1 and hash(True) == hash(1): the key keeps the type
        Limits.resolve({"max_recursion": True})
    for _ in range(2):  # errors are not cached: the second attempt fails the same way
        with pytest.raises(LimitsError, match="unknown limits key"):
            Limits.resolve({"max_memroy": "1mb"})
    with pytest.raises(LimitsError):  # an unhashable value is validated uncached, for its message
        Limits.resolve({"max_memory": [1]})
