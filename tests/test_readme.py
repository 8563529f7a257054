"""The README's Python example runs as written."""
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    for code in blocks:
        exec(compile(code, str(README), "exec"), {})
    assert "smalltc.Plan" in capsys.readouterr().out


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    first_block = re.search(r"```sh\n(.*?)```", text, flags=re.S).group(1)
    assert [ln.split()[:2] for ln in first_block.strip().splitlines()] == [["make", "demo"],
                                                                           ["make", "test"]]
