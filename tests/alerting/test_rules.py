"""Rules: the shipped defaults, matching, and rejections that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor_agent.alerting.rules import (
    Rule,
    RuleError,
    first_match,
    load_rules,
    parse_duration,
    parse_rules,
    shadowed,
)
from monitor_agent.alerting.settings import AlertingSettings
from monitor_agent.records.types import Finding, Severity

GOOD = """
routes: {page: [pagerduty], chat: [slack]}
rules:
  - name: Nan
    match: {types: [nan_inf]}
    severity: critical
    cooldown: 1m
"""


def finding(type_: str = "nan_inf", severity: Severity = Severity.CRITICAL, **kw) -> Finding:
    return Finding(type=type_, severity=severity, run_id="r", step=1, message="m", **kw)


def test_defaults_follow_the_issue():
    rules = {r.name: r for r in load_rules(AlertingSettings().rules_file)}
    expect = {
        "TrainingNanInf": ("critical", 60), "TrainingGradExplosion": ("error", 120),
        "TrainingDivergence": ("error", 120), "TrainingLossSpike": ("warning", 300),
        "TrainingThroughputDrop": ("warning", 600), "TrainingMemoryPressure": ("warning", 300),
        "TrainingPlateau": ("warning", 1800),
    }
    for name, (severity, cooldown) in expect.items():
        assert (rules[name].severity.label, rules[name].cooldown) == (severity, cooldown), name
    assert "pagerduty" in rules["TrainingNanInf"].channels
    assert "pagerduty" not in rules["TrainingLossSpike"].channels  # warnings go to chat


@pytest.mark.parametrize(
    ("type_", "severity", "expected"),
    [
        ("nan_inf", Severity.CRITICAL, "TrainingNanInf"),
        ("memory_pressure", Severity.ERROR, "TrainingMemoryPressureCritical"),
        ("memory_pressure", Severity.WARNING, "TrainingMemoryPressure"),
        ("stalled", Severity.ERROR, "TrainingStalled"),
        ("hang", Severity.CRITICAL, "TrainingHung"),
        ("category_divergence", Severity.WARNING, "TrainingCategoryDivergence"),
        ("lr_jump", Severity.WARNING, "TrainingLrJump"),
        ("input_bound", Severity.WARNING, "TrainingInputBound"),
        ("rank_outlier", Severity.WARNING, "TrainingRankOutlier"),
        ("brand_new_type", Severity.WARNING, "TrainingFinding"),
        ("brand_new_type", Severity.INFO, None),
    ],
)
def test_first_matching_rule_wins(type_, severity, expected):
    rule = first_match(load_rules(None), finding(type_, severity), {})
    assert (rule.name if rule else None) == expected


def test_a_rule_below_one_that_takes_all_its_findings_is_named_at_load(caplog):
    rules = parse_rules("""
routes: {chat: [slack]}
rules:
  - name: Anything
    match: {types: ["*"], min_severity: warning}
  - name: Divergence
    match: {types: [divergence]}
""")
    assert shadowed(rules) == [
        "alert rules <rules>: rule Divergence never matches: rule Anything above it takes "
        "every divergence finding first (first match wins); move Divergence above Anything"]
    assert "rule Divergence never matches" in caplog.text
    assert shadowed(load_rules(None)) == []  # the shipped rules have none
    # Narrower above broader is fine, and so is a catch-all limited by labels.
    assert not shadowed(parse_rules("""
routes: {chat: [slack]}
rules:
  - name: GptOnly
    match: {types: ["*"], labels: {project: gpt}}
  - name: Divergence
    match: {types: [divergence]}
  - name: Anything
    match: {types: ["*"]}
"""))


def test_labels_and_value_conditions():
    rules = parse_rules("""
routes: {chat: [slack]}
rules:
  - name: Big
    match: {types: [memory_pressure], labels: {project: gpt}}
    when: {value_above: 0.95}
""")
    f = finding("memory_pressure", Severity.WARNING, value=0.97)
    assert first_match(rules, f, {"project": "gpt"}) is not None
    assert first_match(rules, f, {"project": "other"}) is None
    low = finding("memory_pressure", Severity.WARNING, value=0.5)
    assert first_match(rules, low, {"project": "gpt"}) is None
    nan = finding("memory_pressure", Severity.WARNING, value=float("nan"))
    assert first_match(rules, nan, {"project": "gpt"}) is None


def test_route_defaults_by_severity():
    rules = parse_rules(GOOD)
    assert rules[0].channels == ("pagerduty",)
    assert rules[0].repeat_interval == 4 * 3600 and rules[0].fingerprint == ("layer",)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace("cooldown: 1m", "cooldown: 5x"), "rules[0].cooldown (rule Nan): Value error, invalid duration '5x'"),
        (GOOD.replace("cooldown: 1m", "cooldwn: 1m"), "rules[0].cooldwn (rule Nan): unknown field"),
        (GOOD.replace("[nan_inf]", "[nan-inf]"), "rules[0].match.types (rule Nan): Value error, unknown finding type(s) ['nan-inf']"),
        (GOOD.replace("critical", "fatal"), "rules[0].severity (rule Nan)"),
        (GOOD + "    route: pager\n", "rules[0] (Nan).route: no route 'pager'"),
        (GOOD.replace("[pagerduty]", "[pagerdoody]"), "routes.page[0]"),
        (GOOD.replace("name: Nan", "name: 'has space'"), "rules[0].name"),
        ("rules: []\nroutes: {}\n", "rules:"),
        ("- just a list", "expected a mapping"),
        ("routes: {a: [slack]\n", "my-rules.yaml:2:1: YAML syntax error"),
    ],
)
def test_invalid_rules_name_the_field(text: str, expected: str):
    with pytest.raises(RuleError) as err:
        parse_rules(text, "my-rules.yaml")
    assert expected in str(err.value)
    assert "my-rules.yaml" in str(err.value)


def test_missing_rules_file_is_a_clear_error(tmp_path: Path):
    with pytest.raises(RuleError, match="cannot read alert rules"):
        load_rules(tmp_path / "nope.yaml")


def test_rules_file_from_settings(tmp_path: Path):
    path = tmp_path / "rules.yaml"
    path.write_text(GOOD)
    assert [r.name for r in load_rules(AlertingSettings(rules_file=path).rules_file)] == ["Nan"]


@pytest.mark.parametrize(("text", "seconds"), [(90, 90.0), ("90s", 90.0), ("1h30m", 5400.0),
                                               ("250ms", 0.25), ("2d", 172800.0), ("300", 300.0)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "5y", "1 h", "-5s", True, "5m garbage"])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def _one_rule(text: str) -> Rule:
    [rule] = parse_rules(f"routes: {{page: [pagerduty], chat: [slack]}}\nrules:\n{text}")
    return rule


def test_value_conditions_are_strict_and_a_missing_or_nan_value_never_matches():
    band = _one_rule("  - {name: Band, match: {types: [memory_pressure]},"
                     " when: {value_above: 0.9, value_below: 0.99}}\n")
    values = {0.9: False, 0.95: True, 0.99: False, None: False, float("nan"): False}
    assert {v: band.matches(finding("memory_pressure", value=v), {}) for v in values} == values


def test_a_rules_severity_replaces_the_findings_and_none_keeps_it():
    fixed = _one_rule("  - {name: Fixed, match: {types: [loss_spike]}, severity: critical}\n")
    kept = _one_rule("  - {name: Kept, match: {types: [loss_spike]}}\n")
    spike = finding("loss_spike", Severity.WARNING)
    assert (fixed.severity_for(spike), kept.severity_for(spike)) == (
        Severity.CRITICAL, Severity.WARNING)


def test_every_field_of_a_rule_is_kept_as_written():
    rule = _one_rule("""  - name: Roll
    match: {types: [nan_inf], labels: {team: nlp}, min_severity: error}
    when: {value_below: 3.0}
    severity: error
    route: chat
    resolve_after: 90s
    fingerprint: [rank, layer, rank]
    action: rollback
    action_after: 3
    rollback_budget: 5
""")
    assert (rule.route, rule.channels, rule.resolve_after, rule.value_below, rule.action,
            rule.action_after, rule.fingerprint, rule.rollback_budget, rule.labels,
            rule.min_severity) == ("chat", ("slack",), 90.0, 3.0, "rollback", 3,
                                   ("rank", "layer"), 5, (("team", "nlp"),), Severity.ERROR)


def test_a_rules_file_that_is_not_utf8_or_not_valid_is_named_in_the_error(tmp_path: Path):
    binary = tmp_path / "rules.yaml"
    binary.write_bytes(b"\xff\xfe rules")
    with pytest.raises(RuleError) as err:
        load_rules(binary)
    assert str(err.value) == f"{binary}: not UTF-8 text (byte 0: invalid start byte)"
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("critical", "fatal"))
    with pytest.raises(RuleError) as err:
        load_rules(bad)
    assert str(err.value).startswith(f"invalid alert rules in {bad}:\n  rules[0].severity "
                                     "(rule Nan): ")
    assert "errors.pydantic.dev" not in str(err.value)  # the fix, not a link


def test_a_missing_route_lists_the_routes_there_are():
    with pytest.raises(RuleError) as err:
        parse_rules("routes: {page: [pagerduty], chat: [slack]}\nrules:\n"
                    "  - {name: X, match: {types: [nan_inf]}, route: pager}\n")
    assert str(err.value).endswith("define it under 'routes' (have: page, chat)")


def test_a_shadowing_warning_names_five_types_at_most():
    def warning(types: str) -> str:
        [said] = shadowed(parse_rules(f"""
routes: {{chat: [slack]}}
rules:
  - name: Labelled
    match: {{types: ["*"], labels: {{project: gpt}}}}
  - name: Anything
    match: {{types: ["*"]}}
  - name: Later
    match: {{types: {types}}}
"""))
        return said

    five = "[nan_inf, loss_spike, divergence, plateau, overfitting]"
    assert ("takes every nan_inf, loss_spike, divergence, plateau, overfitting finding "
            "first") in warning(five)
    assert ("takes every nan_inf, loss_spike, divergence, plateau, overfitting ... finding "
            "first") in warning(five.replace("]", ", stalled]"))


def test_a_rule_for_the_same_types_below_another_is_named_at_load():
    assert shadowed(parse_rules("""
routes: {chat: [slack]}
rules:
  - {name: Divergence, match: {types: [divergence]}}
  - {name: DivergenceAgain, match: {types: [divergence]}, cooldown: 1h}
""")) == ["alert rules <rules>: rule DivergenceAgain never matches: rule Divergence above "
          "it takes every divergence finding first (first match wins); move DivergenceAgain "
          "above Divergence"]


def test_a_zero_duration_is_one_and_a_boolean_or_negative_one_is_refused_saying_why():
    assert parse_duration("0s") == 0.0
    for bad, why in ((True, "expected a duration, got a boolean"),
                     (-5, "a duration cannot be negative")):
        with pytest.raises(ValueError) as err:
            parse_duration(bad)
        assert str(err.value) == why


def test_a_rule_level_error_names_its_rule_and_the_load_warning_its_file(tmp_path, caplog):
    with pytest.raises(RuleError) as err:
        parse_rules("routes: {page: [slack]}\nrules:\n  - {name: Lone, match: {types: "
                    "[nan_inf]}, rollback_budget: 2}\n")
    assert str(err.value).startswith(
        "invalid alert rules in <rules>:\n  rules[0] (rule Lone): Value error, "
        "rollback_budget only apply to action: rollback")
    with pytest.raises(RuleError) as err:  # an entry that is no mapping has no name to give
        parse_rules("routes: {page: [slack]}\nrules: [5]\n", "mine.yaml")
    assert "\n  rules[0]: " in str(err.value)
    path = tmp_path / "rules.yaml"
    path.write_text("routes: {chat: [slack]}\nrules:\n  - {name: A, match: {types: [stalled]}}\n"
                    "  - {name: B, match: {types: [stalled]}}\n")
    load_rules(path)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"alert rules {path}: rule B never matches: rule A above it takes every stalled "
        "finding first (first match wins); move B above A"]


def test_a_rule_without_its_own_timings_takes_the_files_defaults():
    [own, default] = parse_rules("""
routes: {chat: [slack]}
defaults: {cooldown: 7m, repeat_interval: 2h, resolve_after: 3m}
rules:
  - {name: Own, match: {types: [stalled]}, cooldown: 1m, repeat_interval: 1h, resolve_after: 1m}
  - {name: Default, match: {types: [divergence]}}
""")
    assert (own.cooldown, own.repeat_interval, own.resolve_after) == (60.0, 3600.0, 60.0)
    assert (default.cooldown, default.repeat_interval, default.resolve_after) == (
        420.0, 7200.0, 180.0)


def test_a_file_with_no_routes_or_an_unknown_field_says_so():
    with pytest.raises(RuleError) as err:
        parse_rules("routes: {}\nrules:\n  - {name: X, match: {types: [nan_inf]}}\n")
    assert str(err.value).endswith("define it under 'routes' (have: none)")
    with pytest.raises(RuleError) as err:
        parse_rules(GOOD + "Xtra: 1\n")
    assert "\n  Xtra: unknown field (check the spelling)" in str(err.value)
