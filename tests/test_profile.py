import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tabletune.errors import InputError
from tabletune.profile import Fingerprint, StepPoint, StepProfile, step_profile_from_csv_text


def test_csv_samples_use_median():
    p = step_profile_from_csv_text("batch_size,k,step_ms\n1,0,10\n1,0,12\n1,0,30\n4,0,20\n", "x.csv")
    assert p.step_ms(1, 0) == 12.0
    assert p.step_ms(2, 0) == pytest.approx(12 + 8 / 3)
    assert p.step_ms(64, 0) == 20.0


@pytest.mark.parametrize("text, field, value", [
    ("batch_size,step_ms\n1,3\n", "k", None),
    ("batch_size,k,step_ms\n1,0,abc\n", "step_ms (line 2)", "abc"),
    ("batch_size,k,step_ms\n1,0,-3\n", "step_ms (line 2)", "-3.0"),
    ("batch_size,k,step_ms\n0,0,3\n", "batch_size (line 2)", "0"),
    ("batch_size,k,step_ms\n", "step_ms", None),
])
def test_csv_errors_name_file_field_value(text, field, value):
    with pytest.raises(InputError) as info:
        step_profile_from_csv_text(text, "bad.csv")
    assert info.value.source == "bad.csv"
    assert info.value.field == field
    if value is not None:
        assert str(info.value.value) == value


def test_json_roundtrip_and_fingerprint(tmp_path):
    fp = Fingerprint(engine="vllm", engine_version="0.32.0", device="cpu", model="tiny", dtype="float32",
                     drafter="ngram", command="tabletune tune ...")
    p = StepProfile((StepPoint(1, 0, (1.0, 1.2, 1.1, 1.3)), StepPoint(2, 0, (2.0,)), StepPoint(1, 1, (1.5,))), 512, fp)
    path = tmp_path / "s.json"
    p.save(path)
    q = StepProfile.load(path)
    assert q.fingerprint == fp and q.context_len == 512
    assert q.step_ms(1, 0) == pytest.approx(1.15)
    assert q.points[0].spread > 0


def test_unknown_schema_version(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"schema": "tabletune.step_profile", "version": 7, "points": []}))
    with pytest.raises(InputError, match="s.json: field 'version' = 7"):
        StepProfile.load(path)


def test_merge_refuses_other_fingerprint():
    a = StepProfile((StepPoint(1, 0, (1.0,)),), 1024, Fingerprint(device="H200"))
    b = StepProfile((StepPoint(1, 0, (2.0,)),), 1024, Fingerprint(device="H100"))
    with pytest.raises(InputError, match="device"):
        a.merged(b)
    assert a.merged(b, force=True).points[0].samples_ms == (1.0, 2.0)


def test_unmeasured_k_is_an_error():
    p = StepProfile((StepPoint(1, 0, (1.0,)),), 0)
    with pytest.raises(KeyError, match="k=2"):
        p.step_ms(1, 2)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_csv_parser_never_crashes(data):
    text = data.decode("utf-8", errors="replace")
    try:
        step_profile_from_csv_text(text, "fuzz.csv")
    except InputError:
        pass


@settings(max_examples=300)
@given(st.binary(max_size=400))
def test_json_parser_never_crashes(data):
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return
    try:
        StepProfile.from_json(obj, "fuzz.json")
    except InputError:
        pass


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=20)


@given(st.fixed_dictionaries({"schema": st.just("tabletune.step_profile"), "version": st.just(1),
                              "context_len": json_values, "fingerprint": json_values,
                              "points": st.lists(st.dictionaries(st.sampled_from(["batch_size", "k", "samples_ms"]),
                                                                 json_values), max_size=3)}))
def test_structured_json_never_crashes(obj):
    try:
        StepProfile.from_json(obj, "fuzz.json")
    except InputError:
        pass
