"""The compute-sanitizer launch list (spio.bench.sanitize), without a GPU."""


def test_sanitizer_launches_include_multi_image_blocks():
    """Each pass on three layers, then FProp and DGrad blocks of two images over an odd batch."""
    from spio.bench import sanitize

    launches = sanitize.launches()
    assert len(launches) == 3 * 3 + 2
    multi = [(p, c) for p, _, c in launches if c.block_n > 1]
    assert [c.block_n for _, c in multi] == [2, 2] and multi[0][0].n % 2 == 1
