"""The segment scheduler and the controllers driven from Python: the protocol, provenance, a save /
restore round trip in the middle of a step, rejected calls that leave the state unchanged (the
save() bytes are identical before and after), and the controllers against their documented rules."""

import json

import pytest

import ulorl


def make():
    return ulorl.SegmentScheduler(group_size=2, max_response_tokens=8, num_segments=2, max_active_responses=4)


def test_scheduler_protocol_provenance_and_mid_step_restore():
    s = make()
    assert s.segment_tokens == 4
    assert s.offer_prompts(3) == 0
    p = s.plan()
    assert p["new_groups"] == 2 and [it.response_id for it in p["items"]] == [0, 1, 2, 3]
    assert all(it.start_token == 0 and it.max_new_tokens == 4 and it.policy_version == 0 for it in p["items"])
    s.report(0, 3, "eos")
    s.report(1, 4, "segment_end")
    s.report(2, 4, "segment_end")

    # Mid-step checkpoint: a second scheduler restored from the bytes behaves identically.
    blob = s.save()
    t = ulorl.SegmentScheduler.from_bytes(blob)
    u = make()
    u.restore(blob)
    assert t.save() == blob and u.save() == blob and t.phase == "planned"

    def drive(x):
        x.report(3, 1, "failed")
        summary = x.end_step()
        x.update_policy(1)
        q = x.plan()
        for it in q["items"]:
            x.report(it.response_id, it.max_new_tokens, "segment_end")
        x.end_step()
        return summary, q, x.take_experience()

    results = [drive(x) for x in (s, t, u)]
    assert results[0] == results[1] == results[2]
    assert s.save() == t.save() == u.save()
    summary, q, exp = results[0]
    assert summary["reported"] == 4 and summary["finished"] == 1 and summary["failed"] == 1
    # Step 2 resumes 1 and 2 at token 4, response 3 at token 1 (its committed token kept).
    starts = {it.response_id: (it.start_token, it.max_new_tokens, it.policy_version) for it in q["items"]}
    assert starts[1] == (4, 4, 1) and starts[2] == (4, 4, 1) and starts[3] == (1, 3, 1)
    # Group 0 is complete (0 at EOS, 1 at L_max); group 1 waits for response 3 (4 of 8 tokens).
    assert exp["group_ids"] == [0] and exp["policy_version"] == 1
    r = {x["response_id"]: x for x in exp["responses"]}
    assert r[0]["spans"] == [(0, 3, 0)] and r[0]["final_state"] == "finished"
    assert r[1]["spans"] == [(0, 4, 0), (4, 8, 1)] and r[1]["final_state"] == "truncated"
    assert s.state_of(2) == "truncated" and s.state_of(3) == "paused" and s.state_of(0) == "released"
    assert s.spans_of(3) == [(0, 1, 0), (1, 4, 1)] and s.tokens_of(3) == 4
    assert r[1]["versions_spanned"] == 1 and r[1]["max_lag"] == 1
    # Importance-sampling plans from the provenance (docs/segment_rollout.md): SAIS keeps each
    # segment's version, POIS takes the current one for every token (recomputing the stale span).
    spans = r[1]["spans"]
    assert ulorl.old_log_prob_plan(spans, current_version=1, mode="sais") == [(0, 4, 0, False), (4, 8, 1, False)]
    assert ulorl.old_log_prob_plan(spans, current_version=1, mode="pois") == [(0, 4, 1, True), (4, 8, 1, False)]
    assert ulorl.recompute_token_count(spans, current_version=1, mode="pois") == 4
    assert ulorl.old_log_prob_versions(spans, current_version=1, mode="sais") == [0] * 4 + [1] * 4
    with pytest.raises(ulorl.Error, match="tois|TOIS|version"):
        ulorl.old_log_prob_plan(spans, current_version=1, mode="tois")
    c = s.counters
    assert c["generated_tokens"] == c["released_tokens"] + s.live_tokens + c["dropped_tokens"]
    doc = json.loads(s.to_json())
    assert doc["format"] == "ulorl.segment_scheduler" and doc["step"] == s.step


@pytest.mark.parametrize("bad", [
    lambda s: s.report(99, 1, "eos"),            # never planned
    lambda s: s.report(0, 1, "eos"),             # reported twice
    lambda s: s.report(1, 5, "eos"),             # more than max_new_tokens
    lambda s: s.report(1, 2, "segment_end"),     # segment_end with fewer tokens than planned
    lambda s: s.report(1, 2, "done"),            # unknown outcome
    lambda s: s.plan(),                          # a step is already open
    lambda s: s.update_policy(0),                # versions strictly increase
    lambda s: s.set_num_segments(1),             # a step is open
    lambda s: s.offer_prompts(-1),
    lambda s: s.restore(b"not a checkpoint"),
    lambda s: s.restore(s.save()[:-1]),
    lambda s: s.state_of(10 ** 9),
])
def test_rejected_calls_change_nothing(bad):
    s = make()
    s.offer_prompts(3)
    s.plan()
    s.report(0, 2, "eos")
    before = s.save()
    with pytest.raises(ulorl.Error):
        bad(s)
    assert s.save() == before


def test_set_num_segments_between_steps():
    s = make()  # L_max 8, 2 segments of 4
    s.offer_prompts(1)
    p = s.plan()
    for it in p["items"]:
        s.report(it.response_id, 4, "segment_end")
    s.end_step()
    s.set_num_segments(8)  # segments of 1 token: each paused response gets one more
    assert s.segment_tokens == 1
    assert all(it.start_token == 4 and it.max_new_tokens == 1 for it in s.plan()["items"])
    with pytest.raises(ulorl.Error, match="'n'"):
        s.set_num_segments(2)  # a plan is open


def test_bad_configuration():
    with pytest.raises(ulorl.Error, match="config.num_segments"):
        ulorl.SegmentScheduler(group_size=2, max_response_tokens=8, num_segments=9)
    with pytest.raises(ulorl.Error, match="config.order"):
        ulorl.SegmentScheduler(order="fifo")


def test_kl_controller_adaptive_rule_and_restore():
    k = ulorl.KLController(type="adaptive", init_coef=0.05, target_kl=0.1, horizon=1000.0)
    beta = 0.05
    for kl, n in [(0.3, 64), (0.05, 64), (0.11, 128), (0.0, 10)]:
        e = min(max(kl / 0.1 - 1.0, -0.2), 0.2)
        beta *= 1.0 + e * n / 1000.0
        assert k.update(kl, n) == pytest.approx(beta, rel=1e-15)
    blob = k.save()
    r = ulorl.KLController.restore(blob)
    assert r.value == k.value and r.updates == 4 and r.save() == blob
    assert r.update(0.2, 5) == k.update(0.2, 5)
    with pytest.raises(ulorl.Error, match="n_steps"):
        k.update(0.1, -1)
    with pytest.raises(ulorl.Error):
        ulorl.KLController.restore(blob[:-3])
    assert ulorl.KLController(type="fixed", init_coef=0.001).update(5.0, 100) == 0.001


def test_entropy_controller_step_rule_and_gate():
    e = ulorl.EntropyController(target_entropy=0.3, init_coef=0.01, step_up=0.005, step_down=0.002, max_coef=0.1)
    assert e.bonus(0.5) == 0.0 and e.bonus(0.1) == 0.01  # gated above the target
    assert e.update(0.1) == pytest.approx(0.015)
    assert e.update(0.5) == pytest.approx(0.013)
    r = ulorl.EntropyController.restore(e.save())
    assert r.value == e.value and r.update(0.0) == e.update(0.0)
    with pytest.raises(ulorl.Error, match="entropy"):
        e.update(float("nan"))


def test_reference_reset_plateau_and_cooldown():
    p = ulorl.ReferenceResetPolicy(patience=2, min_delta=0.0, cooldown_steps=5)
    assert not p.observe_validation(1, 0.5)["reset_reference"]
    assert not p.observe_validation(2, 0.4)["reset_reference"]
    a = p.observe_validation(3, 0.45)
    assert a["reset_reference"] and a["trigger"] == "plateau" and a["reset_optimizer"] and a["index"] == 1
    blob = p.save()
    q = ulorl.ReferenceResetPolicy.restore(blob)
    assert q.save() == blob and q.cooldown_remaining == 5 and q.best == 0.5
    with pytest.raises(ulorl.Error, match="steps must not decrease"):
        p.observe_step(2, 0.0, 1.0)
    assert p.save() == blob
    m = p.request_manual(4)
    assert m["suppressed_by_cooldown"] and not m["reset_reference"]
    assert ulorl.kl_share(1.0, 3.0) == 0.25
