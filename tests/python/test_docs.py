"""The Python snippets of docs/python.md run, and print what the comments beside them say.

Checks the bindings' sections: every ```python block before the first heading that mentions
torch (the PyTorch part has its own tests). A `print(...)  # text` line must print `text`
(up to the first ':' or ' ...' in the comment, which may explain further); the errors block is
compared with the ``` block after it.
"""

import contextlib
import io
import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"


def bindings_blocks():
    text = DOC.read_text()
    cut = re.search(r"^#+ .*torch", text, flags=re.M | re.I)
    text = text[: cut.start()] if cut else text
    return re.findall(r"```python\n(.*?)```(?:\n\nprints\n\n```\n(.*?)```)?", text, flags=re.S)


def expected_prints(code):
    """The comment after each print(...) line, in order."""
    out = []
    for line in code.splitlines():
        m = re.match(r"\s*print\(.*\)\s+# (.*)$", line)
        if m:
            out.append(re.split(r":(?= |$)| \.\.\.", m.group(1))[0].strip())
    return out


BLOCKS = bindings_blocks()


def test_the_doc_has_snippets():
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_snippet_runs_and_prints_what_it_says(index):
    code, printed = BLOCKS[index]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, f"docs/python.md block {index}", "exec"), {})
    lines = buf.getvalue().splitlines()
    if printed:
        assert lines == printed.splitlines()
    want = expected_prints(code)
    if want and len(want) == len(lines):
        assert [line.strip() for line in lines] == want
    elif want:
        # Some prints have no comment: each commented expectation appears in order.
        it = iter(line.strip() for line in lines)
        for w in want:
            assert any(line == w for line in it), (w, lines)
