"""examples/decode_step.py on the CPU with tiny shapes: it runs every stage, its outputs
obey the step's invariants, and it prints the stage table."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "decode_step.py"


def load_example():
    spec = importlib.util.spec_from_file_location("decode_step", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


example = load_example()


@pytest.mark.parametrize("dcp", [1, 2, 3])
def test_decode_step_runs_on_cpu(dcp, capsys, tmp_path):
    out = tmp_path / "step.json"
    result = example.main(["--device", "cpu", "--batch", "3", "--next-n", "2",
                           "--context", "200", "--block-size", "16", "--heads", "4",
                           "--head-dim", "16", "--topk", "32", "--dcp", str(dcp),
                           "--iters", "2", "--json", str(out)])
    assert result["problems"] == []
    assert result["logits"] == "torch fallback" and result["path"] == "native"
    printed = capsys.readouterr().out
    stages = [s for s in example.STAGES if dcp > 1 or s != "merge"]
    for stage in stages + ["whole step"]:
        assert f"| {stage} |" in printed
    assert ("| merge |" in printed) == (dcp > 1)
    assert "check: ok" in printed
    saved = json.loads(out.read_text())
    assert set(saved["us_per_rank"]) == set(example.STAGES) | {"step"}
    assert all(v > 0 for k, v in saved["us_per_rank"].items() if dcp > 1 or k != "merge")


def test_topk_larger_than_context_is_refused():
    with pytest.raises(SystemExit):
        example.main(["--device", "cpu", "--context", "64", "--topk", "128"])
