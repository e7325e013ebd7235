"""The input layer and the trace readers: every bad file is refused with the file, the row (or byte offset) and
the field named; valid variants (gzip, quoted headers, a UTF-8 BOM) are read exactly."""
from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from tierserve.core.errors import ConfigError, InputError, TierserveError, TraceError
from tierserve.experiments.scenario import ScenarioConfig
from tierserve.workload import read_trace
from tierserve.workload.readers import read_rows

CSV_HEADER = "arrival_s,prompt_tokens,output_tokens\n"
UNREADABLE = Path("/proc/self/mem")      # a regular file whose read fails even for root (EIO)


def write(tmp_path: Path, name: str, data: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return p


def vidur_run(tmp_path: Path, metrics: bytes, arrivals: bytes) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    (d / "request_metrics.csv").write_bytes(metrics)
    (d / "request_arrival_time_series.csv").write_bytes(arrivals)
    return d


# ---- bytes that are not UTF-8 text ---------------------------------------------------------------------------

GOOD = {
    "csv": b"arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,20,6\n",
    "azure": b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,5\n"
             b"2023-11-16 18:15:47.0000000,20,6\n",
    "mooncake": b'{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                b'{"timestamp": 1000, "input_length": 20, "output_length": 6}\n',
    "vidur": b"arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,20,6\n",
}
BAD_BYTES = {   # bytes put into a valid file, and the first of them that is not UTF-8
    "latin-1": (b"\xe9", b"\xe9"),
    "binary": (b"\xff\xfe\x00\x80", b"\xff"),
}


@pytest.mark.parametrize("fmt", sorted(GOOD))
@pytest.mark.parametrize("kind", sorted(BAD_BYTES))
def test_non_utf8_bytes_name_the_file_and_the_byte_offset(tmp_path, fmt, kind):
    bad, first = BAD_BYTES[kind]
    data = GOOD[fmt][:-1] + bad + b"\n"
    p = write(tmp_path, f"t.{fmt}", data)
    with pytest.raises(TraceError) as ei:
        read_trace(p, fmt)
    msg = str(ei.value)
    assert str(p) in msg and "not UTF-8" in msg and f"byte 0x{first.hex()}" in msg
    assert f"byte offset {data.index(first)} " in msg


def test_utf16_file_is_refused_with_a_hint(tmp_path):
    p = write(tmp_path, "t.csv", GOOD["csv"].decode().encode("utf-16"))
    with pytest.raises(TraceError, match=r"byte offset 0 .*UTF-16.*save it as UTF-8"):
        read_trace(p, "csv")


def test_non_utf8_vidur_run_file_is_named(tmp_path):
    d = vidur_run(tmp_path, b"Request Id,request_num_prefill_tokens,request_num_decode_tokens\n0,10,5\n",
                  b"Time (sec)\n0.\xff5\n")
    with pytest.raises(TraceError, match="request_arrival_time_series.csv.*byte offset 13"):
        read_trace(d, "vidur_run")


def test_non_utf8_yaml_is_a_config_error_with_the_offset(tmp_path):
    p = write(tmp_path, "s.yaml", b"name: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"--config.*s.yaml.*byte 0xe9 at byte offset 9"):
        ScenarioConfig.from_yaml(p)


@pytest.mark.parametrize("fmt", sorted(GOOD))
def test_gzip_traces_read_exactly_like_plain_ones(tmp_path, fmt):
    plain = read_trace(write(tmp_path, f"t.{fmt}", GOOD[fmt]), fmt)
    packed = read_trace(write(tmp_path, f"t.{fmt}.gz", gzip.compress(GOOD[fmt])), fmt)
    assert packed == plain and len(plain) == 2


def test_corrupt_gzip_is_named(tmp_path):
    p = write(tmp_path, "t.csv.gz", gzip.compress(GOOD["csv"])[:-12])
    with pytest.raises(TraceError, match=r"t\.csv\.gz.*corrupt gzip"):
        read_trace(p, "csv")


def test_gzip_where_text_is_expected_is_refused(tmp_path):
    p = write(tmp_path, "s.yaml", gzip.compress(b"seed: 1\n"))
    with pytest.raises(ConfigError, match="gzip"):
        ScenarioConfig.from_yaml(p)


def test_utf8_bom_is_skipped(tmp_path):
    p = write(tmp_path, "t.csv", b"\xef\xbb\xbf" + GOOD["csv"])
    assert [r.prompt_tokens for r in read_trace(p, "csv")] == [10, 20]


# ---- unreadable files named on the command line, inside a YAML, or inside a Vidur run folder ---------------

needs_proc_mem = pytest.mark.skipif(not UNREADABLE.exists(), reason="needs Linux /proc/self/mem")


@needs_proc_mem
@pytest.mark.parametrize("fmt", ["csv", "mooncake", "vidur", "azure"])
def test_unreadable_trace_is_named(fmt):
    with pytest.raises(TraceError, match=r"/proc/self/mem.*cannot be read"):
        read_trace(UNREADABLE, fmt)


@needs_proc_mem
def test_unreadable_trace_named_inside_a_yaml_is_named(tmp_path):
    from tierserve.experiments.scenario import run_scenario
    p = write(tmp_path, "s.yaml", "workload:\n  num_requests: null\n  arrivals: {kind: trace}\n"
                                  f"  lengths: {{kind: trace}}\n  trace: {{path: {UNREADABLE}}}\n")
    cfg = ScenarioConfig.from_yaml(p)
    with pytest.raises(TraceError, match=r"/proc/self/mem.*cannot be read"):
        run_scenario(cfg)


@needs_proc_mem
def test_unreadable_file_in_a_vidur_run_folder_is_named(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "request_metrics.csv").symlink_to(UNREADABLE)
    (d / "request_arrival_time_series.csv").write_text("Time (sec)\n0.5\n")
    with pytest.raises(TraceError, match=r"request_metrics.csv.*cannot be read"):
        read_trace(d, "vidur_run")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_file_without_read_permission_is_named(tmp_path):
    p = write(tmp_path, "t.csv", GOOD["csv"])
    p.chmod(0)
    with pytest.raises(TraceError, match=r"t\.csv.*cannot be read \(Permission denied\)"):
        read_trace(p, "csv")


def test_a_folder_where_a_file_is_expected_is_named(tmp_path):
    with pytest.raises(TraceError, match="is a folder"):
        read_trace(tmp_path, "csv")
    with pytest.raises(ConfigError, match="not a folder"):
        ScenarioConfig.from_yaml(tmp_path)


# ---- CSV structure ---------------------------------------------------------------------------------------------

def test_duplicate_csv_column_is_refused(tmp_path):
    p = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,prompt_tokens,output_tokens\n0,10,11,5\n")
    with pytest.raises(TraceError) as ei:
        read_trace(p, "csv")
    assert ei.value.field == "prompt_tokens" and ei.value.row == 0 and "duplicate column" in str(ei.value)


def test_extra_cells_in_a_row_are_refused(tmp_path):
    p = write(tmp_path, "t.csv", CSV_HEADER + "0,10,5\n1,10,5,99\n")
    with pytest.raises(TraceError) as ei:
        read_trace(p, "csv")
    assert ei.value.row == 2 and "4 cells, more than the header's 3 columns" in str(ei.value)


def test_missing_cells_in_a_row_are_refused(tmp_path):
    p = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens,app\n0,10,5,chat\n1,10,5\n")
    with pytest.raises(TraceError, match="row 2.*3 cells, fewer than the header's 4 columns"):
        read_trace(p, "csv")


def test_a_valid_100k_character_line_is_read_and_an_overlong_cell_is_refused_with_the_limit(tmp_path, monkeypatch):
    p = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens,app\n0,10,5," + "x" * 100_000 + "\n")
    assert [r.prompt_tokens for r in read_trace(p, "csv")] == [10]
    monkeypatch.setenv("TIERSERVE_MAX_CELL_CHARS", "4096")
    p = write(tmp_path, "u.csv", "arrival_s,prompt_tokens,output_tokens,app\n0,10,5," + "x" * 5000 + "\n")
    with pytest.raises(TraceError, match="at most 4,096 characters.*TIERSERVE_MAX_CELL_CHARS"):
        read_trace(p, "csv")


def test_overlong_line_is_refused_without_reading_it_whole(tmp_path, monkeypatch):
    monkeypatch.setenv("TIERSERVE_MAX_LINE_CHARS", "1000")
    p = write(tmp_path, "t.jsonl", '{"timestamp": 0, "input_length": 1, "output_length": 5, "pad": "'
              + "x" * 5000 + '"}\n')
    with pytest.raises(TraceError, match="line is longer than at most 1,000"):
        read_trace(p, "mooncake")


def test_more_rows_than_the_request_limit_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TIERSERVE_MAX_REQUESTS", "3")
    p = write(tmp_path, "t.csv", CSV_HEADER + "".join(f"{i},10,5\n" for i in range(4)))
    with pytest.raises(TraceError, match=r"row 4.*at most 3 requests.*TIERSERVE_MAX_REQUESTS=N"):
        read_trace(p, "csv")
    monkeypatch.setenv("TIERSERVE_MAX_REQUESTS", "4")
    assert len(read_trace(p, "csv")) == 4


def test_vidur_trace_with_a_quoted_header_is_read(tmp_path):
    p = write(tmp_path, "v.csv", '"arrived_at","num_prefill_tokens","num_decode_tokens"\n0,10,5\n0.5,20,6\n')
    reqs = read_trace(p, "vidur")
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [(0.0, 10, 5), (0.5, 20, 6)]


# ---- numbers ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cell", ["1_000", "1e30", "18446744073709551616", "٣", "0x10", "1,000", "true"])
def test_token_cell_that_is_not_a_plain_bounded_count_is_refused(tmp_path, cell):
    p = write(tmp_path, "t.csv", f'arrival_s,prompt_tokens,output_tokens\n0,"{cell}",5\n')
    with pytest.raises(TraceError) as ei:
        read_trace(p, "csv")
    assert ei.value.field == "prompt_tokens" and ei.value.row == 1 and ei.value.value == cell


@pytest.mark.parametrize("value, problem", [("true", "not a boolean"), ('"5"', "not a number"),
                                            ("18446744073709551616", "at most 2,147,483,647"),
                                            ("1e30", "at most 2,147,483,647"), ("[5]", "not a number")])
def test_mooncake_count_must_be_a_json_number_in_range(tmp_path, value, problem):
    p = write(tmp_path, "t.jsonl", f'{{"timestamp": 0, "input_length": {value}, "output_length": 5}}\n')
    with pytest.raises(TraceError, match=problem) as ei:
        read_trace(p, "mooncake")
    assert ei.value.field == "input_length"


def test_mooncake_duplicate_key_and_deep_nesting_are_refused(tmp_path):
    p = write(tmp_path, "t.jsonl", '{"timestamp": 0, "input_length": 5, "input_length": 6, "output_length": 5}\n')
    with pytest.raises(TraceError, match="duplicate key 'input_length'"):
        read_trace(p, "mooncake")
    deep = "[" * 100_000 + "]" * 100_000
    p = write(tmp_path, "d.jsonl", f'{{"timestamp": 0, "input_length": 5, "output_length": 5, "x": {deep}}}\n')
    with pytest.raises(TraceError, match="nested too deeply"):
        read_trace(p, "mooncake")


@pytest.mark.parametrize("fmt, body, field", [
    ("csv", CSV_HEADER + "1e17,10,5\n", "arrival_s"),
    ("mooncake", '{"timestamp": 1e20, "input_length": 10, "output_length": 5}\n', "timestamp"),
    ("vidur", "arrived_at,num_prefill_tokens,num_decode_tokens\n2e9,10,5\n", "arrived_at"),
])
def test_arrival_beyond_1e9_s_is_refused(tmp_path, fmt, body, field):
    p = write(tmp_path, f"t.{fmt}", body)
    with pytest.raises(TraceError, match="at most 1e\\+09 s.*sub-microsecond") as ei:
        read_trace(p, fmt)
    assert ei.value.field == field


def test_arrival_at_the_bound_keeps_sub_microsecond_resolution():
    from tierserve.core.limits import MAX_TIME_S
    assert (MAX_TIME_S + 1e-7) - MAX_TIME_S > 0          # 0.1 µs past the bound is still a different time
    import math
    assert math.ulp(MAX_TIME_S) < 1e-6


def test_tier_column_is_bounded_even_without_k(tmp_path):
    p = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens,tier\n0,10,5,1000000\n")
    with pytest.raises(TraceError, match="TIERSERVE_MAX_TIERS"):
        read_rows(p, "csv")


def test_every_error_is_a_tierserve_error_naming_a_field(tmp_path):
    """The classes: InputError (files) and TraceError (traces) carry source, row and field."""
    assert issubclass(TraceError, InputError) and issubclass(InputError, TierserveError)
    p = write(tmp_path, "t.csv", CSV_HEADER + "0,10,5,1\n")
    with pytest.raises(InputError) as ei:
        read_trace(p, "csv")
    assert ei.value.source == str(p) and ei.value.field


def test_nul_byte_is_refused_as_binary_data(tmp_path):
    p = write(tmp_path, "t.csv", b"\x00" + GOOD["csv"])
    with pytest.raises(TraceError, match="NUL byte at byte offset 0"):
        read_trace(p, "csv")
    p = write(tmp_path, "u.csv", GOOD["csv"] + b"2,5,\x00\xff\n")
    with pytest.raises(TraceError, match=f"NUL byte at byte offset {len(GOOD['csv']) + 4}"):
        read_trace(p, "csv")
