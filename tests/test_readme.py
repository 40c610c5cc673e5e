"""The README's example runs as written (on a tiny checkpoint instead of a real Qwen folder)."""

from __future__ import annotations

import os
import re
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_example() -> str:
  text = open(os.path.join(ROOT, "README.md")).read()
  match = re.search(r"<!-- readme-example[^>]*-->\s*```python\n(.*?)```", text, re.S)
  assert match, "README.md lost its marked example"
  return match.group(1)


def test_readme_example_runs(hf_checkpoint, tiny_tokenizer_dir, tmp_path, capsys):
  folder, _ = hf_checkpoint("qwen2-tied-gqa2")
  model_dir = str(tmp_path / "qwen")
  shutil.copytree(folder, model_dir)
  for name in os.listdir(tiny_tokenizer_dir):
    shutil.copy(os.path.join(tiny_tokenizer_dir, name), model_dir)
  code = readme_example()
  assert '"/path/to/Qwen2.5-0.5B-Instruct"' in code and '"/tmp/qwen-export"' in code
  code = code.replace('"/path/to/Qwen2.5-0.5B-Instruct"', repr(model_dir))
  code = code.replace('"/tmp/qwen-export"', repr(str(tmp_path / "export")))
  exec(compile(code, "README.md", "exec"), {})
  assert capsys.readouterr().out.strip()
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(tmp_path / "export"))
