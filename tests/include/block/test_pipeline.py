"""AsyncPipeline's stage bookkeeping in the documented loop, checked against a cp.async model."""


def test_pipeline_loop_has_no_stale_reads_or_overwrites(build_and_run):
    out = build_and_run("pipeline_model")
    assert out.strip().endswith("0 failures")
