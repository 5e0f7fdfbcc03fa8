"""The shared wording: evidence names the finding it belongs to, numbers never read equal
when they differ, and the console text agrees with its headline."""

from __future__ import annotations

from monitor_agent.notify import format as fmt
from tests.notify.sample_events import event, note


def test_evidence_names_its_finding_and_the_alert_size():
    e = event(type="grad_explosion", step=412, layer="h.3.mlp", count=10,
              evidence={"consecutive_steps": 10, "ratio": float("inf")})
    line = fmt.evidence_line(e)
    assert line.startswith("evidence of the grad_explosion finding at step 412, layer h.3.mlp "
                           "(10 findings in this alert): ")
    assert "consecutive_steps=10" in line and "ratio=+inf" in line
    assert fmt.evidence(e)["finding"].startswith("the grad_explosion finding at step 412")
    assert fmt.evidence_line(event(evidence={})) is None
    single = fmt.finding_ref(event(count=1, layer=None))
    assert single == "the nan_inf finding at step 300"


def test_close_numbers_get_the_digits_to_differ_and_no_reference_is_called_a_baseline():
    assert fmt.value_line(event(value=0.80004, threshold=0.8)) == (
        "value 0.80004 (judged against 0.8)")
    assert fmt.value_line(event(value=0.8, threshold=0.8)) == "value 0.8 (judged against 0.8)"
    assert fmt.value_line(event(value=3.0, threshold=None)) == "value 3"
    assert fmt.value_line(event(value=None, threshold=None)) is None


def test_console_text_puts_the_evidence_under_its_own_headline():
    a = event(step=300, evidence={"loss": float("nan")})
    b = event(fingerprint="f2", alertname="TrainingLossSpike", type="loss_spike", step=120,
              layer=None, count=1, evidence={"zscore": 9.5}, summary="loss spiked")
    lines = fmt.plain(note(a, b)).splitlines()
    i = next(n for n, line in enumerate(lines) if n and "TrainingLossSpike" in line)
    assert "step 300" in lines[1] and "nan_inf finding at step 300" in "\n".join(lines[1:i])
    assert "loss_spike finding at step 120" in "\n".join(lines[i:])
    assert "loss_spike" not in "\n".join(lines[1:i])
    resolved = fmt.plain(note(event("resolved")))
    assert "evidence" not in resolved
