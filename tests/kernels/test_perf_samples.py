"""The sample CSV (`spio.kernels.perf_samples`): rows written and read back, comments, rows from
before a column, and refusals that name the row and column."""

import dataclasses

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


def _wgrad_sample(synthetic=False, seconds=12.5e-6):
    """A WGrad sample of a bf16 layer with bias and unequal padding, timed at 12.5 us."""
    params = P(4, 32, 10, 12, padding=(1, 2), r=3, s=5, has_bias=True, dtype="bf16")
    family = FAMILIES["conv2d_gw8_wgrad"]
    config = family.configs(params)[3]
    return ps.Sample(
        family.name, "sm_90", "GPU X", "13.0", "0.0", synthetic, params, config, seconds, "d"
    )


def test_sample_row_fields_match_hand_computed_values():
    """The row's units and encodings, worked out by hand: P = 10 + 2 - 3 + 1 = 10 and
    Q = 12 + 4 - 5 + 1 = 12, so x and dy are 4*32*10*12*2 = 30,720 bytes each, dw (fp32)
    32*8*3*5*4 = 15,360 and dbias 32*4 = 128: 76,928 bytes in 12.5 us is 6.15 GB/s (1e9 B/s).
    Fields a family does not have are empty, and the layer key drops batch size and dtype."""
    sample = _wgrad_sample(synthetic=True)
    row = ps.sample_row(sample)
    assert set(row) == set(ps.SAMPLE_COLUMNS)
    assert (row["time_us"], row["bandwidth_gbs"]) == ("12.5000", "6.15")
    assert (row["pad_h"], row["pad_w"], row["r"], row["s"]) == ("1", "2", "3", "5")
    assert (row["has_bias"], row["dtype"], row["synthetic"]) == ("1", "bf16", "1")
    assert row["cfg_stages"] == str(sample.config.stages)
    assert row["cfg_warp_q16"] == ""  # an FProp/DGrad field, not WGrad's
    assert sample.layer_key == "c32_h10_w12_pad1x2_r3_s5_bias1"


def test_synthetic_rows_read_back_as_synthetic(tmp_path):
    """The synthetic flag survives the CSV, and a synthetic WGrad row from before the variant
    column is not a legacy atomic-only timing (its time came from a formula, not a kernel)."""
    path = tmp_path / "s.csv"
    ps.append_samples(path, [_wgrad_sample(synthetic=True)])
    (back,), _ = ps.read_samples(path)
    assert back.synthetic is True and back.variant == ""
    old = tmp_path / "old.csv"
    old.write_text("".join(line.rsplit(",", 1)[0] + "\n" for line in path.read_text().splitlines()))
    assert "variant" not in old.read_text()
    (legacy,), _ = ps.read_samples(old)
    assert legacy.synthetic is True and legacy.variant == ""


def test_zero_time_and_a_missing_date_column_are_refused(tmp_path):
    """A time of 0 us is not a measurement; a CSV without the date column is refused with a
    ValueError naming the column (not a KeyError out of the reader)."""
    path = tmp_path / "s.csv"
    ps.append_samples(path, [_wgrad_sample()])
    zero = tmp_path / "zero.csv"
    zero.write_text(path.read_text().replace("12.5000", "0", 1))
    with pytest.raises(ValueError, match="data row 1.*positive finite time_us, got '0'"):
        ps.read_samples(zero)
    with pytest.raises(ValueError, match="data row 1: .*need columns date"):
        ps.read_samples(_without_column(path, "date", tmp_path / "no_date.csv"))


def _without_column(path, column, dest):
    """dest: the CSV at path (a header and rows, no comments) with `column` left out."""
    lines = path.read_text().splitlines()
    drop = lines[0].split(",").index(column)
    kept = (",".join(v for i, v in enumerate(line.split(",")) if i != drop) for line in lines)
    dest.write_text("\n".join(kept) + "\n")
    return dest


def test_a_csv_from_before_a_config_field_reads_with_its_default(tmp_path):
    """Config fields are added over time, their defaults what kernels did before: a CSV without
    a field's column had been refused ("need columns cfg_..."), as config_from_fields does not."""
    path = tmp_path / "s.csv"
    sample = _wgrad_sample()
    ps.append_samples(path, [sample])
    family = FAMILIES[sample.family]
    field = next(  # a field at its default: the value a CSV from before it meant
        f.name for f in dataclasses.fields(family.config_type)
        if f.default is not dataclasses.MISSING and getattr(sample.config, f.name) == f.default
    )  # fmt: skip
    (read,), _ = ps.read_samples(_without_column(path, f"cfg_{field}", tmp_path / "older.csv"))
    assert (read.params, read.config, read.variant) == (sample.params, sample.config, "")


def test_comments_and_an_empty_file(tmp_path):
    """Any line starting with '#' is a comment, with or without a space after it; an existing
    empty file takes a header and rows like a new one."""
    path = tmp_path / "s.csv"
    path.write_text("")
    assert ps.append_samples(path, [_wgrad_sample()]) == 1
    assert path.read_text().splitlines()[0] == ",".join(ps.SAMPLE_COLUMNS)
    commented = tmp_path / "c.csv"
    commented.write_text("# one\n#two\n" + path.read_text())
    samples, comments = ps.read_samples(commented)
    assert len(samples) == 1 and comments == ["# one\n", "#two\n"]


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("n", "x", "column n needs an integer, got 'x'"),
        ("cfg_groups", "abc", "column cfg_groups needs an integer, got 'abc'"),
        ("time_us", "fast", "positive finite time_us, got 'fast'"),
        ("has_bias", "yes", "column has_bias needs 0 or 1, got 'yes'"),
        ("has_bias", "True", "column has_bias needs 0 or 1, got 'True'"),
        ("synthetic", "2", "column synthetic needs 0 or 1, got '2'"),
        ("arch", "../../spio/perf_models/sm_90", "column arch needs an arch such as sm_90, got"),
        ("arch", "", "column arch needs an arch such as sm_90, got ''"),
    ],
)
def test_a_bad_cell_is_refused_naming_its_column(tmp_path, column, value, message):
    """A cell that is not a number had raised int()'s or float()'s bare message, naming neither
    the column nor the value's place; a has_bias of 'yes' had read as False (the sample then
    counted for the layer without a bias); an arch of ../.. had the trainer write its model
    outside --out (over a shipped one), an empty one where spio never looks."""
    path = tmp_path / "s.csv"
    ps.append_samples(path, [_wgrad_sample()])
    rows = [line.split(",") for line in path.read_text().splitlines()]
    rows[1][rows[0].index(column)] = value
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(",".join(row) for row in rows) + "\n")
    with pytest.raises(ValueError, match=f"data row 1.*{message}"):
        ps.read_samples(bad)


def test_a_spreadsheets_bom_and_spaces_around_family_and_arch_are_read(tmp_path):
    """A CSV saved by a spreadsheet starts with a UTF-8 BOM: its first column had read as
    '\\ufefffamily' ("kernel family must be one of ..., got ''"), and a family with a space
    before it was refused where the other text columns are stripped."""
    path = tmp_path / "s.csv"
    ps.append_samples(path, [_wgrad_sample()])
    header, row = path.read_text().splitlines()
    cells = row.split(",")
    cells[0], cells[1] = f" {cells[0]}", f"{cells[1]} "
    odd = tmp_path / "odd.csv"
    odd.write_text("\ufeff" + header + "\n" + ",".join(cells) + "\n", encoding="utf-8")
    (sample,) = ps.read_samples(odd)[0]
    assert sample == ps.read_samples(path)[0][0]
    assert ps.append_samples(odd, [_wgrad_sample()]) == 1  # its header is SAMPLE_COLUMNS
    assert len(ps.read_samples(odd)[0]) == 2
