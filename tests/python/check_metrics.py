"""Checks a publisher's metrics_text() with the Prometheus client's own parser against its
status_json(): every metric has HELP and TYPE, counters end in _total, and each value equals
the JSON field of the same name. Run by tests/metrics.rs as
`/usr/bin/python3 tests/python/check_metrics.py METRICS_FILE STATUS_JSON_FILE`."""

import json
import sys

from prometheus_client.parser import text_string_to_metric_families

PREFIX = "mooncake_kv_events_"


def main(metrics_path, status_path):
    with open(metrics_path) as f:
        text = f.read()
    with open(status_path) as f:
        # As a reader that holds every number as a double (JavaScript, many JSON libraries):
        # what must survive that is written as a string.
        status = json.load(f, parse_int=float)
    # Which build answered, not a counter: it has no metric.
    assert status.pop("built_with_kv_events") is True, status

    # The parser fills in what a family lacks (type "unknown", empty help): read the lines
    # too, to see that each metric has its own.
    declared = {"HELP": set(), "TYPE": {}}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            declared["HELP"].add(line.split()[2])
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            declared["TYPE"][name] = kind

    values = {}
    build_info = None
    for family in text_string_to_metric_families(text):
        assert family.type in ("counter", "gauge"), (family.name, family.type)
        assert family.documentation.strip(), f"{family.name} has no HELP text"
        assert len(family.samples) == 1, family.samples
        sample = family.samples[0]
        if sample.name == PREFIX + "build_info":
            # The build, not a stats field: the versions and CURVE as labels.
            assert set(sample.labels) == {"version", "libzmq", "curve"}, sample
            assert sample.labels["curve"] in ("true", "false"), sample
            assert sample.value == 1, sample
            build_info = sample.labels
            continue
        if sample.name.endswith("_info"):
            # An id too wide for a float sample rides in a label: NAME_info{NAME="id"} 1; the
            # status writes it as a string of the same digits.
            field = sample.name[len(PREFIX) : -len("_info")]
            assert isinstance(status[field], str) and status[field].isdigit(), status[field]
            assert sample.labels == {field: status[field]}, (sample, status[field])
            assert sample.value == 1, sample
            values[field] = status[field] = int(status[field])
            continue
        assert sample.labels == {}, sample
        assert sample.name.startswith(PREFIX), sample.name
        assert sample.name in declared["HELP"], f"no # HELP line for {sample.name}"
        assert declared["TYPE"].get(sample.name) == family.type, f"# TYPE of {sample.name}"
        field = sample.name[len(PREFIX) :]
        if family.type == "counter":
            assert field.endswith("_total"), f"counter {sample.name} does not end in _total"
            field = field[: -len("_total")]
        else:
            assert not field.endswith("_total"), f"gauge {sample.name} ends in _total"
        assert field not in values, f"{field} twice"
        values[field] = sample.value

    assert set(values) == set(status), (
        f"metrics without a status field: {sorted(set(values) - set(status))}; "
        f"status fields without a metric: {sorted(set(status) - set(values))}"
    )
    for field, value in sorted(values.items()):
        expected = status[field]
        expected = int(expected) if isinstance(expected, bool) else expected
        assert value == expected, f"{field}: metric {value}, status_json {expected}"
    assert build_info is not None, "no mooncake_kv_events_build_info"
    print(
        f"{len(values)} metrics match status_json: "
        + ", ".join(f"{k}={v:g}" for k, v in sorted(values.items()))
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
