"""The sample CSV (`spio.kernels.perf_samples`): rows written and read back, comments, rows from
before a column, and refusals that name the row and column."""

import pytest

from spio.kernels import perf_samples as ps
from spio.kernels.conv2d_gw8_params import Conv2dGw8Params as P
from spio.kernels.families import FAMILIES


def test_sample_csv_round_trip_and_errors(tmp_path):
    params = P(4, 32, 10, 12, padding=(1, 2), r=3, s=5, has_bias=True, dtype="bf16")
    family = FAMILIES["conv2d_gw8_wgrad"]
    config = family.configs(params)[3]
    sample = ps.Sample(
        family.name, "sm_90", "GPU X", "13.0", "0.0", False, params, config, 12.5e-6, "2026-01-01"
    )
    path = tmp_path / "s.csv"
    assert ps.append_samples(path, [sample]) == 1
    assert ps.append_samples(path, [sample]) == 1  # appends under the same header
    back, comments = ps.read_samples(path)
    assert comments == [] and len(back) == 2
    assert back[0].params == params and back[0].config == config
    assert back[0].seconds == pytest.approx(12.5e-6)
    assert back[0].key() == sample.key()
    assert back[0].variant == ""  # none given

    # A CSV from before the variant column: its WGrad rows timed the atomic kernel alone.
    old = tmp_path / "old.csv"
    lines = path.read_text().splitlines()
    old.write_text("\n".join(line.rsplit(",", 1)[0] for line in lines) + "\n")
    assert "variant" not in old.read_text()
    assert ps.read_samples(old)[0][0].variant == ps.LEGACY_WGRAD_VARIANT

    bad = tmp_path / "bad.csv"
    for time_us in ("-1", "inf", "nan"):
        bad.write_text(path.read_text().replace("12.5000", time_us, 1))
        with pytest.raises(ValueError, match="data row 1.*positive finite time_us"):
            ps.read_samples(bad)
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="has columns"):
        ps.append_samples(other, [sample])
    # The same columns in another order: rows written in SAMPLE_COLUMNS' order would not line
    # up with that header.
    header = path.read_text().splitlines()[0]
    reordered = tmp_path / "reordered.csv"
    reordered.write_text(",".join(reversed(header.split(","))) + "\n")
    with pytest.raises(ValueError, match="has columns"):
        ps.append_samples(reordered, [sample])
