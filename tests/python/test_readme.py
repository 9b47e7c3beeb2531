"""README.md's Python example (its first ```python block) runs and gives a finite loss with gradients."""

import pathlib
import re

import torch

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README.md has no ```python block"
    scope = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    assert torch.isfinite(scope["loss"]).item()
    assert scope["log_prob"].grad is not None and torch.isfinite(scope["log_prob"].grad).all()
